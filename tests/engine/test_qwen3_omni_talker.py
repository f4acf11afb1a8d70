"""Qwen3-Omni's talker on the paged engine, with its code predictor per frame, against transformers' whole
``generate`` (thinker, then talker) on a tiny random checkpoint: the same greedy frames, codebook by codebook.
Sampled, a seeded utterance speaks the same frames whatever else shares its batches."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.llm_engine import LLMEngine
from omni_gateway.engine.core.sequence import EmbedSpan
from omni_gateway.engine.errors import ModelLoadError
from omni_gateway.engine.models.qwen3_omni_code_predictor import FrameSampling
from omni_gateway.engine.runner.input_stream import InputStream
from omni_gateway.engine.sampling_params import SamplingParams
from omni_gateway.omni.qwen3_talker import Qwen3Talker, SpokenFrames

from tests.harness.audio_checkpoints import token_id
from tests.harness.tiny_qwen3_omni import CODE_GROUPS, HIDDEN, IM_END, TTS_BOS, TTS_EOS, TTS_PAD, chat_ids

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MAX_FRAMES = 24
REPLY_TOKENS = 6
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_FRAMES, return_hidden_states=True)
# The tiny checkpoint's heads are peaked (greedy speech varies); hotter, its codes spread over the codebook.
SAMPLED = SamplingParams(temperature=2.0, max_tokens=MAX_FRAMES, return_hidden_states=True)
SPREAD = FrameSampling(temperature=4.0, top_k=0, top_p=1.0)


@pytest.fixture(scope="module")
def tiny_dir(qwen3_omni_speech: tuple[Path, Any]) -> Path:
    return qwen3_omni_speech[0]


@pytest.fixture(scope="module")
def hf(qwen3_omni_speech: tuple[Path, Any]) -> Any:
    return qwen3_omni_speech[1]


@pytest.fixture(scope="module")
def talker(tiny_dir: Path) -> Qwen3Talker:
    return Qwen3Talker.load(tiny_dir)


@pytest.fixture(scope="module")
def engine(talker: Qwen3Talker) -> LLMEngine:
    return LLMEngine(EngineConfig(device="cpu", attention_backend="torch", dtype="float32"), model=talker.loaded)


@dataclass
class Reference:
    """What transformers' generate produced for one prompt: the thinker's states and the talker's frames."""

    ids: list[int]
    embeds: torch.Tensor  # the prompt's input embeddings [P, D]
    hidden: torch.Tensor  # the prompt's hidden states after layer accept_hidden_layer [P, D]
    reply: torch.Tensor  # input embeddings of the reply tokens the thinker fed back [R, D]
    tts: torch.Tensor  # input embeddings of tts_bos, tts_eos, tts_pad [3, D]
    frames: list[list[int]]


