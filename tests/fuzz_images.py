"""A fuzz target for the image reader of ``forensics verify-imports``: seeded mutants of a small, valid image.

The seed is an OCI layout (and a docker-archive) made here: a gzip and a zstd layer holding
a Python tree as the analysis reads it (the stdlib landmark, site.py, site-packages with a
dist-info and RECORD, a .pth, a sitecustomize.py, /etc/passwd, dpkg's status and a file list),
a config with Entrypoint, Env, WorkingDir and User.  Each mutant changes one thing a broken or
hostile source controls -- a JSON value anywhere in index.json / the manifest / the config /
docker save's manifest.json (a type, a key, a nesting, a huge or non-ASCII value), a tar header
(names with '..', absolute, 5000 bytes long; link loops; devices; sizes), bytes of a layer
before or after compression (with the digests made to match, so the parser is reached), a
file's content (.pth, RECORD, METADATA, passwd, dpkg status, deeply nested source), or a
docker-archive member (a Config that is a symlink to itself, two symlinks to each other) --
and file names that carry terminal control characters.

Each mutant is read by the real command line through the shared harness (tests/fuzzing.py):
``verify-imports --json`` always, in text with ``-v`` every third mutant, with ``--execute``
every 25th.  Each run must end in a clear error or a result (exit 0 or 3), within its time
bound and its memory bound, with no control character on the terminal, and write nothing
outside its output (no file in the run's TMPDIR or working directory, nothing added to the
image's directory, no file where a traversal points).

    .venv/bin/python tests/fuzz_images.py --count 5000 --seed 1000     # more than CI's few hundred
"""
from __future__ import annotations

import argparse
import copy
import gzip
import hashlib
import io
import json
import os
import random
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fuzzing import SENTINEL_DIR, Harness, RunSpec, fuzz_count, fuzz_seed
from tests.scriptenv import require_checkout_python

__all__ = ["SeedImage", "mutate", "specs", "main", "SENTINEL_DIR"]
SITE = "/usr/local/lib/python3.11/site-packages"
TIME_BOUND = 30.0  # seconds for one mutant (the seed takes well under one)

SEED_FILES: dict[str, bytes] = {
    "/usr/local/bin/python3.11": b"\x7fELF not really\n",
    "/usr/local/lib/python3.11/os.py": b"# landmark\n",
    "/usr/local/lib/python3.11/site.py": b"# upstream site.py: site-packages\n",
    "/usr/local/lib/python3.11/sitecustomize.py": b"import sys\nsys.path.append('/opt/extra')\n",
    f"{SITE}/nvitop/__init__.py": b"__version__ = '1.7.1'\n",
    f"{SITE}/nvitop/version.py": b"__version__ = '1.7.1'\n",
    f"{SITE}/nvitop-1.7.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: nvitop\nVersion: 1.7.1\n"
                                                b"Requires-Dist: nvidia-ml-py<13.596.0a0,>=11.450.51\n",
    f"{SITE}/pynvml.py": b"# nvidia-ml-py\n",
    f"{SITE}/nvidia_ml_py-12.575.51.dist-info/METADATA": b"Metadata-Version: 2.1\nName: nvidia-ml-py\n"
                                                           b"Version: 12.575.51\n",
    f"{SITE}/extra.pth": b"../../../../opt/legacy\nimport sys; sys.path.insert(0, '/opt/first')\n",
    "/opt/legacy/nvitop/__init__.py": b"__version__ = '1.5.0'\n",
    "/app/nvitop/__init__.py": b"__version__ = '1.5.0'\n",
    "/etc/passwd": b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n",
    "/etc/group": b"root:x:0:\napp:x:1000:\n",
    "/var/lib/dpkg/status": b"Package: python3-psutil\nStatus: install ok installed\nVersion: 5.9.4-1\n"
                            b"Architecture: amd64\nDepends: python3\n\n",
    "/var/lib/dpkg/info/python3-psutil.list": f"/.\n{SITE}/psutil\n{SITE}/psutil/__init__.py\n".encode(),
    f"{SITE}/psutil/__init__.py": b"__version__ = '5.9.4'\n",
}


