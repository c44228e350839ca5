"""Reading the job's shared c10d store, where any client may write any key.

Every worker and launcher of a job is a client of one store, and the store checks nobody: a
value read from it is another client's claim, so it is read without trusting it, and no store
operation may let one bad value cost the reader its connection. Two c10d behaviours shape this:

- torch's store server parses the old value of an `add` as an integer (`stoll`) and, when it is
  not one, closes the connection of the client that asked. One "x" written at a key that
  several clients `add` to cuts every one of them off. So decentrain `add`s to no store key:
  a client keeps its own counters in memory and `set`s them; others' values are read and parsed.
- `get` blocks until the key exists: a key deleted between `check` and `get` would hold the
  reader for the store's whole timeout. So values are read with `peek`, which never waits.

torch has no non-blocking read; `peek` is built from `compare_set`, which does not parse values.
"""

from __future__ import annotations

import torch.distributed as dist

# The expected (and desired) value of peek's compare_set: a value no decentrain client writes.
_ABSENT = b"\x00decentrain-absent\x00"
MAX_COUNT = 1 << 40  # counters (rounds, heartbeats, incarnations, jobs) at or beyond this are nonsense
_COUNT_DIGITS = len(str(MAX_COUNT))


def peek(store: dist.Store, key: str) -> bytes | None:
    """The value at `key`, or None if there is none; never waits and never changes the value.

    `compare_set(key, A, A)` answers the current value when the key holds anything but A, and
    A, without writing it, when the key is missing (c10d's TCPStore and HashStore alike); a
    key holding A already stays as it was. Raises what the store raises (a lost connection).
    """
    raw = store.compare_set(key, _ABSENT, _ABSENT)
    return None if raw == _ABSENT else raw


def parse_count(raw: bytes | None, limit: int = MAX_COUNT) -> int | None:
    """A non-negative decimal integer below `limit` written by another client; None for anything else.

    Stricter than `int()`, which also takes signs, spaces, underscores and non-ASCII digits.
    """
    if not isinstance(raw, bytes) or not 0 < len(raw) <= _COUNT_DIGITS or not raw.isdigit():
        return None  # bytes.isdigit is ASCII 0-9 only
    value = int(raw)
    return value if value < limit else None
