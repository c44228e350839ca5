"""One POST to a model endpoint: one deadline for the whole call, no redirects, every failure one reason.

An endpoint is untrusted. urllib, http.client and urllib3 bound each socket operation, not the
call (urllib3's `Timeout(total=)` says so of its own reads): an endpoint that drips a byte just
inside the timeout, or sends an endless chunked trailer, holds the caller for ever. So this
module runs http.client (which parses the protocol, with its own line and header-count limits)
over a socket whose every operation is given only the time left before one deadline, set when
the call starts; that is the one part written here, because no library here offers it.

http.client never follows a redirect: a 3xx is a failed call, so the Authorization header goes
only to the host the config names. Whatever goes wrong (refused, reset, timed out, a status line
or header http.client rejects, a bad chunk, an answer past its size) is one `CallFailed` whose
reason is a fixed word for the counters; nothing the endpoint sent is put in a log line.
"""

from __future__ import annotations

import http.client
import io
import socket
import time
import urllib.parse

# A URL character http.client refuses (controls, space, DEL), checked before start instead.
_BAD_URL_CHARS = frozenset(map(chr, [*range(0x21), 0x7F]))


class CallFailed(Exception):
    """A model call that yielded nothing; `reason` is a fixed word, never text the endpoint sent."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason} ({detail})" if detail else reason)
        self.reason = reason


def check_url(url: str, field: str) -> None:
    """ValueError naming `field` unless `url` is an http(s) URL with a host and no credentials."""
    try:
        parts = urllib.parse.urlsplit(url) if isinstance(url, str) else None
        port_ok = parts is not None and (parts.port is None or parts.port > 0)  # .port raises on a bad one
    except ValueError:
        parts, port_ok = None, False
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or not port_ok
        or _BAD_URL_CHARS.intersection(url)
    ):
        raise ValueError(f"{field}={url!r} must be an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{field} must not hold credentials: name the key's environment variable instead")
    if parts.query or parts.fragment:
        raise ValueError(f"{field}={url!r} must have no query or fragment")


def where(url: str) -> str:
    """What a log line may say about an endpoint: scheme, host and port."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}:{parts.port or ''}".rstrip(":")


def post(url: str, body: bytes, headers: dict[str, str], timeout_s: float, max_bytes: int) -> bytes:
    """The body of a 200 answer to POST `url`, at most `max_bytes`, within `timeout_s` in all; else CallFailed."""
    parts = urllib.parse.urlsplit(url)
    deadline = time.monotonic() + timeout_s
    base = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = _connection(base)(parts.hostname, parts.port, timeout=timeout_s, deadline=deadline)
    resp = None
    try:
        conn.request("POST", parts.path or "/", body, headers)
        resp = conn.getresponse()
        if 300 <= resp.status < 400:
            raise CallFailed("redirect_refused", str(resp.status))
        if resp.status != 200:
            raise CallFailed("http_status", str(resp.status))
        data = resp.read(max_bytes + 1)
    except CallFailed:
        raise
    except TimeoutError:
        raise CallFailed("deadline", f"{timeout_s:g} s") from None
    # http.client raises OSError, HTTPException, ValueError and more on a hostile answer: whichever,
    # it is this call's failure and nothing else's
    except Exception as e:  # noqa: BLE001
        raise CallFailed("connection" if isinstance(e, OSError) else "protocol", type(e).__name__) from None
    finally:
        if resp is not None:
            resp.close()
        conn.close()
    if len(data) > max_bytes:
        raise CallFailed("too_large", f"> {max_bytes} bytes")
    return data


def _connection(base: type[http.client.HTTPConnection]) -> type[http.client.HTTPConnection]:
    class DeadlineConnection(base):  # type: ignore[valid-type, misc]
        def __init__(self, host: str, port: int | None, *, timeout: float, deadline: float):
            super().__init__(host, port, timeout=timeout)
            self.deadline = deadline
            # http.client's hook between the TCP connect and (for https) the TLS handshake: the
            # handshake then runs under the time left (CPython bounds a whole handshake by the timeout)
            self._create_connection = self._connect

        def _connect(self, address, timeout, source_address=None) -> socket.socket:
            sock = socket.create_connection(address, _left(self.deadline), source_address)
            sock.settimeout(_left(self.deadline))
            return sock

        def connect(self) -> None:
            super().connect()
            self.sock = _DeadlineSocket(self.sock, self.deadline)

    return DeadlineConnection


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the call's deadline passed")
    return left


class _DeadlineSocket:
    """The socket calls http.client makes, each given only the time left before the call's deadline.

    Like a socket's own makefile, a reader keeps the socket open: http.client closes the connection
    as soon as it knows the server will, and reads the body from the response's reader after that.
    """

    def __init__(self, sock: socket.socket, deadline: float):
        self._sock, self._deadline = sock, deadline
        self._readers, self._closed = 0, False

    def sendall(self, data) -> None:
        view = memoryview(data).cast("B")
        while view:
            self._sock.settimeout(_left(self._deadline))
            view = view[self._sock.send(view) :]

    def recv_into(self, buffer, nbytes: int = 0) -> int:
        self._sock.settimeout(_left(self._deadline))
        return self._sock.recv_into(buffer, nbytes)

    def makefile(self, mode: str = "rb", *args, **kwargs) -> io.BufferedReader:
        if mode != "rb":
            raise ValueError(f"a deadline socket only reads: {mode!r}")
        self._readers += 1
        return io.BufferedReader(_Reader(self))

    def close(self) -> None:
        self._closed = True
        if self._readers == 0:
            self._sock.close()

    def _reader_closed(self) -> None:
        self._readers -= 1
        if self._closed and self._readers == 0:
            self._sock.close()


class _Reader(io.RawIOBase):
    def __init__(self, sock: _DeadlineSocket):
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self._sock.recv_into(buffer)

    def close(self) -> None:
        if not self.closed:
            self._sock._reader_closed()
        super().close()
