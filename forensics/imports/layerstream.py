"""A layer blob read as a stream: decompressed (gzip, zstd or none), hashed against its digest, bounded.

:class:`LayerLimits` and :class:`LayerBlob` describe what may be read and from where;
``_Stream`` is the one pass over a blob that :mod:`forensics.imports.layers` indexes;
``_Shared`` holds the counters its worker threads share (bytes over all layers, the
abort flag).  Nothing here trusts the blob: sizes, ratios and header reads are bounded.
"""
from __future__ import annotations

import hashlib
import io
import threading
import zlib
from dataclasses import dataclass
from collections.abc import Callable
from types import TracebackType
from typing import Protocol

from ..errors import ImageFormatError, LayerLimitExceeded, LayerRejected
from .imagemeta import parse_digest

__all__ = ["LayerLimits", "LayerBlob", "BlobFile", "CHUNK"]

CHUNK = _CHUNK = 1 << 20
_MAX_READ = 64 << 20  # pax/GNU long-name headers (read whole by tarfile) bigger than this are refused


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerLimits:
    """Bounds on what reading an image may cost; exceeding one is a :class:`LayerLimitExceeded`."""

    max_bytes: int = 64 << 30  # uncompressed tar bytes over all layers
    max_files: int = 2_000_000  # tar members over all layers
    max_ratio: int = 200  # uncompressed : compressed, enforced once a layer passes ratio_floor
    ratio_floor: int = 256 << 20
    max_capture: int = 2 << 20  # one file kept in memory by the first pass
    max_fetch: int = 32 << 20  # one file the analysis asks for by name (dpkg's status of a big image)
    max_capture_total: int = 96 << 20  # all files kept in memory


class BlobFile(Protocol):
    """What a layer's bytes are read through: a file opened ``"rb"``, or a byte range of one."""

    def read(self, n: int = -1, /) -> bytes: ...

    def __enter__(self) -> BlobFile: ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None, /) -> object: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerBlob:
    """One layer: how to open its bytes and what they must hash to."""

    name: str  # for messages: the digest or the path in the archive
    open: Callable[[], BlobFile]
    digest: str | None = None  # "sha256:..." of the blob as stored (compressed)
    diff_id: str | None = None  # "sha256:..." of the uncompressed tar (checked when no digest is given)


