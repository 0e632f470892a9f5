"""Real images for the verify-imports tests, built without a Docker engine.

A base layer holds a runnable CPython 3.11 (the pyenv build found on this
machine, its stdlib, libpython and the shared libraries it needs, so that the
image runs on its own under bubblewrap); upper layers hold real nvitop /
nvitop-exporter / nvidia-ml-py wheels from PyPI installed into site-packages
(RECORD, INSTALLER, console scripts), stale source trees, whiteouts.  Images are
written as OCI layouts (optionally as an index with an attestation manifest) and
as docker-archive tars.  Wheels and the base layer are cached under
$FORENSICS_CACHE (default ~/.cache/forensics).

This module holds no tests; the test modules import its helpers.
"""
from __future__ import annotations

import base64
import csv
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.pythons import discover_pythons  # noqa: E402

CACHE = Path(os.environ.get("FORENSICS_CACHE") or Path.home() / ".cache" / "forensics")
WHEELS = CACHE / "wheels"
BUILDER_VERSION = 4
PY_VERSION = "3.11"
SITE = f"/usr/local/lib/python{PY_VERSION}/site-packages"


def host_python() -> str | None:
    return discover_pythons().get(PY_VERSION)


def missing_tool(*tools: str) -> str | None:
    """A skip reason when a tool is missing (install: bash tests/imports_env.sh)."""
    for t in tools:
        if shutil.which(t) is None:
            return f"{t} not installed (run: bash tests/imports_env.sh)"
    return None


# -- wheels ---------------------------------------------------------------------------------------

_WHEEL_NAME = {"nvitop": "nvitop", "nvitop-exporter": "nvitop_exporter", "nvidia-ml-py": "nvidia_ml_py",
               "psutil": "psutil", "prometheus-client": "prometheus_client", "pynvml": "pynvml"}


def wheel(name: str, version: str | None = None) -> Path:
    """A wheel from the cache, downloaded from PyPI with pip on first use."""
    WHEELS.mkdir(parents=True, exist_ok=True)
    stem = _WHEEL_NAME[name]
    pattern = re.compile(rf"^{stem}-{re.escape(version) if version else '[^-]+'}-.*\.whl$")
    found = sorted(p for p in WHEELS.iterdir() if pattern.match(p.name))
    if found:
        return found[-1]
    spec = f"{name}=={version}" if version else name
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(WHEELS), spec]
    if name == "psutil":
        cmd += ["--only-binary", ":all:", "--platform", "manylinux2014_x86_64", "--python-version", PY_VERSION]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    found = sorted(p for p in WHEELS.iterdir() if pattern.match(p.name))
    assert found, f"pip download {spec} produced no wheel"
    return found[-1]


# -- layers ---------------------------------------------------------------------------------------