def _record(files: dict[str, bytes], dist_info: str, prefix: str) -> bytes:
    import base64

    rows = []
    for p, data in files.items():
        if p.startswith(prefix + "/"):
            rel = p[len(prefix) + 1:]
            h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{rel},sha256={h},{len(data)}")
    rows.append(f"{dist_info}/RECORD,,")
    return ("\n".join(rows) + "\n").encode()


def _members(files: dict[str, bytes]) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    out, dirs = [], set()
    for path in sorted(files):
        parts = path.strip("/").split("/")
        for i in range(1, len(parts)):
            d = "/".join(parts[:i])
            if d not in dirs:
                dirs.add(d)
                ti = tarfile.TarInfo(d)
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                out.append((ti, None))
        ti = tarfile.TarInfo(path.strip("/"))
        ti.size, ti.mode = len(files[path]), 0o755 if "/bin/" in path else 0o644
        out.append((ti, files[path]))
    link = tarfile.TarInfo("usr/local/bin/python3")
    link.type, link.linkname = tarfile.SYMTYPE, "python3.11"
    out.append((link, None))
    return out


def tar_bytes(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for ti, data in members:
            ti = copy.copy(ti)
            if data is not None and ti.isreg():
                ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data) if data is not None and ti.isreg() else None)
    return buf.getvalue()


def zstd(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor().compress(data)


class SeedImage:
    """The seed: its documents as JSON values and its layers as tar members, serialized on demand."""

    def __init__(self) -> None:
        files = dict(SEED_FILES)
        files[f"{SITE}/nvitop-1.7.1.dist-info/RECORD"] = _record(
            {k: v for k, v in files.items() if f"{SITE}/nvitop/" in k or "nvitop-1.7.1.dist-info" in k},
            "nvitop-1.7.1.dist-info", SITE)
        files[f"{SITE}/nvidia_ml_py-12.575.51.dist-info/RECORD"] = _record(
            {k: v for k, v in files.items() if k.endswith("/pynvml.py") or "nvidia_ml_py-12.575.51" in k},
            "nvidia_ml_py-12.575.51.dist-info", SITE)
        names = sorted(files)
        half = len(names) // 2
        self.layers = [_members({k: files[k] for k in names[:half]}), _members({k: files[k] for k in names[half:]})]
        self.compression = ["gzip", "zstd"]
        self.config = {"architecture": "amd64", "os": "linux",
                       "config": {"Entrypoint": ["python3", "-m", "nvitop"], "Cmd": ["--once"],
                                  "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/root"], "WorkingDir": "/app",
                                  "User": "app"},
                       "rootfs": {"type": "layers", "diff_ids": []}}
        self.manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                         "config": {"mediaType": "application/vnd.oci.image.config.v1+json"}, "layers": []}
        self.index = {"schemaVersion": 2,
                      "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                                     "annotations": {"org.opencontainers.image.ref.name": "seed"}}]}
        self.blob_hook = None  # (layer index, stage "tar"|"compressed", fn(bytes) -> bytes)
        self.raw_docs: dict[str, bytes] = {}  # document name -> bytes that replace its serialization
        self.keep_digests = True  # recompute digests after a mutation, so the parser is reached

    def layer_blobs(self) -> list[tuple[bytes, bytes]]:
        """(stored blob, uncompressed tar) per layer."""
        out = []
        for i, members in enumerate(self.layers):
            tar = tar_bytes(members)
            if self.blob_hook and self.blob_hook[0] == i and self.blob_hook[1] == "tar":
                tar = self.blob_hook[2](tar)
            kind = self.compression[i]
            blob = gzip.compress(tar, mtime=0) if kind == "gzip" else zstd(tar) if kind == "zstd" else tar
            if self.blob_hook and self.blob_hook[0] == i and self.blob_hook[1] == "compressed":
                blob = self.blob_hook[2](blob)
            out.append((blob, tar))
        return out

    def write_oci(self, layout: Path) -> str:
        blobs = layout / "blobs" / "sha256"
        blobs.mkdir(parents=True)
        (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')

        def put(data: bytes) -> str:
            d = hashlib.sha256(data).hexdigest()
            (blobs / d).write_bytes(data)
            return "sha256:" + d

        config, manifest, index = copy.deepcopy(self.config), copy.deepcopy(self.manifest), copy.deepcopy(self.index)
        layer_descs = []
        for blob, tar in self.layer_blobs():
            layer_descs.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": put(blob),
                                "size": len(blob)})
            rootfs = config.get("rootfs") if isinstance(config, dict) else None
            if isinstance(rootfs, dict) and isinstance(rootfs.get("diff_ids"), list):
                rootfs["diff_ids"].append("sha256:" + hashlib.sha256(tar).hexdigest())
        cfg = self.raw_docs.get("config") or dump(config)
        mcfg = manifest.get("config") if isinstance(manifest, dict) else None
        if isinstance(mcfg, dict) and "digest" not in mcfg:
            mcfg["digest"] = put(cfg)
            mcfg["size"] = len(cfg)
        else:
            put(cfg)
        if isinstance(manifest, dict) and manifest.get("layers") == []:
            manifest["layers"] = layer_descs
        man = self.raw_docs.get("manifest") or dump(manifest)
        m_digest = put(man)
        mans = index.get("manifests") if isinstance(index, dict) else None
        if isinstance(mans, list) and mans and isinstance(mans[0], dict) and "digest" not in mans[0]:
            index["manifests"][0]["digest"] = m_digest
            index["manifests"][0]["size"] = len(man)
        (layout / "index.json").write_bytes(self.raw_docs.get("index") or dump(index))
        return f"oci:{layout}"

    def write_archive(self, path: Path, extra: list[tuple[tarfile.TarInfo, bytes | None]] = (),
                      manifest: object = None) -> str:
        """docker save's format; ``extra`` members are added (symlinks among them), ``manifest`` replaces
        manifest.json's value."""
        cfg = self.raw_docs.get("config") or dump(self.config)
        cfg_name = hashlib.sha256(cfg).hexdigest() + ".json"
        layers = []
        with tarfile.open(path, "w") as tf:
            def add(name: str, data: bytes) -> None:
                ti = tarfile.TarInfo(name)
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))

            for i, (_, tar) in enumerate(self.layer_blobs()):
                add(f"l{i}/layer.tar", tar)
                layers.append(f"l{i}/layer.tar")
            add(cfg_name, cfg)
            for ti, data in extra:
                tf.addfile(ti, io.BytesIO(data) if data is not None else None)
            doc = manifest if manifest is not None else [{"Config": cfg_name, "RepoTags": ["seed:latest"],
                                                          "Layers": layers}]
            add("manifest.json", self.raw_docs.get("archive") or dump(doc))
        return f"docker-archive:{path}"


