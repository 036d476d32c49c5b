"""The kernels' library built ahead of time and checked before use: ``python -m agents.runtime.kernels build`` writes
it once, a host with no compiler on PATH loads it, and a library whose ABI version, struct sizes or sources differ
from this tree is refused with a sentence naming the difference."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agents.runtime.kernels import abi, build, library

pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C compiler to build the library with")

ROOT = Path(__file__).resolve().parents[2]
PROBE = ("import json; from agents.runtime import kernels; from agents.runtime.kernels import build, library; "
         "import torch; x = torch.randn(3, 8); y = kernels.silu_and_mul(x); "
         "ref = torch.nn.functional.silu(x[:, :4]) * x[:, 4:]; "
         "print(json.dumps({**kernels.status(), 'path': str(library.path), 'compiler': build.compiler(), "
         "'close': None if y is None else bool(torch.allclose(y, ref, rtol=1e-6, atol=1e-6))}))")


def _without_compiler(tmp_path: Path, **env: str) -> dict:
    """The probe in a fresh interpreter whose PATH holds no C compiler (and no CC)."""
    bare = tmp_path / "bin"
    bare.mkdir(exist_ok=True)
    clean = {k: v for k, v in os.environ.items() if k not in ("CC", build.PREBUILT_ENV, "DAY0_KERNEL_CFLAGS")}
    clean.update(PATH=str(bare), PYTHONPATH=str(ROOT), DAY0_KERNEL_CACHE=str(tmp_path / "empty-cache"), **env)
    done = subprocess.run([sys.executable, "-c", PROBE], env=clean, capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _variant(tmp_path: Path, name: str, edit: tuple[str, str] | None = None, digest: str | None = None) -> Path:
    """A library compiled from a copy of the sources with ``edit`` (old, new) applied to the header."""
    src = tmp_path / f"src-{name}"
    shutil.copytree(build.CSRC, src)
    if edit:
        header = src / "day0_kernels.h"
        text = header.read_text()
        assert edit[0] in text
        header.write_text(text.replace(edit[0], edit[1]))
    out = tmp_path / name / build.PREBUILT_NAME
    out.parent.mkdir()
    subprocess.run([build.compiler(), *build.FLAGS, f'-DDAY0_SOURCE_DIGEST="{digest or build.source_digest()}"',
                    "-o", str(out), str(src / "day0_kernels.c"), "-lm"], check=True, timeout=300)
    return out


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prebuilt")
    done = subprocess.run([sys.executable, "-m", "agents.runtime.kernels", "build", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out / build.PREBUILT_NAME)
    return out


def test_a_host_without_a_compiler_loads_the_prebuilt_library(prebuilt, tmp_path):
    got = _without_compiler(tmp_path, DAY0_KERNEL_PREBUILT=str(prebuilt))
    assert got["compiler"] is None
    assert got["loaded"] and got["reason"] is None and got["path"] == str(prebuilt / build.PREBUILT_NAME)
    assert got["close"] is True
    assert not (tmp_path / "empty-cache").exists()  # nothing compiled


def test_without_a_compiler_or_a_prebuilt_library_the_torch_code_runs(tmp_path):
    got = _without_compiler(tmp_path, DAY0_KERNEL_PREBUILT=str(tmp_path / "nothing-here"))
    assert not got["loaded"] and got["reason"] == "no C compiler (cc, gcc or clang) on PATH"
    assert got["close"] is None  # the wrapper said None: the caller runs its torch code


@pytest.mark.slow
def test_a_prebuilt_library_of_another_abi_version_is_refused(tmp_path):
    lib = _variant(tmp_path, "abi", (f"#define DAY0_ABI_VERSION {abi.ABI_VERSION}", "#define DAY0_ABI_VERSION 99"))
    assert abi.mismatch(ctypes.CDLL(str(lib))) == f"the library has ABI version 99, the Python mirror {abi.ABI_VERSION}"
    got = _without_compiler(tmp_path, DAY0_KERNEL_PREBUILT=str(lib.parent))
    assert not got["loaded"]
    assert got["reason"] == (f"no C compiler (cc, gcc or clang) on PATH; {lib} refused: the library has ABI version "
                             f"99, the Python mirror {abi.ABI_VERSION}")


def test_a_library_whose_struct_differs_from_its_mirror_is_refused(tmp_path):
    lib = _variant(tmp_path, "struct", ("float in_eps, post_eps, qk_eps, scale;",
                                        "float in_eps, post_eps, qk_eps, scale, extra;"))
    size = ctypes.sizeof(abi.DecodeLayer)
    assert abi.mismatch(ctypes.CDLL(str(lib))) == (
        f"struct day0_layer is {size + 8} bytes in the library, {size} in its mirror DecodeLayer")


def test_a_prebuilt_library_of_other_sources_gives_way_to_the_compiler(tmp_path, monkeypatch, caplog):
    stale = _variant(tmp_path, "stale", digest="0" * 64)
    monkeypatch.setenv(build.PREBUILT_ENV, str(stale.parent))
    for name, value in (("state", "unloaded"), ("lib", None), ("path", None), ("reason", "")):
        monkeypatch.setattr(library, name, value)
    assert library.available()
    assert library.path != stale and library.path.parent == build.cache_dir()
    assert f"{stale} refused: it was built from other sources (digest 000000000000" in caplog.text


def test_the_library_reports_the_sources_it_was_built_from(prebuilt):
    lib = ctypes.CDLL(str(prebuilt / build.PREBUILT_NAME))
    assert abi.mismatch(lib) is None
    assert lib.day0_source_digest().decode() == build.source_digest() and lib.day0_cpu_supported() == 1
    assert lib.day0_struct_size(len(abi.STRUCTS)) == -1  # past the last mirrored struct
