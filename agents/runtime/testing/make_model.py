"""Random-weight test models built with ``transformers`` from small configs, saved like a hub repository:
config.json, sharded safetensors with an index, tokenizer.json, tokenizer_config.json (chat template),
generation_config.json. Deterministic for a seed; ``cached_model`` builds each once per builder version."""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents.runtime.testing import tokenizer as tokmod
from agents.runtime.testing.configs import ARCHES, SIZES, model_config

REPO_ROOT = Path(__file__).resolve().parents[3]
_BUILDER_FILES = ("make_model.py", "configs.py", "tokenizer.py", "corpus.py")


def builder_version() -> str:
    """A short hash of the builder's source and of the libraries that shape its output (torch's RNG and init,
    transformers' modeling and saving, tokenizers' trainer): a change to any of them invalidates the cache."""
    digest = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for name in _BUILDER_FILES:
        digest.update((here / name).read_bytes())
    for package in ("torch", "transformers", "tokenizers", "safetensors"):
        digest.update(f"{package}=={importlib.metadata.version(package)}".encode())
    return digest.hexdigest()[:10]


def _check(arch: str, size: str) -> None:
    if arch not in ARCHES:
        raise ValueError(f"unknown arch {arch!r}; expected one of {', '.join(ARCHES)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {', '.join(SIZES)}")


def _shard_size(total_bytes: int) -> int:
    # About a third of the model per shard: at least two shards (and an index) even for tiny models.
    return max(total_bytes // 3 + 1, 1024)


def make_model(arch: str, size: str = "tiny", seed: int = 0, out: Path | str = Path("model")) -> Path:
    """Build a random-weight ``arch`` model of ``size`` into ``out`` (created; must be empty if it exists)."""
    _check(arch, size)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"output directory {out} is not empty")
    out.mkdir(parents=True, exist_ok=True)

    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    cfg: dict[str, Any] = model_config(arch, size)
    text_cfg = cfg.get("text_config", cfg)  # a vision-language model nests its decoder's config
    tok = tokmod.train_tokenizer(text_cfg["vocab_size"])
    if "vision_config" in cfg:
        tokens = _vision_tokens(cfg["model_type"])
        tok.add_special_tokens(list(tokens.values()))
        cfg.update({key: tok.token_to_id(token) for key, token in tokens.items()})
    text_cfg["vocab_size"] = tok.get_vocab_size()
    for c in {id(cfg): cfg, id(text_cfg): text_cfg}.values():
        c.update(bos_token_id=tokmod.BOS_ID, eos_token_id=tokmod.EOS_ID, pad_token_id=tokmod.PAD_ID)

    config_cls = transformers.AutoConfig.for_model(cfg.pop("model_type")).__class__
    config = config_cls(**cfg)
    text_config = config.get_text_config()
    model_cls = getattr(transformers, config.architectures[0])
    torch.manual_seed(seed)
    with torch.device("cpu"):
        model = model_cls(config).to(torch.float32).eval()
    _perturb_constant_initialised(model, seed)
    total_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    model.save_pretrained(out, max_shard_size=_shard_size(total_bytes))
    model.generation_config.save_pretrained(out)
    tokmod.save_tokenizer(tok, out, model_max_length=text_config.max_position_embeddings)
    if "vision_config" in cfg:
        _save_vision_processor(out, config)
    if not (out / "model.safetensors.index.json").exists():
        raise RuntimeError(f"save_pretrained wrote no shard index in {out}")
    for path in out.iterdir():
        path.chmod(0o644)  # shared caches: readable by every user
    return out


IMAGE_TOKEN = "<image>"
# Qwen2-VL / Qwen2.5-VL / Qwen3-VL: an image is <|vision_start|> + one <|image_pad|> per merged patch + <|vision_end|>
QWEN_VISION_TOKENS: dict[str, str] = {
    "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>",
    "image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
}
QWEN_IMAGE_TEXT = "<|vision_start|><|image_pad|><|vision_end|>"
QWEN_PIXELS = (32 * 32, 64 * 64)  # min and max pixels after resizing: 4 to 16 image tokens per image


def _vision_tokens(model_type: str) -> dict[str, str]:
    """config key -> special token text of a vision-language model's image tokens."""
    if model_type == "llava":
        return {"image_token_index": IMAGE_TOKEN}
    if model_type in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):
        return dict(QWEN_VISION_TOKENS)
    raise ValueError(f"no image tokens defined for model_type {model_type!r}")


def _add_special_tokens(out: Path, tokens: dict[int, str]) -> None:
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    for token_id, text in tokens.items():
        tok_config["added_tokens_decoder"][str(token_id)] = {
            "content": text, "special": True, "lstrip": False, "rstrip": False, "normalized": False,
            "single_word": False,
        }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2, sort_keys=True) + "\n")


def _set_chat_template(out: Path, template: str) -> None:
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps({**tok_config, "chat_template": template}, indent=2,
                                                          sort_keys=True) + "\n")


def _save_vision_processor(out: Path, config: Any) -> None:
    """The image processor's preprocessor_config.json, the processor's own config where transformers can build
    it here, the image tokens in tokenizer_config.json and the chat template with image placeholders."""
    if config.model_type == "llava":
        _save_llava_processor(out, config)
    else:
        _save_qwen_vl_processor(out, config)


