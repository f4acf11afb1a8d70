"""The import rules of docs/architecture.md, checked on the source (AST) and by importing in a clean interpreter."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "omni_gateway"
PACKAGES = ("gateway", "omni", "encoders", "engine", "kernels")
# Which of our packages each package must never import (its own is always allowed).
FORBIDDEN = {
    "gateway": {"engine", "encoders", "kernels"},  # omni only through the names below
    "omni": {"gateway"},
    "engine": {"gateway", "omni", "encoders"},
    "encoders": {"gateway", "omni", "engine"},
    "kernels": {"gateway", "omni", "encoders", "engine"},
}
GATEWAY_OMNI_ANYWHERE = ("omni.protocol", "omni.config")
GATEWAY_OMNI_IN_FUNCTIONS = ("omni", "omni.load_backend")
TORCH_FREE_ENGINE_MODULES = (
    "core.sequence",
    "sampling_params",
    "config",
    "errors",
    "core.block_pool",
    "core.kv_cache_manager",
    "core.scheduler",
    "core.intake",
)


@dataclass(frozen=True)
class Import:
    module: str
    line: int
    in_function: bool


def module_name(path: Path) -> str:
    """The installed name of a source file: ``engine/core/scheduler.py`` is ``omni_gateway.engine.core.scheduler``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([NAMESPACE, *parts])


def ours(module: str) -> str | None:
    """``omni_gateway.engine.x`` -> ``engine.x``; None for anything outside the namespace."""
    prefix = NAMESPACE + "."
    return module[len(prefix) :] if module.startswith(prefix) else None


def imports_of(source: str, module: str, is_package: bool = False) -> list[Import]:
    """Every import in ``source`` as absolute module names; ``from a import b`` yields ``a.b``."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend(Import(a.name, child.lineno, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                found.extend(
                    Import(f"{base}.{a.name}" if a.name != "*" else base, child.lineno, in_function)
                    for a in child.names
                )
            visit(child, inner)

    visit(ast.parse(source), False)
    return found


def violations(package: str, module: str, imports: list[Import]) -> list[str]:
    out = []
    for imp in imports:
        where = f"{module}:{imp.line} imports {imp.module}"
        if imp.module.split(".")[0] in PACKAGES:
            out.append(f"{where} (bare name: our packages are imported as {NAMESPACE}.*)")
            continue
        name = ours(imp.module)
        top = (name or imp.module).split(".")[0]
        if name is not None and top in FORBIDDEN[package]:
            out.append(f"{where} ({package} must not import {top})")
        elif package == "gateway" and top == "torch":
            out.append(f"{where} (gateway never imports torch)")
        elif package == "gateway" and name is not None and top == "omni":
            allowed = _under(name, GATEWAY_OMNI_ANYWHERE) or (imp.in_function and name in GATEWAY_OMNI_IN_FUNCTIONS)
            if not allowed:
                out.append(f"{where} (gateway may use omni.protocol, omni.config, and omni.load_backend lazily)")
    if (
        module.startswith(f"{NAMESPACE}.engine.")
        and module.removeprefix(f"{NAMESPACE}.engine.") in TORCH_FREE_ENGINE_MODULES
    ):
        out.extend(
            f"{module}:{imp.line} imports {imp.module} (pure module: no torch)"
            for imp in imports
            if imp.module.split(".")[0] == "torch"
        )
    return out


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def source_files() -> list[tuple[str, Path]]:
    return [(pkg, path) for pkg in PACKAGES for path in sorted((ROOT / pkg).rglob("*.py"))]


def test_layer_rules_hold_for_every_source_file() -> None:
    problems = []
    for package, path in source_files():
        module = module_name(path)
        imports = imports_of(path.read_text(encoding="utf-8"), module, path.name == "__init__.py")
        problems.extend(violations(package, module, imports))
    assert not problems, "layer rule violations:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("package", "module", "source", "expected"),
    [
        ("gateway", "omni_gateway.gateway.x", "import torch", "never imports torch"),
        ("gateway", "omni_gateway.gateway.x", "from omni_gateway.engine import LLM", "must not import engine"),
        ("gateway", "omni_gateway.gateway.x", "from omni_gateway import omni", "lazily"),
        ("gateway", "omni_gateway.gateway.x", "import omni_gateway.omni.pipeline", "lazily"),
        ("engine", "omni_gateway.engine.x", "import omni_gateway.encoders.audio", "must not import encoders"),
        (
            "encoders",
            "omni_gateway.encoders.x",
            "from omni_gateway.engine.core.sequence import EmbedSpan",
            "must not import engine",
        ),
        ("encoders", "omni_gateway.encoders.x", "from omni_gateway.omni.pipeline import run", "must not import omni"),
        (
            "kernels",
            "omni_gateway.kernels.x",
            "from omni_gateway.engine.config import EngineConfig",
            "must not import engine",
        ),
        ("kernels", "omni_gateway.kernels.sub.x", "from ...engine import config", "must not import engine"),
        ("engine", "omni_gateway.engine.core.scheduler", "def f():\n    import torch", "pure module"),
        ("engine", "omni_gateway.engine.x", "from engine.config import EngineConfig", "bare name"),
        ("omni", "omni_gateway.omni.x", "import kernels.reference", "bare name"),
    ],
)
def test_checker_flags_violations(package: str, module: str, source: str, expected: str) -> None:
    found = violations(package, module, imports_of(source, module))
    assert len(found) == 1 and expected in found[0]


@pytest.mark.parametrize(
    "source",
    [
        "from omni_gateway.omni.protocol import OmniRequest\nfrom omni_gateway.omni import config",
        "def f():\n    from omni_gateway.omni import load_backend\n    from omni_gateway import omni",
        "from . import auth\nfrom .http import chat",
    ],
)
def test_checker_allows_gateway_contract_imports(source: str) -> None:
    module = "omni_gateway.gateway.x"
    assert violations("gateway", module, imports_of(source, module)) == []


def _loads_torch(modules: list[str]) -> list[str]:
    """Import each module in a fresh interpreter; returns those after which torch was loaded."""
    script = textwrap.dedent(f"""
        import importlib, sys
        culprits = []
        for name in {modules!r}:
            importlib.import_module(name)
            if "torch" in sys.modules:
                culprits.append(name)
                break
        print("\\n".join(culprits))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"importing {modules} failed:\n{done.stderr[-4000:]}"
    return [line for line in done.stdout.splitlines() if line]


