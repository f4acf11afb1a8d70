"""The EAGLE-3 proposer over a tiny 4-layer Llama target on the CPU: the published checkpoint layout loaded and
checked, the head's forward against a plain re-statement of its math, the target's hidden states handed over at
the right positions, greedy output as without speculation, KV blocks all returned, and drafts accepted from a
head built to predict what the target predicts."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from omni_gateway.engine import LLM, SamplingParams
from omni_gateway.engine.errors import ModelLoadError
from omni_gateway.engine.models.eagle3 import Eagle3Config, Eagle3Head, read_eagle3_weights
from omni_gateway.engine.spec.eagle3 import Eagle3Proposer, aux_layers_of, default_aux_layer_ids
from omni_gateway.engine.spec.proposer import AuxHidden, ProposalRequest

from tests.harness.checkpoints import VOCAB
from tests.harness.tiny_eagle3 import (
    HIDDEN,
    TARGET_LAYERS,
    eagle3_config,
    random_eagle3_weights,
    save_eagle3,
    save_tiny_eagle3,
    save_tiny_target,
)

NEW_TOKENS = 20


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("eagle3-target")
    save_tiny_target(path)
    return path


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random head over a draft vocabulary of every other target token (d2t offsets)."""
    return save_tiny_eagle3(tmp_path_factory.mktemp("eagle3-head"), draft_vocab=VOCAB // 2)


def prompts() -> list[list[int]]:
    shared = [3 + (i * 11) % 300 for i in range(20)]
    return [
        shared + [5, 6, 7, 5, 6, 7],
        shared + [9],
        [7, 8, 9, 10, 7, 8, 9, 10],
        [40, 41],
        [100 + i for i in range(30)],
    ]


def greedy(max_tokens: int = NEW_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def build(target: Path, head: Path | None, **kw: Any) -> LLM:
    spec = {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3} if head else None
    return LLM(model=str(target), device="cpu", dtype="float32", max_model_len=128, speculative_config=spec, **kw)


@pytest.fixture(scope="module")
def reference(target: Path) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in build(target, None).generate(prompts(), greedy())]


# ---- loading ----------------------------------------------------------------------------------------------


def test_the_published_layout_loads_with_vllms_default_layers(head_dir: Path, target: Path) -> None:
    config = Eagle3Config.read(head_dir)
    assert (config.draft_vocab_size, config.vocab_size, config.target_hidden_size) == (VOCAB // 2, VOCAB, HIDDEN)
    weights = read_eagle3_weights(head_dir)
    assert "embed_tokens.weight" not in weights and "t2d" in weights
    head = Eagle3Head(
        config,
        weights,
        device=torch.device("cpu"),
        dtype=torch.float32,
        max_positions=64,
        shared_embedding=lambda ids: torch.zeros(len(ids), HIDDEN),
    )
    assert head.target_ids(torch.tensor([0, 1, 5])).tolist() == [0, 2, 10]  # d + d2t[d]
    assert default_aux_layer_ids(TARGET_LAYERS) == (2, 2, 1)
    llm = build(target, head_dir)
    # vLLM's ids name the residual stream entering a layer: the output of the layer before.
    assert llm.engine.speculator.proposer.aux_hidden_layers == (1, 1, 0)


def test_the_checkpoints_layer_ids_win(tmp_path: Path, target: Path) -> None:
    config = eagle3_config(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2, 3]})
    save_eagle3(tmp_path, config, random_eagle3_weights(config))
    assert build(target, tmp_path).engine.speculator.proposer.aux_hidden_layers == (0, 1, 2)
    with pytest.raises(ModelLoadError, match=r"among 1\.\.3, got \[0, 2, 3\]"):
        aux_layers_of([0, 2, 3], TARGET_LAYERS)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda w: w.pop("midlayer.hidden_norm.weight"),
            r"lacks 'midlayer.hidden_norm.weight' \(expected shape \[64\]\)",
        ),
        (
            lambda w: w.update({"midlayer.self_attn.q_proj.weight": torch.zeros(64, 64)}),
            r"'midlayer.self_attn.q_proj.weight' has shape \[64, 64\], expected \[64, 128\]",
        ),
        (
            lambda w: w.update({"fc.weight": torch.zeros(64, 64)}),
            r"'fc.weight' has shape \[64, 64\], expected \[64, 192\]",
        ),
        (lambda w: w.pop("d2t"), r"lacks 'd2t'"),
    ],
    ids=["missing-norm", "qkv-not-2x", "fc-not-3x", "no-d2t-for-small-vocab"],
)
def test_a_malformed_checkpoint_names_the_tensor(tmp_path: Path, target: Path, edit: Any, message: str) -> None:
    config = eagle3_config(VOCAB // 2)
    weights = random_eagle3_weights(config)
    edit(weights)
    save_eagle3(tmp_path, config, weights)
    with pytest.raises(ModelLoadError, match=message):
        build(target, tmp_path)


def test_a_head_for_another_target_width_is_refused(tmp_path: Path, target: Path) -> None:
    config = eagle3_config(target_hidden_size=32)
    save_eagle3(tmp_path, config, random_eagle3_weights(config))
    with pytest.raises(ModelLoadError, match="hidden states of 32 features; the target's are 64"):
        build(target, tmp_path)


# ---- the head's math ----------------------------------------------------------------------------------------


def restated_head(
    w: dict[str, torch.Tensor], tokens: torch.Tensor, fused: torch.Tensor, embed: torch.Tensor
) -> torch.Tensor:
    """Draft logits over the target vocabulary at positions 0..n-1, straight from the weights: one causal
    Llama layer over cat(norm(embed(token)), norm(hidden)), the hidden row as residual, then norm and lm_head
    scattered through d2t (other target ids -inf)."""
    eps, heads, kv_heads, hd = 1e-6, 4, 2, HIDDEN // 4

    def rms(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * g

    n = len(tokens)
    x = torch.cat(
        [rms(embed[tokens], w["midlayer.input_layernorm.weight"]), rms(fused, w["midlayer.hidden_norm.weight"])], -1
    )
    q = (x @ w["midlayer.self_attn.q_proj.weight"].T).view(n, heads, hd)
    k = (x @ w["midlayer.self_attn.k_proj.weight"].T).view(n, kv_heads, hd)
    v = (x @ w["midlayer.self_attn.v_proj.weight"].T).view(n, kv_heads, hd)
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
    angles = torch.arange(n).float()[:, None] * inv[None, :]
    cos, sin = torch.cat([angles.cos()] * 2, -1)[:, None], torch.cat([angles.sin()] * 2, -1)[:, None]

    def rope(t: torch.Tensor) -> torch.Tensor:
        half = torch.cat([-t[..., hd // 2 :], t[..., : hd // 2]], -1)
        return t * cos + half * sin

    q, k = rope(q), rope(k)
    out = torch.empty(n, heads, hd)
    for h in range(heads):
        kh = h // (heads // kv_heads)
        scores = q[:, h] @ k[:, kh].T / hd**0.5
        scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
        out[:, h] = scores.softmax(-1) @ v[:, kh]
    h1 = out.reshape(n, -1) @ w["midlayer.self_attn.o_proj.weight"].T + fused
    y = rms(h1, w["midlayer.post_attention_layernorm.weight"])
    mlp = torch.nn.functional.silu(y @ w["midlayer.mlp.gate_proj.weight"].T) * (y @ w["midlayer.mlp.up_proj.weight"].T)
    draft_logits = rms(mlp @ w["midlayer.mlp.down_proj.weight"].T + h1, w["norm.weight"]) @ w["lm_head.weight"].T
    full = torch.full((n, VOCAB), float("-inf"))
    full[:, torch.arange(w["lm_head.weight"].shape[0]) + w["d2t"]] = draft_logits
    return full


def test_the_heads_forward_is_the_published_math(head_dir: Path) -> None:
    config, weights = Eagle3Config.read(head_dir), read_eagle3_weights(head_dir)
    embed = torch.randn(VOCAB, HIDDEN)
    head = Eagle3Head(
        config,
        weights,
        device=torch.device("cpu"),
        dtype=torch.float32,
        max_positions=64,
        shared_embedding=lambda ids: embed[ids],
    )
    aux = torch.randn(7, 3, HIDDEN)
    tokens = torch.randint(0, VOCAB, (7,))
    cache = head.new_cache()
    # In two calls, the second attending over the first's cached K/V.
    a, _ = head.forward(tokens[:4], head.combine(aux[:4]), 0, cache)
    b, _ = head.forward(tokens[4:], head.combine(aux[4:]), 4, cache)
    fused = aux.reshape(7, -1) @ weights["fc.weight"].T
    want = restated_head(weights, tokens, fused, embed)
    got_ids = head.target_ids(torch.cat([a, b]).argmax(-1))
    assert torch.equal(got_ids, want.argmax(-1))
    mapped = torch.full((7, VOCAB), float("-inf"))
    mapped[:, head.draft_to_target] = torch.cat([a, b])
    torch.testing.assert_close(mapped, want, rtol=1e-4, atol=1e-4)


def test_a_batch_of_sequences_gets_the_drafts_each_gets_alone(head_dir: Path) -> None:
    """Sequences of different lengths and draft counts in one batched head forward per round, over two
    requests (the second after some drafts were kept and one was replaced): the drafts each gets alone."""
    config, weights = Eagle3Config.read(head_dir), read_eagle3_weights(head_dir)
    embed = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(5))
    head = Eagle3Head(
        config,
        weights,
        device=torch.device("cpu"),
        dtype=torch.float32,
        max_positions=64,
        shared_embedding=lambda ids: embed[ids],
    )
    gen = torch.Generator().manual_seed(11)
    lengths, asked = [5, 9, 2, 14], [1, 3, 4, 2]
    tokens = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in lengths]
    rows = [torch.randn(40, 3, HIDDEN, generator=gen) for _ in lengths]

    def requests(seen: list[int]) -> list[ProposalRequest]:
        return [
            ProposalRequest(i, t, k, AuxHidden(s, r[s : len(t) - 1]))
            for i, (t, k, r, s) in enumerate(zip(tokens, asked, rows, seen))
        ]

    batched = Eagle3Proposer(head, (0, 1, 2), VOCAB)
    alone = [Eagle3Proposer(head, (0, 1, 2), VOCAB) for _ in lengths]
    for round_ in range(2):
        seen = [0] * len(lengths) if round_ == 0 else [n - 3 for n in lengths]  # the rows since the first request
        reqs = requests(seen)
        together = [p.token_ids for p in batched.propose(reqs)]
        each = [alone[i].propose([req])[0].token_ids for i, req in enumerate(reqs)]
        assert together == each
        assert [len(d) for d in together] == asked, round_
        # Keep the first draft of each, then a token of the target's own (so later entries are dropped).
        lengths = [n + 2 for n in lengths]
        tokens = [t + [d[0], (d[0] + 1) % VOCAB] for t, d in zip(tokens, together)]


# ---- in the engine ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "engine_args",
    [{}, {"num_kv_blocks": 20, "max_num_batched_tokens": 24}, {"enable_prefix_caching": False, "max_num_seqs": 2}],
    ids=["roomy", "tight", "no-prefix-cache"],
)
def test_greedy_output_is_that_of_decoding_without_drafts(
    target: Path, head_dir: Path, reference: list[list[int]], engine_args: dict[str, Any]
) -> None:
    llm = build(target, head_dir, **engine_args)
    free = llm.engine.scheduler.kv.num_free_blocks
    assert [o.outputs[0].token_ids for o in llm.generate(prompts(), greedy())] == reference
    stats = llm.engine.stats()
    assert stats["spec_draft_tokens"] > stats["spec_accepted_tokens"]  # a random head: most drafts rejected
    assert llm.engine.scheduler.kv.num_free_blocks == free
    assert not llm.engine.speculator.proposer._states
    assert not llm.engine.runner.aux_hidden._rows


def test_rows_dropped_while_unproposed_leave_the_output_exact(
    target: Path, head_dir: Path, reference: list[list[int]]
) -> None:
    """A window of 4 rows and the policy at k=0 for 6 steps in 7: each sequence's kept rows stay bounded,
    the head re-syncs from the recent rows it gets, proposes again, and the output is unchanged."""
    llm = build(target, head_dir)
    store, speculator = llm.engine.runner.aux_hidden, llm.engine.speculator
    store.max_rows = 4
    steps = iter(range(10**6))
    speculator.policy = SimpleNamespace(
        choose_k=lambda num_running: 3 if next(steps) % 7 == 6 else 0, record=lambda proposed, accepted: None
    )
    most, record = [0], store.record

    def recording(batch: Any, rows: Any) -> None:
        record(batch, rows)
        most[0] = max([most[0]] + [store.num_rows(s.seq_id) for s in batch.seqs])

    store.record = recording
    firsts: list[int] = []
    propose = speculator.proposer.propose
    speculator.proposer.propose = lambda requests: (
        firsts.extend(r.aux_hidden.first_position for r in requests if r.aux_hidden is not None) or propose(requests)
    )
    assert [o.outputs[0].token_ids for o in llm.generate(prompts(), greedy())] == reference
    assert 0 < most[0] <= 8
    assert any(f > 0 for f in firsts)  # rows handed out past dropped ones
    assert speculator.num_drafts > 0


def test_the_target_rows_handed_over_are_hfs_at_each_accepted_position(target: Path, head_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    llm = build(target, head_dir)
    proposer = llm.engine.speculator.proposer
    seen: list[Any] = []
    propose = proposer.propose
    # The request's token_ids is a view fixed at the sequence's length then, though the sequence grows after.
    proposer.propose = lambda requests: (
        seen.extend((r.aux_hidden, len(r.token_ids)) for r in requests) or propose(requests)
    )
    prompt = prompts()[0]
    out = llm.generate([prompt], greedy())[0].outputs[0].token_ids
    hf = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    with torch.no_grad():
        states = hf(torch.tensor([prompt + out]), output_hidden_states=True).hidden_states
    # HF's hidden_states[j + 1] is the output of layer j (below the last, which HF norms).
    want = torch.stack([states[j + 1][0] for j in proposer.aux_hidden_layers], dim=1)
    covered = 0
    for aux, length in seen:
        assert aux is not None and aux.first_position == covered  # every position once, in order
        assert aux.first_position + aux.num_positions == length - 1
        torch.testing.assert_close(aux.rows, want[covered : covered + aux.num_positions], rtol=1e-4, atol=1e-4)
        covered += aux.num_positions
    assert len(seen) > 2


def save_bigram_target(directory: Path, perm: torch.Tensor) -> None:
    """A target whose layers add nothing (o and down projections zero), so every layer's output is the token's
    embedding, and whose greedy next token after ``x`` is ``g(x) = perm^-1(x)``: unit-norm embedding rows ``E``,
    ``lm_head[y] = E[perm[y]]``."""
    model = save_tiny_target(directory)
    state = model.state_dict()
    embed = torch.nn.functional.normalize(state["model.embed_tokens.weight"], dim=-1)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(embed)
        model.lm_head.weight.copy_(embed[perm])
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    model.save_pretrained(directory)


def test_a_head_that_predicts_the_target_gets_drafts_accepted(tmp_path: Path) -> None:
    """At position p the head reads the target's row of p (here the embedding of token p) and predicts token
    p + 2, which for a greedy output is g(g(x_p)): ``fc`` passes the first row through, the layer adds nothing,
    and ``lm_head[y] = E[perm[perm[y]]]``. Its further drafts repeat the first, so past a sequence's first
    request each step keeps its first draft only: one in k (the policy's k per step, 1..3)."""
    perm = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(3))
    save_bigram_target(tmp_path / "target", perm)
    embed = _embedding(tmp_path / "target")
    config = eagle3_config()
    weights = random_eagle3_weights(config)
    weights["fc.weight"] = torch.cat([torch.eye(HIDDEN), torch.zeros(HIDDEN, 2 * HIDDEN)], dim=1)
    weights["midlayer.self_attn.o_proj.weight"].zero_()
    weights["midlayer.mlp.down_proj.weight"].zero_()
    weights["norm.weight"] = torch.ones(HIDDEN)
    weights["lm_head.weight"] = embed[perm[perm]]
    save_eagle3(tmp_path / "head", config, weights)

    plain = build(tmp_path / "target", None).generate(prompts(), greedy())
    llm = build(tmp_path / "target", tmp_path / "head")
    got = llm.generate(prompts(), greedy())
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in plain]
    stats = llm.engine.stats()
    assert 0.3 * stats["spec_draft_tokens"] <= stats["spec_accepted_tokens"] < stats["spec_draft_tokens"]


def _embedding(directory: Path) -> torch.Tensor:
    from safetensors.torch import load_file

    return load_file(str(directory / "model.safetensors"))["model.embed_tokens.weight"]