def reference(hf: Any, user: list[int], voice: str, monkeypatch: pytest.MonkeyPatch) -> Reference:
    seen: dict[str, Any] = {}
    thinker_generate, decode = hf.thinker.generate, hf.code2wav.chunked_decode

    def keep_thinker(*args: Any, **kwargs: Any) -> Any:
        seen["thinker"] = out = thinker_generate(*args, **kwargs)
        return out

    def keep_codes(codes: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        seen["codes"] = codes
        return decode(codes, **kwargs)

    ids = chat_ids(user)
    with monkeypatch.context() as patch:
        # Newer transformers mirror talker_do_sample onto the code predictor; older ones sample its codes unless told.
        patch.setattr(hf.talker.code_predictor.generation_config, "do_sample", False)
        patch.setattr(hf.thinker, "generate", keep_thinker)
        patch.setattr(hf.code2wav, "chunked_decode", keep_codes)
        hf.generate(
            input_ids=torch.tensor([ids]),
            speaker=voice,
            thinker_max_new_tokens=REPLY_TOKENS,
            thinker_eos_token_id=IM_END,
            thinker_do_sample=False,
            talker_do_sample=False,
            talker_repetition_penalty=1.0,
            talker_max_new_tokens=MAX_FRAMES + 1,
        )
    states = seen["thinker"].hidden_states  # per forward: (embeddings, layer 1 output, ...)
    layer = hf.config.talker_config.accept_hidden_layer
    with torch.no_grad():
        tts = hf.thinker.get_input_embeddings()(torch.tensor([TTS_BOS, TTS_EOS, TTS_PAD]))
    return Reference(
        ids=ids,
        embeds=states[0][0][0],
        hidden=states[0][layer][0],
        reply=torch.cat([step[0][0] for step in states[1:]]),
        tts=tts,
        frames=seen["codes"][0].T.tolist(),
    )


def start(
    engine: LLMEngine,
    talker: Qwen3Talker,
    ref: Reference,
    voice: str,
    rid: str,
    params: SamplingParams = GREEDY,
) -> SpokenFrames:
    ids, rows = talker.inputs.prompt(ref.ids, ref.embeds, ref.hidden, ref.reply[0], ref.tts, voice)
    text = talker.inputs.text_rows(torch.cat((ref.reply[1:], ref.tts)))
    frames = SpokenFrames(InputStream(start=len(ids)), tts_eos=text[-2], tts_pad=text[-1], seed=params.seed)
    engine.add_request(
        rid,
        ids,
        params,
        embed_spans=[EmbedSpan(offset=0, length=len(ids), key=rid, embeds=rows)],
        input_stream=frames.stream,
    )
    frames.add_text(text[:-3])
    frames.end_text()
    return frames


def run(
    engine: LLMEngine,
    talker: Qwen3Talker,
    utterances: dict[str, SpokenFrames],
    sampling: FrameSampling = FrameSampling(),
) -> int:
    """Step the engine to the end, feeding every step's frames through the code predictor; the largest batch."""
    feeder, widest = talker.feeder(), 0
    while engine.has_unfinished():
        work = []
        for delta in engine.step():
            if delta.token_ids:
                work.append((utterances[delta.request_id], delta.hidden_states[-1], delta.token_ids[-1]))
        widest = max(widest, len(work))
        feeder.step(work, sampling)
    return widest


def test_frames_equal_transformers(
    hf: Any, talker: Qwen3Talker, engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = reference(hf, [30, 31, 32, 33], "Ethan", monkeypatch)
    assert len(ref.frames) >= 8 and len({tuple(f) for f in ref.frames}) > 4, ref.frames  # varied speech
    assert all(len(f) == CODE_GROUPS for f in ref.frames)
    frames = start(engine, talker, ref, "Ethan", "one")
    run(engine, talker, {"one": frames})
    assert frames.frames[: len(ref.frames)] == ref.frames
    assert engine.scheduler.kv.usage().num_used_blocks == 0


def test_utterances_batch_through_the_code_predictor(
    hf: Any, talker: Qwen3Talker, engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    refs = {
        "a": (reference(hf, [40, 41, 42], "chelsie", monkeypatch), "chelsie"),
        "b": (reference(hf, [50, 51, 52, 53, 54], "ethan", monkeypatch), "ethan"),
    }
    assert refs["a"][0].frames != refs["b"][0].frames
    utterances = {rid: start(engine, talker, ref, voice, rid) for rid, (ref, voice) in refs.items()}
    assert run(engine, talker, utterances) == 2  # both utterances' frames went through one predictor call
    for rid, (ref, _) in refs.items():
        assert utterances[rid].frames[: len(ref.frames)] == ref.frames


def test_a_seeded_utterance_speaks_the_same_frames_beside_any_other(
    hf: Any, talker: Qwen3Talker, engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The talker's draws and the code predictor's come from the request's seed and their step alone."""
    refs = {
        "a": (reference(hf, [40, 41, 42], "chelsie", monkeypatch), "chelsie"),
        "b": (reference(hf, [50, 51, 52, 53, 54], "ethan", monkeypatch), "ethan"),
    }
    calls = iter(range(100))

    def speak(seeds: dict[str, int | None]) -> dict[str, list[list[int]]]:
        n = next(calls)
        utterances = {
            rid: start(engine, talker, refs[rid][0], refs[rid][1], f"{rid}{n}", replace(SAMPLED, seed=seed))
            for rid, seed in seeds.items()
        }
        widest = run(engine, talker, {f"{rid}{n}": u for rid, u in utterances.items()}, SPREAD)
        assert widest == len(seeds)
        return {rid: u.frames for rid, u in utterances.items()}

    alone = speak({"a": 5})["a"]
    assert len(alone) >= 8 and len({tuple(f) for f in alone}) > 4, alone
    assert speak({"a": 5})["a"] == alone
    assert speak({"a": 5, "b": None})["a"] == alone
    assert speak({"b": 6, "a": 5})["a"] == alone
    assert speak({"a": 6})["a"] != alone
    assert speak({"a": None})["a"] != speak({"a": None})["a"]  # unseeded: fresh draws each time


def test_a_seeded_row_draws_its_codes_from_its_seed_and_frame_alone(talker: Qwen3Talker) -> None:
    g, width = torch.Generator().manual_seed(3), talker.predictor.config.hidden_size
    hidden, first = torch.randn(16, width, generator=g), torch.randint(0, 32, (16,), generator=g)

    def codes(rows: list[int], seeds: list[tuple[int, int] | None]) -> list[tuple[int, ...]]:
        return [tuple(c) for c in talker.predictor.predict(hidden[rows], first[rows], SPREAD, seeds)[0].tolist()]

    (alone,) = codes([0], [(7, 2)])
    assert codes([0, 1, 2], [(7, 2), None, (8, 2)])[0] == alone
    assert codes([2, 1, 0], [(9, 2), (8, 2), (7, 2)])[2] == alone
    same_input = [0] * 16
    by_seed = codes(same_input, [(seed, 2) for seed in range(16)])
    assert codes(same_input, [(seed, 2) for seed in range(16)]) == by_seed
    assert len(set(by_seed)) > 8  # another seed, other codes
    assert len(set(codes(same_input, [(7, frame) for frame in range(16)]))) > 8  # another frame too
    assert len(set(codes(same_input, [None] * 16))) > 8  # unseeded rows draw apart
    assert codes(list(range(16)), []) != codes(list(range(16)), [])
    greedy = talker.predictor.predict(hidden, first)[0]
    assert torch.equal(talker.predictor.predict(hidden, first, seeds=[(7, 2)] * 16)[0], greedy)


def test_unknown_voice_lists_the_known_ones(talker: Qwen3Talker) -> None:
    with pytest.raises(ValueError, match=r"unknown voice 'Nobody'.*chelsie, ethan"):
        talker.inputs.tokens.speaker("Nobody")


def test_load_rejects_a_checkpoint_without_a_qwen3_talker(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}')
    with pytest.raises(ModelLoadError, match="no Qwen3-Omni talker_config"):
        Qwen3Talker.load(tmp_path)


def test_text_arriving_late_makes_the_talker_wait(
    hf: Any, talker: Qwen3Talker, engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = reference(hf, [60, 61, 62], "ethan", monkeypatch)
    ids, rows = talker.inputs.prompt(ref.ids, ref.embeds, ref.hidden, ref.reply[0], ref.tts, "ethan")
    text = talker.inputs.text_rows(torch.cat((ref.reply[1:], ref.tts)))
    frames = SpokenFrames(InputStream(start=len(ids)), tts_eos=text[-2], tts_pad=text[-1])
    engine.add_request(
        "late",
        ids,
        GREEDY,
        embed_spans=[EmbedSpan(offset=0, length=len(ids), key="late", embeds=rows)],
        input_stream=frames.stream,
    )
    later, feeder, waits = list(text[:-3]), talker.feeder(), 0
    while engine.has_unfinished():
        deltas = engine.step()
        if not deltas and engine.waits_for_input():
            waits += 1  # the talker caught up with the thinker's text: hand it the next row
            if later:
                frames.add_text([later.pop(0)])
            else:
                frames.end_text()
        feeder.step([(frames, d.hidden_states[-1], d.token_ids[-1]) for d in deltas if d.token_ids])
    assert waits == len(text) - 3 + 1  # once per text row and once for the text's end
    assert frames.frames[: len(ref.frames)] == ref.frames


def test_interleaved_rotary_positions_equal_transformers(hf: Any, engine: LLMEngine) -> None:
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeTalkerRotaryEmbedding

    rotary = Qwen3OmniMoeTalkerRotaryEmbedding(hf.config.talker_config.text_config)
    positions = torch.randint(0, 100, (3, 12), generator=torch.Generator().manual_seed(0))
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions[:, None, :])
    table = engine.runner.model.mrope_table(positions)
    half = table.shape[1] // 2
    assert not torch.equal(positions[0], positions[1])
    torch.testing.assert_close(table[:, :half], cos[0, :, :half])
    torch.testing.assert_close(table[:, half:], sin[0, :, :half])


def test_moe_blocks_equal_transformers(hf: Any, engine: LLMEngine) -> None:
    """Each talker layer's experts and gated shared expert, on the same input: top-k weights not renormalized
    (the talker's ``norm_topk_prob`` is off)."""
    width = hf.config.talker_config.text_config.hidden_size
    x = torch.randn(9, width, generator=torch.Generator().manual_seed(2))
    assert not hf.config.talker_config.text_config.norm_topk_prob
    for layer, block in zip(hf.talker.model.layers, engine.runner.model.layers):
        assert block.moe is not None and block.moe.shared is not None
        assert float(layer.mlp.experts.down_proj.abs().max()) > 0  # routed experts that add something
        with torch.no_grad():
            want = layer.mlp(x[None])[0]
        torch.testing.assert_close(block.moe(x), want, rtol=1e-5, atol=1e-7)


def test_media_positions_are_heard_through_the_hidden_projection(hf: Any, talker: Qwen3Talker) -> None:
    audio = token_id("<|AUDIO|>")
    ids = chat_ids([30, audio, audio, audio, 31])
    g = torch.Generator().manual_seed(1)
    embeds, hidden = torch.randn(len(ids), HIDDEN, generator=g), torch.randn(len(ids), HIDDEN, generator=g)
    tts = torch.randn(3, HIDDEN, generator=g)
    _, rows = talker.inputs.prompt(ids, embeds, hidden, torch.randn(HIDDEN, generator=g), tts, "ethan")
    users = [i for i, t in enumerate(ids) if i >= 7 and i < len(ids) - 3]  # the user turn, through its newline
    mask = torch.tensor([[t == audio for t in ids]])
    with torch.no_grad():
        want = hf._get_talker_user_parts(users[0], users[-1] + 1, mask, hidden[None], embeds[None])[0]
    torch.testing.assert_close(rows[: len(users)], want)


def test_load_reads_a_sharded_checkpoint(hf: Any, talker: Qwen3Talker, tmp_path: Path) -> None:
    hf.save_pretrained(tmp_path, max_shard_size="200KB")
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    sharded = Qwen3Talker.load(tmp_path)
    assert sharded.loaded.weights.keys() == talker.loaded.weights.keys()
    assert all(torch.equal(sharded.loaded.weights[n], t) for n, t in talker.loaded.weights.items())
    assert not any(n.startswith(("thinker", "code2wav")) for n in sharded.loaded.weights)


def test_load_names_a_missing_code_predictor_tensor(hf: Any, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    hf.save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["talker.code_predictor.lm_head.1.weight"]
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"lacks the talker tensor talker\.code_predictor\.lm_head\.1\.weight"):
        Qwen3Talker.load(tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_frames_on_cuda_equal_transformers(hf: Any, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused Triton MoE and the decode graphs (which stage the input rows) give transformers' frames."""
    talker = Qwen3Talker.load(tiny_dir, device="cuda")
    engine = LLMEngine(EngineConfig(device="cuda", dtype="float32"), model=talker.loaded)
    ref = reference(hf, [30, 31, 32, 33], "Ethan", monkeypatch)
    frames = start(engine, talker, ref, "Ethan", "cuda")
    run(engine, talker, {"cuda": frames})
    assert frames.frames[: len(ref.frames)] == ref.frames