def test_importing_gateway_does_not_load_torch() -> None:
    modules = sorted(module_name(p) for p in (ROOT / "gateway").rglob("*.py"))
    assert "omni_gateway.gateway" in modules
    assert _loads_torch(modules) == []


def test_pure_engine_modules_do_not_load_torch() -> None:
    assert _loads_torch([f"{NAMESPACE}.engine.{m}" for m in TORCH_FREE_ENGINE_MODULES]) == []


def test_only_the_harness_is_shared_with_tests() -> None:
    """Benchmarks and the harness import test code only from ``tests/harness``; demos import none."""
    allowed = {"benchmarks": ("tests.harness",), "tests/harness": ("tests.harness",), "demos": ()}
    problems = [
        f"{path.relative_to(ROOT)}:{imp.line} imports {imp.module}"
        for folder, shared in allowed.items()
        for path in sorted((ROOT / folder).rglob("*.py"))
        for imp in imports_of(path.read_text(), folder.replace("/", "."))
        if (imp.module == "tests" or imp.module.startswith("tests."))
        and not any(imp.module == s or imp.module.startswith(s + ".") for s in shared)
    ]
    assert not problems, "\n".join(problems)


def benchmark_imports(folder: Path) -> list[str]:
    """Every import of ``benchmarks`` (at module level or inside a function) in the sources under ``folder``, as
    ``file:line imports module`` with the file's path under ``folder``."""
    return [
        f"{path.relative_to(folder)}:{imp.line} imports {imp.module}"
        for path in sorted(folder.rglob("*.py"))
        for imp in imports_of(path.read_text(), "tests.harness")
        if imp.module == "benchmarks" or imp.module.startswith("benchmarks.")
    ]


def test_the_harness_imports_no_benchmark() -> None:
    """Benchmarks build on the harness, never the other way round."""
    problems = benchmark_imports(ROOT / "tests" / "harness")
    assert not problems, "tests/harness imports benchmarks:\n" + "\n".join(problems)


def test_benchmark_imports_are_found_inside_functions(tmp_path: Path) -> None:
    (tmp_path / "builder.py").write_text("def build():\n    from benchmarks.engine_gpu import shape_config\n")
    (tmp_path / "shared.py").write_text("import benchmarks.lib.common\nfrom tests.harness import checkpoints\n")
    assert benchmark_imports(tmp_path) == [
        "builder.py:2 imports benchmarks.engine_gpu.shape_config",
        "shared.py:1 imports benchmarks.lib.common",
    ]
