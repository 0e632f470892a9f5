"""A compressed core decompressed to a file, bounded: the one loop a bundle's ``core.zst``, a
systemd-coredump store's core (zstd, lz4, xz) and a core object fetched from a bucket go through.

- :func:`decompress_core_file`: ``src`` streamed into a new file ``dest`` (mode 0600, renamed into place),
  never more than the core's own program headers say it holds (read from its first MiB), nor
  :func:`max_core_bytes`, nor what would leave less than 1 GiB free where ``dest`` lies
- :func:`open_reader` / :func:`damaged_errors`: each codec's own streaming reader, and what it raises on a
  damaged stream
"""
from __future__ import annotations

import contextlib
import os
from typing import BinaryIO

from forensics.core import elf
from forensics.errors import CoreReadError

__all__ = ["DEFAULT_MAX_CORE", "max_core_bytes", "open_reader", "damaged_errors", "decompress_core_file"]

DEFAULT_MAX_CORE = 256 << 30  # bytes a core may decompress to (FORENSICS_MAX_CORE_BYTES)
_FREE_RESERVE = 1 << 30  # bytes left free on the destination's filesystem after decompressing
_CHUNK = 1 << 20


def max_core_bytes() -> int:
    """``FORENSICS_MAX_CORE_BYTES`` (at least 1 MiB), or :data:`DEFAULT_MAX_CORE` (256 GiB)."""
    try:
        return max(1 << 20, int(os.environ.get("FORENSICS_MAX_CORE_BYTES") or DEFAULT_MAX_CORE))
    except ValueError:
        return DEFAULT_MAX_CORE


def open_reader(codec: str, fin: BinaryIO):
    """A file-like ``read(n)`` over the decompressed stream of ``fin``: ``zstd``, ``lz4`` or ``xz``."""
    if codec == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(fin, read_across_frames=True)
    if codec == "lz4":
        import lz4.frame

        return lz4.frame.LZ4FrameFile(fin, mode="rb")
    import lzma

    return lzma.LZMAFile(fin, mode="rb")


def damaged_errors() -> tuple[type[BaseException], ...]:
    """What the codecs' readers raise on a damaged stream."""
    import lzma

    errors: list[type[BaseException]] = [lzma.LZMAError, EOFError, RuntimeError]  # lz4 says RuntimeError
    with contextlib.suppress(ImportError):
        import zstandard

        errors.append(zstandard.ZstdError)
    return tuple(errors)


def _core_size(head: bytes) -> int | None:
    """The size the core's own program headers give it (what the kernel wrote), from its first bytes."""
    try:
        header = elf.parse_elf_header(head)
        end = header.phoff + header.phnum * elf.PHDR64_SIZE
        if header.phnum == elf.PN_XNUM or end > len(head):
            return None
        phdrs = elf.parse_program_headers(head[header.phoff:end], header.phnum)
    except (ValueError, AttributeError):
        return None
    return max((p.offset + p.filesz for p in phdrs), default=len(head))


def decompress_core_file(src: str, dest: str, codec: str = "zstd", *, limit: int | None = None,
                         partial: bool = False) -> int:
    """Stream-decompress the core ``src`` to ``dest`` (a new file, mode 0600, renamed into place); bytes written.

    :param codec: ``zstd``, ``lz4`` or ``xz``
    :param limit: the most bytes written (default :func:`max_core_bytes`)
    :param partial: ``src`` is known to be cut short (a frame cut by a full disk): decompressed as far as it goes
    :raises CoreReadError: when the stream is damaged, or decompressing would pass a bound
    :raises OSError: when ``dest`` cannot be written (``src`` unreadable is a :class:`CoreReadError`)
    """
    limit = limit or max_core_bytes()
    d, name = os.path.split(os.path.abspath(dest))
    tmp = os.path.join(d, f".{name}.tmp{os.getpid()}")
    try:
        fin = open(src, "rb")  # noqa: SIM115 -- closed below, with the file it is written to
    except OSError as e:
        raise CoreReadError(src, e.strerror or str(e)) from None
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except BaseException:
        fin.close()
        raise
    try:
        with fin, os.fdopen(fd, "wb") as fout:
            try:
                n = _copy_bounded(src, open_reader(codec, fin), fout, d, limit)
            except damaged_errors() as e:
                if not partial:
                    raise CoreReadError(src, f"damaged {codec} stream: {e}") from None
                n = fout.tell()
        os.rename(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):  # our own temporary file; the error being raised is what matters
            os.unlink(tmp)
        raise
    return n


def _copy_bounded(src: str, reader, fout: BinaryIO, d: str, limit: int) -> int:
    st = os.statvfs(d)
    room = st.f_bavail * st.f_frsize - _FREE_RESERVE
    bound = None
    n = 0
    while chunk := reader.read(_CHUNK):
        if bound is None:
            said = _core_size(chunk)
            bound = min(limit, said) if said else limit
            if said and bound > room:
                raise CoreReadError(src, f"decompressing needs {bound:,} bytes; {d} has "
                                         f"{max(0, room):,} to spare (1 GiB stays free)")
        chunk = chunk[: max(0, bound - n)]
        fout.write(chunk)
        n += len(chunk)
        if n > room:
            raise CoreReadError(src, f"decompressing filled {d} past its last free GiB")
        if n >= bound:
            if bound == limit and reader.read(1):
                raise CoreReadError(src, f"decompresses to more than {limit:,} bytes (FORENSICS_MAX_CORE_BYTES)")
            break
    return n
