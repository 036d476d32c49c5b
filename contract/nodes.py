"""A job over several hosts, as the portal reserves it and the agents run it: how many nodes one job may span,
and the ports its nodes meet at (each stage that runs ranks meets at ``master_port`` plus its own offset, so the
portal hands every multi-node job ``PORTS_PER_JOB`` consecutive ports)."""

from __future__ import annotations

MAX_NODES = 1024
STAGE_PORTS: dict[str, int] = {"load": 0, "serve": 1, "comm": 2}  # ranked stage -> offset from master_port
PORTS_PER_JOB = len(STAGE_PORTS)