# -- mutations -------------------------------------------------------------------------------------------

_WEIRD = [None, True, 0, -1, 5, 2 ** 70, 1.5, "", "x" * 5000, "\u0661\u0662\u0663", "\u00b2", "/../../etc",
          "sha512:zz", "sha256:" + "0" * 64, [], [1, 2], [[["a"]]], {}, {"a": 1}, "\x00", "../" * 50 + "tmp",
          "/app\x1b]0;owned\x07\r\n  result: OK", ["python3", "-m", "nvitop\x1b[2J"]]

#: what a hostile name carries to a terminal: a title change, a screen clear, a forged line, a CSI in C1
_CONTROL_TAILS = ["\x1b]0;owned\x07", "\x1b[2J", "\r\n  result: OK (forged)", "\x9b31m", "\x7f\x08\x08"]


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))


def _set(doc, path, value):
    if not path:
        return value
    cur = doc
    for p in path[:-1]:
        cur = cur[p]
    if value is _DELETE:
        del cur[path[-1]]
    else:
        cur[path[-1]] = value
    return doc


_DELETE = object()


DEEP = "@@deep@@"  # replaced by a nesting too deep for json.dumps to write (and for json.loads to read)


def _weird(rng: random.Random):
    if rng.random() < 0.1:
        return DEEP
    return copy.deepcopy(rng.choice(_WEIRD))


def dump(value: object) -> bytes:
    """JSON bytes; the DEEP placeholder becomes 100,000 nested lists."""
    text = json.dumps(value)
    return text.replace(json.dumps(DEEP), "[" * 100_000 + "1" + "]" * 100_000).encode()