class _Stream:
    """A layer blob as a readable stream: decompressed, hashed, bounded."""

    def __init__(self, raw: BlobFile, blob: LayerBlob, limits: LayerLimits, shared: _Shared) -> None:
        self.raw = raw
        self.blob = blob
        self.limits = limits
        self.shared = shared  # uncompressed bytes over all layers, the abort flag
        self.blob_hash = _hasher(blob.name, blob.digest) if blob.digest else None
        self.tar_hash = _hasher(blob.name, blob.diff_id) if (blob.diff_id and not blob.digest) else None
        self.compressed = 0
        self.out = 0
        self.buf = b""
        self.bpos = 0
        self.position = 0
        self.eof = False
        head = raw.read(_CHUNK)
        self._count_in(head)
        self.pending: bytes | None = head
        self.gzip: zlib._Decompress | None = None
        self.zstd: _Readable | None = None
        if head[:2] == b"\x1f\x8b":
            self.kind = "gzip"
            self.gzip = zlib.decompressobj(wbits=31)
        elif head[:4] == b"\x28\xb5\x2f\xfd":
            self.kind = "zstd"
            # a reader, not a one-shot decompress: each read yields at most _CHUNK * 8 bytes, so a small
            # frame that expands to GiBs is stopped by the same bounds as gzip before it is in memory
            self.zstd = _zstd_reader(blob.name, _Input(self))
        else:
            self.kind = "tar"

    def _count_in(self, data: bytes) -> None:
        self.compressed += len(data)
        if self.blob_hash is not None:
            self.blob_hash.update(data)

    def _next_input(self) -> bytes:
        if self.pending is not None:
            data, self.pending = self.pending, None
            return data
        data = self.raw.read(_CHUNK)
        self._count_in(data)
        return data

    def _produce(self) -> None:
        while not self.buf and not self.eof:
            if self.kind == "tar":
                data = self._next_input()
                if not data:
                    self.eof = True
                    break
                self._emit(data)
                continue
            if self.gzip is not None:
                if self.gzip.eof:  # concatenated gzip members
                    data = self.gzip.unused_data or self._next_input()
                    if not data:
                        self.eof = True
                        break
                    self.gzip = zlib.decompressobj(wbits=31)
                elif self.gzip.unconsumed_tail:
                    data = self.gzip.unconsumed_tail
                else:
                    data = self._next_input()
                    if not data:
                        self.eof = True
                        raise ImageFormatError(self.blob.name, "layer", "truncated gzip stream")
                try:
                    out = self.gzip.decompress(data, _CHUNK * 8)
                except zlib.error as e:
                    raise ImageFormatError(self.blob.name, "layer", f"bad gzip data: {e}") from e
            else:
                assert self.zstd is not None  # a stream is tar, gzip or zstd
                try:
                    out = self.zstd.read(_CHUNK * 8)
                except (ImageFormatError, LayerRejected):
                    raise
                except Exception as e:  # zstandard.ZstdError, compression.zstd.ZstdError: damaged data
                    raise ImageFormatError(self.blob.name, "layer", f"bad zstd data: {e}") from e
                if not out:
                    self.eof = True
                    break
            self._emit(out)

    def _emit(self, out: bytes) -> None:
        if not out:
            return
        self.out += len(out)
        total = self.shared.add_out(len(out))
        if self.tar_hash is not None:
            self.tar_hash.update(out)
        lim = self.limits
        if self.shared.abort:
            raise LayerRejected(self.blob.name, "(stream)", "reading stopped: another layer was refused")
        if total > lim.max_bytes:
            raise LayerLimitExceeded(self.blob.name, "(stream)",
                                     f"more than {lim.max_bytes} uncompressed bytes in the image (--max-size)")
        if self.kind != "tar" and self.out > lim.ratio_floor and self.out > lim.max_ratio * max(self.compressed, 1):
            raise LayerLimitExceeded(self.blob.name, "(stream)",
                                     f"decompression bomb: {self.out} bytes from {self.compressed} compressed "
                                     f"(ratio over {lim.max_ratio}:1)")
        self.buf = out
        self.bpos = 0

    # a forward-only file: tarfile's random-access mode ("r:") seeks past member data, which
    # here means decompressing and dropping it without copying it through Python objects
    def _fill(self) -> bool:
        if self.bpos >= len(self.buf):
            self.buf = b""
            self.bpos = 0
            self._produce()
        return self.bpos < len(self.buf)

    def read(self, n: int = -1) -> bytes:
        if n < 0 or n > _MAX_READ:  # tarfile reads headers whole: a 10 GB pax header must not land in memory
            raise LayerRejected(self.blob.name, "(header)", f"a tar header or read larger than {_MAX_READ} bytes")
        parts = []
        while n != 0 and self._fill():
            avail = len(self.buf) - self.bpos
            take = avail if n < 0 or n >= avail else n
            parts.append(self.buf[self.bpos:self.bpos + take] if (self.bpos or take != avail) else self.buf)
            self.bpos += take
            self.position += take
            if n > 0:
                n -= take
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def tell(self) -> int:
        return self.position

    def seek(self, pos: int, whence: int = 0) -> int:
        if whence == 1:
            pos += self.position
        if whence == 2 or pos < self.position:
            raise io.UnsupportedOperation("layer streams only seek forward")
        skip = pos - self.position
        while skip > 0 and self._fill():
            take = min(skip, len(self.buf) - self.bpos)
            self.bpos += take
            self.position += take
            skip -= take
        return self.position

    def seekable(self) -> bool:
        return True

    def write(self, b: bytes, /) -> int:
        raise io.UnsupportedOperation("layer streams are read-only")

    def close(self) -> None:
        """Nothing to release: the blob's file is closed by whoever opened it (tarfile calls this only for
        files it opened itself)."""

    def finish(self) -> None:
        """Drain to EOF (tar padding after the end marker) and check the digest."""
        while self._fill():
            self.position += len(self.buf) - self.bpos
            self.bpos = len(self.buf)
        if self.blob_hash is not None:
            got = f"{self.blob_hash.name}:" + self.blob_hash.hexdigest()
            if got != self.blob.digest:
                raise ImageFormatError(self.blob.name, "layer", f"digest mismatch: blob hashes to {got}")
        if self.tar_hash is not None:
            got = f"{self.tar_hash.name}:" + self.tar_hash.hexdigest()
            if got != self.blob.diff_id:
                raise ImageFormatError(self.blob.name, "layer", f"diff_id mismatch: tar hashes to {got}")


def _hasher(name: str, digest: str) -> hashlib._Hash:
    """The hash a digest names; a digest that cannot be verified is refused, never skipped."""
    return hashlib.new(parse_digest(digest, name, "layer").partition(":")[0])


class _Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


class _Input:
    """The compressed bytes of a stream, read by the zstd reader: counted and hashed as they pass."""

    def __init__(self, stream: _Stream) -> None:
        self.stream = stream

    def read(self, n: int = -1) -> bytes:
        return self.stream._next_input()


_ZSTD_MAX_WINDOW = 1 << 27  # a frame may ask for a window up to 2 GiB; 128 MiB is zstd's own default bound


def _zstd_reader(name: str, raw: _Input) -> _Readable:
    try:
        import zstandard

        dctx = zstandard.ZstdDecompressor(max_window_size=_ZSTD_MAX_WINDOW)
        # the reader only calls raw.read(); zstandard's stub asks for a whole IO[bytes]
        return dctx.stream_reader(raw, read_size=_CHUNK, read_across_frames=True)  # type: ignore[arg-type]
    except ImportError:  # probing: the standard library's zstd (3.14+) is next
        pass
    try:
        # Python 3.14's module; the type check runs against 3.10's standard library
        from compression import zstd  # type: ignore[import-not-found,unused-ignore]

        return zstd.ZstdFile(raw, mode="r", options={zstd.DecompressionParameter.window_log_max: 27})
    except ImportError:
        raise ImageFormatError(name, "layer",
                               "zstd-compressed layer; install the 'zstandard' module to read it") from None


class _Shared:
    """Counters shared by the layer workers: uncompressed bytes, captured bytes, abort flag."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.uncompressed = 0
        self.captured = 0
        self.abort = False

    def add_out(self, n: int) -> int:
        with self.lock:
            self.uncompressed += n
            return self.uncompressed

    def reserve(self, n: int, limit: int) -> bool:
        with self.lock:
            if self.captured + n > limit:
                return False
            self.captured += n
            return True
