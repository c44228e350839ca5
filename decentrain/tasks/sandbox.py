"""Run verifiers that evaluate model text (`eval`, sympy's `parse_expr`) outside this interpreter.

`SandboxScorer` keeps one worker subprocess (`python -m decentrain.tasks.sandbox`) and talks to
it in JSON lines. The worker builds every sandboxed task's verifier, scores a warm-up entry (so
lazy imports happen), then locks itself down before it reads a single request:
  - cwd is a directory that no longer exists (as root: also the chroot, and then uid nobody);
    RLIMIT_NOFILE = 3 (no new file, pipe or socket), RLIMIT_FSIZE = 0, RLIMIT_NPROC = 0 (no
    fork), RLIMIT_CORE = 0, RLIMIT_AS and RLIMIT_CPU caps;
  - os functions that touch files or processes without an audit event (mkfifo, close, ...)
    are removed, and an audit hook (PEP 578) refuses opening files, imports, os/subprocess/
    socket/ctypes calls and frame or gc introspection (so evaluated text cannot read the nonce).
Each request carries a fresh random nonce that the reply must echo; a reply that is late,
malformed, has the wrong nonce, or is followed by extra bytes scores 0 and the worker is
replaced. No single layer is a proof (an audit hook is not a sandbox on its own); together they
leave evaluated text no file, process, socket or way to forge a score.
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import select
import subprocess
import sys
import time
from typing import Any

logger = logging.getLogger(__name__)

_MAX_REPLY = 1 << 16

# -- parent side ---------------------------------------------------------------------------------


class SandboxScorer:
    """Scores answers for sandboxed tasks in a locked-down worker; any failure scores 0."""

    def __init__(self, timeout_s: float = 2.0, memory_mb: int = 1024, start_timeout_s: float = 120.0):
        self.timeout_s, self.memory_mb, self.start_timeout_s = timeout_s, memory_mb, start_timeout_s
        self._proc: subprocess.Popen | None = None
        self._buf = b""
        self.failures = 0  # requests that scored 0 because the worker misbehaved or timed out
        self.starts = 0

    @property
    def restarts(self) -> int:
        return max(self.starts - 1, 0)

    def _start(self) -> subprocess.Popen:
        self.starts += 1
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "decentrain.tasks.sandbox", str(self.memory_mb)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
            close_fds=True, start_new_session=True,
        )
        self._buf = b""
        ready = self._read_line(self.start_timeout_s)
        if ready != b'{"ready":true}':
            self.close()
            raise RuntimeError(f"verifier sandbox did not start (got {ready!r:.80})")
        return self._proc

    def _read_line(self, timeout_s: float) -> bytes | None:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or len(self._buf) > _MAX_REPLY or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, _MAX_REPLY)
            if not chunk:
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def score(self, task: str, entry: dict[str, Any], answers: list[str | None]) -> list[float]:
        zeros = [0.0] * len(answers)
        if self._proc is None or self._proc.poll() is not None:
            self.close()
            self._start()
        assert self._proc is not None and self._proc.stdin is not None
        nonce = secrets.token_hex(16)
        request = json.dumps({"nonce": nonce, "task": task, "entry": entry, "answers": answers}) + "\n"
        try:
            self._proc.stdin.write(request.encode("utf-8", "surrogatepass"))
            self._proc.stdin.flush()
        except OSError:
            return self._fail(zeros, "worker gone")
        line = self._read_line(self.timeout_s)
        if line is None:
            return self._fail(zeros, f"no reply within {self.timeout_s} s")
        if self._buf or select.select([self._proc.stdout.fileno()], [], [], 0)[0]:
            return self._fail(zeros, "extra bytes after the reply")  # someone else wrote to the pipe
        try:
            reply = json.loads(line)
            scores = reply["scores"]
            ok = (reply["nonce"] == nonce and isinstance(scores, list) and len(scores) == len(answers)
                  and all(type(s) in (int, float) and 0.0 <= s <= 1.0 for s in scores))
        except (ValueError, TypeError, KeyError):
            ok = False
        if not ok:
            return self._fail(zeros, "malformed reply")
        return [float(s) for s in scores]

    def _fail(self, zeros: list[float], why: str) -> list[float]:
        self.failures += 1
        logger.warning("verifier sandbox: %s; scoring 0 and restarting it", why)
        self.close()
        return zeros

    def close(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            for stream in (self._proc.stdin, self._proc.stdout):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass
            self._proc = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


# -- worker side ---------------------------------------------------------------------------------

_DENIED_PREFIXES = (
    "os.", "subprocess.", "socket.", "ctypes.", "shutil.", "gc.", "sys.", "resource.", "pty.", "mmap.",
    "urllib.", "http.", "ftplib.", "smtplib.", "poplib.", "imaplib.", "nntplib.", "telnetlib.", "webbrowser.",
    "sqlite3.", "_thread.", "signal.", "fcntl.", "marshal.", "pickle.", "code.", "function.", "cpython.",
    "tempfile.", "glob.", "shelve.", "dbm.", "zipimport.", "msvcrt.", "winreg.", "_winapi.",
)
_DENIED = frozenset({"open", "import", "object.__getattr__", "object.__setattr__", "object.__delattr__",
                     "builtins.input", "builtins.breakpoint", "setopencode", "exec_module"})


def _deny(event: str, args: tuple) -> None:
    if event in _DENIED or event.startswith(_DENIED_PREFIXES):
        raise RuntimeError(f"sandbox: {event} is not allowed")


def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


# os/posix functions that change the filesystem or processes without raising an audit event
# (mkfifo, close, dup2, ...) or that an audit hook would cover anyway: removed from the worker.
_REMOVED_OS_FUNCTIONS = (
    "mkfifo", "mknod", "close", "closerange", "dup", "dup2", "write", "pwrite", "writev", "pipe", "pipe2",
    "sendfile", "splice", "copy_file_range", "fchdir", "chroot", "setsid", "setpgid", "setuid", "setgid",
    "seteuid", "setegid", "setreuid", "setregid", "setresuid", "setresgid", "link", "symlink", "rename",
    "replace", "remove", "unlink", "rmdir", "mkdir", "makedirs", "truncate", "ftruncate", "chmod", "fchmod",
    "lchmod", "chown", "fchown", "lchown", "kill", "killpg", "fork", "forkpty", "system", "popen",
    "posix_spawn", "posix_spawnp", "execv", "execve", "execl", "execle", "execlp", "execlpe", "execvp",
    "execvpe", "spawnv", "spawnve", "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnvp", "spawnvpe",
    "putenv", "unsetenv", "open", "openpty", "login_tty", "memfd_create", "eventfd", "register_at_fork",
)
_NOBODY = 65534


def _lock_down(memory_mb: int) -> None:
    import posix
    import resource
    import tempfile

    vm = _vm_bytes()
    os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    gone = tempfile.mkdtemp(prefix="dtr-sandbox-")
    fd = os.open(gone, os.O_RDONLY)
    os.rmdir(gone)
    os.fchdir(fd)  # cwd: a directory that no longer exists, so relative paths resolve nowhere
    if os.geteuid() == 0:
        # As root: make that deleted directory the filesystem root, then stop being root, so
        # absolute paths resolve nowhere either and the chroot cannot be undone.
        os.chroot(".")
        os.setgroups([])
        os.setgid(_NOBODY)
        os.setuid(_NOBODY)
    os.close(fd)
    cpu = int(resource.getrusage(resource.RUSAGE_SELF).ru_utime) + 3600
    for limit, value in ((resource.RLIMIT_AS, vm + memory_mb * (1 << 20)), (resource.RLIMIT_FSIZE, 0),
                         (resource.RLIMIT_NPROC, 0), (resource.RLIMIT_CORE, 0), (resource.RLIMIT_CPU, cpu),
                         (resource.RLIMIT_NOFILE, 3)):
        resource.setrlimit(limit, (value, value))
    for module in (os, posix):
        for name in _REMOVED_OS_FUNCTIONS:
            module.__dict__.pop(name, None)
    sys.addaudithook(_deny)


def _scorers() -> dict[str, Any]:
    """Every sandboxed task's verifier, each warmed up on its own entry and on list/expression text."""
    from reasoning_gym.factory import DATASETS

    from decentrain.tasks.vetted import SANDBOX, VETTED_TASKS, verifier_mode

    out = {}
    for name in VETTED_TASKS:
        if name not in DATASETS or verifier_mode(name) != SANDBOX:
            continue
        cls, cfg_cls = DATASETS[name]
        ds = cls(config=cfg_cls(size=1, seed=0))
        entry = ds[0]
        for answer in (str(entry["answer"]), "['a', 'b']", "[[1, 0], [0, 1]]", "x**2 + 2*x - 1", "1 2 3", ""):
            ds.score_answer(answer, entry)
        out[name] = ds
    return out


def _score(ds: Any, entry: dict[str, Any], answer: str | None) -> float:
    try:
        s = float(ds.score_answer(answer, entry))
    except Exception:  # evaluated text that raises scores 0
        return 0.0
    return min(max(s, 0.0), 1.0) if math.isfinite(s) else 0.0


def _serve(memory_mb: int) -> None:
    scorers = _scorers()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # stray prints from a verifier must not land on the reply channel
    _lock_down(memory_mb)
    stdout.write(b'{"ready":true}\n')
    stdout.flush()
    for line in stdin:
        req = json.loads(line)
        ds = scorers.get(req["task"])
        scores = [0.0 if ds is None else _score(ds, req["entry"], a) for a in req["answers"]]
        stdout.write(json.dumps({"nonce": req["nonce"], "scores": scores}).encode() + b"\n")
        stdout.flush()


if __name__ == "__main__":
    _serve(int(sys.argv[1]) if len(sys.argv) > 1 else 1024)
