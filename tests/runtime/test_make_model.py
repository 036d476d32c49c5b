"""make_model: deterministic, hub-like layout, a working tokenizer and chat template, a safe cache."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agents.runtime.testing.make_model import cached_model, make_model


def _digests(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.glob("*.safetensors"))}


def test_same_seed_gives_byte_identical_shards_and_another_seed_differs(tmp_path: Path) -> None:
    a = make_model("qwen3-moe", "tiny", 3, tmp_path / "a")
    b = make_model("qwen3-moe", "tiny", 3, tmp_path / "b")
    c = make_model("qwen3-moe", "tiny", 4, tmp_path / "c")
    assert _digests(a) == _digests(b)
    assert len(_digests(a)) >= 2
    assert _digests(a) != _digests(c)
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("arch", ["llama", "qwen3", "mixtral", "qwen3-moe", "deepseek-v3"])
def test_layout_is_a_sharded_hub_repository(arch: str) -> None:
    path = cached_model(arch)
    config = json.loads((path / "config.json").read_text())
    index = json.loads((path / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) >= 2
    assert all((path / shard).is_file() for shard in shards)
    assert 2 <= config["num_hidden_layers"] <= 4 and 512 <= config["vocab_size"] <= 1024
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (path / name).is_file(), name
    tok_config = json.loads((path / "tokenizer_config.json").read_text())
    assert "im_start" in tok_config["chat_template"]


def test_deepseek_config_has_mla_groups_shared_expert_and_a_dense_first_layer() -> None:
    config = json.loads((cached_model("deepseek-v3") / "config.json").read_text())
    assert config["first_k_dense_replace"] == 1 and config["n_shared_experts"] == 1
    assert config["n_group"] > config["topk_group"] >= 1 and config["kv_lora_rank"] > 0
    assert config["num_key_value_heads"] == config["num_attention_heads"]
    weights = json.loads((cached_model("deepseek-v3") / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in weights
    assert "model.layers.0.mlp.gate_proj.weight" in weights  # the dense first layer


def test_tokenizer_round_trips_and_ids_match_the_config() -> None:
    from transformers import AutoTokenizer

    path = cached_model("llama")
    config = json.loads((path / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(path)
    assert (tok.bos_token_id, tok.eos_token_id) == (config["bos_token_id"], config["eos_token_id"])
    assert len(tok) == config["vocab_size"]
    text = "The harbour woke at 7:30 — naïve café, 42 + x!"
    ids = tok(text)["input_ids"]
    assert ids[0] == config["bos_token_id"]
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_chat_template_renders_chatml_turns() -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(cached_model("llama"))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<s><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_cached_model_builds_once_when_two_processes_ask(tmp_path: Path) -> None:
    code = (
        "from agents.runtime.testing.make_model import cached_model; "
        "p = cached_model('llama', seed=7); print(p, (p / 'config.json').stat().st_mtime_ns)"
    )
    env = {"DAY0_TEST_MODELS_DIR": str(tmp_path), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[2]) for _ in range(2)]
    outs = [proc.communicate(timeout=120)[0].strip() for proc in procs]
    assert all(proc.returncode == 0 for proc in procs)
    assert outs[0] == outs[1]  # same directory, same build (the second waited and reused it)
    built = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert len(built) == 1 and not [p for p in tmp_path.iterdir() if p.is_dir() and p.name.startswith(".")]


def test_unknown_arch_and_non_empty_out_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown arch 'gpt2'"):
        make_model("gpt2", "tiny", 0, tmp_path / "x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):
        make_model("llama", "tiny", 0, tmp_path / "full")


def test_cli_builds_a_model(tmp_path: Path) -> None:
    from day0cli.main import main

    assert main(["make-model", "--arch", "mixtral", "--size", "tiny", "--seed", "1", "--out", str(tmp_path / "m")]) == 0
    assert (tmp_path / "m" / "model.safetensors.index.json").is_file()


@pytest.mark.parametrize("arch", ["llama", "qwen3", "mixtral", "qwen3-moe", "deepseek-v3"])
def test_100m_configs_have_about_100m_parameters(arch: str) -> None:
    import torch
    import transformers

    from agents.runtime.testing.configs import model_config

    cfg = model_config(arch, "100m")
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):  # shapes only, no memory, no init
        model = getattr(transformers, config.architectures[0])(config)
    total = sum(p.numel() for p in model.parameters())
    assert 90e6 <= total <= 120e6, total


@pytest.mark.slow
def test_100m_llama_builds_with_a_32k_vocabulary(tmp_path: Path) -> None:
    path = make_model("llama", "100m", 0, tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    assert config["vocab_size"] == 32000
    assert len(set(json.loads((path / "model.safetensors.index.json").read_text())["weight_map"].values())) >= 2