def _mutate_json(rng: random.Random, img: SeedImage, which: str) -> str:
    doc = {"config": img.config, "manifest": img.manifest, "index": img.index}[which]
    paths = list(_paths(doc))
    path = rng.choice(paths)
    if rng.random() < 0.15 and path:
        new = _set(doc, path, _DELETE)
        what = "delete"
    else:
        new = _set(doc, path, _weird(rng))
        what = "set"
    setattr(img, which, new if path else new)
    return f"{which}: {what} {'.'.join(map(str, path))[:80]}"


def _sentinel(rng: random.Random) -> str:
    return f"{SENTINEL_DIR}/{rng.getrandbits(48):x}"


def _mutate_member(rng: random.Random, img: SeedImage) -> str:
    li = rng.randrange(len(img.layers))
    members = img.layers[li]
    i = rng.randrange(len(members))
    ti, data = members[i]
    ti = copy.copy(ti)
    choice = rng.randrange(11)
    if choice == 10:
        head, _, tail = ti.name.rpartition("/")
        ti.name = f"{head}/{tail}{rng.choice(_CONTROL_TAILS)}" if head else tail + rng.choice(_CONTROL_TAILS)
        members[i] = (ti, data)
        return f"layer {li}: control characters in the name of {ti.name[:60]!r}"
    if choice == 0:
        ti.name = "../" * rng.randint(1, 12) + _sentinel(rng).lstrip("/")
        what = "traversal name"
    elif choice == 1:
        ti.name = _sentinel(rng)
        what = "absolute name"
    elif choice == 2:
        ti.name = "a/" * rng.randint(1000, 3000) + "x"
        what = "long name"
    elif choice == 3:
        ti.type, ti.linkname = tarfile.SYMTYPE, rng.choice([ti.name.rsplit("/", 1)[-1], "/", "../" * 20, ti.name])
        data = None
        what = "symlink"
    elif choice == 4:
        ti.type, ti.linkname = tarfile.LNKTYPE, rng.choice(["/etc/shadow", "../../etc/passwd", "missing", ti.name])
        data = None
        what = "hard link"
    elif choice == 5:
        ti.type, ti.devmajor, ti.devminor = rng.choice([tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE]), 1, 3
        data = None
        what = "special file"
    elif choice == 6:
        ti.mode = rng.choice([0o4755, 0o7777, 0, 0o1777])
        what = "mode"
    elif choice == 7 and data is not None:
        data = _mutate_content(rng, ti.name, data)
        what = "content"
    elif choice == 8:
        # a symlink parent, then a file written through it
        ti2 = tarfile.TarInfo(ti.name.rsplit("/", 1)[0] + "/through/" + os.path.basename(_sentinel(rng)))
        ti2.size = 1
        link = tarfile.TarInfo(ti.name.rsplit("/", 1)[0] + "/through")
        link.type, link.linkname = tarfile.SYMTYPE, rng.choice(["/", "/tmp", "../../../.."])
        members.insert(i, (link, None))
        members.insert(i + 1, (ti2, b"x"))
        return f"layer {li}: write through a symlink"
    else:
        ti.name = rng.choice([".wh.." + ti.name, ti.name.rsplit("/", 1)[0] + "/.wh..wh..opq", ti.name + "/.wh."])
        what = "whiteout"
    members[i] = (ti, data)
    return f"layer {li}: {what} of {members[i][0].name[:60]}"


def _mutate_content(rng: random.Random, name: str, data: bytes) -> bytes:
    options = [b"\xff\xfe\x00garbage", b"import sys; sys.path.insert(0, " + b"(" * 300 + b")\n",
               b"1" + b"+1" * 100000, b"-" * 100000 + b"1", data * 1000, b"", b"x" * (3 << 20),
               b"Name: \xff\nVersion: " + b"9" * 5000 + b"\n", b'"' * 10000, b"a,b,c\n" * 50000,
               b"root:x:abc:0::/:/bin/sh\napp:x:\xd9\xa1:1:::\n", b"/opt/\x1b]0;owned\x07\r\nimport sys\n",
               b"\n\n".join([b"Package: p\nStatus: install ok installed"] * 3000)]
    return rng.choice(options)


def _mutate_blob(rng: random.Random, img: SeedImage) -> str:
    li = rng.randrange(len(img.layers))
    stage = rng.choice(["tar", "compressed"])

    def flip(data: bytes) -> bytes:
        b = bytearray(data)
        for _ in range(rng.randint(1, 16)):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
        if rng.random() < 0.3:
            b = b[: rng.randrange(len(b) + 1)]
        return bytes(b)

    img.blob_hook = (li, stage, flip)
    return f"layer {li}: bytes of the {stage} stream"


