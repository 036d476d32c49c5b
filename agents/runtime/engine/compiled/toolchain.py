"""What the compiled path needs before it compiles: a C++ compiler (Inductor on CPU) or Triton (on a GPU), and
Inductor's caches pointed at a directory that outlives the process."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import torch

CACHE_ENV = "DAY0_COMPILE_CACHE_DIR"


class CompileUnavailable(RuntimeError):
    """The compiled path cannot run here (no C++ compiler for Inductor on CPU, an unsupported model)."""


def default_cache_dir() -> Path:
    """``$DAY0_COMPILE_CACHE_DIR``, else ``$DAY0_DATA_DIR/compile-cache``, else ``var/compile-cache`` of the repo."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    data = os.environ.get("DAY0_DATA_DIR")
    return (Path(data) if data else Path(__file__).resolve().parents[4] / "var") / "compile-cache"


def configure_caches(cache_dir: str | Path | None = None) -> Path:
    """Point Inductor's caches at ``cache_dir`` (``TORCHINDUCTOR_CACHE_DIR``) and turn the FX graph cache and
    the AOT autograd cache on. Call before the first compile of the process."""
    path = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path.resolve())
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = True
    functorch_config.enable_autograd_cache = True
    return path.resolve()


def check_cpp_compiler() -> str:
    """The C++ compiler Inductor's CPU backend calls, with its version line; ``CompileUnavailable`` naming
    what to install when none answers ``--version``."""
    from torch._inductor import cpp_builder, exc

    try:
        cxx = cpp_builder.get_cpp_compiler()
    except exc.InvalidCxxCompiler:
        raise CompileUnavailable(
            "torch.compile on CPU (Inductor) needs a C++ compiler, and none was found: g++ (or $CXX) does not "
            "answer --version. Install one (Debian/Ubuntu: apt-get install g++) or set CXX to its path."
        ) from None
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    return f"{cxx}: {version.splitlines()[0]}" if version.strip() else cxx


def check_triton(device: torch.device) -> str:
    """Inductor on a GPU generates Triton kernels: ``CompileUnavailable`` when Triton is not installed."""
    from torch.utils._triton import has_triton

    if not has_triton():
        raise CompileUnavailable(f"torch.compile on {device.type} (Inductor) needs Triton, which is not installed "
                                 "for this torch (pip install triton, matching the torch build)")
    import triton

    return f"triton {triton.__version__}"
