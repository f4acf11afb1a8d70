"""Grammar-constrained decoding: what a constraint costs per decode step, what compiling one costs, and
how often answers fail to parse without one.

    python -m benchmarks.structured [--model default] [--device cpu|cuda|auto] [--dtype auto]
        [--batches 1,64] [--fractions 0,0.5,1] [--steps 16] [--requests 50] [--skip-rates]
        [--pipeline-decode auto|on|off] [--out FILE]

1. Decode step time with 0%, 50% and 100% of the rows constrained (a typical tool's arguments, as a
   JSON array long enough never to end inside the measured steps), at each batch size: the median
   wall time of ``LLMEngine.step`` once every request decodes; and the sampler alone on random logits
   of the model's vocabulary (the mask's own cost, free of the model's).
2. Compile time of a typical tool schema (JSON schema and the tool-call structural tag) on a cold
   cache, and of the tokenizer's vocabulary (once per model).
3. At temperature 1.0, ``--requests`` json_schema answers and ``--requests`` forced tool calls, with
   and without the constraint: the share that fails to parse and validate (needs ``jsonschema``).

``--model`` takes "default" (the embedded SmolLM2-135M), a Hugging Face directory or a GGUF file;
``--device cuda`` runs the same measurements on a GPU (CUDA graphs and pipelined decode as configured).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from benchmarks.lib.common import ResultLog, add_out_argument

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather forecast for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
            },
            "required": ["city", "unit", "days"],
            "additionalProperties": False,
        },
    },
}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 40},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
JSON_PROMPT = "Invent a person. Answer with a JSON object with the keys name, age and city."
TOOL_PROMPT = "What will the weather be in Lisbon for the next 3 days, in celsius? Use the tool."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default", help='"default", a HF directory or a GGUF file')
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--batches", default="1,64", help="comma-separated batch sizes")
    parser.add_argument("--fractions", default="0,0.5,1", help="comma-separated shares of constrained rows")
    parser.add_argument("--steps", type=int, default=32, help="decode steps timed per configuration")
    parser.add_argument("--requests", type=int, default=50, help="requests per parse-failure rate")
    parser.add_argument("--skip-rates", action="store_true", help="skip the parse-failure rates")
    parser.add_argument(
        "--pipeline-decode", default="auto", choices=("auto", "on", "off"), help="off: every step waits for the host"
    )
    add_out_argument(parser, "structured")
    args = parser.parse_args()

    from omni_gateway.engine import LLM

    batches = [int(b) for b in args.batches.split(",")]
    fractions = [float(f) for f in args.fractions.split(",")]
    llm = LLM(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        max_model_len=1024,
        max_num_seqs=max(max(batches), args.requests),
        pipeline_decode=args.pipeline_decode,
    )
    engine = llm.engine
    device = str(getattr(engine.runner, "device", args.device))
    with ResultLog(args.out, "structured", model=args.model, device=device, pipeline=args.pipeline_decode) as log:
        compile_times(engine, log)
        step_time(engine, max(batches), 0.5, 4, None)  # warm-up: first-use allocations and thread pools
        for batch in batches:
            for fraction in fractions:
                if (batch * fraction) % 1:
                    continue  # not a whole number of rows (50% of batch 1)
                step_time(engine, batch, fraction, args.steps, log)
                sampler_time(engine, batch, fraction, log)
        if not args.skip_rates:
            failure_rates(llm, args.requests, log)


# ---- 1. step time -------------------------------------------------------------------------------------


def step_time(engine: Any, batch: int, fraction: float, steps: int, log: ResultLog | None) -> None:
    from omni_gateway.engine import SamplingParams, StructuredOutputs

    spec = StructuredOutputs(json={"type": "array", "items": TOOL["function"]["parameters"], "minItems": 1000})
    constrained = round(batch * fraction)
    prompt = engine.render_chat([{"role": "user", "content": TOOL_PROMPT}])
    warmup = 3
    for i in range(batch):
        params = SamplingParams(
            temperature=1.0,
            seed=i,
            max_tokens=warmup + steps + 8,
            ignore_eos=True,
            structured_outputs=spec if i < constrained else None,
        )
        engine.add_request(f"step-{batch}-{fraction}-{i}", prompt, params)
    times: list[float] = []
    cpu_times: list[float] = []  # this process's CPU seconds: less swayed than wall time by a busy machine
    while engine.has_unfinished():
        decoding = all(s.num_output_tokens >= warmup for s in engine.scheduler.running) and not engine.scheduler.waiting
        start, cpu_start = time.perf_counter(), time.process_time()
        engine.step()
        if decoding and len(times) < steps and len(engine.scheduler.running) == batch:
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
    engine.pop_finished()
    if log is None:
        return
    median = statistics.median(times)
    label = f"decode step, batch {batch:3d}, {100 * fraction:3.0f}% constrained:"
    cpu = statistics.median(cpu_times)
    print(f"{label} {1000 * median:8.2f} ms wall, {1000 * cpu:8.2f} ms CPU (medians of {len(times)})")
    log.write(
        "step",
        batch=batch,
        constrained_rows=constrained,
        steps=len(times),
        median_s=median,
        median_cpu_s=cpu,
        times_s=times,
        cpu_times_s=cpu_times,
    )


def sampler_time(engine: Any, batch: int, fraction: float, log: ResultLog, repeats: int = 20) -> None:
    """``Sampler.choose`` plus the matchers' advance, on random logits: the constraint's own cost."""
    from omni_gateway.engine import SamplingParams, StructuredOutputs
    from omni_gateway.engine.core.sequence import Sequence
    from omni_gateway.engine.runner.sampler import Sampler
    from omni_gateway.kernels.host_copies import to_host

    spec = StructuredOutputs(json={"type": "array", "items": TOOL["function"]["parameters"], "minItems": 1000})
    device = getattr(engine.runner, "device", torch.device("cpu"))
    constrained = round(batch * fraction)
    seqs = []
    for i in range(batch):
        seq = Sequence(
            "s", [1, 2, 3], SamplingParams(temperature=1.0, structured_outputs=spec if i < constrained else None)
        )
        seq.grammar = engine.grammars.matcher(spec) if i < constrained else None
        seqs.append(seq)
    sampler = Sampler(device)
    generator = torch.Generator(device=device).manual_seed(0)
    times = []
    for _ in range(repeats):
        logits = torch.randn(batch, engine.vocab_size, device=device, generator=generator)
        start = time.perf_counter()
        tokens = to_host(sampler.choose(logits, seqs))[0].tolist()
        engine.grammars.accept(seqs, tokens)
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(f"  sampler alone:                    {1000 * median:8.2f} ms")
    log.write("sampler", batch=batch, constrained_rows=constrained, median_s=median, times_s=times)


# ---- 2. compile time ----------------------------------------------------------------------------------


def compile_times(engine: Any, log: ResultLog, repeats: int = 5) -> None:
    from omni_gateway.engine import StructuredOutputs
    from omni_gateway.omni.tools import tool_call_format

    start = time.perf_counter()
    engine.grammars.compile(StructuredOutputs(regex="a"))  # builds the vocabulary's index
    vocab_s = time.perf_counter() - start
    print(f"tokenizer info ({engine.vocab_size} tokens), once per model: {1000 * vocab_s:.1f} ms")
    log.write("compile", what="tokenizer_info", seconds=vocab_s)
    specs = {
        "tool_json_schema": StructuredOutputs(json=TOOL["function"]["parameters"]),
        "tool_call_tag_required": StructuredOutputs(
            structural_tag=json.dumps(tool_call_format("hermes").grammar([TOOL], required=True, parallel=True))
        ),
        "tool_call_tag_auto": StructuredOutputs(
            structural_tag=json.dumps(tool_call_format("hermes").grammar([TOOL], required=False, parallel=True))
        ),
    }
    for name, spec in specs.items():
        times = []
        for _ in range(repeats):
            engine.grammars.clear()
            start = time.perf_counter()
            engine.grammars.compile(spec)
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        print(f"compile {name}: {1000 * median:.2f} ms (median of {repeats}, cold cache)")
        log.write("compile", what=name, seconds=median, times_s=times)


# ---- 3. parse failure rates ---------------------------------------------------------------------------


def failure_rates(llm: Any, requests: int, log: ResultLog) -> None:
    import jsonschema
    from omni_gateway.engine import SamplingParams, StructuredOutputs
    from omni_gateway.omni.tools import tool_call_format

    def valid_json(text: str) -> bool:
        try:
            jsonschema.validate(json.loads(text), PERSON)
        except (ValueError, jsonschema.ValidationError):
            return False
        return True

    def valid_call(text: str) -> bool:
        _, calls = tool_call_format("hermes").parse(text, frozenset({"get_weather"}))
        try:
            return bool(calls) and all(
                jsonschema.validate(json.loads(c.arguments), TOOL["function"]["parameters"]) is None for c in calls
            )
        except (ValueError, jsonschema.ValidationError):
            return False

    engine = llm.engine
    json_prompt = engine.render_chat([{"role": "user", "content": JSON_PROMPT}])
    tool_prompt = engine.render_chat([{"role": "user", "content": TOOL_PROMPT}], tools=[TOOL])
    tag = json.dumps(tool_call_format("hermes").grammar([TOOL], required=True, parallel=False))
    cases = [
        ("json_schema", json_prompt, StructuredOutputs(json=PERSON), valid_json),
        ("tool_call_required", tool_prompt, StructuredOutputs(structural_tag=tag), valid_call),
    ]
    for name, prompt, spec, valid in cases:
        for constrained in (True, False):
            params = SamplingParams(
                temperature=1.0, max_tokens=200, seed=None, structured_outputs=spec if constrained else None
            )
            start = time.perf_counter()
            outputs = llm.generate([prompt] * requests, params)
            seconds = time.perf_counter() - start
            failed = sum(not valid(o.outputs[0].text) for o in outputs)
            label = "constrained" if constrained else "unconstrained"
            print(f"{name} {label:13s}: {failed}/{requests} fail to parse or validate ({100 * failed / requests:.0f}%)")
            log.write(
                "failure_rate",
                case=name,
                constrained=constrained,
                requests=requests,
                failed=failed,
                seconds=seconds,
                example=outputs[0].outputs[0].text[:300],
            )


if __name__ == "__main__":
    main()