def _save_llava_processor(out: Path, config: Any) -> None:
    """preprocessor_config.json (a Pillow CLIP or SigLIP image processor: resize (and centre crop for CLIP),
    normalise to the vision tower's input size), processor_config.json (LlavaProcessor: patch size, CLS dropped
    or not) and the chat template with image placeholders in tokenizer_config.json."""
    import transformers

    vision = config.vision_config
    side = vision.image_size
    if vision.model_type == "siglip_vision_model":  # no CLS token: every patch is an image token
        images = transformers.SiglipImageProcessorPil(size={"height": side, "width": side})
        extra_tokens = 0
    else:
        images = transformers.CLIPImageProcessorPil(
            size={"shortest_edge": side}, crop_size={"height": side, "width": side}, do_center_crop=True,
        )
        extra_tokens = 1
    _add_special_tokens(out, {config.image_token_index: IMAGE_TOKEN})
    _set_chat_template(out, _vlm_template(IMAGE_TOKEN))
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    processor = transformers.LlavaProcessor(
        image_processor=images, tokenizer=tokenizer, patch_size=vision.patch_size,
        vision_feature_select_strategy=config.vision_feature_select_strategy, image_token=IMAGE_TOKEN,
        num_additional_image_tokens=extra_tokens, chat_template=_vlm_template(IMAGE_TOKEN),
    )
    processor.save_pretrained(out)
    # the processor's save writes the template beside the tokenizer's files; the runtime reads tokenizer_config
    _set_chat_template(out, _vlm_template(IMAGE_TOKEN))


def _save_qwen_vl_processor(out: Path, config: Any) -> None:
    """preprocessor_config.json of the Pillow Qwen2-VL image processor (dynamic resolution between
    ``QWEN_PIXELS``, the vision tower's patch, frame and merge sizes), naming the model's processor class as hub
    repositories do. transformers' Qwen processor itself needs a video processor, which needs torchvision, so no
    processor_config.json: the runtime composes the image processor and the tokenizer (server/images.py)."""
    import transformers

    vision = config.vision_config
    images = transformers.Qwen2VLImageProcessorPil(
        patch_size=vision.patch_size, temporal_patch_size=vision.temporal_patch_size,
        merge_size=vision.spatial_merge_size, min_pixels=QWEN_PIXELS[0], max_pixels=QWEN_PIXELS[1],
    )
    images.save_pretrained(out)
    pre = json.loads((out / "preprocessor_config.json").read_text())
    pre["processor_class"] = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor",
                              "qwen3_vl": "Qwen3VLProcessor"}[config.model_type]
    (out / "preprocessor_config.json").write_text(json.dumps(pre, indent=2, sort_keys=True) + "\n")
    _add_special_tokens(out, {getattr(config, key): text for key, text in QWEN_VISION_TOKENS.items()})
    _set_chat_template(out, _vlm_template(QWEN_IMAGE_TEXT))


def _vlm_template(image_text: str) -> str:
    part = ("{% for part in message['content'] %}{% if part['type'] == 'image' %}{{ '" + image_text + "' }}"
            "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}")
    content = "{% if message['content'] is string %}{{ message['content'] }}{% else %}" + part + "{% endif %}"
    template = tokmod.CHAT_TEMPLATE.replace(
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}",
        "{{ '<|im_start|>' + message['role'] + '\\n' }}" + content + "{{ '<|im_end|>' + '\\n' }}",
    )
    if template == tokmod.CHAT_TEMPLATE:
        raise RuntimeError("the text chat template changed: the image-part template no longer applies to it")
    return template


def _perturb_constant_initialised(model: Any, seed: int) -> None:
    """Tensors that ``transformers`` initialises to constants (norm weights = 1, routing-score correction
    biases = 0) get small random offsets, so that a runtime ignoring or misplacing one shows up in alignment."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, tensor in sorted([*model.named_parameters(), *model.named_buffers()]):
            if name.endswith("e_score_correction_bias"):
                tensor.copy_(torch.rand(tensor.shape, generator=gen) * 0.1)  # bias: [experts]
            elif "norm" in name and name.endswith(".weight"):
                tensor.add_(torch.randn(tensor.shape, generator=gen) * 0.1)  # weight: [dim], around 1


def models_dir() -> Path:
    env = os.environ.get("DAY0_TEST_MODELS_DIR")
    return Path(env) if env else REPO_ROOT / "var" / "test-models"


def cached_model(arch: str, size: str = "tiny", seed: int = 0) -> Path:
    """The path of a built test model, building it once (atomically, under a file lock) if needed."""
    _check(arch, size)
    root = models_dir()
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{arch}-{size}-s{seed}-{builder_version()}"
    return build_once(final, lambda out: make_model(arch, size, seed, out))


def build_once(final: Path, build: Callable[[Path], object], marker: str = "config.json") -> Path:
    """``final``, made by ``build(out)`` once: in a temporary sibling renamed into place, under a file lock so
    that concurrent processes wait for the first instead of building twice. ``marker``: the file that says it
    is built."""
    if (final / marker).exists():
        return final
    root = final.parent
    with open(root / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process building the same model: wait for it
        if (final / marker).exists():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
        try:
            build(tmp / "m")
            os.rename(tmp / "m", final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def describe(path: Path) -> dict[str, Any]:
    """Architecture, vocab and shard files of a built model (for the CLI's summary)."""
    config = json.loads((path / "config.json").read_text())
    text = config.get("text_config", config)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    return {
        "architecture": config["architectures"][0],
        "vocab_size": text["vocab_size"],
        "layers": text["num_hidden_layers"],
        "shards": sorted(set(index["weight_map"].values())),
        "tensors": len(index["weight_map"]),
    }