@dataclass
class Layer:
    """A layer under construction: tar members in order."""

    members: list = field(default_factory=list)

    def file(self, path: str, data: bytes | str, mode: int = 0o644) -> Layer:
        if isinstance(data, str):
            data = data.encode()
        ti = tarfile.TarInfo(path.lstrip("/"))
        ti.size, ti.mode, ti.mtime = len(data), mode, 1700000000
        self.members.append((ti, data))
        return self

    def dir(self, path: str, mode: int = 0o755) -> Layer:
        ti = tarfile.TarInfo(path.lstrip("/"))
        ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, mode, 1700000000
        self.members.append((ti, None))
        return self

    def symlink(self, path: str, target: str) -> Layer:
        ti = tarfile.TarInfo(path.lstrip("/"))
        ti.type, ti.linkname, ti.mode, ti.mtime = tarfile.SYMTYPE, target, 0o777, 1700000000
        self.members.append((ti, None))
        return self

    def hardlink(self, path: str, target: str, raw_name: bool = False) -> Layer:
        ti = tarfile.TarInfo(path if raw_name else path.lstrip("/"))
        ti.type, ti.linkname, ti.mtime = tarfile.LNKTYPE, target, 1700000000
        self.members.append((ti, None))
        return self

    def raw(self, ti: tarfile.TarInfo, data: bytes | None = None) -> Layer:
        self.members.append((ti, data))
        return self

    def whiteout(self, path: str) -> Layer:
        parent, _, base = path.rstrip("/").rpartition("/")
        return self.file(f"{parent}/.wh.{base}", b"")

    def opaque(self, directory: str) -> Layer:
        return self.file(f"{directory.rstrip('/')}/.wh..wh..opq", b"")

    def tree(self, host_dir: str | Path, dest: str, exclude=lambda rel: False) -> Layer:
        host_dir = Path(host_dir)
        for dirpath, dirnames, filenames in os.walk(host_dir):
            rel_dir = os.path.relpath(dirpath, host_dir)
            dirnames[:] = sorted(d for d in dirnames if not exclude(os.path.normpath(os.path.join(rel_dir, d))))
            self.dir(os.path.normpath(f"{dest}/{rel_dir}"))
            for name in sorted(filenames):
                rel = os.path.normpath(os.path.join(rel_dir, name))
                if exclude(rel):
                    continue
                src = os.path.join(dirpath, name)
                if os.path.islink(src):
                    self.symlink(f"{dest}/{rel}", os.readlink(src))
                else:
                    self.file(f"{dest}/{rel}", Path(src).read_bytes(), os.stat(src).st_mode & 0o777)
        return self

    def install_wheel(self, whl: Path, site: str = SITE, bin_dir: str = "/usr/local/bin",
                      python: str = f"/usr/local/bin/python{PY_VERSION}") -> Layer:
        """Install a wheel the way pip does: files, RECORD with INSTALLER, console scripts."""
        with zipfile.ZipFile(whl) as z:
            names = z.namelist()
            info_dir = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
            record_rows = []
            for n in names:
                if n.endswith("/"):
                    continue
                data = z.read(n)
                if n == f"{info_dir}/RECORD":
                    continue
                self.file(f"{site}/{n}", data)
                record_rows.append([n, "sha256=" + _b64(hashlib.sha256(data).digest()), str(len(data))])
            self.file(f"{site}/{info_dir}/INSTALLER", b"pip\n")
            record_rows.append([f"{info_dir}/INSTALLER", "sha256=" + _b64(hashlib.sha256(b"pip\n").digest()), "4"])
            ep = z.read(f"{info_dir}/entry_points.txt").decode() if f"{info_dir}/entry_points.txt" in names else ""
        section = None
        for line in ep.splitlines():
            line = line.strip()
            if line.startswith("["):
                section = line.strip("[]")
            elif section == "console_scripts" and "=" in line:
                script, _, target = (x.strip() for x in line.partition("="))
                mod, _, func = target.partition(":")
                body = (f"#!{python}\n# -*- coding: utf-8 -*-\nimport re\nimport sys\nfrom {mod} import {func}\n"
                        f"if __name__ == '__main__':\n"
                        f"    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
                        f"    sys.exit({func}())\n").encode()
                self.file(f"{bin_dir}/{script}", body, 0o755)
                rel = os.path.relpath(f"{bin_dir}/{script}", site)
                record_rows.append([rel, "sha256=" + _b64(hashlib.sha256(body).digest()), str(len(body))])
        record_rows.append([f"{info_dir}/RECORD", "", ""])
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(record_rows)
        self.file(f"{site}/{info_dir}/RECORD", buf.getvalue())
        return self

    def source_tree(self, whl: Path, package: str, dest_dir: str) -> Layer:
        """A package's source as a plain tree (a stale checkout): no dist-info, no RECORD."""
        with zipfile.ZipFile(whl) as z:
            dirs = set()
            for n in sorted(z.namelist()):
                if n.startswith(package + "/") and not n.endswith("/"):
                    d = os.path.dirname(n)
                    if d not in dirs:
                        self.dir(f"{dest_dir}/{d}")
                        dirs.add(d)
                    self.file(f"{dest_dir}/{n}", z.read(n))
        return self

    def tar_bytes(self) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
            for ti, data in self.members:
                tf.addfile(ti, io.BytesIO(data) if data is not None else None)
        return buf.getvalue()


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


