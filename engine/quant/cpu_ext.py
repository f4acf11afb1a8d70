"""Builds and loads the AVX2 kernels of ``cpu_kernels.c`` (quantized matmuls, and the norm and decode
attention of ``cpu_layers``): a plain C library called through ctypes.

The library is compiled once per source version with the system C compiler and cached on disk; a
machine without AVX2/FMA or without a compiler gets ``None`` and the engine keeps float weights.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_SOURCES = tuple(Path(__file__).with_name(name) for name in ("cpu_kernels.c", "cpu_pool.c"))
_FLAGS = ("-O3", "-mavx2", "-mfma", "-fno-math-errno", "-pthread", "-shared", "-fPIC")
_P = ctypes.c_void_p
_I = ctypes.c_int64
_SIGNATURES = {
    "quantize": (_P, _I, _I, _P, ctypes.c_int),
    "add_rms_norm": (_P, _P, _P, ctypes.c_float, _I, _I, _P, _P, ctypes.c_int),
    "silu_mul": (_P, _I, _I, _P, _P, ctypes.c_int),
    "q4_linear": (_P, _I, _I, _P, _P, _P, _I, _P, _I, ctypes.c_int),
    "q8_linear": (_P, _I, _I, _P, _P, _I, _I, _P, _I, ctypes.c_int),
    "q4_dequantize": (_P, _P, _P, _I, _I, _P, ctypes.c_int),
    "q8_dequantize": (_P, _P, _I, _I, _I, _P, ctypes.c_int),
    "decode_attention": (_P, _I, _I, _I, _I, _P, _P, _P, _P, _I, _P, _P, _P, _I, ctypes.c_float, _P, _P, ctypes.c_int),
}


def cache_dir() -> Path:
    """Next to torch inductor's cache when the engine has named one (``compile_cache_dir``)."""
    inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if inductor:
        return Path(inductor).parent / "cpu_quant"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "omni_gateway" / "cpu_quant"


@functools.lru_cache(maxsize=1)
def load_kernels() -> ctypes.CDLL | None:
    """The compiled library, or ``None`` where this CPU or toolchain cannot run it."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        log.info("quantized CPU matmuls need AVX2; GGUF weights are de-quantized to float32")
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler found; GGUF weights are de-quantized to float32 (more memory, slower)")
        return None
    try:
        source = b"".join(path.read_bytes() for path in _SOURCES)
    except OSError as exc:  # an install without the C sources
        log.warning("the quantized CPU kernels' sources are missing (%s); using float32 weights", exc)
        return None
    digest = hashlib.sha256(source + " ".join(_FLAGS).encode()).hexdigest()[:16]
    target = cache_dir() / f"cpu_kernels-{digest}.so"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        try:
            command = [compiler, *_FLAGS, "-o", tmp, *map(str, _SOURCES)]
            subprocess.run(command, check=True, capture_output=True, timeout=120)
            os.replace(tmp, target)  # atomic: concurrent builders each install a complete file
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            log.warning("building the quantized CPU matmuls failed (%s %s); using float32 weights", exc, detail[-500:])
            Path(tmp).unlink(missing_ok=True)
            return None
    lib = ctypes.CDLL(str(target))
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = None
    return lib
