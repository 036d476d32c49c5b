"""``day0 serve --bind-threads``: the engine thread's OpenMP team pinned one thread to a core, when (auto) the team
has exactly the process's CPUs, and never otherwise; the pinning itself checked in a fresh process."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents.runtime import kernels
from agents.runtime.threads import plan_binding, plan_rank_threads

REPO = Path(__file__).resolve().parents[2]


def test_auto_pins_only_a_team_that_has_exactly_the_processs_cpus():
    assert plan_binding(None, 2, [3, 1]) == ([1, 3], "2 threads pinned to CPUs 1,3")
    cpus, said = plan_binding(None, 1, [0, 1])  # the cores are shared (the suite runs many such processes)
    assert cpus is None and "1 threads share the 2 CPUs" in said
    cpus, said = plan_binding(None, 4, [0, 1])
    assert cpus is None and "oversubscribed" in said


def test_asked_for_it_pins_to_the_first_cpus_and_off_never_pins():
    assert plan_binding(True, 2, [5, 4, 7, 6])[0] == [4, 5]
    assert plan_binding(True, 3, [0, 1])[0] is None  # more threads than CPUs: never
    assert plan_binding(False, 2, [0, 1]) == (None, "not pinned (--no-bind-threads)")
    assert plan_binding(None, 0, [0])[0] is None and plan_binding(None, 2, [])[0] is None


PIN = """
import json, os, sys, torch
from agents.runtime import kernels
cpus = json.loads(sys.argv[1])
torch.set_num_threads(len(cpus))
ok = kernels.bind_threads(cpus)
torch.randn(512, 512) @ torch.randn(512, 512)  # torch's own parallel region: the same team
masks = []
for task in sorted(os.listdir("/proc/self/task")):
    with open(f"/proc/self/task/{task}/status") as fh:
        line = next(x for x in fh if x.startswith("Cpus_allowed_list"))
    masks.append(line.split()[1])
print(json.dumps({"ok": ok, "main": sorted(os.sched_getaffinity(0)), "masks": masks}))
"""


@pytest.mark.skipif(not kernels.available(), reason="native kernels not built here")
def test_bind_threads_pins_the_callers_team_one_thread_a_cpu_in_a_fresh_process():
    allowed = sorted(os.sched_getaffinity(0))
    cpus = allowed[:2] if len(allowed) >= 2 else allowed[:1]
    out = subprocess.run([sys.executable, "-c", PIN, json.dumps(cpus)], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["ok"] is True
    assert result["main"] == [cpus[0]]  # the caller is thread 0
    for cpu in cpus:  # every team thread has exactly one CPU of the list; torch's region reused the team
        assert str(cpu) in result["masks"]
    assert kernels.bind_threads([]) is False


def test_day0_serve_takes_bind_threads():
    from agents.runtime.commands.serve import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    assert parser.parse_args(["serve", "m"]).bind_threads is None  # auto
    assert parser.parse_args(["serve", "m", "--bind-threads"]).bind_threads is True
    assert parser.parse_args(["serve", "m", "--no-bind-threads"]).bind_threads is False
    assert parser.parse_args(["serve", "m", "--tp", "2", "--bind-threads"]).bind_threads is True  # per rank


def test_the_ranks_on_a_host_split_its_cpus_into_contiguous_shares_of_their_own():
    assert [plan_rank_threads([1, 0], None, 2, r) for r in (0, 1)] == [([0], 1, True), ([1], 1, True)]
    five = [plan_rank_threads([4, 3, 2, 1, 0], None, 2, r) for r in (0, 1)]  # the first share one longer
    assert five == [([0, 1, 2], 3, True), ([3, 4], 2, True)]
    # OMP_NUM_THREADS is the whole server's: its first CPUs, cut between the ranks
    assert [plan_rank_threads(list(range(8)), 4, 2, r)[0] for r in (0, 1)] == [[0, 1], [2, 3]]
    assert [plan_rank_threads(list(range(8)), 4, 4, r)[0] for r in range(4)] == [[0], [1], [2], [3]]
    assert plan_rank_threads([0, 1, 2], 9, 3, 2) == ([2], 1, True)  # more asked than there are: all of them
    # fewer CPUs than ranks: shared by all, one thread each, never pinned (not own)
    assert plan_rank_threads([0, 1], None, 3, 2) == ([0, 1], 1, False)
    assert plan_rank_threads([0, 1], 1, 2, 0) == ([0], 1, False)
    assert plan_rank_threads([0, 1], None, 1, 0) == ([0, 1], 2, True)
    with pytest.raises(ValueError, match="local rank 2 is not one of the 2 ranks"):
        plan_rank_threads([0, 1], None, 2, 2)
