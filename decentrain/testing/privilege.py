"""Re-run a test as an ordinary user: the node's guarantees must not depend on running as root."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNPRIVILEGED_ENV = "DECENTRAIN_TEST_UNPRIVILEGED"
_NOBODY = 65534


def rerun_unprivileged(test_file: str | Path, selector: str, timeout_s: float = 600) -> None:
    """Run `pytest test_file -k selector` as uid/gid nobody and fail with its output if it fails.

    `unshare --user` maps this root user to nobody in a new user namespace: the process has no
    capabilities, cannot chroot or switch users, and sees itself as an ordinary user, which is
    the path a node takes without root (files it owns stay writable, as a user's own files are).
    It still reaches an interpreter installed under a private home, where `setpriv` (the
    fallback) would not. Skips when this process is not root (it is then the ordinary-user run).
    """
    if os.environ.get(UNPRIVILEGED_ENV) or os.geteuid() != 0:
        pytest.skip("already running as an ordinary user")
    if (unshare := shutil.which("unshare")) and subprocess.run(
        [unshare, "--user", f"--map-user={_NOBODY}", f"--map-group={_NOBODY}", "true"], capture_output=True
    ).returncode == 0:
        drop = [unshare, "--user", f"--map-user={_NOBODY}", f"--map-group={_NOBODY}"]
    elif setpriv := shutil.which("setpriv"):
        drop = [setpriv, f"--reuid={_NOBODY}", f"--regid={_NOBODY}", "--clear-groups", "--inh-caps=-all"]
    else:
        pytest.skip("neither unshare --user nor setpriv is available")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, UNPRIVILEGED_ENV: "1", "HOME": "/tmp", "PYTHONPATH": str(root)}
    cmd = [
        *drop,
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-n",
        "0",
        "-p",
        "no:cacheprovider",
        "--basetemp",
        f"/tmp/decentrain-nobody-{os.getpid()}",
        str(test_file),
        "-k",
        selector,
    ]
    proc = subprocess.run(cmd, cwd="/", env=env, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode == 5:
        pytest.fail(f"no test matched {selector!r} as nobody")
    assert proc.returncode == 0, f"as uid {_NOBODY}:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    assert " passed" in proc.stdout and " skipped" not in proc.stdout.split("\n")[-2], proc.stdout[-2000:]
