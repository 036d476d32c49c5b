"""The sandbox that runs generated code: network and outside writes refused, limits enforced, temp dir removed."""

from __future__ import annotations

import glob
import os
import tempfile
import time

from contract import sandbox

FAST = sandbox.Limits(wall_s=5.0, cpu_s=3, memory_mb=512)


def test_a_correct_program_passes_and_a_failing_one_fails():
    ok = sandbox.run_python("def f(x):\n    return x + 1\nassert f(1) == 2\n", FAST)
    assert ok.passed and ok.returncode == 0
    bad = sandbox.run_python("assert 1 == 2, 'wrong'\n", FAST)
    assert bad.status == "failed" and "wrong" in bad.stderr_tail


def test_network_refused():
    out = sandbox.run_python("import socket\ns = socket.socket()\ns.connect(('1.1.1.1', 80))\n", FAST)
    assert out.status == "failed" and "refused" in out.stderr_tail


def test_a_write_outside_its_dir_is_refused(tmp_path):
    target = tmp_path / "escaped.txt"
    out = sandbox.run_python(f"open({str(target)!r}, 'w').write('x')\n", FAST)
    assert out.status == "failed" and "outside the sandbox" in out.stderr_tail
    assert not target.exists()
    inside = sandbox.run_python("open('here.txt', 'w').write('x')\nassert open('here.txt').read() == 'x'\n", FAST)
    assert inside.passed
    removal = sandbox.run_python(f"import os\nos.remove({str(tmp_path)!r})\n", FAST)
    assert removal.status == "failed" and tmp_path.exists()


def test_processes_refused():
    out = sandbox.run_python("import subprocess\nsubprocess.run(['true'])\n", FAST)
    assert out.status == "failed" and "refused" in out.stderr_tail


def test_an_infinite_loop_is_killed_within_the_limit():
    t0 = time.perf_counter()
    out = sandbox.run_python("while True:\n    pass\n", sandbox.Limits(wall_s=3.0, cpu_s=1, memory_mb=512))
    assert out.status in ("killed", "timeout") and not out.passed
    assert time.perf_counter() - t0 < 6
    sleeper = sandbox.run_python("import time\ntime.sleep(60)\n", sandbox.Limits(wall_s=1.0, cpu_s=5))
    assert sleeper.status == "timeout" and sleeper.seconds < 4


def test_a_memory_bomb_is_stopped():
    out = sandbox.run_python("x = bytearray(4 * 1024 ** 3)\n", FAST)
    assert not out.passed and "MemoryError" in out.stderr_tail


def test_no_inherited_secrets_and_the_temp_dir_is_removed(monkeypatch):
    monkeypatch.setenv("DAY0_SECRET_TOKEN", "hunter2")
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "day0-sandbox-*")))
    out = sandbox.run_python("import os\nassert 'DAY0_SECRET_TOKEN' not in os.environ\nprint(os.getcwd())\n", FAST)
    assert out.passed
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "day0-sandbox-*"))) == before
