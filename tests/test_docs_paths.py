"""Every repository path the docs cite exists: a backticked path that starts at a top-level folder or file of the
checkout (``engine/core/scheduler.py``, ``benchmarks/results/*.jsonl``); a backticked file name or partial path
(``session_core.py``, ``realtime/session.py``), which must end the path of some file of the checkout; and a
backticked module name of ours (``omni_gateway.engine.AsyncEngine``, ``encoders.vad.VadBatcher``), whose module must
exist and whose last name, when it is not a module, must occur in that module's source. Placeholders
(``benchmarks/NAME.py``, ``<name>``) are skipped."""

from __future__ import annotations

import os
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
NAMESPACE = "omni_gateway"
MODULE_ROOTS = ("gateway", "omni", "encoders", "engine", "kernels", "benchmarks", "tests", "demos")
SPAN = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
PLACEHOLDER = re.compile(r"<[^>]*>|\bNAME\b")  # benchmarks/NAME.py, <name>.jsonl
FILE_NAME = re.compile(r"[\w.-]+(?:/[\w.-]+)*\.(?:py|md|c|toml|jsonl|gz|txt|json|js|html|css)")


@cache
def checkout_files() -> tuple[str, ...]:
    """Every file of the checkout as a path relative to its root, hidden folders and build output left out."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("build", "dist", "__pycache__")]
        found.extend(Path(folder, f).relative_to(ROOT).as_posix() for f in files)
    return tuple(found)


def cited(text: str) -> list[tuple[int, str]]:
    """The backticked spans of ``text`` outside fenced code blocks, with their line numbers."""
    spans = []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            spans.extend((number, m.group(1).strip()) for m in SPAN.finditer(line))
    return spans


def path_exists(span: str) -> bool | None:
    """Whether a repository path exists; None when ``span`` is not one (it does not start at the checkout's top)."""
    if " " in span or span.startswith(("/", "-")) or PLACEHOLDER.search(span):
        return None
    if "/" not in span or span.split("/")[0] not in {p.name for p in ROOT.iterdir()}:
        if "*" in span or not FILE_NAME.fullmatch(span):
            return None
        return any(f == span or f.endswith("/" + span) for f in checkout_files())
    path = span.rstrip("/")
    if "*" in path:
        return any(ROOT.glob(path))
    return (ROOT / path).exists()


def module_exists(span: str) -> bool | None:
    """Whether a dotted name of ours resolves: the longest prefix that is a module, then a name in its source."""
    if not DOTTED.fullmatch(span) or PLACEHOLDER.search(span):
        return None
    parts = span.split(".")
    if parts[0] == NAMESPACE:
        parts = parts[1:]
    if not parts or parts[0] not in MODULE_ROOTS or (ROOT / parts[0]).is_file():
        return None
    for size in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:size])
        source = next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)
        if source is None and base.is_dir() and size == len(parts):
            return True  # a namespace folder (kernels/)
        if source is not None:
            rest = parts[size:]
            return not rest or re.search(rf"\b{re.escape(rest[0])}\b", source.read_text(encoding="utf-8")) is not None
    return False


def missing(doc: Path) -> list[str]:
    problems = []
    for line, span in cited(doc.read_text(encoding="utf-8")):
        found = path_exists(span)
        if found is None:
            found = module_exists(span)
        if found is False:
            problems.append(f"{doc.relative_to(ROOT)}:{line}: `{span}`")
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_cited_paths_exist(doc: Path) -> None:
    problems = missing(doc)
    assert not problems, "cited but not in the checkout:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("span", "exists"),
    [
        ("engine/core/scheduler.py", True),
        ("engine/scheduler.py", False),
        ("benchmarks/results/*.jsonl", True),
        ("benchmarks/results/*.csv", False),
        ("omni_gateway.engine.core.scheduler", True),
        ("omni_gateway.engine.AsyncEngine", True),  # a lazy export: named in the package's source
        ("encoders.vad.VadBatcher", True),
        ("encoders.vad.NoSuchThing", False),
        ("omni.heads.tts_vits", False),
        ("omni_gateway.kernels", True),
        ("session_core.py", True),
        ("realtime/session.py", True),
        ("heads/token2wav_dit.py", False),
        ("DESIGN.md", False),
    ],
)
def test_the_check_tells_present_from_absent(span: str, exists: bool) -> None:
    found = path_exists(span)
    assert (module_exists(span) if found is None else found) is exists


@pytest.mark.parametrize(
    "span", ["benchmarks/NAME.py", "benchmarks/results/<name>.jsonl", "/v1/realtime", "omni_gateway/engine/", "a.b"]
)
def test_placeholders_and_other_spans_are_not_checked(span: str) -> None:
    assert path_exists(span) is None and module_exists(span) is None
