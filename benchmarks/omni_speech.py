"""Speech out of Qwen2.5-Omni: time to first audio and real-time factor, ours against transformers.

Random weights in Qwen2.5-Omni-7B's shapes (``--shapes 7b``; ``tiny`` is a smoke test that runs on a
CPU). One ``Qwen2_5OmniForConditionalGeneration`` is built on the device; transformers' own
``generate(return_audio=True)`` at concurrency 1 is the baseline (its audio arrives all at once, so
its first audio is its whole run). Ours shares the same weight tensors: the thinker's text model and
the talker each on a paged engine (``engine.models``), token2wav as the streaming head
(``omni.heads.token2wav``), driven by ``omni.speech.SpokenModel.speak`` at concurrency 1, 8 and 32
with no web stack. The thinker runs as the plain Qwen2 text model it is for text-only prompts.

Time to first audio: the request handed to the pipeline -> its first audio chunk. Real-time factor:
the request's wall time / the seconds of audio it returned (below 1 is faster than real time).

    python -m benchmarks.omni_speech                  # H200: 7B shapes, concurrency 1 8 32
    python -m benchmarks.omni_speech --shapes tiny --concurrency 1 2 --device cpu
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.analysis.speech_stages import BATCHES, CLOCK, STAGES, instrument, mark
from benchmarks.analysis.step_timeline import Timeline
from benchmarks.analysis.trace_streams import device_trace
from benchmarks.lib.common import ResultLog, add_out_argument, summary
from benchmarks.lib.spoken_turns import speak_timed, speech_times

SPEAKER = "Chelsie"


def omni_config(shapes: str) -> Any:
    from transformers import Qwen2_5OmniConfig

    if shapes == "tiny":
        from tests.harness.tiny_omni import tiny_omni_config

        return tiny_omni_config()
    mrope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]}
    return Qwen2_5OmniConfig(
        thinker_config={
            "text_config": dict(
                vocab_size=152064,
                hidden_size=3584,
                intermediate_size=18944,
                num_hidden_layers=28,
                num_attention_heads=28,
                num_key_value_heads=4,
                max_position_embeddings=32768,
                rope_parameters=mrope,
                tie_word_embeddings=False,
            ),
            # The released checkpoint's ids; some transformers versions read them without a default.
            "vision_start_token_id": 151652,
            "vision_end_token_id": 151653,
        },
        talker_config=dict(
            vocab_size=8448,
            embedding_size=3584,
            hidden_size=896,
            intermediate_size=18944,
            num_hidden_layers=24,
            num_attention_heads=12,
            num_key_value_heads=4,
            head_dim=128,
            max_position_embeddings=32768,
            rope_parameters=mrope,
        ),
    )  # token2wav: the config's defaults are the 7B's


class _WordTokenizer:
    """Random weights speak no language: every token reads as one short word."""

    chat_template = None

    def decode(self, ids: Any, **_: Any) -> str:
        return "".join(" w" for _ in ids)


def build(shapes: str, device: torch.device, max_seqs: int, eager: bool = False) -> tuple[Any, Any, Any]:
    """The HF model, our thinker engine and our SpokenModel, sharing the weights."""
    from omni_gateway.engine.config import EngineConfig
    from omni_gateway.engine.core.llm_engine import LLMEngine
    from omni_gateway.engine.frontend.async_engine import AsyncEngine
    from omni_gateway.engine.models.qwen2_5_omni_talker import TalkerTokens, talker_config, talker_weights
    from omni_gateway.engine.models.talker_checkpoint import CodecTokenizer
    from omni_gateway.engine.runner.loader import LoadedModel
    from omni_gateway.omni.heads.token2wav.head import Token2Wav
    from omni_gateway.omni.heads.token2wav.loader import Speaker, Token2WavModels
    from omni_gateway.omni.speech import SpokenModel
    from transformers import Qwen2_5OmniForConditionalGeneration

    from tests.harness.tiny_omni import thinker_as_qwen2, thinker_weights_as_qwen2

    config = omni_config(shapes)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with device:
        hf = Qwen2_5OmniForConditionalGeneration._from_config(config, dtype=dtype).eval()
    hf.token2wav.float()
    t2w_cfg = config.token2wav_config.dit_config
    cond = torch.randn(t2w_cfg.enc_emb_dim, device=device)
    ref_mel = torch.randn(1, 300, t2w_cfg.mel_dim, device=device)
    bos = int(config.talker_config.tts_text_start_token_id)
    hf.speaker_map = {SPEAKER: {"cond": cond, "ref_mel": ref_mel, "bos_token": bos}}

    state = hf.state_dict()
    text = config.thinker_config.text_config
    thinker_cfg = thinker_as_qwen2(
        text, rope_theta=float(text.rope_parameters.get("rope_theta", 1e6)), architectures=["Qwen2ForCausalLM"]
    )
    thinker_weights = thinker_weights_as_qwen2(state)
    max_len = 4096
    engine_kw: dict[str, Any] = dict(
        device=device.type, max_num_seqs=max_seqs, max_model_len=max_len, enforce_eager=eager
    )
    if device.type == "cpu":
        engine_kw["attention_backend"] = "torch"
    thinker = LLMEngine(
        EngineConfig(num_kv_blocks=max_seqs * 32 + 64, **engine_kw),
        model=LoadedModel(
            thinker_cfg,
            _WordTokenizer(),
            frozenset({0}),
            max_len,
            text.vocab_size,
            None,
            "thinker",
            "Qwen2ForCausalLM",
            thinker_weights,
        ),
    )
    tcfg = talker_config(config)
    talker = LLMEngine(
        EngineConfig(num_kv_blocks=max_seqs * (max_len // 16) + 64, **engine_kw),
        model=LoadedModel(
            tcfg,
            CodecTokenizer(),
            TalkerTokens.from_hf(tcfg).stop_ids,
            max_len,
            tcfg.vocab_size,
            None,
            "talker",
            "Qwen2_5OmniTalkerForConditionalGeneration",
            talker_weights(state),
        ),
    )
    models = Token2WavModels(
        dit=hf.token2wav.code2wav_dit_model,
        vocoder=hf.token2wav.code2wav_bigvgan_model,
        speakers={SPEAKER: Speaker(cond=cond.float()[None], ref_mel=ref_mel.float(), bos_token=bos)},
        device=device,
    )
    return hf, AsyncEngine(engine=thinker), SpokenModel(AsyncEngine(engine=talker), Token2Wav(models))


def hf_baseline(hf: Any, prompt: list[int], text_tokens: int, codes: int, device: torch.device) -> dict[str, Any]:
    """transformers' ``generate(return_audio=True)``, timed.

    Random talker weights pick codec ids anywhere in the talker's vocabulary, and the ids past the DiT's
    code table (the special codes) make its embedding lookup fail on the device; the device assert then
    surfaces at the vocoder's next cuDNN call as "unable to find an engine". The real talker never
    speaks those ids, so the baseline's talker is barred from them (``bad_words_ids``); ours drops them."""
    ids = torch.tensor([prompt], device=device)
    num_codes = int(hf.config.token2wav_config.dit_config.num_embeds)
    barred = [[c] for c in range(num_codes, int(hf.config.talker_config.vocab_size))]
    start = time.perf_counter()
    _, wav = hf.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        speaker=SPEAKER,
        thinker_max_new_tokens=text_tokens,
        thinker_min_new_tokens=text_tokens,
        talker_max_new_tokens=codes,
        talker_min_new_tokens=codes,
        **({"talker_bad_words_ids": barred} if barred else {}),
    )
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    return speech_times(wall, wall, wav.numel() / 24000)


