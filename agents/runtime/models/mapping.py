"""Checkpoint names <-> runtime parameters, from a family's mapping declared as data."""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence


class WeightMapping:
    """Rules ``(checkpoint fragment, parameter fragment, shard id)``; ``{e}`` in a checkpoint fragment matches
    an expert index, making the shard id ``(expert, shard)``. The first matching rule wins; no match means the
    names are identical and the shard id is None."""

    def __init__(self, rules: Sequence[tuple[str, str, Hashable]], ignored: Sequence[str] = ()) -> None:
        self.rules = [
            (re.compile(re.escape(ckpt).replace(re.escape("{e}"), r"(?P<e>\d+)")), ckpt, param, shard)
            for ckpt, param, shard in rules
        ]
        self.ignored_patterns = [re.compile(p) for p in ignored]

    def ignored(self, name: str) -> bool:
        return any(p.search(name) for p in self.ignored_patterns)

    def target(self, name: str) -> tuple[str, Hashable]:
        """Checkpoint name -> (parameter name, shard id)."""
        for regex, _ckpt, param, shard in self.rules:
            m = regex.search(name)
            if m:
                sid = (int(m["e"]), shard) if "e" in m.groupdict() else shard
                return name[: m.start()] + param + name[m.end() :], sid
        return name, None

    def checkpoint_name(self, param_name: str, shard: Hashable) -> str:
        """Parameter name and shard id -> the checkpoint name that fills it (inverse of ``target``)."""
        expert, key = shard if isinstance(shard, tuple) else (None, shard)
        for _regex, ckpt, param, rule_shard in self.rules:
            if rule_shard == key and param in param_name:
                return param_name.replace(param, ckpt.replace("{e}", str(expert)), 1)
        return param_name