def mutate(seed: int) -> tuple[SeedImage, str, str]:
    """The mutant for ``seed``: (image, format "oci" | "archive", what changed)."""
    rng = random.Random(seed)
    img = SeedImage()
    fmt = "archive" if rng.random() < 0.25 else "oci"
    kind = rng.randrange(5)
    if kind == 0:
        what = _mutate_json(rng, img, rng.choice(["config", "manifest", "index"] if fmt == "oci" else ["config"]))
    elif kind in (1, 2):
        what = _mutate_member(rng, img)
    elif kind == 3:
        what = _mutate_blob(rng, img)
    else:
        li = rng.randrange(len(img.layers))
        img.compression[li] = rng.choice(["gzip", "zstd", "none"])
        what = _mutate_member(rng, img)
    return img, fmt, what


def _archive_extra(rng: random.Random, img: SeedImage):
    """docker-archive specials: a Config that is a symlink to itself or to another symlink (#13 item 3a)."""
    choice = rng.randrange(4)
    if choice == 0:
        ti = tarfile.TarInfo("loop.json")
        ti.type, ti.linkname = tarfile.SYMTYPE, "loop.json"
        return [(ti, None)], [{"Config": "loop.json", "Layers": []}], "Config is a symlink to itself"
    if choice == 1:
        a, b = tarfile.TarInfo("a.json"), tarfile.TarInfo("b.json")
        a.type, a.linkname, b.type, b.linkname = tarfile.SYMTYPE, "b.json", tarfile.SYMTYPE, "a.json"
        return [(a, None), (b, None)], [{"Config": "a.json", "Layers": ["a.json"]}], "two symlinks to each other"
    if choice == 2:
        return [], _weird(rng), "manifest.json value"
    return [], None, "none"


def specs(ref: str, seed: int, execute_every: int, mutant_dir: str) -> list[RunSpec]:
    """The command lines each mutant is read with: --json always; every third mutant in text too (what
    a terminal shows of an image's names); every ``execute_every``-th with --execute."""
    base = ["verify-imports", ref]
    out = [RunSpec(base + ["--json"], json=True, time_bound=TIME_BOUND, results=(0, 3), inputs=(mutant_dir,))]
    if seed % 3 == 0:
        out.append(RunSpec(base + ["-v"], time_bound=TIME_BOUND, results=(0, 3), inputs=(mutant_dir,)))
    if execute_every > 0 and seed % execute_every == 0:
        out.append(RunSpec(base + ["--json", "--execute"], json=True, time_bound=TIME_BOUND, results=(0, 3),
                           inputs=(mutant_dir,)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=fuzz_count())
    ap.add_argument("--seed", type=int, default=fuzz_seed())
    ap.add_argument("--execute-every", type=int, default=25, help="run every Nth mutant with --execute too")
    ap.add_argument("--json", action="store_true", help="one JSON line per run on stdout")
    args = ap.parse_args(argv)
    require_checkout_python("tests/fuzz_images.py", ("zstandard",))
    # imported once; every run is a fork of this process
    import forensics.cli
    import forensics.commands.verify_imports
    import forensics.imports.verify  # noqa: F401

    harness = Harness("images", json_lines=args.json, command="verify-imports")
    work = Path(tempfile.mkdtemp(prefix="fuzz-images-"))
    try:
        for seed in range(args.seed, args.seed + args.count):
            img, fmt, what = mutate(seed)
            d = work / str(seed)
            d.mkdir()
            rng = random.Random(seed ^ 0x5EED)
            if fmt == "oci":
                ref = img.write_oci(d / "oci")
            else:
                extra, manifest, special = _archive_extra(rng, img) if rng.random() < 0.4 else ([], None, "")
                what += f"; archive: {special}" if special else ""
                ref = img.write_archive(d / "img.tar", extra, manifest)
            for spec in specs(ref, seed, args.execute_every, str(d)):
                harness.run(seed, f"{fmt}: {what}", spec)
            shutil.rmtree(d, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return harness.finish()


if __name__ == "__main__":
    sys.exit(main())
