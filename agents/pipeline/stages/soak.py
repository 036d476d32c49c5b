"""The ``soak`` stage: sustained mixed load against the served model for a set duration, with abnormal requests
mixed in (an oversized prompt, a malformed body, a client that disconnects mid-stream) and one injected
process-level failure (the server killed with SIGKILL) that the stage's supervisor must recover from.

Per window it records output tokens/s, the server's resident memory (its process tree) and KV-cache blocks in
use (``/metrics``). It passes when the memory slope of the final server process stays under
``max_memory_slope`` bytes/s, the last window's throughput is at least ``min_throughput_ratio`` of the first's,
nothing crashed besides the injected kill, abnormal requests were refused with a 4xx (never a 5xx or a dead
server), and readiness came back within ``recover_timeout`` seconds (``recover_seconds``)."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.server import start_server, stop_server
from agents.pipeline.support.server_process import ServerProcess

DEFAULTS: dict[str, Any] = {
    "seconds": 60.0,  # hours on a real host; about a minute in tests
    "window_seconds": 10.0,
    "concurrency": 2,
    "max_tokens": 16,
    "prompt_words": 24,
    "abnormal_every": 4,  # every Nth request of a client is abnormal
    "kill_at": 0.4,  # the fraction of the run at which the server is killed (None: no injected failure)
    "ready_timeout": 600.0,
    "recover_timeout": 180.0,
    "max_memory_slope": 1024.0 * 1024.0,  # bytes/s of the last server process
    "min_throughput_ratio": 0.95,
}
# key -> (lowest, highest): the job's ``bench.soak`` options are checked before anything starts
BOUNDS: dict[str, tuple[float, float]] = {
    "seconds": (1.0, 7 * 86_400.0), "window_seconds": (0.5, 86_400.0), "concurrency": (1, 256),
    "max_tokens": (1, 4096), "prompt_words": (1, 4096), "abnormal_every": (0, 1_000_000), "kill_at": (0.0, 0.95),
    "ready_timeout": (1.0, 86_400.0), "recover_timeout": (1.0, 86_400.0), "max_memory_slope": (0.0, 1e12),
    "min_throughput_ratio": (0.0, 1.0),
}
ABNORMAL_KINDS = ("oversized", "malformed", "disconnect")


def soak_settings(options: Any) -> dict[str, Any]:
    """``DEFAULTS`` with the job's options; an unknown key or a value out of its bound is a StageFailed naming it."""
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise StageFailed(f"soak options must be an object, got {type(options).__name__}")
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise StageFailed(f"soak: unknown option(s) {', '.join(unknown)}; options are {', '.join(DEFAULTS)}")
    settings = {**DEFAULTS, **options}
    for key, (low, high) in BOUNDS.items():
        value = settings[key]
        if key == "kill_at" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
            raise StageFailed(f"soak: {key} must be a number from {low:g} to {high:g}, got {value!r}")
    if settings["window_seconds"] > settings["seconds"]:
        raise StageFailed(f"soak: window_seconds ({settings['window_seconds']:g}) exceeds seconds "
                          f"({settings['seconds']:g})")
    return settings
_KV_RE = re.compile(r"^day0:kv_blocks_used(?:\{[^}]*\})?\s+([0-9.eE+-]+)$", re.M)


