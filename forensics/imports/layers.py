"""Read image layers in order, whiteouts applied, without trusting them.

One streaming pass over each layer builds a merged index of the image's file
system (:class:`LayerFS`): headers only, plus the bytes of the few small files
the analysis reads (``.pth``, dist-info metadata, ``__init__.py``/``version.py``,
``pyvenv.cfg``, ``site.py``/``sitecustomize.py``, ``/etc/passwd``, dpkg's status and
the file lists of its Python packages).  Files the analysis asks for later are
fetched by a second, targeted pass (:meth:`LayerFS.fetch`).

Every member is checked before it enters the index: no absolute paths, no
``..``, no path a runtime could not create (PATH_MAX, NAME_MAX), no parent that
is a symlink, no hard link to a path outside the image or not in it; device
nodes are skipped (counted in a note) and setuid/setgid bits dropped; the number
of entries, the uncompressed bytes and the compression ratio are bounded.  A
hostile layer raises :class:`~forensics.errors.LayerRejected` before anything
is written; :meth:`LayerFS.extract` (for ``--execute``) only ever writes the
validated index, creating directories first and links last, with
``O_NOFOLLOW | O_EXCL``.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
import stat
import tarfile
from collections.abc import Callable, Iterable

from ..errors import ImageFormatError, LayerLimitExceeded, LayerRejected
from .imagemeta import MAX_PATH
from .layerstream import _CHUNK, LayerBlob, LayerLimits, _Shared, _Stream
from .rootfs import Node, RootFS

__all__ = ["LayerFS", "read_layers", "default_capture"]

_WH = ".wh."
_OPAQUE = ".wh..wh..opq"


class _Entry:
    __slots__ = ("kind", "size", "mode", "target", "content", "layer", "ordinal", "link")

    def __init__(self, kind, size, mode, target, layer, ordinal, link=None):
        self.kind = kind
        self.size = size
        self.mode = mode
        self.target = target
        self.content = None
        self.layer = layer
        self.ordinal = ordinal
        self.link = link  # a hard link: the in-root path of the file it shares data with


def default_capture(modules: Iterable[str] = ()) -> Callable[[str, int], bool]:
    """The predicate choosing which files' bytes the first pass keeps: what the resolver reads.

    >>> keep = default_capture(["nvitop"])
    >>> keep("/app/nvitop/version.py", 900), keep("/usr/lib/x/big.py", 900), keep("/s/a.pth", 10)
    (True, False, True)
    """
    names = {m.split(".")[0] for m in modules}
    meta = {"RECORD", "METADATA", "top_level.txt", "INSTALLER", "PKG-INFO", "installed-files.txt", "direct_url.json",
            "requires.txt"}
    versionish = {"__init__.py", "version.py", "_version.py", "__version__.py", "__about__.py", "_about.py"}
    fixed = {"/etc/passwd", "/etc/group", "/var/lib/dpkg/status"}
    site = {"site.py", "sitecustomize.py", "usercustomize.py"}

    def keep(path: str, size: int) -> bool:
        base = path.rsplit("/", 1)[-1]
        if base.endswith(".pth") or base == "pyvenv.cfg" or path in fixed or base.startswith("forensics_guard_"):
            return True
        parent = path[: len(path) - len(base) - 1]
        if base in site:
            return True
        if parent == "/var/lib/dpkg/info" and "python" in base and base.endswith((".list", ".md5sums")):
            return True
        if base in meta and (parent.endswith(".dist-info") or parent.endswith(".egg-info")):
            return True
        if base.endswith(".egg-info"):
            return True
        if base in versionish and size <= 256 << 10:
            return True
        return base.endswith(".py") and base[:-3] in names

    return keep


def _clean_name(layer: str, name: str) -> str:
    """The member's in-root path, or raise for absolute paths and ``..``."""
    if "\x00" in name:
        raise LayerRejected(layer, name, "NUL in path")
    if name.startswith("/"):
        raise LayerRejected(layer, name, "absolute path in layer (would land outside the image root)")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise LayerRejected(layer, name, "path traversal ('..') in layer")
    path = "/" + "/".join(parts)
    if len(path.encode("utf-8", "surrogateescape")) > MAX_PATH:
        raise LayerRejected(layer, name[:200] + "...", f"path longer than {MAX_PATH} bytes: no runtime can unpack it")
    if any(len(p.encode("utf-8", "surrogateescape")) > 255 for p in parts):
        raise LayerRejected(layer, name[:200] + "...",
                            "a path component longer than 255 bytes: no runtime can unpack it")
    return path


