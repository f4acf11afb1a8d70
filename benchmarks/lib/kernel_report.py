"""The kernel benchmark's report: raw records as JSON lines, each table printed and appended to a Markdown
twin, and the device copy bandwidth the tables measure against."""

from __future__ import annotations

import torch
import triton
import triton.testing

from benchmarks.lib.common import ResultLog


class Report:
    """Raw records to the run's JSON-lines file, and each table printed and appended to its ``.md`` twin."""

    def __init__(self, log: ResultLog) -> None:
        self.log = log
        self.md = open(log.path.with_suffix(".md"), "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def record(self, kind: str, **fields: object) -> None:
        self.log.write(kind, **fields)

    def table(self, title: str, header: list[str], rows: list[list[object]]) -> None:
        lines = [f"\n### {title}\n", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
        text = "\n".join(lines) + "\n"
        self.md.write(text)
        self.md.flush()
        print(text, flush=True)

    def close(self) -> None:
        self.md.close()
        self.log.close()


def copy_bandwidth(report: Report) -> float:
    n = 2 << 30  # 2 GiB per buffer
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median") / 1e3
    assert torch.equal(dst[:4096], src[:4096])
    bw = 2 * n / t
    report.record("copy", bytes=2 * n, seconds=t, bandwidth=bw)
    report.table(
        "Device copy", ["buffer", "time (ms)", "GB/s (read+write)"], [["2 GiB", f"{t * 1e3:.3f}", f"{bw / 1e9:.0f}"]]
    )
    return bw