@dataclass(frozen=True)
class Blob:
    data_path: Path  # the stored (possibly compressed) blob
    digest: str
    diff_id: str
    size: int
    media_type: str


def make_blob(tar: bytes, out_dir: Path, compress: bool = True) -> Blob:
    out_dir.mkdir(parents=True, exist_ok=True)
    diff_id = "sha256:" + hashlib.sha256(tar).hexdigest()
    data = gzip.compress(tar, compresslevel=1, mtime=0) if compress else tar
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    p = out_dir / digest.split(":")[1]
    if not p.exists():
        p.write_bytes(data)
    mt = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if compress else "")
    return Blob(p, digest, diff_id, len(data), mt)


def _host_libs(python_root: Path) -> list[str]:
    sos = [str(python_root / "bin" / f"python{PY_VERSION}")]
    sos += [str(p) for p in (python_root / "lib" / f"python{PY_VERSION}" / "lib-dynload").glob("*.so")
            if "_tkinter" not in p.name]
    libs: set[str] = set()
    for so in sos:
        out = subprocess.run(["ldd", so], capture_output=True, text=True).stdout
        for line in out.splitlines():
            m = re.search(r"(/\S+\.so[.\d]*)", line)
            if m and "pyenv" not in m.group(1):
                libs.add(m.group(1))
    return sorted(libs)


def base_blob() -> Blob:
    """The CPython base layer, built once and cached (gzip, ~25 MB)."""
    exe = host_python()
    assert exe, "CPython 3.11 not found"
    pyroot = Path(exe).resolve().parents[1]
    key = hashlib.sha256(f"{BUILDER_VERSION}:{pyroot}:{os.stat(exe).st_mtime}".encode()).hexdigest()[:16]
    cache_dir = CACHE / "images" / f"base-{key}"
    meta = cache_dir / "blob.json"
    if meta.exists():
        d = json.loads(meta.read_text())
        return Blob(Path(d["path"]), d["digest"], d["diff_id"], d["size"], d["media_type"])
    layer = Layer()
    for d in ("/usr", "/usr/bin", "/usr/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local", "/usr/local/bin",
              "/usr/local/lib", "/etc", "/tmp", "/proc", "/dev", "/root", "/home", "/home/app"):
        layer.dir(d, 0o1777 if d == "/tmp" else 0o755)
    layer.symlink("/lib", "usr/lib").symlink("/lib64", "usr/lib64").symlink("/bin", "usr/bin")
    for lib in _host_libs(pyroot):
        real = os.path.realpath(lib)
        if "ld-linux" in lib:
            layer.file("/usr/lib64/ld-linux-x86-64.so.2", Path(real).read_bytes(), 0o755)
            continue
        usr = lambda p: p if p.startswith("/usr/") else "/usr" + p  # noqa: E731 - the image is usr-merged
        layer.file(usr(real), Path(real).read_bytes(), 0o755)
        if usr(lib) != usr(real):  # the soname link (libz.so.1 -> libz.so.1.2.13)
            layer.symlink(usr(lib), os.path.basename(real))
    # glibc's compatibility stubs, which manylinux wheels (psutil) still link against
    for compat in ("libpthread.so.0", "libdl.so.2", "librt.so.1", "libutil.so.1"):
        host = f"/usr/lib/x86_64-linux-gnu/{compat}"
        if os.path.exists(host):
            layer.file(host, Path(os.path.realpath(host)).read_bytes(), 0o755)
    libpy = pyroot / "lib" / f"libpython{PY_VERSION}.so.1.0"
    layer.file(f"/usr/lib/x86_64-linux-gnu/libpython{PY_VERSION}.so.1.0", libpy.read_bytes(), 0o755)
    layer.file(f"/usr/local/bin/python{PY_VERSION}", (pyroot / "bin" / f"python{PY_VERSION}").read_bytes(), 0o755)
    layer.symlink("/usr/local/bin/python3", f"python{PY_VERSION}").symlink("/usr/local/bin/python", "python3")
    skip_top = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages",
                f"config-{PY_VERSION}-x86_64-linux-gnu", "unittest", "pydoc_data"}

    def exclude(rel: str) -> bool:
        parts = rel.split(os.sep)
        return parts[0] in skip_top or "__pycache__" in parts or parts[-1].startswith("_tkinter")

    layer.tree(pyroot / "lib" / f"python{PY_VERSION}", f"/usr/local/lib/python{PY_VERSION}", exclude)
    layer.dir(SITE)
    layer.file("/etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"
                              "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
                              "app:x:1000:1000:app:/home/app:/bin/sh\n")
    layer.file("/etc/group", "root:x:0:\nnogroup:x:65534:\napp:x:1000:\n")
    cache_dir.mkdir(parents=True, exist_ok=True)
    blob = make_blob(layer.tar_bytes(), cache_dir)
    meta.write_text(json.dumps({"path": str(blob.data_path), "digest": blob.digest, "diff_id": blob.diff_id,
                                "size": blob.size, "media_type": blob.media_type}))
    return blob


