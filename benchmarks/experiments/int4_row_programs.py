"""Which program shape (rows, warps, split) runs each 8B linear of a batch-1 decode layer fastest on the
int4 fragment kernel (kernels/int4_fragments.py), with the decode folds it runs in the engine?

    python -m benchmarks.experiments.int4_row_programs [--variants 32,2,0 64,4,16 ...] [--shapes o,down]

A variant is ``rows,warps,split`` (split 0: the shipped ``split_for``). Each shape runs the folded call of
``benchmarks.experiments.int4_row_folds`` in CUDA graphs over weight sets larger than L2, each output
checked against the unfused layer's twin. Needs an sm_90 GPU. Raw records:
``benchmarks/results/int4_row_programs.jsonl`` (under ``$OUT`` when set).

Answer (one H100 80GB, 2026-12-07 09:31 UTC, run 20261207T093106Z-880): the shipped 32 rows, 2 warps and
``split_for`` are within 0.6 us of the best at every shape. o: 7.57 us shipped, 6.98 at 64 rows, 4 warps, 16
splits; gate/up: 26.72, 26.29 at 64 rows, 4 warps, 8 splits; qkv 9.20 (9.11 at 64 rows, 2 warps, 16); down
14.44 (14.41). The o projection at 64/4/16 in the whole step, same call: 2.308 ms a token against 2.312, within
the run-to-run spread, so the kernel keeps one program shape.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from omni_gateway.kernels import int4_fragments as fr
from omni_gateway.kernels import quant_gemv

from benchmarks.common import RESULTS_DIR, ResultLog, rel_err, time_graph
from benchmarks.experiments.int4_row_folds import CASES, DEV, _case, _expected, _sets, operands


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=["32,2,0", "64,4,16", "64,4,8", "64,2,16", "32,2,16"])
    parser.add_argument("--shapes", default=",".join(CASES))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.experiments.int4_row_programs needs a CUDA GPU")
    quant_gemv.prepare_device(DEV)
    variants = [tuple(int(v) for v in item.split(",")) for item in args.variants]
    out_path = Path(os.environ["OUT"]) / "int4_row_programs.jsonl" if os.environ.get("OUT") else None
    shipped = fr.BLOCK_N, fr.WARPS, fr.split_for
    torch.manual_seed(0)
    ok = True
    with ResultLog(out_path or RESULTS_DIR / "int4_row_programs.jsonl", "experiments.int4_row_programs") as log:
        for shape in args.shapes.split(","):
            n, k, _, fusions = CASES[shape]
            sets, w0 = _sets(n, k)
            x = torch.randn(1, k, device=DEV, dtype=torch.bfloat16)
            g = torch.rand(k, device=DEV, dtype=torch.bfloat16) + 0.5
            ops = operands(n, x, g)
            expected = _expected(n, w0, fusions, x, g, ops)
            line = []
            for rows, warps, split in variants:
                fr.BLOCK_N, fr.WARPS = rows, warps
                fr.split_for = (lambda groups, blocks, s=split: s) if split else shipped[2]
                try:
                    used = fr.split_for(k // fr.GROUP, n // rows)
                    call = _case(n, k, fusions, x, g, ops)
                    err = rel_err(call(sets[0]).double(), expected)
                    passed = err < (3e-2 if fusions.get("gated") else 1e-2)
                    us = time_graph(lambda i, c=call: c(sets[i]), len(sets), max(5e-6, n * k / 5e12), replays=7) * 1e6
                finally:
                    fr.BLOCK_N, fr.WARPS, fr.split_for = shipped
                ok &= passed
                log.write("case", shape=shape, rows=rows, warps=warps, split=used, us=us, rel_err=err, ok=passed)
                line.append(f"{rows}/{warps}/s{used} {us:6.2f}{'' if passed else ' WRONG'}")
            print(f"{shape:8s} " + "  ".join(line), flush=True)
    if not ok:
        raise SystemExit("SOME CHECKS FAILED")


if __name__ == "__main__":
    main()
