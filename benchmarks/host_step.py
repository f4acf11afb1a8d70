"""Host time of one engine step: the scheduler, sampling bookkeeping, detokenization and stream
deltas around a runner that answers at once, so what is timed is what the device waits for
between two decode steps at batch 1 (and what a batch adds per sequence).

    python -m benchmarks.host_step [--batch 1,8,64] [--tokens 2000] [--out FILE]

The same run times streaming detokenization through the transformers tokenizer wrapper (the
baseline) and through the Rust tokenizer directly (the engine's path), and prints the ratio.
The tokenizer is a byte-level BPE trained on a small corpus (the tests' tokenizer), so token ids
map to real text of a few bytes each (``tests.harness.checkpoints.byte_level_tokenizer``).

Then the block-table packing of a graphed decode step (``GraphedDecode.run``, minus the device
copy): every sequence's table into one int32 host buffer, converted from its Python list on every
step (the baseline) or from the rows ``BlockTableRows`` keeps, and prints the ratio. Raw results go to
``benchmarks/results/host_step.jsonl``.
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.llm_engine import LLMEngine
from omni_gateway.engine.runner.block_table_rows import BlockTableRows
from omni_gateway.engine.runner.pending_decode import PendingDecode
from omni_gateway.engine.runner.sampler import SampleResult
from omni_gateway.engine.sampling_params import SamplingParams

from benchmarks.lib.common import ResultLog, add_out_argument
from tests.harness.checkpoints import byte_level_tokenizer


class InstantRunner:
    """Samples a fixed cycle of ordinary tokens without touching a model."""

    num_kv_blocks = 1 << 16
    device = SimpleNamespace(type="cpu")  # the engine reads only the type: no pipelined steps on the CPU

    def __init__(self, config: EngineConfig, model: Any) -> None:
        self._cycle = [t for t in range(2, model.vocab_size)]
        self._i = 0

    def execute(self, batch: Any, after: Any = None) -> PendingDecode:
        out = []
        for _ in batch.seqs:
            self._i = (self._i + 1) % len(self._cycle)
            out.append(SampleResult(self._cycle[self._i], None))
        return PendingDecode.resolved_with(batch, out)

    def release(self, seq_ids: list[int]) -> None:
        pass


def overriding_decode(tok: Any) -> Any:
    """``tok`` as a tokenizer that overrides decoding (here only forwarding it, one Python call more): the
    engine decodes it through the transformers wrapper, as every tokenizer was before the direct Rust decode
    (``detokenizer.direct_decoder`` bypasses the wrapper only where it adds nothing)."""
    from transformers import PreTrainedTokenizerFast

    class OverridingDecode(PreTrainedTokenizerFast):
        def decode(self, *args: Any, **kwargs: Any) -> Any:
            return super().decode(*args, **kwargs)

    return OverridingDecode(tokenizer_object=tok.backend_tokenizer, eos_token=tok.eos_token, bos_token=tok.bos_token)


def us_per_step(batch: int, tokens: int, *, through_wrapper: bool = False) -> float:
    tok = byte_level_tokenizer()
    if through_wrapper:
        tok = overriding_decode(tok)
    model = SimpleNamespace(tokenizer=tok, eos_token_ids=[tok.eos_token_id], vocab_size=len(tok), max_model_len=8192)
    engine = LLMEngine(
        EngineConfig(device="cpu", block_size=16, max_num_seqs=max(batch, 1)), model=model, runner_factory=InstantRunner
    )
    prompt = tok.encode("The end of the story is near. User: hi. Assistant: hello there.") * 16
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)

    def run() -> int:
        for i in range(batch):
            engine.add_request(f"r{i}", list(prompt), params)
        steps = 0
        while engine.has_unfinished():
            engine.step()
            steps += 1
        engine.pop_finished()
        return steps

    run()  # warm-up: imports, caches
    start = time.perf_counter()
    steps = run()
    return (time.perf_counter() - start) / steps * 1e6


def pack_ms(batch: int, blocks: int, steps: int = 64, cached: bool = True) -> float:
    """Milliseconds per step to pack ``batch`` block tables of ``blocks`` entries (one token per
    sequence per step, so a table gains a block every 16 steps)."""
    tables = np.zeros((batch, 2 * blocks), dtype=np.int32)
    seqs = [
        SimpleNamespace(
            seq_id=i, block_table=list(range(i * 4 * blocks, i * 4 * blocks + blocks)), block_table_version=0
        )
        for i in range(batch)
    ]
    rows = BlockTableRows()
    start = time.perf_counter()
    for step in range(steps):
        for i, seq in enumerate(seqs):
            if step % 16 == i % 16:
                seq.block_table.append(seq.block_table[-1] + 1)
            table = seq.block_table
            tables[i, : len(table)] = rows.row(seq) if cached else table
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", default="1,8,64", help="comma list of concurrent requests")
    parser.add_argument("--tokens", type=int, default=2000, help="output tokens per request")
    parser.add_argument(
        "--pack", default="16x128,256x128,256x1024", help="comma list of BATCHxBLOCKS block-table packing cases"
    )
    add_out_argument(parser, "host_step")
    args = parser.parse_args()
    log = ResultLog(args.out, "host_step", tokens=args.tokens)
    for batch in [int(b) for b in args.batch.split(",")]:
        ours = us_per_step(batch, args.tokens)
        wrapper = us_per_step(batch, args.tokens, through_wrapper=True)
        print(
            f"batch {batch:>3}: {ours:7.1f} us per step ({ours / batch:5.1f} per sequence); "
            f"through the tokenizer wrapper {wrapper:7.1f} us -> {wrapper / ours:.2f}x",
            flush=True,
        )
        log.write(
            "step",
            batch=batch,
            us_per_step=ours,
            us_per_sequence=ours / batch,
            wrapper_us_per_step=wrapper,
            ratio=wrapper / ours,
        )
    for case in args.pack.split(","):
        batch, blocks = (int(x) for x in case.split("x"))
        cached, lists = pack_ms(batch, blocks), pack_ms(batch, blocks, cached=False)
        print(
            f"pack {batch:>3} tables x {blocks:>4} blocks: {cached:6.3f} ms per step from cached rows, "
            f"{lists:6.3f} ms from the lists -> {lists / cached:.1f}x",
            flush=True,
        )
        log.write("pack", tables=batch, blocks=blocks, cached_ms=cached, lists_ms=lists, ratio=lists / cached)
    log.close()


if __name__ == "__main__":
    main()