# -- images ---------------------------------------------------------------------------------------


def image_config(blobs: list[Blob], *, env=None, entrypoint=None, cmd=None, workdir="/", user="") -> dict:
    env = list(env or [])
    if not any(e.startswith("PATH=") for e in env):
        env.insert(0, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return {"architecture": "amd64", "os": "linux", "created": "2024-01-01T00:00:00Z",
            "config": {"Env": env, "Entrypoint": entrypoint, "Cmd": cmd, "WorkingDir": workdir, "User": user},
            "rootfs": {"type": "layers", "diff_ids": [b.diff_id for b in blobs]}, "history": []}


def _put(layout: Path, data: bytes) -> tuple[str, int]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    p = layout / "blobs" / "sha256" / digest.split(":")[1]
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return digest, len(data)


def write_oci(layout: Path, blobs: list[Blob], config: dict, tag: str = "latest", attestation: bool = False,
              index: bool = False) -> str:
    """An OCI image layout; with ``attestation``, the tag points at an index carrying a BuildKit-style
    attestation manifest next to the linux/amd64 image."""
    layout.mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    for b in blobs:
        dest = layout / "blobs" / "sha256" / b.digest.split(":")[1]
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            if os.stat(b.data_path).st_dev == os.stat(dest.parent).st_dev:
                os.link(b.data_path, dest)
            else:
                shutil.copy(b.data_path, dest)
    cfg_digest, cfg_size = _put(layout, json.dumps(config).encode())
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg_digest,
                           "size": cfg_size},
                "layers": [{"mediaType": b.media_type, "digest": b.digest, "size": b.size} for b in blobs]}
    m_digest, m_size = _put(layout, json.dumps(manifest).encode())
    top = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": m_digest, "size": m_size,
           "annotations": {"org.opencontainers.image.ref.name": tag}}
    if attestation or index:
        entries = [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": m_digest, "size": m_size,
                    "platform": {"architecture": "amd64", "os": "linux"}}]
        if attestation:
            statement = json.dumps({"_type": "https://in-toto.io/Statement/v0.1",
                                    "predicateType": "https://slsa.dev/provenance/v0.2",
                                    "subject": [{"name": "image", "digest": {"sha256": m_digest.split(":")[1]}}],
                                    "predicate": {"builder": {"id": "forensics-tests"}}}).encode()
            s_digest, s_size = _put(layout, statement)
            a_cfg_digest, a_cfg_size = _put(layout, b"{}")
            att = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                   "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": a_cfg_digest,
                              "size": a_cfg_size},
                   "layers": [{"mediaType": "application/vnd.in-toto+json", "digest": s_digest, "size": s_size,
                               "annotations": {"in-toto.io/predicate-type": "https://slsa.dev/provenance/v0.2"}}]}
            a_digest, a_size = _put(layout, json.dumps(att).encode())
            entries.append({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": a_digest,
                            "size": a_size, "platform": {"architecture": "unknown", "os": "unknown"},
                            "annotations": {"vnd.docker.reference.digest": m_digest,
                                            "vnd.docker.reference.type": "attestation-manifest"}})
        idx = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": entries}
        i_digest, i_size = _put(layout, json.dumps(idx).encode())
        top = {"mediaType": "application/vnd.oci.image.index.v1+json", "digest": i_digest, "size": i_size,
               "annotations": {"org.opencontainers.image.ref.name": tag}}
    index_path = layout / "index.json"
    existing = json.loads(index_path.read_text()) if index_path.exists() else {"schemaVersion": 2, "manifests": []}
    existing["manifests"] = [m for m in existing["manifests"]
                             if (m.get("annotations") or {}).get("org.opencontainers.image.ref.name") != tag] + [top]
    index_path.write_text(json.dumps(existing))
    return f"oci:{layout}:{tag}"


