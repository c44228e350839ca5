"""Shared pieces of the DEI tests: the pMARS binary (required in CI, skipped elsewhere without it), a
scripted warrior endpoint, and a hostile one that writes raw bytes."""

from __future__ import annotations

import json
import os
import socket
import socketserver
import threading
import time
from collections.abc import Callable

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
                body = json.dumps(
                    {"choices": [{"message": {"role": "assistant", "content": f"```redcode\n{text}```"}}]}
                ).encode()
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


Respond = Callable[[socket.socket, threading.Event], None]


class HostileEndpoint:
    """A TCP server on 127.0.0.1 that answers every HTTP request with `respond(sock, stop)`: raw
    bytes, since http.server cannot write the malformed answers a hostile model endpoint can.

    `heads` holds each request's head (request line and headers) as received, so a test can see
    who was sent the key. `stop` is set by `close()` and ends an answer that runs until then
    (`drip`, `endless_trailer`); each of those also gives up by itself after `limit_s`, so the
    client that never stops reading (the old code) fails its test instead of hanging it.
    """

    def __init__(self, respond: Respond):
        self.heads: list[str] = []
        self.stop = threading.Event()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                head, _, rest = _read_head(self.request)
                outer.heads.append(head)
                length = next(
                    (
                        int(v)
                        for k, _, v in (ln.partition(":") for ln in head.split("\r\n")[1:])
                        if k.strip().lower() == "content-length" and v.strip().isdigit()
                    ),
                    0,
                )
                while len(rest) < length and (chunk := self.request.recv(65536)):
                    rest += chunk
                try:
                    respond(self.request, outer.stop)
                except OSError:  # the client hung up (its deadline): the answer ends here
                    pass

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def _read_head(sock: socket.socket) -> tuple[str, bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 65536 and (chunk := sock.recv(65536)):
        data += chunk
    head, sep, rest = data.partition(b"\r\n\r\n")
    return head.decode("latin-1"), sep, rest


def chat_answer(text: str) -> bytes:
    """A well-formed chat-completions answer with `text` as its message (HTTP/1.1 200, closed after)."""
    body = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
    return ok(body)


def ok(body: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
        % len(body)
    ) + body


def send(data: bytes) -> Respond:
    """Answer with `data`, then hang up."""

    def respond(sock: socket.socket, stop: threading.Event) -> None:
        sock.sendall(data)

    return respond


def drip(data: bytes, every_s: float = 0.2, limit_s: float = 60.0) -> Respond:
    """Answer with `data` one byte every `every_s` (each read returns long before any read timeout)."""

    def respond(sock: socket.socket, stop: threading.Event) -> None:
        end = time.monotonic() + limit_s
        for i in range(len(data)):
            if stop.wait(every_s) or time.monotonic() > end:
                return
            sock.sendall(data[i : i + 1])

    return respond


def endless_trailer(every_s: float = 0.01, limit_s: float = 60.0) -> Respond:
    """A chunked 200 whose last chunk is followed by trailer lines that never end."""

    def respond(sock: socket.socket, stop: threading.Event) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n")
        end = time.monotonic() + limit_s
        while not stop.wait(every_s) and time.monotonic() < end:
            sock.sendall(b"X-Trailer: more\r\n")

    return respond
