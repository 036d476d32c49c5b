"""Run untrusted generated code (a model's HumanEval completion) in a separate process, confined:

* **no network**: the child runs in a fresh network namespace (``unshare -rn``) when the host allows user
  namespaces, and in every case a guard installed before the program runs refuses socket creation, connect and
  bind through an audit hook (``sys.addaudithook``: a hook cannot be removed once added);
* **files**: the working directory is a fresh temp dir, removed afterwards; the guard refuses opening any file
  for writing, and removing, renaming or creating paths, outside it; starting processes and loading native
  libraries (``ctypes``) are refused too;
* **limits**: CPU seconds (``RLIMIT_CPU``), address space (``RLIMIT_AS``), file size (``RLIMIT_FSIZE``), no core
  files; a wall-clock timeout kills the child's whole process group;
* **environment**: none inherited (a fixed PATH, HOME the temp dir); Python in isolated mode (``-I``: no
  PYTHON* variables, no user site), no bytecode written (``-B``).

This confines mistakes and casual misbehaviour of model output, not a determined attacker with a kernel
exploit; docs/references.md says so.

Standard library only, in ``contract`` so both sides run the same confinement: the agents (the eval stage, the
reference run) and the portal's Celery worker, which re-runs a challenge's code the reference run did not
(``apps.evidence.reruns``); never the web process."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache

_GUARD = r'''
import os, resource, sys
_ROOT = os.path.realpath(sys.argv[1])
_CPU, _MEMORY, _FSIZE = (int(x) for x in sys.argv[2:5])
resource.setrlimit(resource.RLIMIT_CPU, (_CPU, _CPU + 1))
resource.setrlimit(resource.RLIMIT_AS, (_MEMORY, _MEMORY))
resource.setrlimit(resource.RLIMIT_FSIZE, (_FSIZE, _FSIZE))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
_PROGRAM = os.path.join(_ROOT, "program.py")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_PATH_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link",
                "os.symlink", "os.truncate", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile"}
_REFUSED = ("socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.sendto",
            "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
            "os.kill", "os.killpg", "ctypes.dlopen", "ctypes.cdata")

def _inside(path):
    try:
        path = os.fsdecode(path) if not isinstance(path, int) else None
    except TypeError:
        return False
    if path is None:
        return True  # a file descriptor already open: its opening was checked
    real = os.path.realpath(path)
    return real == _ROOT or real.startswith(_ROOT + os.sep)

def _hook(event, args):
    if event in _REFUSED:
        raise PermissionError(f"sandbox: {event} refused")
    if event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS)
        if writing and not _inside(path):
            raise PermissionError(f"sandbox: writing {path!r} outside the sandbox refused")
    elif event in _PATH_EVENTS:
        for arg in args[:2]:
            if isinstance(arg, (str, bytes, os.PathLike)) and not _inside(arg):
                raise PermissionError(f"sandbox: {event} on {arg!r} outside the sandbox refused")

with open(_PROGRAM, encoding="utf-8") as _f:
    _source = _f.read()
_code = compile(_source, _PROGRAM, "exec")
sys.addaudithook(_hook)
del _f, _source
exec(_code, {"__name__": "__main__", "__file__": _PROGRAM, "__builtins__": __builtins__})
'''


@dataclass(frozen=True)
class Limits:
    """Per run: wall-clock seconds, CPU seconds, address space (MiB), largest file written (MiB)."""

    wall_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 1024
    file_mb: int = 16


@dataclass(frozen=True)
class Outcome:
    """One run: ``status`` is "passed" (exit 0), "failed" (non-zero exit), "timeout" (wall clock) or
    "killed" (a signal: CPU limit, memory). ``network_namespace``: whether the run had its own (empty) one."""

    status: str
    returncode: int | None
    seconds: float
    stderr_tail: str
    network_namespace: bool

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@lru_cache(maxsize=1)
def _unshare_prefix() -> tuple[str, ...]:
    """``unshare -rn`` when this host lets an unprivileged process make a user + network namespace, else ()."""
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    try:
        probe = subprocess.run([exe, "-rn", "true"], capture_output=True, timeout=10, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.SubprocessError):
        return ()
    return (exe, "-rn") if probe.returncode == 0 else ()


def run_python(source: str, limits: Limits | None = None) -> Outcome:
    """Run ``source`` as a Python program in the sandbox; the temp dir is removed whatever happens."""
    limits = limits or Limits()
    root = tempfile.mkdtemp(prefix="day0-sandbox-")
    prefix = _unshare_prefix()
    started = time.perf_counter()
    try:
        with open(os.path.join(root, "program.py"), "w", encoding="utf-8") as f:
            f.write(source)
        guard = os.path.join(root, "guard.py")
        with open(guard, "w", encoding="utf-8") as f:
            f.write(_GUARD)
        os.chmod(guard, 0o444)
        env = {"PATH": "/usr/bin:/bin", "HOME": root, "TMPDIR": root, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
        # the limits are set by the guard itself before the program runs (soft = hard: it cannot raise them); no
        # preexec_fn, which is unsafe with threads (programs run from a thread pool)
        limit_args = [str(max(1, int(limits.cpu_s))), str(limits.memory_mb << 20), str(limits.file_mb << 20)]
        cmd = [*prefix, sys.executable, "-I", "-B", guard, root, *limit_args]
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=limits.wall_s)
            status = "passed" if proc.returncode == 0 else ("killed" if proc.returncode < 0 else "failed")
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            _, err = proc.communicate()
            status = "timeout"
        return Outcome(status, proc.returncode, round(time.perf_counter() - started, 3),
                       err.decode("utf-8", "replace")[-2000:], bool(prefix))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
