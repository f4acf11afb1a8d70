"""What ``session.truncation`` adds to a realtime response: counting the conversation's prompt
tokens (chat template plus tokenizer) before the request goes to the engine.

    python -m benchmarks.prompt_count [--model default] [--turns 4,16,64] [--out FILE]

Loads only the LLM side of the pipeline and times ``OmniPipeline.count_tokens`` on conversations
of alternating user and assistant turns (about 20 tokens each, as in a voice chat). Prints the
median over repeats next to the prompt's size, and appends it to ``benchmarks/results/prompt_count.jsonl``.
"""

from __future__ import annotations

import argparse
import statistics
import time

from omni_gateway.omni.protocol import Message, TextPart

from benchmarks.lib.common import ResultLog, add_out_argument

_USER = "Could you remind me what we said about the train times to the coast on Saturday morning?"
_ASSISTANT = "Sure: the first train leaves at seven forty, and there is another one every half hour after that."


def conversation(turns: int) -> tuple[Message, ...]:
    return tuple(
        Message("user" if i % 2 == 0 else "assistant", parts=(TextPart(_USER if i % 2 == 0 else _ASSISTANT),))
        for i in range(turns)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default", help="LLM: 'default' or a local model path")
    parser.add_argument("--turns", default="4,16,64", help="comma list of conversation lengths")
    parser.add_argument("--repeats", type=int, default=50)
    add_out_argument(parser, "prompt_count")
    args = parser.parse_args()
    turn_counts = [int(t) for t in args.turns.split(",")]

    from omni_gateway.omni.config import EngineConfig, OmniConfig
    from omni_gateway.omni.pipeline import OmniPipeline

    start = time.perf_counter()
    pipeline = OmniPipeline.load(
        OmniConfig(engine=EngineConfig(model=args.model), asr=None, tts=None, vad=False, vision=False, warm_up=False)
    )
    print(
        f"LLM {pipeline.capabilities.model} loaded in {time.perf_counter() - start:.1f} s "
        f"(context {pipeline.capabilities.max_context_tokens} tokens)",
        flush=True,
    )
    log = ResultLog(args.out, "prompt_count", model=args.model, repeats=args.repeats)
    try:
        for turns in turn_counts:
            messages = conversation(turns)
            tokens = pipeline.count_tokens(messages)
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                pipeline.count_tokens(messages)
                times.append(time.perf_counter() - t0)
            print(
                f"{turns:4d} turns, {tokens:6d} prompt tokens: count_tokens {statistics.median(times) * 1e3:.2f} ms "
                f"(median of {args.repeats})",
                flush=True,
            )
            log.write("count", turns=turns, prompt_tokens=tokens, median_ms=statistics.median(times) * 1e3)
    finally:
        log.close()
        pipeline.shutdown()


if __name__ == "__main__":
    main()
