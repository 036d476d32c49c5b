"""The version lock: the locked variables that are set, one run's lock flattened, two locks' differences first."""

from __future__ import annotations

from contract.version_lock import LOCKED_ENV_VARS, flatten_lock, lock_diff, locked_environment


def test_only_locked_variables_that_are_set_are_recorded() -> None:
    env = {"OMP_NUM_THREADS": "4", "LD_PRELOAD": "/usr/lib/libjemalloc.so.2", "HOME": "/root", "DAY0_API_KEY": "x"}
    assert locked_environment(env) == {"OMP_NUM_THREADS": "4", "LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}
    assert "MKL_NUM_THREADS" in LOCKED_ENV_VARS and "HOME" not in LOCKED_ENV_VARS


def test_a_lock_flattens_engine_environment_packages_and_host() -> None:
    serve = {"engine": {"name": "vllm", "version": "0.32.0", "reported_version": "0.32.0",
                        "command": ["vllm", "serve", "/m dir", "--port", "8100"], "environment": {"OMP_NUM_THREADS": "8"}}}
    env = {"torch": "2.9.0", "python": "3.11.7", "device": "cpu", "cpu_count": 16, "threads": 8,
           "environment": {"MALLOC_CONF": "background_thread:true"}}
    lock = flatten_lock(serve, env)
    assert lock["engine.command"] == "vllm serve '/m dir' --port 8100"  # the exact argv, quoted as a shell would
    assert (lock["engine.env.OMP_NUM_THREADS"], lock["env.MALLOC_CONF"], lock["package.torch"],
            lock["host.cpu_count"], lock["host.threads"]) == ("8", "background_thread:true", "2.9.0", "16", "8")
    assert flatten_lock(None, "not a section") == {"engine.name": "day0", "engine.version": None,
                                                   "engine.reported_version": None, "engine.command": None}


def test_the_diff_names_every_difference_first_and_a_missing_entry_differs() -> None:
    a = flatten_lock({"engine": {"name": "vllm", "environment": {"OMP_NUM_THREADS": "8"}}}, {"torch": "2.9.0"})
    b = flatten_lock({"engine": {"name": "vllm"}}, {"torch": "2.9.0"})
    rows = lock_diff(a, b)
    assert [r[0] for r in rows if r[3]] == ["engine.env.OMP_NUM_THREADS"]
    assert rows[0] == ("engine.env.OMP_NUM_THREADS", "8", None, True)
    assert ("package.torch", "2.9.0", "2.9.0", False) in rows