class LayerFS(RootFS):
    """The merged file system of an image's layers, built by :func:`read_layers`."""

    def __init__(self, blobs: tuple[LayerBlob, ...], limits: LayerLimits, description: str) -> None:
        self.blobs = blobs
        self.limits = limits
        self.description = description
        self.entries: dict[str, _Entry] = {"/": _Entry("dir", 0, 0o755, None, -1, -1)}
        self.children: dict[str, set[str]] = {"/": set()}
        self.misses: set[str] = set()
        self.unfetchable: set[str] = set()  # asked for, but over the bounds: read as absent
        self.fetched = 0
        self.captured = 0
        self.members = 0
        self.uncompressed = 0
        self.compressed = 0
        self.notes: list[str] = []  # counts that change no verdict
        self._setid_dropped = 0
        self._skipped_special = 0
        self._skipped_devices = 0

    # -- RootFS ---------------------------------------------------------------------------
    def lstat(self, path: str) -> Node | None:
        e = self.entries.get(path)
        if e is None:
            return None
        return Node(e.kind, e.size, e.mode, e.target)

    def _listdir(self, path: str) -> list[str]:
        return list(self.children.get(path, ()))

    def _read(self, path: str, limit: int) -> bytes | None:
        e = self.entries.get(path)
        if e is None:
            return None
        if e.content is None and e.size:
            if path not in self.unfetchable:
                self.misses.add(path)
            return None
        return e.content if e.content is not None else b""

    # -- building ---------------------------------------------------------------------------
    def _remove(self, path: str) -> None:
        """Drop ``path`` and everything below it (iteratively: a layer may nest thousands deep)."""
        if self.entries.pop(path, None) is None:
            return
        parent, _, base = path.rpartition("/")
        self.children.get(parent or "/", set()).discard(base)
        stack = [path]
        while stack:
            p = stack.pop()
            for child in self.children.pop(p, ()):
                c = p.rstrip("/") + "/" + child
                if self.entries.pop(c, None) is not None:
                    stack.append(c)

    def _check_parents(self, layer: str, name: str, path: str, pending: dict[str, _Entry]) -> None:
        parent = path.rpartition("/")[0]
        while parent:
            e = pending.get(parent) or self.entries.get(parent)
            if e is not None:
                if e.kind == "symlink":
                    raise LayerRejected(layer, name, f"parent {parent} is a symlink (-> {e.target}); "
                                                     "writing through it could leave the image root")
                if e.kind != "dir":
                    raise LayerRejected(layer, name, f"parent {parent} is not a directory")
            parent = parent.rpartition("/")[0]

    def _iter_members(self, blob: LayerBlob, stream: _Stream):
        """(ordinal, TarInfo, TarFile) for each member; tarfile's random-access mode over a forward-only stream."""
        try:
            tf = tarfile.open(fileobj=stream, mode="r:")  # noqa: SIM115 - closed below
        except tarfile.TarError as e:
            raise ImageFormatError(blob.name, "layer", f"not a tar archive: {e}") from e
        ordinal = -1
        try:
            while True:
                try:
                    m = tf.next()
                except tarfile.TarError as e:
                    raise ImageFormatError(blob.name, "layer", f"bad tar: {e}") from e
                if m is None:
                    break
                # the index keeps what it needs; TarInfo objects would pile up in tarfile's own list (an
                # attribute typeshed does not declare)
                tf.members = []  # type: ignore[attr-defined]
                ordinal += 1
                yield ordinal, m, tf
        finally:
            tf.close()

    def _scan_layer(self, index: int, blob: LayerBlob, keep: Callable[[str, int], bool], shared: _Shared) -> _Scan:
        """Read one layer (in a worker thread): check every member on its own, keep wanted bytes."""
        lim = self.limits
        scan = _Scan()
        with blob.open() as raw:
            stream = _Stream(raw, blob, lim, shared)
            for ordinal, m, tf in self._iter_members(blob, stream):
                scan.members += 1
                if scan.members > lim.max_files:
                    raise LayerLimitExceeded(blob.name, m.name, f"more than {lim.max_files} entries (--max-files)")
                self._scan_member(blob.name, index, ordinal, m, tf, keep, scan, shared)
            stream.finish()
            scan.compressed = stream.compressed
        return scan

    def _scan_member(self, layer: str, index: int, ordinal: int, m: tarfile.TarInfo, tf: tarfile.TarFile,
                     keep, scan: _Scan, shared: _Shared) -> None:
        lim = self.limits
        path = _clean_name(layer, m.name)
        if path == "/":
            return
        parent, _, base = path.rpartition("/")
        parent = parent or "/"
        if base.startswith(_WH):
            if base == _OPAQUE:
                scan.records.append((2, parent, None, None, m.name))
            else:
                hidden = base[len(_WH):]
                if not hidden or hidden in (".", ".."):
                    raise LayerRejected(layer, m.name, "malformed whiteout")
                scan.records.append((1, parent.rstrip("/") + "/" + hidden, None, None, m.name))
            return
        mode = m.mode & 0o7777
        if mode & (stat.S_ISUID | stat.S_ISGID):
            mode &= ~(stat.S_ISUID | stat.S_ISGID)
            scan.setid += 1
        link = None
        if m.isdir():
            e = _Entry("dir", 0, mode, None, index, ordinal)
        elif m.issym():
            e = _Entry("symlink", 0, mode, m.linkname, index, ordinal)
        elif m.islnk():
            target = m.linkname
            if target.startswith("/"):
                raise LayerRejected(layer, m.name, f"hard link to absolute path {target} (outside the image root)")
            tparts = [p for p in target.split("/") if p not in ("", ".")]
            if ".." in tparts:
                raise LayerRejected(layer, m.name, f"hard link to {target} escapes the image root")
            link = "/" + "/".join(tparts)
            e = _Entry("file", 0, mode, None, index, ordinal)
        elif m.isreg():
            e = _Entry("file", m.size, mode, None, index, ordinal)
            if m.size <= lim.max_capture and keep(path, m.size) and shared.reserve(m.size, lim.max_capture_total):
                e.content = _member_bytes(layer, tf, m)
        elif m.ischr() or m.isblk():
            # a root file system packed as a layer (mmdebstrap, docker import) carries /dev/console, /dev/null:
            # never created, never read, and no import depends on them
            scan.devices += 1
            return
        else:  # FIFOs: harmless, but nothing the analysis needs and nothing extract() creates
            scan.special += 1
            e = _Entry("other", 0, mode, None, index, ordinal)
        scan.records.append((0, path, e, link, m.name))

    def _merge_layer(self, index: int, blob: LayerBlob, scan: _Scan) -> None:
        """Apply one scanned layer on top of the index: parents, hard links, whiteouts (in layer order)."""
        self.members += scan.members
        if self.members > self.limits.max_files:
            raise LayerLimitExceeded(blob.name, "(image)", f"more than {self.limits.max_files} entries (--max-files)")
        self.compressed += scan.compressed
        self._setid_dropped += scan.setid
        self._skipped_special += scan.special
        self._skipped_devices += scan.devices
        pending: dict[str, _Entry] = {}
        names: dict[str, str] = {}
        links: dict[str, str] = {}
        whiteouts: list[tuple[str, bool]] = []
        for kind, path, e, link, name in scan.records:
            if kind == 0:
                pending[path] = e
                names[path] = name
                if link is not None:
                    links[path] = link
                else:
                    links.pop(path, None)
            else:
                whiteouts.append((path, kind == 2))
                # the marker lives in its parent directory (an opaque marker: in the directory itself)
                self._check_parents(blob.name, name, path.rstrip("/") + "/x" if kind == 2 else path, pending)
        for path in pending:
            self._check_parents(blob.name, names[path], path, pending)
        self._link(blob, links, names, pending)
        # whiteouts hide what the layers below hold, never what this layer adds
        for path, opaque in whiteouts:
            if opaque:
                for child in list(self.children.get(path, ())):
                    self._remove(path.rstrip("/") + "/" + child)
            else:
                self._remove(path)
        for path, e in pending.items():
            old = self.entries.get(path)
            if old is not None and not (old.kind == "dir" and e.kind == "dir"):
                self._remove(path)
            self.entries[path] = e
            parent, _, base = path.rpartition("/")
            parent = parent or "/"
            if parent not in self.entries:  # implicit parent directories
                self._mkdirs(parent, index)
            self.children.setdefault(parent, set()).add(base)
            if e.kind == "dir":
                self.children.setdefault(path, set())

    def _link(self, blob: LayerBlob, links: dict[str, str], names: dict[str, str], pending: dict[str, _Entry]) -> None:
        """A layer's hard links take their target's content: a file of this layer or of one below."""
        for path, target in links.items():
            t = pending.get(target) or self.entries.get(target)
            if t is None:
                raise LayerRejected(blob.name, names[path], f"hard link to {target[1:]}, which is not in the image")
            if t.kind != "file":
                raise LayerRejected(blob.name, names[path], f"hard link to {target[1:]}, which is a {t.kind}")
            self._check_parents(blob.name, target[1:], target, pending)
            e = pending[path]
            e.size, e.content, e.link = t.size, t.content, t.link or target

    def _fetch_layer(self, index: int, only: dict[int, str]) -> None:
        blob = self.blobs[index]
        with blob.open() as raw:
            stream = _Stream(raw, blob, self.limits, _Shared())
            for ordinal, m, tf in self._iter_members(blob, stream):
                path = only.get(ordinal)
                if path is not None and m.isreg():
                    e = self.entries.get(path)
                    if e is not None and m.size <= self.limits.max_fetch and \
                            self.fetched + m.size <= self.limits.max_capture_total:
                        e.content = _member_bytes(blob.name, tf, m)
                        self.fetched += m.size
                    elif e is not None:
                        e.content = None
                        self.unfetchable.add(path)

    def _mkdirs(self, path: str, layer: int) -> None:
        while path not in self.entries:
            self.entries[path] = _Entry("dir", 0, 0o755, None, layer, -1)
            self.children.setdefault(path, set())
            parent, _, base = path.rpartition("/")
            parent = parent or "/"
            self.children.setdefault(parent, set()).add(base)
            path = parent

    def fetch(self, paths: Iterable[str]) -> int:
        """Second, targeted pass: read the bytes of ``paths`` (in-root, resolved) that the first pass skipped."""
        want: dict[int, dict[int, str]] = {}
        for p in paths:
            e = self.entries.get(p)
            if e is None or e.kind != "file" or e.content is not None:
                continue
            src = e.link or p
            se = self.entries.get(src, e)
            want.setdefault(se.layer, {})[se.ordinal] = p
        for index, only in sorted(want.items()):
            self._fetch_layer(index, only)
        # a hard link's data was read under the link's first path; share it
        for p in paths:
            e = self.entries.get(p)
            if e is not None and e.content is None and e.link and self.entries.get(e.link) is not None:
                e.content = self.entries[e.link].content
        self.misses.difference_update(paths)
        return sum(len(v) for v in want.values())

    def finish(self) -> None:
        if self._setid_dropped:
            self.notes.append(f"{self._setid_dropped} setuid/setgid bits in the layers not kept (they change no "
                              "import)")
        if self._skipped_devices:
            self.notes.append(f"{self._skipped_devices} device nodes in the layers skipped (a root file system packed "
                              "as a layer carries /dev; they change no import)")
        if self._skipped_special:
            self.notes.append(f"{self._skipped_special} FIFOs/sockets in the layers ignored")

    # -- extraction for --execute -------------------------------------------------------------
    def extract(self, dest: str) -> None:
        """Write the validated, merged file system under ``dest`` (an empty directory).

        Directories first, then regular files (``O_EXCL|O_NOFOLLOW``), then hard links and
        symlinks, then directory modes: nothing is ever written through a link.
        """
        dest = os.path.realpath(dest)
        dirs = sorted(p for p, e in self.entries.items() if e.kind == "dir" and p != "/")
        for p in dirs:
            os.mkdir(dest + p, 0o700)
        by_layer: dict[int, dict[int, str]] = {}
        for p, e in self.entries.items():
            if e.kind == "file" and e.link is None:
                by_layer.setdefault(e.layer, {})[e.ordinal] = p
        for index, only in sorted(by_layer.items()):
            self._extract_layer(index, only, dest)
        for p, e in self.entries.items():
            if e.kind == "file" and e.link is not None:
                os.link(dest + e.link, dest + p, follow_symlinks=False)
                os.chmod(dest + p, e.mode & 0o777, follow_symlinks=False)
            elif e.kind == "symlink":
                os.symlink(e.target, dest + p)
        for p in reversed(dirs):
            os.chmod(dest + p, (self.entries[p].mode & 0o1777) | 0o700)

    def _extract_layer(self, index: int, only: dict[int, str], dest: str) -> None:
        blob = self.blobs[index]
        with blob.open() as raw:
            stream = _Stream(raw, blob, self.limits, _Shared())
            for ordinal, m, tf in self._iter_members(blob, stream):
                path = only.get(ordinal)
                if path is None or not m.isreg():
                    continue
                e = self.entries[path]
                fd = os.open(dest + path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             e.mode & 0o777)
                with os.fdopen(fd, "wb") as out:
                    src = tf.extractfile(m)
                    while src is not None:
                        try:
                            chunk = src.read(_CHUNK)
                        except tarfile.TarError as err:
                            raise ImageFormatError(blob.name, "layer", f"{m.name[:200]}: {err}") from err
                        if not chunk:
                            break
                        out.write(chunk)
                os.chmod(dest + path, e.mode & 0o777)