def rss_bytes(pid: int) -> int | None:
    """Resident memory of ``pid`` and its children (tensor-parallel ranks), or None once it is gone."""
    try:
        import psutil

        proc = psutil.Process(pid)
        return proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(recursive=True))
    except ImportError:
        pass
    except Exception:  # psutil.NoSuchProcess and friends: the process is gone
        return None
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def memory_slope(samples: list[tuple[float, int]]) -> float:
    """Least-squares slope, bytes per second, of ``(t, rss)`` samples (0 for fewer than two)."""
    if len(samples) < 2:
        return 0.0
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_m = sum(m for _, m in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    return 0.0 if var == 0 else sum((t - mean_t) * (m - mean_m) for t, m in samples) / var


@dataclass
class Supervisor:
    """Keeps one server up: watches its process, restarts it when it exits, and records every exit (the
    injected kill, or a crash) and how long readiness took to return."""

    ctx: StageContext
    recover_timeout: float
    server: ServerProcess | None = None
    generation: int = 0  # bumped on each (re)start: samples of another process are not one memory series
    exits: list[dict[str, Any]] = field(default_factory=list)
    recover_seconds: float | None = None
    gave_up: str | None = None
    injected_at: float | None = None
    ready: threading.Event = field(default_factory=threading.Event)  # cleared from an exit until ready again
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str | None:
        return self.server.url if self.server is not None and self.gave_up is None else None

    @property
    def up(self) -> bool:
        return (self.ready.is_set() and self.server is not None and self.server.proc.poll() is None
                and self.gave_up is None)

    def kill(self) -> None:
        """The injected failure: SIGKILL, no chance to clean up."""
        with self._lock:
            self.injected_at = time.monotonic()
            os.kill(self.server.proc.pid, signal.SIGKILL)

    def watch(self) -> None:
        while not self._stop.wait(0.1):
            if self.server.proc.poll() is None:
                continue
            self.ready.clear()
            down_at = time.monotonic()
            injected = self.injected_at is not None and not any(e["injected"] for e in self.exits)
            self.exits.append({"t": down_at, "code": self.server.proc.returncode, "injected": injected})
            self.server.stop()
            started = self.injected_at if injected else down_at
            try:
                self.server = start_server(self.ctx)
                self.generation += 1
                remaining = self.recover_timeout - (time.monotonic() - started)
                self.server.wait_ready(max(remaining, 0.0) + (time.monotonic() - self.server.started), None)
            except StageFailed as exc:
                self.gave_up = (f"the server did not come back within {self.recover_timeout:g} s after "
                                f"{'the injected kill' if injected else 'a crash'}: {str(exc)[:500]}")
                return
            if injected:
                self.recover_seconds = round(time.monotonic() - started, 3)
            self.ready.set()

    def stop(self) -> None:
        self._stop.set()


@dataclass
class Tally:
    """What the clients saw, per window and in all."""

    tokens: int = 0
    requests: int = 0
    errors: list[str] = field(default_factory=list)  # failures outside the outage
    abnormal: dict[str, dict[str, int]] = field(default_factory=lambda: {k: {"sent": 0, "refused_cleanly": 0}
                                                                         for k in ABNORMAL_KINDS})
    lock: threading.Lock = field(default_factory=threading.Lock)


def _stream_tokens(client: Any, url: str, body: dict[str, Any], *, disconnect: bool = False) -> int:
    """Chunks of a streamed completion (one token each); ``disconnect`` closes after the first."""
    count = 0
    with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.read()[:200]!r}")
        for line in response.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            count += 1
            if disconnect:
                break
    return count