def write_docker_archive(path: Path, blobs: list[Blob], config: dict, repotag: str = "forensics/test:latest") -> str:
    """``docker save`` format: <id>.json config, <n>/layer.tar (uncompressed), manifest.json, repositories."""
    cfg = json.dumps(config).encode()
    cfg_id = hashlib.sha256(cfg).hexdigest()
    with tarfile.open(path, "w") as tf:
        def add(name: str, data: bytes) -> None:
            ti = tarfile.TarInfo(name)
            ti.size, ti.mtime = len(data), 1700000000
            tf.addfile(ti, io.BytesIO(data))

        layers = []
        for i, b in enumerate(blobs):
            raw = b.data_path.read_bytes()
            if raw[:2] == b"\x1f\x8b":
                raw = gzip.decompress(raw)
            name = f"{i:03d}{b.diff_id.split(':')[1][:12]}/layer.tar"
            add(name, raw)
            layers.append(name)
        add(f"{cfg_id}.json", cfg)
        add("manifest.json",
            json.dumps([{"Config": f"{cfg_id}.json", "RepoTags": [repotag], "Layers": layers}]).encode())
        repo, _, tag = repotag.rpartition(":")
        add("repositories", json.dumps({repo: {tag: layers[-1].split("/")[0]}}).encode())
    return f"docker-archive:{path}"


# -- an editable install, made by pip itself ---------------------------------------------------------

EDITABLE_PYPROJECT = """[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "nvitop"
version = "1.7.1"

[tool.setuptools.packages.find]
include = ["nvitop*"]
"""


