"""Test doubles for the engine: tiny trained tokenizers and a runner that simulates a paged KV cache.

The fake runner writes each computed token into the slot its block table names and, to sample,
reads the whole context back through the block table. A wrong prefix hit, a stale block or a bad
slot mapping therefore changes the generated tokens, which the tests compare against an oracle
that never touches a cache.
"""

from __future__ import annotations

import functools
import hashlib
import json
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.llm_engine import LLMEngine
from omni_gateway.engine.core.sequence import ScheduledBatch, Sequence

from tests.harness.checkpoints import CORPUS, byte_level_tokenizer


@functools.cache
def sentencepiece_style_tokenizer() -> Any:
    """Llama-style: '▁' marks spaces, the decoder strips the leading one, unknown text uses byte fallback."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<eos>", "<bos>"]
    normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.normalizer = normalizer
    trained.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=160, special_tokens=specials))
    # Byte tokens are ordinary vocabulary (as in Llama), so skip_special_tokens keeps them.
    vocab = dict(trained.get_vocab(with_added_tokens=False))
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    merges = [
        tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in json.loads(trained.to_str())["model"]["merges"]
    ]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizer
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", bos_token="<bos>", unk_token="<unk>")


@dataclass(frozen=True)
class FakeSample:
    token_id: int
    logprob: Any = None


@dataclass(frozen=True)
class FakeStep:
    """A step the fake runner ran: resolved at once."""

    batch: ScheduledBatch
    samples: list[FakeSample | None]

    def results(self) -> list[FakeSample | None]:
        return self.samples

    def finish(self) -> None:
        """Nothing held back: the fake samples without grammars."""


def hashed_next_token(context: list[int], seed: int | None, vocab_size: int, first_id: int) -> int:
    """Deterministic 'model': a token picked by hashing the whole context (and the seed, if any)."""
    digest = hashlib.sha256(array("q", context).tobytes() + str(seed).encode()).digest()
    return first_id + int.from_bytes(digest[:8], "little") % (vocab_size - first_id)


class FakeRunner:
    device: Any = SimpleNamespace(type="cpu")  # a torch.device's only attribute the engine reads

    def __init__(
        self, config: EngineConfig, model: Any, *, next_token: Callable[[list[int], Sequence], int] | None = None
    ) -> None:
        self.block_size = config.block_size
        self.num_kv_blocks = config.num_kv_blocks or 64
        self.slots: list[tuple[int, int] | None] = [None] * (self.num_kv_blocks * self.block_size)
        self.vocab_size = model.vocab_size
        self.next_token = next_token or (
            lambda ctx, seq: hashed_next_token(ctx, seq.params.seed, self.vocab_size, model.first_free_id)
        )
        self.batches: list[list[tuple[int, int, int]]] = []  # per step: (seq_id, start, num_new_tokens)
        self.released: list[int] = []
        self.fail_after: int | None = None  # raise on this step number (engine death tests)

    def execute(self, batch: ScheduledBatch, after: FakeStep | None = None) -> FakeStep:
        """Like ``ModelRunner.execute``; with ``after``, each sequence decodes the position after its
        last known token, whose id ``after`` sampled."""
        if self.fail_after is not None and len(self.batches) >= self.fail_after:
            raise RuntimeError("simulated device failure")
        bs = self.block_size
        ahead = after is not None
        in_flight = {} if after is None else {s.seq_id: r.token_id for s, r in zip(after.batch.seqs, after.results())}
        self.batches.append(
            [(s.seq_id, s.num_computed_tokens + ahead, n) for s, n in zip(batch.seqs, batch.num_new_tokens)]
        )
        out: list[FakeSample | None] = []
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            tokens = seq.token_ids + ([in_flight[seq.seq_id]] if ahead else [])
            start = seq.num_computed_tokens + ahead
            end = start + n
            needed = -(-end // bs)
            held = len(seq.block_table)  # ahead, the scheduler may have allocated the next block already
            assert held == needed or (ahead and held > needed), f"{seq!r} holds {held} blocks, needs {needed}"
            for pos in range(start, end):
                self.slots[seq.slot(pos, bs)] = (pos, tokens[pos])
            if end < len(tokens):
                out.append(None)
                continue
            context = []
            for pos in range(end):
                entry = self.slots[seq.slot(pos, bs)]
                assert entry is not None and entry[0] == pos, f"slot for position {pos} of {seq!r} holds {entry}"
                context.append(entry[1])
            out.append(FakeSample(self.next_token(context, seq)))
        return FakeStep(batch, out)

    def release(self, seq_ids: list[int]) -> None:
        self.released.extend(seq_ids)


def fake_model(tokenizer: Any | None = None, *, max_model_len: int = 512) -> SimpleNamespace:
    tok = tokenizer or byte_level_tokenizer()
    specials = [tok.convert_tokens_to_ids(t) for t in tok.all_special_tokens]
    return SimpleNamespace(
        hf_config=None,
        tokenizer=tok,
        eos_token_ids=frozenset({tok.eos_token_id}),
        max_model_len=max_model_len,
        vocab_size=len(tok),
        chat_template=tok.chat_template,
        name="fake",
        first_free_id=max(specials) + 1,
    )  # the hashed model never emits special tokens by accident


def make_engine(
    *,
    model: SimpleNamespace | None = None,
    next_token: Callable[[list[int], Sequence], int] | None = None,
    **config: Any,
) -> LLMEngine:
    config.setdefault("num_kv_blocks", 64)
    config.setdefault("block_size", 16)  # the tests count cached tokens in 16-token blocks
    cfg = EngineConfig(**config)
    return LLMEngine(
        cfg, model=model or fake_model(), runner_factory=lambda c, m: FakeRunner(c, m, next_token=next_token)
    )


def oracle(engine: LLMEngine, prompt_ids: list[int], num_tokens: int, seed: int | None = None) -> list[int]:
    """What the hashed model generates for a prompt, computed without any cache."""
    ctx = list(prompt_ids)
    model = engine.model
    for _ in range(num_tokens):
        ctx.append(hashed_next_token(ctx, seed, model.vocab_size, model.first_free_id))
    return ctx[len(prompt_ids) :]
