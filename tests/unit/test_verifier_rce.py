"""Hostile completions are data: scoring one changes no later score, file, socket or process.

Uses only the API the old code had too (`Verifier(template).scores`), so it fails there: one
completion escaped the old verifier sandbox (through `catch_warnings.__init__.__globals__['sys']`,
or sympy's `ilcm.__globals__` for polynomial_multiplication), switched its audit hook off and made
every later score 1.0; as an ordinary user the same foothold created, truncated and deleted
files through ctypes, opened sockets and killed processes. Runs as root and, re-run by
`test_as_an_ordinary_user`, as uid nobody.
"""

from __future__ import annotations

import secrets
import shutil
import socket
import string
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from decentrain.tasks import PromptTemplate, TaskMixConfig, TaskMixture, TemplateConfig, Verifier
from decentrain.tasks.vetted import VETTED_TASKS
from decentrain.testing import rerun_unprivileged

_CATCH_WARNINGS_SYS = (
    "[c for c in ().__class__.__base__.__subclasses__() if c.__name__=='catch_warnings'][0].__init__.__globals__['sys']"
)
_ILCM_SYS = "ilcm.__globals__['sys']"  # names sympy's parser leaves alone
# Switch the old worker's audit hook off and make its `_score` return 1.0 for anything.
_FORGE = ".modules['__main__'].__dict__.update({'_DENIED': (), '_DENIED_PREFIXES': ('~',), 'float': id})"


def spelled(n: int) -> str:
    """An expression for `n` with no decimal digit in it. A port or a PID changes every run; written
    out as digits it could contain an entry's answer, and the substring scorer gives partial credit."""
    return f"int(''.join(str('abcdefghij'.index(c)) for c in '{str(n).translate(_LETTERS)}'))"


_LETTERS = str.maketrans(string.digits, "abcdefghij")


def digitless_dir() -> Path:
    """A fresh temp dir whose path has no digit in it (pytest's tmp_path has run numbers), for the same reason."""
    root = Path(tempfile.gettempdir())
    if any(c.isdigit() for c in str(root)):
        root = Path("/tmp")
    path = root / ("decentrain-rce-" + "".join(secrets.choice(string.ascii_lowercase) for _ in range(12)))
    path.mkdir(mode=0o700)
    return path


def hostile(task: str, tmp: Path, port: int, pid: int) -> list[str]:
    """The attacks; every input that changes per run (the dir, the port, the PID) is written without digits."""
    assert not any(c.isdigit() for c in str(tmp)), tmp
    port_, pid_ = spelled(port), spelled(pid)
    sys_ = _ILCM_SYS if task == "polynomial_multiplication" else _CATCH_WARNINGS_SYS
    forge = sys_ + _FORGE
    libc = "__import__('ctypes').CDLL(None)"
    free_fd = f"{_CATCH_WARNINGS_SYS}.stderr.close()"  # RLIMIT_NOFILE=3 left no descriptor free
    attacks = [
        forge,
        f"[{forge}, {free_fd}, {libc}.unlink(b'{tmp}/delete_me')]",
        f"[{forge}, {free_fd}, {libc}.truncate(b'{tmp}/keep', 0)]",
        f"[{forge}, {free_fd}, {libc}.creat(b'{tmp}/created', 420)]",
        f"[{forge}, {free_fd}, __import__('socket').create_connection(('127.0.0.1', {port_})).sendall(b'x')]",
        f"[{forge}, {free_fd}, {libc}.kill({pid_}, 9)]",
        f"[{forge}, {free_fd}, __import__('os').kill({pid_}, 9)]",
        f'__import__("os").system("touch {tmp}/system")',
        f'open("{tmp}/opened", "w")',
        f"exec(\"open('{tmp}/exec', 'w')\")",
    ]
    return [f"<answer>{a}</answer>" for a in attacks]


_WATCHED = ("exec", "compile", "import", "open", "os.", "socket.", "ctypes.", "subprocess.")


@pytest.mark.parametrize("task", VETTED_TASKS)
def test_hostile_completions_change_nothing(task):
    tmp_path = digitless_dir()
    (tmp_path / "keep").write_text("precious")
    (tmp_path / "delete_me").write_text("x")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.setblocking(False)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    v = Verifier(PromptTemplate(TemplateConfig(prompt="{question}", answer_format="tag")))
    mix = TaskMixture(TaskMixConfig(tasks=[task], size=20))
    items = [mix[i] for i in range(3)]
    wrong = ["<answer>wrong</answer>", "<answer>1 2</answer>", "<answer>[0]</answer>"]
    try:
        before = [v.scores(it, wrong + [f"<answer>{it.answer}</answer>"]) for it in items]
        assert all(s == [0.0, 0.0, 0.0, 1.0] for s in before), before
        events: list[str] = []
        on = [True]
        sys.addaudithook(lambda e, a: events.append(e) if on[0] and e.startswith(_WATCHED) else None)
        try:
            scores = v.scores(items[0], hostile(task, tmp_path, server.getsockname()[1], bystander.pid))
        finally:
            on[0] = False
        assert events == [], f"scoring peer text raised audit events {sorted(set(events))}"
        assert scores == [0.0] * len(scores)
        after = [v.scores(it, wrong + [f"<answer>{it.answer}</answer>"]) for it in items]
        assert after == before, "a completion changed later scores"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["delete_me", "keep"]
        assert (tmp_path / "keep").read_text() == "precious"
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody connected
        assert bystander.poll() is None, "a completion killed a process"
    finally:
        v.close()
        server.close()
        bystander.kill()
        bystander.wait()
        shutil.rmtree(tmp_path, ignore_errors=True)


def test_as_an_ordinary_user():
    rerun_unprivileged(__file__, "test_hostile_completions_change_nothing")