def editable_nvitop() -> tuple[Path, dict[str, bytes]]:
    """``pip install -e`` of a flat-layout checkout whose pyproject says 1.7.1 and whose code is 1.5.0's.

    Real pip and setuptools write the editable files (a ``__editable__`` .pth, its finder module with the
    MAPPING to the checkout, the dist-info with direct_url.json): the checkout stays at its path in the
    cache and the image holds it at the same path.  Returns (checkout, {site-packages relative path: bytes}).
    """
    base = CACHE / "images" / f"editable-nvitop-{BUILDER_VERSION}"
    proj, venv, done = base / "src" / "nvitop", base / "venv", base / "done.json"
    if not done.exists():
        if base.exists():
            shutil.rmtree(base)
        proj.mkdir(parents=True)
        with zipfile.ZipFile(wheel("nvitop", "1.5.0")) as z:
            for n in z.namelist():
                if n.startswith("nvitop/") and not n.endswith("/"):
                    (proj / n).parent.mkdir(parents=True, exist_ok=True)
                    (proj / n).write_bytes(z.read(n))
        (proj / "pyproject.toml").write_text(EDITABLE_PYPROJECT)
        subprocess.run([host_python(), "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
        p = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "-e", str(proj)],
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, f"pip install -e failed:\n{p.stdout}\n{p.stderr}"
        done.write_text("{}")
    site = venv / "lib" / f"python{PY_VERSION}" / "site-packages"
    files: dict[str, bytes] = {}
    for path in sorted(site.rglob("*")):
        rel = path.relative_to(site).as_posix()
        if path.is_file() and "__pycache__" not in rel and (
                rel.startswith(("__editable__", "nvitop-1.7.1.dist-info/"))):
            files[rel] = path.read_bytes()
    assert any(r.endswith("_finder.py") for r in files), f"setuptools wrote no editable finder: {sorted(files)}"
    return proj, files


# -- the scenarios ----------------------------------------------------------------------------------

STACK_171 = (("nvitop", "1.7.1"), ("nvitop-exporter", "1.7.1"), ("nvidia-ml-py", "13.580.126"))


def site_layer(stack=STACK_171) -> Layer:
    layer = Layer()
    for name, version in stack:
        layer.install_wheel(wheel(name, version))
    layer.install_wheel(wheel("psutil"))
    layer.install_wheel(wheel("prometheus-client"))
    return layer


SCENARIOS = {
    # name: (description, expected verdict of nvitop)
    "clean": "nvitop 1.7.1 installed, python -m nvitop_exporter from WORKDIR /srv",
    "incident": "WORKDIR /app holds nvitop 1.5.0 source; python -m nvitop_exporter",
    "safepath": "the incident image with ENV PYTHONSAFEPATH=1",
    "pythonpath": "nvitop 1.5.0 tree in /opt/legacy, ENV PYTHONPATH=/opt/legacy",
    "tmp-pythonpath": "nvitop 1.5.0 tree in the image's /tmp/legacy, ENV PYTHONPATH=/tmp/legacy",
    "pth": "a .pth import line puts /opt/legacy (nvitop 1.5.0) first",
    "whiteout": "the stale /app/nvitop deleted by a whiteout in an upper layer",
    "opaque": "the stale /app made opaque by an upper layer",
    "attestation": "the clean image behind an OCI index with an attestation manifest",
    "console-script": "a script entrypoint /app/bin/run-exporter with a stale nvitop tree next to it",
    "conflict": "nvitop 1.5.0 + nvitop-exporter 1.5.0 with nvidia-ml-py 12.575.51 (pip check fails)",
    "guard": "the clean image plus a `forensics guard` (.pth + module) in site-packages",
    "guard-off": "the guard image with the guard's switch set off in the image's Env",
    "editable": "nvitop installed with pip install -e from a checkout: metadata 1.7.1, code 1.5.0",
    "missing-lib": "the clean image with libpthread.so.0 (which PyPI's psutil extension needs) deleted by a layer",
}


def build_scenario(name: str, out: Path, fmt: str = "oci") -> str:  # noqa: C901 -- one case per scenario, side by side
    """Build scenario ``name`` as an OCI layout (``fmt='oci'``) or docker-archive; return its reference."""
    blobs_dir = out / "blobs-store"
    base = base_blob()
    entry = ["python3", "-m", "nvitop_exporter"]
    env, workdir, cmd = [], "/srv", None
    stale = Layer().source_tree(wheel("nvitop", "1.5.0"), "nvitop", "/app")
    layers: list[Layer] = [site_layer()]
    attestation = False
    if name == "clean":
        layers.append(Layer().dir("/srv").file("/srv/README", "exporter\n"))
    elif name in ("incident", "safepath"):
        workdir = "/app"
        layers.append(stale.dir("/app").file("/app/README.md", "old checkout\n"))
        if name == "safepath":
            env = ["PYTHONSAFEPATH=1"]
    elif name in ("pythonpath", "tmp-pythonpath"):
        legacy = "/opt/legacy" if name == "pythonpath" else "/tmp/legacy"
        layers.append(Layer().source_tree(wheel("nvitop", "1.5.0"), "nvitop", legacy).dir("/srv"))
        env = [f"PYTHONPATH={legacy}"]
    elif name == "pth":
        layers.append(Layer().source_tree(wheel("nvitop", "1.5.0"), "nvitop", "/opt/legacy").dir("/srv")
                      .file(f"{SITE}/legacy-paths.pth",
                            "# vendored tools\nimport sys; sys.path.insert(0, '/opt/legacy')\n"))
    elif name == "whiteout":
        workdir = "/app"
        layers.append(stale.dir("/app").file("/app/README.md", "old checkout\n"))
        layers.append(Layer().whiteout("/app/nvitop"))
    elif name == "opaque":
        workdir = "/app"
        layers.append(stale.dir("/app").file("/app/README.md", "old checkout\n"))
        layers.append(Layer().dir("/app").opaque("/app").file("/app/config.yaml", "port: 9000\n"))
    elif name == "missing-lib":
        layers.append(Layer().dir("/srv").whiteout("/usr/lib/x86_64-linux-gnu/libpthread.so.0"))
    elif name == "attestation":
        layers.append(Layer().dir("/srv"))
        attestation = True
    elif name == "console-script":
        entry = ["/app/bin/run-exporter", "--bind-address", "0.0.0.0"]
        script = ("#!/usr/local/bin/python3\nimport sys\nfrom nvitop_exporter.cli import main\n"
                  "if __name__ == '__main__':\n    sys.exit(main())\n")
        layers.append(Layer().dir("/app").dir("/app/bin").file("/app/bin/run-exporter", script, 0o755)
                      .source_tree(wheel("nvitop", "1.5.0"), "nvitop", "/app/bin").dir("/srv"))
    elif name in ("guard", "guard-off"):
        if name == "guard-off":
            env = ["FORENSICS_GUARD_NVLINK=off"]
        from forensics.guard import parse_target, render_guard

        files = render_guard(parse_target("nvitop.api.device:Device.nvlink_throughput", "[]", "FORENSICS_GUARD_NVLINK"))
        guard = Layer().dir("/srv")
        for fname, text in files.items():
            guard.file(f"{SITE}/{fname}", text)
        layers.append(guard)
    elif name == "editable":
        proj, files = editable_nvitop()
        layers = [site_layer(STACK_171[1:]), Layer().dir("/srv").tree(proj, str(proj))]
        for rel, data in files.items():
            layers[1].file(f"{SITE}/{rel}", data)
    elif name == "conflict":
        layers = [site_layer((("nvitop", "1.5.0"), ("nvitop-exporter", "1.5.0"), ("nvidia-ml-py", "12.575.51"))),
                  Layer().dir("/srv")]
    else:
        raise KeyError(name)
    blobs = [base] + [make_blob(layer.tar_bytes(), blobs_dir) for layer in layers]
    config = image_config(blobs, env=env, entrypoint=entry, cmd=cmd, workdir=workdir)
    if fmt == "oci":
        return write_oci(out / "oci", blobs, config, tag=name, attestation=attestation)
    return write_docker_archive(out / f"{name}.tar", blobs, config, repotag=f"forensics/{name}:latest")


class ImageFactory:
    """Builds each (scenario, format) once per session."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.cache: dict[tuple[str, str], str] = {}

    def get(self, name: str, fmt: str = "oci") -> str:
        key = (name, fmt)
        if key not in self.cache:
            t = time.monotonic()
            self.cache[key] = build_scenario(name, self.base, fmt)
            _ = time.monotonic() - t
        return self.cache[key]
