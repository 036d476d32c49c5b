"""The eval stage's agent task: a deterministic multi-turn tool environment (a small key-value store) whose
end state is checked. An episode is built from a seed (``random.Random(seed)``): a store of a few keys and one
goal (copy a value, rename a key, add to a number, delete the keys with a prefix). The model acts one tool call
per turn until it calls ``finish`` or runs out of turns; the episode succeeds when the store then equals the
goal's.

Protocol: plain text over ``/v1/completions`` (the same token ids on the served target and the reference). The
transcript shows the tools, one worked example, the task, then ``Action: `` lines the model completes with one
JSON object ``{"tool": NAME, "args": {...}}`` and ``Observation: `` lines the environment writes back. A line
that is not such an object is answered with an error observation and still uses a turn. (The chat endpoint's
``tools`` field is not used, so the task measures the model and the engine, not a tool-call parser.)

Pure: standard library only (no torch, no Django)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

TASK = "agent_kv"
MAX_TURNS = 8
ACTION_MAX_TOKENS = 48
STOP: tuple[str, ...] = ("\n",)
WORDS = ("apple", "river", "stone", "cloud", "maple", "tiger", "lemon", "ocean", "amber", "cedar", "delta", "ember")

TOOLS = """You operate a key-value store through tools. Each turn, write exactly one action as a JSON object on
one line: {"tool": NAME, "args": {...}}. Tools:
- list: {} -> the keys, sorted
- get: {"key": K} -> the value of K
- set: {"key": K, "value": V} -> stores V under K
- delete: {"key": K} -> removes K
- finish: {} -> ends the task (call it when the task is done)

Example task: Copy the value of key "x" to key "y".
Action: {"tool": "get", "args": {"key": "x"}}
Observation: "7"
Action: {"tool": "set", "args": {"key": "y", "value": "7"}}
Observation: "ok"
Action: {"tool": "finish", "args": {}}
Observation: "done"
"""


def _goal(rng: random.Random, store: dict[str, str]) -> tuple[str, dict[str, str]]:
    keys = sorted(store)
    kind = rng.choice(("copy", "rename", "add", "purge"))
    end = dict(store)
    if kind == "copy":
        a, b = rng.sample(keys, 2)
        end[b] = store[a]
        return f'Copy the value of key "{a}" to key "{b}".', end
    if kind == "rename":
        a = rng.choice(keys)
        b = rng.choice([w for w in WORDS if w not in store])
        end[b] = end.pop(a)
        return f'Rename key "{a}" to "{b}" (same value, the old key removed).', end
    if kind == "add":
        a = rng.choice([k for k in keys if store[k].isdigit()])
        n = rng.randint(2, 9)
        end[a] = str(int(store[a]) + n)
        return f'Add {n} to the number stored under key "{a}".', end
    for k in keys:
        if k.startswith("tmp_"):
            del end[k]
    return 'Delete every key whose name starts with "tmp_".', end


@dataclass
class Episode:
    """One episode: its seed, task text, store, the goal's end state, and the turns taken so far."""

    seed: int
    task: str
    store: dict[str, str]
    goal: dict[str, str]
    actions: list[str] = field(default_factory=list)  # canonical actions (JSON) or the raw line when invalid
    observations: list[str] = field(default_factory=list)
    done: bool = False
    truncated: bool = False

    @classmethod
    def from_seed(cls, seed: int) -> Episode:
        rng = random.Random(seed)
        names = rng.sample(WORDS, 3)
        store = {names[0]: str(rng.randint(10, 99)), names[1]: rng.choice(WORDS), names[2]: str(rng.randint(1, 9))}
        for i in range(rng.randint(1, 2)):
            store[f"tmp_{i}"] = rng.choice(WORDS)
        task, goal = _goal(rng, store)
        return cls(seed, task, store, goal)

    def transcript(self) -> str:
        lines = [TOOLS, f"Task: {self.task}"]
        for action, observation in zip(self.actions, self.observations, strict=True):
            lines += [f"Action: {action}", f"Observation: {observation}"]
        return "\n".join(lines) + "\nAction:"  # the model writes " {...}" (no trailing space: BPE puts it on the word)

    def step(self, text: str) -> None:
        """Apply one model output (the line after ``Action:``); an episode that is done takes no more."""
        if self.done:
            raise ValueError(f"episode {self.seed} is done")
        line = text.strip().split("\n", 1)[0].replace("\x00", "\ufffd")  # a NUL cannot travel in the portal's JSON
        action, observation = parse(line)
        if action is None:
            self.actions.append(line)
        else:
            self.actions.append(json.dumps(action, sort_keys=True))
            observation = self._apply(action)
        self.observations.append(json.dumps(observation))
        if (action or {}).get("tool") == "finish" or len(self.actions) >= MAX_TURNS:
            self.done = True

    def _apply(self, action: dict[str, Any]) -> str:
        tool, args = action["tool"], action["args"]
        if tool == "list":
            return ", ".join(sorted(self.store))
        if tool == "finish":
            return "done"
        key = args.get("key")
        if not isinstance(key, str) or not key:
            return "error: args.key must be a non-empty string"
        if tool == "get":
            return self.store.get(key, f"error: no key {key!r}")
        if tool == "delete":
            return "ok" if self.store.pop(key, None) is not None else f"error: no key {key!r}"
        value = args.get("value")
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            return "error: args.value must be a string or a number"
        self.store[key] = str(value)
        return "ok"

    @property
    def success(self) -> bool:
        return self.store == self.goal and not self.truncated


