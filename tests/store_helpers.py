"""A job store (`python -m decentrain.core.job_store`) for tests, on loopback, any free port."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path


def start_store(tmp_path: Path) -> tuple[subprocess.Popen, str]:
    """Start the store; returns (process, HOST:PORT) once it accepts clients (its ready file)."""
    ready = tmp_path / "store.addr"
    proc = subprocess.Popen([sys.executable, "-m", "decentrain.core.job_store", "--host", "127.0.0.1", "--port", "0",
                             "--ready-file", str(ready)], stderr=subprocess.PIPE, text=True)
    while not ready.exists():
        assert proc.poll() is None, proc.stderr.read()
        threading.Event().wait(0.05)
    return proc, ready.read_text().strip()
