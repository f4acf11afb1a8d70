"""Where the idle RSS of ``omni serve`` goes: each model stage loaded alone in a fresh process.

Every stage runs in its own interpreter, which first imports what the server imports (torch, the
gateway app) and then loads the stage; the stage's cost is the RSS it adds. ``after_trim`` is the RSS
once glibc has returned its free heap pages (``malloc_trim``), so the gap between the two is memory
the allocator keeps, not memory in use.

    python -m benchmarks.idle_rss                      # all stages, then the whole server
    python -m benchmarks.idle_rss --stages llm asr     # some of them

Raw results: a ``stage`` record per stage, appended to ``benchmarks/results/idle_rss.jsonl`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from benchmarks.lib.common import ResultLog, add_out_argument

STAGES = ("imports", "llm", "vad", "asr", "tts", "server")

# Runs in the child: RSS after the imports, after loading the stage, after malloc_trim.
CHILD = r"""
import ctypes, gc, json, sys, time
from pathlib import Path

def rss():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

def tensor_bytes(root):
    # Bytes of every tensor reachable from root (oneDNN-packed copies apart), each storage once.
    import dataclasses
    seen, storages, stack, total = set(), set(), [root], {"plain": 0, "packed": 0}
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.is_mkldnn:
                total["packed"] += obj.numel() * obj.element_size()
            elif obj.untyped_storage().data_ptr() not in storages:  # tied weights share one storage
                storages.add(obj.untyped_storage().data_ptr())
                total["plain"] += obj.untyped_storage().nbytes()
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif dataclasses.is_dataclass(obj):
            stack.extend(getattr(obj, f.name) for f in dataclasses.fields(obj))
        elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("omni_gateway"):
            stack.extend(vars(obj).values())
    return total

import torch
from omni_gateway.gateway.app import create_app
from omni_gateway.omni.config import OmniConfig
from omni_gateway.omni.loading import stage_threads
from omni_gateway.omni.pipeline import OmniPipeline
torch.set_num_threads(stage_threads(OmniConfig()))
stage = sys.argv[1]
base = rss()
detail = {}
t0 = time.monotonic()
if stage == "llm":
    from omni_gateway.engine.frontend.async_engine import AsyncEngine
    from omni_gateway.engine.config import EngineConfig
    engine = AsyncEngine(EngineConfig(model="default"))
    runner = engine.engine.runner
    detail["kv_cache_mib"] = round(runner.kv_cache.nbytes / 2**20)
    detail["kv_blocks"] = runner.num_kv_blocks
    sizes = tensor_bytes(runner.model)
    detail["weights_mib"] = round(sizes["plain"] / 2**20)
    detail["onednn_packed_mib"] = round(sizes["packed"] / 2**20)
    detail["dtype"] = str(runner.dtype)
elif stage == "vad":
    from omni_gateway.encoders.vad import load_session
    session = load_session()
elif stage == "asr":
    from omni_gateway.encoders.asr import load_recognizer
    asr = load_recognizer("default")
    asr.transcribe(bytes(16000), sample_rate=16000)
elif stage == "tts":
    from omni_gateway.omni.heads.tts.head import TtsHead
    tts = TtsHead.load("default", threads=stage_threads(OmniConfig()))
    tts.synthesize("Hello, this sentence only warms up the voice before anyone hears it.")
elif stage == "server":
    pipe = OmniPipeline.load(OmniConfig())
    app = create_app(pipe)
loaded = rss()
gc.collect()
ctypes.CDLL("libc.so.6").malloc_trim(0)
print(json.dumps({"stage": stage, "imports_mib": round(base), "loaded_mib": round(loaded),
                  "stage_mib": round(loaded - base), "after_trim_mib": round(rss()),
                  "load_s": round(time.monotonic() - t0, 1), **detail}))
"""


def measure(stage: str, env: dict[str, str] | None) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, stage], capture_output=True, text=True, timeout=900, env=env, check=False
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"stage {stage} failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(lines[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES))
    parser.add_argument("--malloc-arena-max", type=int, default=None, help="MALLOC_ARENA_MAX for the children")
    add_out_argument(parser, "idle_rss")
    args = parser.parse_args()
    env = None
    if args.malloc_arena_max is not None:
        import os

        env = dict(os.environ, MALLOC_ARENA_MAX=str(args.malloc_arena_max))
    print(f"{'stage':8} {'imports':>8} {'+stage':>8} {'loaded':>8} {'trimmed':>8}  (MiB RSS)  detail")
    with ResultLog(args.out, "idle_rss") as log:
        for stage in args.stages:
            row = measure(stage, env)
            row.update(time=time.time(), malloc_arena_max=args.malloc_arena_max)
            log.write("stage", **row)
            extra = {
                k: v
                for k, v in row.items()
                if k in ("kv_cache_mib", "kv_blocks", "weights_mib", "onednn_packed_mib", "dtype")
            }
            print(
                f"{stage:8} {row['imports_mib']:8} {row['stage_mib']:8} {row['loaded_mib']:8} "
                f"{row['after_trim_mib']:8}  load {row['load_s']} s {extra or ''}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