def _client_loop(sup: Supervisor, tally: Tally, settings: dict[str, Any], model: str, index: int,
                 stop: threading.Event) -> None:
    import httpx

    words = " ".join(f"w{(index * 7 + i) % 97}" for i in range(int(settings["prompt_words"])))
    body = {"model": model, "prompt": words, "max_tokens": int(settings["max_tokens"]), "temperature": 0.0,
            "stream": True, "ignore_eos": True}
    n = 0
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            url = sup.url
            if url is None or not sup.up:
                sup.ready.wait(0.2)
                continue
            n += 1
            every = int(settings["abnormal_every"])
            kind = ABNORMAL_KINDS[(n // every) % len(ABNORMAL_KINDS)] if every and n % every == 0 else None
            generation = sup.generation
            try:
                if kind is None:
                    tokens = _stream_tokens(client, url, body)
                    with tally.lock:
                        tally.tokens += tokens
                        tally.requests += 1
                    continue
                if kind == "disconnect":
                    _stream_tokens(client, url, dict(body, max_tokens=256), disconnect=True)
                    clean = True
                else:
                    payload = (b'{"model": "x", "prompt": ' if kind == "malformed"
                               else json.dumps(dict(body, stream=False, prompt="tok " * 200_000)).encode())
                    answer = client.post(f"{url}/v1/completions", content=payload,
                                         headers={"Content-Type": "application/json"})
                    clean = 400 <= answer.status_code < 500
                    if not clean:
                        raise RuntimeError(f"{kind} request answered HTTP {answer.status_code}")
                with tally.lock:  # counted once answered: a request cut by the outage is neither
                    tally.abnormal[kind]["sent"] += 1
                    tally.abnormal[kind]["refused_cleanly"] += int(clean)
            except (httpx.HTTPError, RuntimeError) as exc:
                if sup.generation != generation or not sup.up or sup.injected_at and not sup.exits:
                    continue  # the server went down under this request: the outage, not an error
                with tally.lock:
                    tally.errors.append(f"{kind or 'normal'}: {type(exc).__name__}: {str(exc)[:200]}")
                    if kind is not None:
                        tally.abnormal[kind]["sent"] += 1


def _kv_blocks_used(url: str) -> float | None:
    import httpx

    try:
        match = _KV_RE.search(httpx.get(f"{url}/metrics", timeout=5).text)
    except httpx.HTTPError:
        return None
    return float(match.group(1)) if match else None


def device_memory(url: str | None) -> dict[str, Any] | None:
    """The server's ``/stats/memory``: on CUDA torch's allocator counters; on CPU ``source`` says
    "cpu: process RSS" (there is no device memory to sample); None when it does not answer."""
    import httpx

    if url is None:
        return None
    try:
        r = httpx.get(f"{url}/stats/memory", timeout=5)
        return r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def _device_row(memory: dict[str, Any] | None) -> dict[str, Any]:
    memory = memory or {}
    return {"device_allocated_bytes": memory.get("allocated_bytes"),
            "device_max_allocated_bytes": memory.get("max_allocated_bytes")}


def run(ctx: StageContext) -> dict[str, Any]:
    """The soak section: seconds, passed, windows [{t, output_tok_s, rss_bytes, kv_blocks_used,
    device_allocated_bytes, device_max_allocated_bytes, outage}], memory_slope, device_memory (its source, and
    on CUDA the slope of allocated bytes), crashes, recover_seconds, abnormal, thresholds, reasons."""
    settings = soak_settings(ctx.bench.get("soak"))
    seconds, window = float(settings["seconds"]), float(settings["window_seconds"])
    server = ctx.state.server
    if server is None or server.proc.poll() is not None:
        server = start_server(ctx)
    ready_seconds = server.wait_ready(float(settings["ready_timeout"]), ctx)
    sup = Supervisor(ctx, float(settings["recover_timeout"]), server=server)
    sup.ready.set()
    watcher = threading.Thread(target=sup.watch, name="soak-supervisor", daemon=True)
    watcher.start()
    tally, stop = Tally(), threading.Event()
    model = ctx.config.get("_name_or_path") or "model"
    try:
        import httpx

        model = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]["id"]
    except Exception:  # the server answers with its own name; a guess is only a fallback
        pass
    clients = [threading.Thread(target=_client_loop, args=(sup, tally, settings, model, i, stop), daemon=True)
               for i in range(int(settings["concurrency"]))]
    for c in clients:
        c.start()
    windows: list[dict[str, Any]] = []
    samples: dict[int, list[tuple[float, int]]] = {}
    device: dict[str, Any] = {"source": None, "samples": {}}  # samples: generation -> [(t, allocated bytes)]
    start = time.monotonic()
    kill_at = None if settings["kill_at"] is None else start + float(settings["kill_at"]) * seconds
    last_tokens, last_t = 0, start
    try:
        while (now := time.monotonic()) < start + seconds and sup.gave_up is None:
            ctx.check_cancelled()
            if kill_at is not None and now >= kill_at and sup.injected_at is None:
                sup.kill()
                ctx.emit("log", f"soak: killed the server (pid {sup.server.proc.pid}) at {now - start:.1f} s")
            if sup.up:
                rss = rss_bytes(sup.server.proc.pid)
                if rss is not None:
                    samples.setdefault(sup.generation, []).append((now - start, rss))
            if now - last_t >= window:
                with tally.lock:
                    tokens = tally.tokens
                outage = bool(sup.injected_at and sup.recover_seconds is None) or not sup.up
                memory = device_memory(sup.url) if sup.up else None
                if memory is not None:
                    device["source"] = device["source"] or memory.get("source")
                    if memory.get("allocated_bytes") is not None:
                        device["samples"].setdefault(sup.generation, []).append(
                            (now - start, int(memory["allocated_bytes"])))
                row = {"t": round(now - start, 3), "output_tok_s": round((tokens - last_tokens) / (now - last_t), 3),
                       "rss_bytes": rss_bytes(sup.server.proc.pid) if sup.up else None,
                       "kv_blocks_used": _kv_blocks_used(sup.url) if sup.up else None, **_device_row(memory),
                       "outage": outage}
                windows.append(row)
                ctx.emit("progress", f"soak: {row['t']:.0f}/{seconds:.0f} s, {row['output_tok_s']:.1f} tok/s",
                         data={"done": int(row["t"]), "total": int(seconds), "what": "soak", "window": row})
                last_tokens, last_t = tokens, now
            time.sleep(min(0.5, window / 4))
    finally:
        stop.set()
        for c in clients:
            c.join(timeout=70)
        sup.stop()
        watcher.join(timeout=float(settings["recover_timeout"]) + 30)
        ctx.state.server = sup.server
        stop_server(ctx)
    return judge(settings, windows, samples, sup, tally, ready_seconds, time.monotonic() - start, device)


def _warm_slope(samples: dict[int, list[tuple[float, int]]]) -> tuple[float, int]:
    """The memory slope of the last server process's second half of samples (the first half is its warm-up:
    pools, caches), and how many samples that is."""
    final = samples.get(max(samples), []) if samples else []
    warm = final[len(final) // 2:]
    return memory_slope(warm), len(warm)


def judge(settings: dict[str, Any], windows: list[dict[str, Any]], samples: dict[int, list[tuple[float, int]]],
          sup: Supervisor, tally: Tally, ready_seconds: float, elapsed: float,
          device: dict[str, Any] | None = None) -> dict[str, Any]:
    reasons: list[str] = []
    limit = float(settings["max_memory_slope"])
    slope, n_warm = _warm_slope(samples)
    if slope > limit:
        reasons.append(f"memory grows {slope / 1024:.0f} KiB/s over {n_warm} samples of the server "
                       f"(limit {limit / 1024:.0f} KiB/s)")
    device = device or {"source": None, "samples": {}}
    device_block: dict[str, Any] = {"source": device["source"]}
    if device["samples"]:  # CUDA: torch's allocated bytes of the server, judged like its resident memory
        device_slope, n_device = _warm_slope(device["samples"])
        device_block["memory_slope"] = round(device_slope, 3)
        if device_slope > limit:
            reasons.append(f"device memory grows {device_slope / 1024:.0f} KiB/s over {n_device} samples of the "
                           f"server (limit {limit / 1024:.0f} KiB/s)")
    elif device["source"] == "cpu: process RSS":
        device_block["note"] = "no device memory on CPU: the server's memory is its process RSS (rss_bytes)"
    steady = [w for w in windows if not w["outage"]]
    ratio = None
    if len(steady) >= 2 and steady[0]["output_tok_s"] > 0:
        ratio = steady[-1]["output_tok_s"] / steady[0]["output_tok_s"]
        if ratio < float(settings["min_throughput_ratio"]):
            reasons.append(f"last window's throughput {steady[-1]['output_tok_s']:.1f} tok/s is {ratio:.0%} of the "
                           f"first's {steady[0]['output_tok_s']:.1f} (at least "
                           f"{float(settings['min_throughput_ratio']):.0%})")
    else:
        reasons.append(f"too few windows with throughput to compare ({len(steady)})")
    crashes = sum(1 for e in sup.exits if not e["injected"])
    if crashes:
        reasons.append(f"{crashes} crash(es) besides the injected kill (exit codes "
                       f"{[e['code'] for e in sup.exits if not e['injected']]})")
    if sup.gave_up:
        reasons.append(sup.gave_up)
    elif settings["kill_at"] is not None and sup.recover_seconds is None:
        reasons.append("the server was not ready again after the injected kill before the run ended")
    if tally.errors:
        reasons.append(f"{len(tally.errors)} request(s) failed outside the outage, first: {tally.errors[0]}")
    unclean = {k: v for k, v in tally.abnormal.items() if v["sent"] and v["refused_cleanly"] < v["sent"]}
    if unclean:
        reasons.append(f"abnormal requests not handled cleanly: {unclean}")
    return {"seconds": round(elapsed, 3), "passed": not reasons, "windows": windows,
            "memory_slope": round(slope, 3), "device_memory": device_block, "crashes": crashes, "recover_seconds": sup.recover_seconds,
            "ready_seconds": round(ready_seconds, 3), "throughput_ratio": None if ratio is None else round(ratio, 4),
            "requests": tally.requests, "abnormal": tally.abnormal, "errors": tally.errors[:20],
            "injected": [{"code": e["code"], "injected": e["injected"]} for e in sup.exits],
            "thresholds": {k: settings[k] for k in ("max_memory_slope", "min_throughput_ratio", "recover_timeout")},
            "reasons": reasons}
