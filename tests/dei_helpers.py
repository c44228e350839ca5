"""Shared pieces of the DEI tests: the pMARS binary (required in CI, skipped elsewhere without it)."""

from __future__ import annotations

import os

import pytest

from decentrain.algorithms.dei.pmars import PMarsConfig, PMarsUnavailable, find_pmars


def pmars_or_skip() -> str:
    """The display-less pMARS; CI (`DECENTRAIN_REQUIRE_PMARS=1`, set by .ci/run) fails instead of skipping."""
    try:
        return find_pmars(PMarsConfig())
    except PMarsUnavailable as e:
        if os.environ.get("DECENTRAIN_REQUIRE_PMARS"):
            pytest.fail(str(e))
        pytest.skip(str(e))


class WarriorEndpoint:
    """An OpenAI-compatible chat endpoint on 127.0.0.1 that answers with edited shipped warriors.

    It stands in for vLLM/Ollama (none runs here) and exercises the operator's real HTTP path.
    Node i calls it at `/n{i}/v1`; `hold_after[i] = k` makes node i's calls after its k-th wait
    until the endpoint is closed (a node frozen at a known state, for fault tests).
    """

    def __init__(self, hold_after: dict[int, int] | None = None):
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        import numpy as np

        from decentrain.algorithms.dei.sft import _edit, shipped_warriors

        warriors = list(shipped_warriors().values())
        self.calls: dict[int, int] = {}
        self.released = threading.Event()
        rng = np.random.default_rng(0)
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                node = int(self.path.split("/")[1][1:])
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    outer.calls[node] = outer.calls.get(node, 0) + 1
                    n = outer.calls[node]
                    text = _edit(warriors[int(rng.integers(len(warriors)))], rng, 8000).render()
                if hold_after and node in hold_after and n > hold_after[node]:
                    outer.released.wait()
                body = json.dumps({"choices": [{"message": {"role": "assistant",
                                                            "content": f"```redcode\n{text}```"}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, node: int) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/n{node}/v1"

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
