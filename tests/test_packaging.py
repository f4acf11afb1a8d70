"""Installed, the product is one import namespace, ``omni_gateway``, that shadows no other distribution.

The wheel is built from a copy of the checkout and unpacked into a folder of its own; what it holds and
what imports from it are checked from outside the checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "omni_gateway"
SOURCE_FOLDERS = ("gateway", "omni", "encoders", "engine", "kernels")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "src"
    # A copy keeps the build's own folders (build/, *.egg-info) out of the checkout.
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".venv", ".pytest_cache"),
    )
    out = tmp / "dist"
    out.mkdir()
    # The PEP 517 hook pip would call, without needing pip or a network in the test environment.
    build = "import sys; from setuptools import build_meta; build_meta.build_wheel(sys.argv[1])"
    done = subprocess.run(
        [sys.executable, "-c", build, str(out)], cwd=source, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (built,) = out.glob("*.whl")
    return built


def test_wheel_has_one_top_level_name(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    metadata = {top for top in tops if top.endswith((".dist-info", ".data"))}
    assert tops - metadata == {NAMESPACE}, f"top-level names besides {NAMESPACE}: {sorted(tops - metadata)}"
    assert all(top.startswith(f"{NAMESPACE}-") for top in metadata), sorted(metadata)


def test_wheel_holds_every_source_module(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        f"{NAMESPACE}/{path.relative_to(ROOT).as_posix()}"
        for folder in SOURCE_FOLDERS
        for path in (ROOT / folder).rglob("*.py")
    }
    missing = sorted(expected - names)
    assert not missing, f"source modules missing from the wheel (add their package to pyproject): {missing}"


def test_wheel_declares_the_omni_command(wheel: Path) -> None:
    archive = zipfile.ZipFile(wheel)
    (entry_points,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
    text = archive.read(entry_points).decode()
    assert "omni = omni_gateway.gateway.cli:main" in text


def _probe(cwd: Path, path: list[Path]) -> dict[str, str | None]:
    """Where each name imports from, in a fresh interpreter whose sys.path starts with ``path``."""
    script = """
import importlib.util, json, sys
def origin(name):
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        return None
    if spec is None:
        return None
    return spec.origin or "namespace:" + ";".join(spec.submodule_search_locations or [])
names = ["engine", "gateway", "omni", "encoders", "kernels", "omni_gateway.engine", "omni_gateway.kernels.reference"]
print(json.dumps({name: origin(name) for name in names}))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path))}
    done = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_installed_wheel_exposes_no_bare_names(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    found = _probe(elsewhere, [target])
    assert found["omni_gateway.engine"] == str(target / NAMESPACE / "engine" / "__init__.py")
    assert found["omni_gateway.kernels.reference"] == str(target / NAMESPACE / "kernels" / "reference.py")
    for bare in ("engine", "gateway", "omni", "encoders", "kernels"):
        assert found[bare] is None or str(target) not in found[bare], f"the wheel exposes a bare {bare!r}"


def test_checkout_root_on_sys_path_does_not_shadow_kernels() -> None:
    """``python -m pytest`` or a script run from the root puts the root first on sys.path: Hugging Face's
    ``kernels`` (or nothing) must still be what ``import kernels`` finds, never our kernel folder."""
    found = _probe(ROOT, [ROOT])
    ours = ROOT / "kernels"
    assert (
        found["kernels"] is None
        or found["kernels"].startswith("namespace:")
        or not Path(found["kernels"]).is_relative_to(ours)
    ), found["kernels"]
    assert found["omni_gateway.kernels.reference"] == str(ours / "reference.py")


def test_hugging_face_kernels_stays_importable_beside_ours() -> None:
    pytest.importorskip("transformers")
    from importlib import metadata

    try:
        metadata.version("kernels")
    except metadata.PackageNotFoundError:
        pytest.skip("Hugging Face's kernels is not installed")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import kernels, omni_gateway.kernels.reference as r; print(kernels.__file__); print(r.__file__)",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    hub_kernels, reference = done.stdout.split()
    assert not Path(hub_kernels).is_relative_to(ROOT / "kernels")  # a .venv inside the checkout is fine
    assert Path(reference) == ROOT / "kernels" / "reference.py"