def _member_bytes(layer: str, tf: tarfile.TarFile, m: tarfile.TarInfo) -> bytes:
    """A member's data; a tar that ends inside it is a format error, not a crash."""
    try:
        f = tf.extractfile(m)
        return f.read() if f is not None else b""
    except tarfile.TarError as e:
        raise ImageFormatError(layer, "layer", f"{m.name[:200]}: {e}") from e


class _Scan:
    """One layer's members, checked on their own, in tar order (merged later, in layer order)."""

    __slots__ = ("records", "members", "compressed", "setid", "special", "devices")

    def __init__(self) -> None:
        self.records: list[tuple] = []  # (0 entry | 1 whiteout | 2 opaque, path, _Entry, hard link target, tar name)
        self.members = 0
        self.compressed = 0
        self.setid = 0
        self.special = 0
        self.devices = 0


def read_layers(blobs: Iterable[LayerBlob], *, limits: LayerLimits | None = None,
                capture: Callable[[str, int], bool] | None = None, description: str = "image") -> LayerFS:
    """Index the layers, lowest first, into a :class:`LayerFS`.

    :param blobs: the layers in manifest order (the base first)
    :param limits: bounds on entries, bytes and compression ratio
    :param capture: which files' bytes to keep in the first pass (see :func:`default_capture`)
    :raises LayerRejected: a member would land outside the root, links out, or is a device node
    :raises LayerLimitExceeded: the image is bigger than ``limits`` allow
    :raises ImageFormatError: a layer is not a tar (gzip, zstd) or does not match its digest
    """
    blobs = tuple(blobs)
    fs = LayerFS(blobs, limits or LayerLimits(), description)
    keep = capture or default_capture()
    shared = _Shared()
    workers = max(1, min(len(blobs), os.cpu_count() or 1, 4))
    # decompression and hashing release the GIL: layers are scanned in parallel, merged in order
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="forensics-layer")
    try:
        futures = [pool.submit(fs._scan_layer, i, b, keep, shared) for i, b in enumerate(blobs)]
        for index, (blob, fut) in enumerate(zip(blobs, futures, strict=True)):
            fs._merge_layer(index, blob, fut.result())
    except BaseException:
        shared.abort = True
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    fs.uncompressed = shared.uncompressed
    fs.captured = shared.captured
    fs.finish()
    return fs
