from __future__ import annotations

import platform

import pytest
import torch

from agents.pipeline.stages import env
from agents.pipeline.support.context import StageContext
from agents.pipeline.support.environment import dispatch_key_for
from agents.pipeline.support.errors import StageFailed
from contract.sections import section_problems


def _ctx(device: str = "cpu") -> StageContext:
    return StageContext(model_dir=None, config={}, hardware={"slug": "cpu"}, device=device)


def test_env_section_locks_versions_and_device():
    section = env.run(_ctx())
    assert section_problems("env", section) == []
    assert section["torch"] == torch.__version__
    assert section["python"] == platform.python_version()
    assert section["dispatch_key"] == "CPU"
    assert section["device_count"] == 1
    assert section["device"] == section["cpu_model"]
    # the repository is a git checkout here: a 40-hex commit
    assert len(section["runtime_commit"]) == 40 and int(section["runtime_commit"], 16) >= 0


def test_env_section_locks_threads_and_the_locked_variables(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    section = env.run(_ctx())
    assert section["threads"] == torch.get_num_threads()
    assert section["environment"]["MALLOC_ARENA_MAX"] == "2" and "LD_PRELOAD" not in section["environment"]


def test_dispatch_key_of_accelerators():
    assert dispatch_key_for("cuda:1") == "CUDA"
    assert dispatch_key_for("privateuseone") == "PrivateUse1"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without CUDA")
def test_cuda_target_without_cuda_fails_with_a_clear_error():
    with pytest.raises(StageFailed, match="sees no CUDA device"):
        env.run(_ctx("cuda"))


def test_unknown_device_is_named():
    with pytest.raises(StageFailed, match="nonsense"):
        env.run(_ctx("nonsense"))
