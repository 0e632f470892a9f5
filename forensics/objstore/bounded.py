"""What an object store may make a reader wait for, and how much it may make it read.

A hostile or broken endpoint holds a reader in three ways the SDK does not bound: a listing that never ends
(a new continuation token with every page), an object sent a byte at a time under the socket timeout, and
an answer that redirects to itself (botocore's region redirector asks again, recursively).  The readers
(:mod:`.fetch`) use what is here:

- :class:`Deadline`: the command's (``--deadline``) and, inside it, one per object: at least
  :data:`OBJECT_FLOOR` seconds, plus one second per :data:`MIN_RATE` bytes the object announces;
- :func:`call_within`: one SDK call (a page, an object's headers and body) in a thread of its own, given up
  at its deadline (its connection shut, so that the thread ends too);
- :func:`list_keys`: ListObjectsV2 page by page, at most :data:`MAX_PAGES` pages and :data:`MAX_KEYS` keys,
  stopped at a continuation token that repeats or does not advance; a listing cut short is said in one
  line and what it listed is kept.
"""
from __future__ import annotations

import contextlib
import math
import socket
import threading
import time
from dataclasses import dataclass, field

from ..errors import ObjectStoreUnavailable

__all__ = ["Deadline", "call_within", "list_keys", "OBJECT_FLOOR", "MIN_RATE", "MAX_PAGES",
           "MAX_KEYS", "READ_DEADLINE"]

OBJECT_FLOOR = 10.0  # seconds an object (or a page of a listing) may take, whatever its size
MIN_RATE = 1 << 20  # bytes a second an object is given beyond that
MAX_PAGES = 1000  # pages of one listing
MAX_KEYS = 200_000  # keys of one listing looked at
READ_DEADLINE = 3600.0  # seconds the s3:// inputs of one command may take together, without --deadline
_SLICE = 0.25  # seconds between looks at a call in flight (the main thread stays able to take a signal)


@dataclass
class Deadline:
    """A time by which something must be done: ``seconds`` from now, or never (None)."""

    seconds: float | None = None
    end: float = field(init=False)

    def __post_init__(self) -> None:
        self.end = math.inf if self.seconds is None else time.monotonic() + self.seconds

    def left(self) -> float:
        return self.end - time.monotonic()


class _Call:
    """One call in flight: its result or error, and what to shut when it is given up."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: object = None
        self.error: BaseException | None = None
        self.until = math.inf  # when the object's own bound ends (moved once its size is known)
        self.body: object = None  # a streaming body being read, to shut when given up

    def sized(self, started: float, size: object) -> None:
        """The object's bound, now that it announced ``size`` bytes."""
        n = size if isinstance(size, int) and size >= 0 else 0
        self.until = started + OBJECT_FLOOR + n / MIN_RATE


def _shut(body: object) -> None:
    """Shut the connection under a botocore streaming body: a thread blocked reading it wakes at once."""
    raw = getattr(body, "_raw_stream", None)  # urllib3's response
    sock = getattr(getattr(raw, "connection", None), "sock", None)
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def call_within(fn, *, deadline: Deadline, url: str, what: str):
    """``fn(call)`` run in a thread of its own and waited for until the sooner of ``deadline`` and the object's
    own bound (:data:`OBJECT_FLOOR`, extended by ``call.sized`` once the size is known); its result, or its
    error raised here.

    :raises ObjectStoreUnavailable: when it is not done by then (the call is given up; its connection shut)
    """
    import signal

    if deadline.left() <= 0:
        raise ObjectStoreUnavailable(url, f"{what} not asked: the command's deadline ({deadline.seconds:g} s, "
                                          "--deadline) has passed")
    call = _Call()
    started = time.monotonic()
    call.until = started + OBJECT_FLOOR

    def run() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGINT))  # they are the main thread's
        try:
            call.result = fn(call)
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
            call.error = e
        finally:
            call.done.set()

    threading.Thread(target=run, name="forensics-s3", daemon=True).start()
    while not call.done.wait(_SLICE):
        now = time.monotonic()
        if now >= deadline.end or now >= call.until:
            _shut(call.body)
            if now >= deadline.end:
                raise ObjectStoreUnavailable(url, f"{what} not done within the command's deadline "
                                                  f"({deadline.seconds:g} s, --deadline)")
            raise ObjectStoreUnavailable(url, f"{what} not done within {now - started:.0f} s (an object gets "
                                              f"{OBJECT_FLOOR:g} s and 1 s a MiB; a server sending it a byte "
                                              "at a time is left)")
    if call.error is not None:
        raise call.error
    return call.result


def list_keys(client, bucket: str, prefix: str, *, deadline: Deadline, problems: list[str], url: str,
              translate, stop_at=None) -> list[tuple[str, int]]:
    """(key, size) of the objects under ``prefix``, in the store's order, page by page within ``deadline``.

    Stopped, with one line in ``problems``, after :data:`MAX_PAGES` pages or :data:`MAX_KEYS` keys, at a
    continuation token already seen or not advancing, at a page of keys all listed already, or at a page that
    cannot be read after the first; ``stop_at(key)`` returning True for a new key stops it there, quietly (enough
    found).

    :param translate: an SDK error into one of ours (:func:`~forensics.objstore.client.translate_error`'s)
    :raises ObjectStoreError: when the first page cannot be read
    """
    keys: dict[str, int] = {}
    seen: set[str] = set()
    token: str | None = None
    for page_no in range(MAX_PAGES):
        kw = {"Bucket": bucket, "Prefix": prefix, **({"ContinuationToken": token} if token else {})}
        try:
            page = call_within(lambda _call, kw=kw: client.list_objects_v2(**kw), deadline=deadline, url=url,
                               what=f"page {page_no + 1} of the listing")
        except Exception as e:  # the first page's error is the command's; a later one cuts it short
            err = translate(e)
            if not keys:
                raise err from e
            problems.append(f"listing of {url} cut short after {len(keys):,} keys: {err}")
            return list(keys.items())
        new = 0
        for o in page.get("Contents") or []:
            key, size = o.get("Key"), o.get("Size")
            if isinstance(key, str) and key not in keys:
                keys[key] = size if isinstance(size, int) else -1
                new += 1
                if stop_at is not None and stop_at(key):
                    return list(keys.items())
        nxt = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not isinstance(nxt, str) or not nxt:
            return list(keys.items())
        why = None
        if len(keys) >= MAX_KEYS:
            why = f"at {len(keys):,} keys (at most {MAX_KEYS:,} are looked at)"
        elif nxt == token or nxt in seen:
            why = (f"after {page_no + 1} pages: the store gave a continuation token "
                   f"{'again' if nxt in seen else 'that does not advance'}")
        elif not new and page.get("Contents"):
            why = f"after {page_no + 1} pages: the store listed the same keys again"
        if why:
            problems.append(f"listing of {url} stopped {why}; the {len(keys):,} keys listed are read")
            return list(keys.items())
        seen.add(nxt)
        token = nxt
    problems.append(f"listing of {url} stopped after {MAX_PAGES:,} pages ({len(keys):,} keys; a new continuation "
                    "token every page); the keys listed are read")
    return list(keys.items())