def parse(line: str) -> tuple[dict[str, Any] | None, str]:
    """``({"tool", "args"}, "")`` for a valid action line, else ``(None, error observation)``."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None, "error: the action is not one JSON object on one line"
    if not isinstance(obj, dict) or obj.get("tool") not in ("list", "get", "set", "delete", "finish"):
        return None, "error: unknown tool (list, get, set, delete, finish)"
    args = obj.get("args", {})
    if not isinstance(args, dict):
        return None, "error: args must be an object"
    return {"tool": obj["tool"], "args": args}, ""


def score(reference: list[Episode], target: list[Episode], tolerance: float, min_agreement: float) -> dict[str, Any]:
    """``eval.agent``: success rates of both sides, per-turn agreement (the target's action at turn i equal to the
    reference's at turn i, over the longer trajectory of each episode; a missing turn disagrees), per-episode rows,
    and the verdict: target success ≥ reference success − ``tolerance`` and agreement ≥ ``min_agreement``."""
    agreed = total = 0
    rows = []
    for ref, tgt in zip(reference, target, strict=True):
        turns = max(len(ref.actions), len(tgt.actions))
        same = sum(1 for i in range(min(len(ref.actions), len(tgt.actions))) if ref.actions[i] == tgt.actions[i])
        agreed += same
        total += turns
        rows.append({"seed": ref.seed, "task": ref.task, "reference": ref.success, "target": tgt.success,
                     "turns": {"reference": len(ref.actions), "target": len(tgt.actions)},
                     "turn_agreement": same / turns if turns else 1.0,
                     "actions": {"reference": ref.actions, "target": tgt.actions}})
    n = len(reference)
    ref_rate = sum(e.success for e in reference) / n if n else 0.0
    tgt_rate = sum(e.success for e in target) / n if n else 0.0
    agreement = agreed / total if total else 1.0
    return {
        "task": TASK,
        "episodes": n,
        "max_turns": MAX_TURNS,
        "success": {"reference": ref_rate, "target": tgt_rate},
        "turn_agreement": agreement,
        "tolerance": tolerance,
        "min_turn_agreement": min_agreement,
        "passed": tgt_rate + 1e-9 >= ref_rate - tolerance and agreement + 1e-9 >= min_agreement,
        "per_episode": rows,
    }