async def ours(
    thinker: Any,
    speech: Any,
    prompts: list[list[int]],
    text_tokens: int,
    codes: int,
    stages: bool = False,
    arrival_s: float = 0.0,
) -> list[dict]:
    """Each prompt's answer spoken, the i-th request sent ``i * arrival_s`` after the first; each request's
    times run from its own sending."""
    from omni_gateway.engine.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=text_tokens, ignore_eos=True, temperature=0.7)

    async def one(i: int, prompt: list[int]) -> dict[str, float]:
        await asyncio.sleep(i * arrival_s)
        clock = {"t0": time.perf_counter()} if stages else None
        CLOCK.set(clock)
        turn = await speak_timed(
            speech, thinker, i, prompt, params, SPEAKER, on_audio=lambda: mark(clock, "first_audio")
        )
        samples = sum(n for _, n in turn.arrivals)
        out: dict[str, Any] = speech_times(
            turn.arrivals[0][0] if turn.arrivals else turn.wall_s, turn.wall_s, samples / turn.sample_rate
        )
        if clock is not None:
            out["stages"] = {k: v for k, v in clock.items() if k != "t0"}
        return out

    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


def allocator_counters() -> dict[str, float]:
    """The CUDA caching allocators' calls so far: device allocations and frees, failed allocations that
    flushed the cache (each waits for the whole device), pinned host blocks created and the ms that took."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    device, host = torch.cuda.memory_stats(), torch.cuda.host_memory_stats()
    names = ("num_alloc_retries", "num_sync_all_streams", "num_device_alloc", "num_device_free")
    counters = {name: float(device.get(name, 0)) for name in names}
    counters["num_host_alloc"] = float(host.get("num_host_alloc", 0))
    counters["host_alloc_ms"] = float(host.get("host_alloc_time.total", 0)) / 1e3  # reported in us
    return counters


def main() -> None:
    from omni_gateway.omni.heads.token2wav.chunking import DIT_DTYPES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", choices=("7b", "tiny"), default="7b")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--text-tokens", type=int, default=48, help="thinker tokens per answer")
    parser.add_argument(
        "--arrival-ms",
        type=float,
        default=0.0,
        help="send a run's requests this far apart, not all at once (each one's times run from its sending)",
    )
    parser.add_argument("--codes", type=int, default=400, help="talker codes per answer in the baseline (8 s)")
    parser.add_argument("--first-chunk", type=int, default=None, help="token2wav first chunk, in codes")
    parser.add_argument("--lookahead", type=int, default=None, help="token2wav lookahead, in codes")
    parser.add_argument("--steps", type=int, default=None, help="token2wav ODE steps (Qwen's default: 10)")
    parser.add_argument("--first-steps", type=int, default=None, help="token2wav ODE steps of the first chunk")
    parser.add_argument(
        "--t2w-graphs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="replay token2wav's regular chunks (ODE and vocoder) from CUDA graphs (default: on)",
    )
    parser.add_argument("--dit-dtype", choices=DIT_DTYPES, default=None, help="token2wav DiT precision")
    parser.add_argument("--t2w-lanes", type=int, default=None, help="token2wav worker lanes (default: 2)")
    parser.add_argument(
        "--first-chunks-alone",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="engines launch no step while a first chunk's token2wav call runs (default: on)",
    )
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--enforce-eager", action="store_true", help="thinker and talker without CUDA graphs")
    parser.add_argument("--stages", action="store_true", help="time each request's stages")
    parser.add_argument(
        "--timeline",
        type=Path,
        default=None,
        metavar="FILE",
        help="append each engine step and token2wav call, and the stacks of engine launches stalled past 20 ms",
    )
    parser.add_argument(
        "--trace",
        type=Path,
        default=None,
        metavar="FILE",
        help="a torch.profiler trace (gzipped Chrome JSON, kernels on every stream) of the largest concurrency's "
        "timed run; python -m benchmarks.analysis.trace_streams FILE summarizes it",
    )
    parser.add_argument(
        "--switch-interval-ms",
        type=float,
        default=None,
        help="the interpreter's thread switch interval (default: what omni serve sets for its stage threads)",
    )
    add_out_argument(parser, "omni_speech")
    args = parser.parse_args()
    if args.arrival_ms < 0:
        parser.error(f"--arrival-ms must be 0 or more, got {args.arrival_ms}")
    arrival_s = args.arrival_ms / 1e3
    from omni_gateway.omni.loading import STAGE_SWITCH_INTERVAL_S

    # The engines, the token2wav worker and the event loop are threads of one process, as in omni serve.
    sys.setswitchinterval(STAGE_SWITCH_INTERVAL_S if args.switch_interval_ms is None else args.switch_interval_ms / 1e3)
    device = torch.device(args.device)
    hf, thinker, speech = build(args.shapes, device, max(args.concurrency), args.enforce_eager)
    changes = {
        name: value
        for name, value in (
            ("first_chunk_codes", args.first_chunk),
            ("lookahead_codes", args.lookahead),
            ("num_steps", args.steps),
            ("first_chunk_steps", args.first_steps),
            ("cuda_graphs", args.t2w_graphs),
            ("dit_dtype", args.dit_dtype),
            ("lanes", args.t2w_lanes),
            ("first_chunks_alone", args.first_chunks_alone),
        )
        if value is not None
    }
    if changes:
        from omni_gateway.omni.heads.token2wav.head import Token2Wav

        speech.token2wav = Token2Wav(speech.token2wav.models, dataclasses.replace(speech.token2wav.config, **changes))
    speech.config = dataclasses.replace(speech.config, max_codes=args.codes)
    if args.stages:
        instrument(thinker, speech)
    timeline = Timeline()
    if args.timeline is not None:
        timeline.watch_engine("thinker", thinker.engine)
        timeline.watch_engine("talker", speech.talker.engine)
        timeline.watch_token2wav(speech.token2wav)
        timeline.watch_stalls()
        timeline.watch_allocator()
    vocab = min(1000, hf.config.thinker_config.text_config.vocab_size)  # ordinary ids, clear of the special ones
    g = torch.Generator().manual_seed(1)

    def prompts(n: int) -> list[list[int]]:
        return [torch.randint(200, vocab, (args.prompt_tokens,), generator=g).tolist() for _ in range(n)]

    t2w = speech.token2wav.config
    with ResultLog(
        args.out,
        "omni_speech",
        shapes=args.shapes,
        device=str(device),
        first_chunk_codes=t2w.first_chunk_codes,
        chunk_codes=t2w.chunk_codes,
        lookahead_codes=t2w.lookahead_codes,
        num_steps=t2w.num_steps,
        first_chunk_steps=t2w.first_chunk_steps,
        token2wav_graphs=t2w.cuda_graphs and device.type == "cuda",
        dit_dtype=t2w.dit_dtype,
        token2wav_lanes=t2w.lanes,
        switch_interval_ms=sys.getswitchinterval() * 1e3,
        cuda_graphs=not args.enforce_eager,
        text_tokens=args.text_tokens,
        codes=args.codes,
        arrival_ms=args.arrival_ms,
    ) as log:
        asyncio.run(ours(thinker, speech, prompts(1), 4, 16))  # warm-up: first-call costs out of the way
        for c in args.concurrency:
            # Warm-up at this batch size, untimed, as long as the timed run: the engines' and token2wav's
            # first calls at a batch size (kernel selection, allocator growth) stay out of the timed run.
            asyncio.run(ours(thinker, speech, prompts(c), args.text_tokens, args.codes, arrival_s=arrival_s))
            BATCHES.clear()
            before = allocator_counters()
            traced = args.trace is not None and c == max(args.concurrency)
            with device_trace(args.trace if traced else None):
                timeline.begin(c)
                runs = asyncio.run(
                    ours(thinker, speech, prompts(c), args.text_tokens, args.codes, args.stages, arrival_s)
                )
                timeline.end()
            allocator = {k: v - before.get(k, 0) for k, v in allocator_counters().items()}
            ttfa = summary([r["first_audio_s"] for r in runs])
            rtf = statistics.mean(r["rtf"] for r in runs)
            audio = statistics.mean(r["audio_s"] for r in runs)
            log.write(
                "result",
                system="omni-gateway",
                concurrency=c,
                first_audio=ttfa,
                rtf_mean=rtf,
                audio_s_mean=audio,
                allocator=allocator,
            )
            if allocator:
                print(f"c={c} allocator calls during the timed run: {allocator}")
            print(
                f"omni-gateway c={c}: first audio median {ttfa['median'] * 1000:.0f} ms "
                f"p90 {ttfa['p90'] * 1000:.0f} ms, RTF {rtf:.3f}, {audio:.1f} s audio each"
            )
            if args.stages:
                medians = {
                    name: statistics.median(r["stages"][name] for r in runs if name in r["stages"])
                    for name in STAGES
                    if any(name in r["stages"] for r in runs)
                }
                rows = {
                    f"{kind}_chunk_rows_mean": statistics.mean(n for k, n in BATCHES if k == kind)
                    for kind in ("first", "later", "last")
                    if any(k == kind for k, _ in BATCHES)
                }
                log.write("stages", concurrency=c, **medians, **rows)
                print("  stages (median ms): " + ", ".join(f"{k} {v * 1000:.0f}" for k, v in medians.items()))
                print("  token2wav rows per call (mean): " + ", ".join(f"{k} {v:.1f}" for k, v in rows.items()))
        if not args.no_baseline:
            hf_baseline(hf, prompts(1)[0], 4, 16, device)  # warm-up
            base = hf_baseline(hf, prompts(1)[0], args.text_tokens, args.codes, device)
            log.write("result", system="transformers", concurrency=1, **base)
            print(f"transformers c=1: first audio {base['first_audio_s'] * 1000:.0f} ms, RTF {base['rtf']:.3f}")
    if args.timeline is not None:
        timeline.stop_stalls()
        timeline.write(args.timeline)
    thinker.shutdown()
    speech.shutdown()


if __name__ == "__main__":
    main()
