"""Roots someone else controls: a live container swapping a directory for a symlink to ``/`` while
forensics resolves paths through it, and capture bundles that name places outside themselves.

Every command that reads a root (analyze --sysroot, verify-imports dir:/--pid, capture --pid,
analyze BUNDLE) goes through the one resolver (forensics.rootpath).  Each layout puts a decoy
on the host exactly where a resolver that re-checks a string (or follows the swapped symlink)
would land, and a different file inside the root where the walk should end.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import zstandard
from click.testing import CliRunner

from forensics.procfs import open_in_root
from forensics.cli import cli
from forensics.core.files import resolve_file
from forensics.errors import UnsafeContainerPath
from forensics.imports.rootfs import DirFS
from tests.crashers.make_core import build_libcrash, make_core
from tests.helpers import pyelftools_build_id
from tests.pythons import discover_pythons
from tests.swapper import Swapper

ROUNDS = 3000  # lookups while the swapper runs: the old resolvers were caught within a few hundred
OUTSIDE = b"OUTSIDE-THE-ROOT\n"
INSIDE = b"inside the root\n"


def _rel(p: Path) -> str:
    return str(p).lstrip("/")


def _dist(site: Path, version: str, body: bytes) -> None:
    (site / "nvitop").mkdir(parents=True)
    (site / "nvitop/__init__.py").write_bytes(body)
    info = site / f"nvitop-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: nvitop\nVersion: {version}\n")
    (info / "RECORD").write_text("nvitop/__init__.py,,\n")


@pytest.fixture
def site_layout(tmp_path):
    """R/x/<tmp>/site holds nvitop 1.0 (inside); the host's <tmp>/site holds nvitop 6.6.6 (the decoy):
    R/x swapped for a symlink to / makes a string-following resolver land on the decoy."""
    root = tmp_path / "root"
    inside = root / "x" / _rel(tmp_path) / "site"
    _dist(inside, "1.0", INSIDE)
    _dist(tmp_path / "site", "6.6.6", OUTSIDE)
    # a minimal interpreter for verify-imports: the version comes from the name, the prefix from os.py
    (root / "usr/local/bin").mkdir(parents=True)
    (root / "usr/local/lib/python3.11").mkdir(parents=True)
    (root / "usr/local/lib/python3.11/os.py").write_text("")
    (root / "usr/local/bin/python3.11").write_text("")
    (root / "usr/local/bin/python3.11").chmod(0o755)
    os.symlink("python3.11", root / "usr/local/bin/python3")
    return root, f"/x/{_rel(tmp_path)}/site", hashlib.sha256(OUTSIDE).hexdigest()


def test_dirfs_never_leaves_a_root_whose_directory_is_swapped_for_a_symlink(site_layout):
    # GIVEN a container that keeps swapping /x for a symlink to / while verify-imports reads its root
    root, site, _ = site_layout
    fs = DirFS(str(root))
    seen = set()
    with Swapper(root, "x", chroot=False):
        # WHEN the module file and its metadata are looked up and read, over and over
        for _ in range(ROUNDS):
            seen.add(fs.read(f"{site}/nvitop/__init__.py"))
            seen.add(fs.read_text(f"{site}/nvitop-6.6.6.dist-info/METADATA") is not None)
    # THEN what was read is the root's own file or nothing (the swap was met), never the host's
    assert OUTSIDE not in seen and True not in seen
    assert INSIDE in seen and None in seen, "the swap was never met: the test proved nothing"


def test_verify_imports_never_reports_a_file_outside_the_root(site_layout):
    root, site, _ = site_layout
    args = ["verify-imports", f"dir:{root}", "--json", "--only", "-m", "nvitop", "--entrypoint", "python3 -c pass",
            "--env", f"PYTHONPATH={site}"]
    # the root as it stands is read whole: the module and its metadata
    still = CliRunner().invoke(cli, args)
    assert still.exit_code == 3, still.output  # 3: no image config, so the entrypoint's cwd is not known
    assert [m["verdict"] for m in json.loads(still.stdout)["result"]["modules"]] == ["OK"]
    with Swapper(root, "x", chroot=False):  # (it asserts at its end that it swapped until killed)
        outs = [CliRunner().invoke(cli, args) for _ in range(20)]
    for r in outs:
        assert r.exit_code in (0, 3), r.output
        assert "6.6.6" not in r.output  # the host's decoy is never the version found
        (m,) = json.loads(r.stdout)["result"]["modules"]
        # a root changing under the reader may show the module, or not, or without its metadata (which run
        # meets which depends on the machine's timing); never what lies outside
        assert m["verdict"] in {"OK", "MISSING", "UNMANAGED"}, m


def test_capture_open_in_root_never_leaves_a_swapping_root(site_layout):
    root, site, _ = site_layout
    seen = set()
    with Swapper(root, "x", chroot=False):
        for _ in range(ROUNDS):
            try:
                fd = open_in_root(str(root), f"{site}/nvitop/__init__.py")
            except (FileNotFoundError, UnsafeContainerPath):
                seen.add(None)
                continue
            try:
                seen.add(os.read(fd, 100))
            finally:
                os.close(fd)
    assert OUTSIDE not in seen
    assert INSIDE in seen and None in seen, "the swap was never met: the test proved nothing"


@pytest.mark.skipif(os.geteuid() != 0, reason="capture --pid arms another process as root")
def test_capture_of_a_swapping_container_reads_only_its_root(site_layout, tmp_path):
    # GIVEN a process chrooted into the root, working in the swapped directory's site-packages
    root, site, decoy_sha = site_layout
    with Swapper(root, "x", cwd=site) as container:
        # WHEN it is captured, again and again while it swaps
        outs = [CliRunner().invoke(cli, ["capture", "--pid", str(container.pid), "--core-dir", str(tmp_path / "cores"),
                                         "--json"]) for _ in range(5)]
    # THEN nothing the host holds at the escaped path appears in the capture
    for r in outs:
        assert r.exit_code in (0, 4), r.output
        assert decoy_sha not in r.output and "6.6.6" not in r.output
    for bundle in (tmp_path / "cores/bundles").iterdir():
        snap = (bundle / "40-process/snapshot.json").read_text()
        assert decoy_sha not in snap and "6.6.6" not in snap


@pytest.fixture
def sysroot_layout(tmp_path, core_pattern, newest_python):
    """A core whose libcrash.so was at H = <tmp>/mirror/<tmp>/host/libcrash.so; the sysroot holds another
    build there; <tmp>/host/libcrash.so (a third build) is where R/<tmp>/mirror -> / leads a string."""
    lib_dir = tmp_path / "mirror" / _rel(tmp_path) / "host"
    lib = build_libcrash(lib_dir)
    (tmp_path / "run").mkdir()
    core = make_core(tmp_path / "run", discover_pythons()[newest_python], "segv", libcrash=lib)
    decoy = build_libcrash(tmp_path / "host", cflags=["-Wl,--build-id=0x" + "ee" * 20])
    root = tmp_path / "root"
    inside = build_libcrash(root / _rel(lib_dir), cflags=["-Wl,--build-id=0x" + "11" * 20])
    ids = {name: pyelftools_build_id(p) for name, p in (("crashed", lib), ("outside", decoy), ("inside", inside))}
    assert len(set(ids.values())) == 3
    return core, lib, root, ids


def test_sysroot_lookup_never_leaves_a_swapping_root(sysroot_layout, tmp_path):
    core, lib, root, ids = sysroot_layout
    seen = set()
    with Swapper(root / _rel(tmp_path), "mirror", chroot=False):
        for _ in range(ROUNDS):
            seen.add(resolve_file(str(lib), str(root), ids["crashed"]))
    under_root = {(p, b) for p, b in seen if p and p.startswith(str(root) + "/")}
    assert all(b == ids["inside"] for _, b in under_root), seen  # a file under the root is the root's file
    assert ids["outside"] not in {b for _, b in seen}
    # the lookups met both states: the root's own build, and (swapped) the host's same build by its path
    assert under_root and (str(lib), ids["crashed"]) in seen, seen


def test_analyze_with_a_swapping_sysroot_names_only_files_inside_it(sysroot_layout, tmp_path):
    core, lib, root, ids = sysroot_layout
    with Swapper(root / _rel(tmp_path), "mirror", chroot=False):
        outs = [CliRunner().invoke(cli, ["analyze", "--method", "direct", "--json", "--sysroot", str(root), str(core)])
                for _ in range(5)]
    for r in outs:
        assert r.exit_code in (0, 4), r.output
        libs = {x["path"]: x for x in json.loads(r.stdout)["analysis"]["snapshot"]["core"]["libraries"]}
        mine = libs[str(lib)]
        assert mine["file_build_id"] != ids["outside"]
        if mine["file_path"] and mine["file_path"].startswith(str(root)):
            assert mine["file_build_id"] == ids["inside"]


# -- bundles ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_core(tmp_path_factory, cores, newest_python):
    return cores.get(newest_python, "segv")


def _bundle(tmp_path: Path, core: Path, objects: list[dict], record: dict | None = None) -> Path:
    """A bundle as the core handler writes one (the test's own), naming ``objects`` in its snapshot."""
    b = tmp_path / "work" / "bundle"
    (b / "50-core").mkdir(parents=True)
    (b / "40-process").mkdir()
    with open(core, "rb") as src, open(b / "50-core/core.zst", "wb") as dst:
        zstandard.ZstdCompressor(level=1).copy_stream(src, dst)
    (b / "40-process/snapshot.json").write_text(json.dumps({"objects": objects}))
    (b / "metadata.json").write_text(json.dumps(record or {}))
    (b / "MANIFEST.json").write_text(json.dumps({"schema_version": 1, "items": []}))
    store = b / "objects" / "ab"
    store.mkdir(parents=True)
    (store / ("cd" * 19)).write_bytes(b"a stored object\n")
    return b


def _tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): (p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
            for p in sorted(d.rglob("*"))}


def test_analyze_bundle_writes_nowhere_outside_its_directory(real_core, tmp_path):
    # GIVEN a bundle whose snapshot names objects at paths that climb out of it
    victim = tmp_path / "victim"
    victim.mkdir()
    up = "/.." * 30
    objects = [{"path": f"{up}{victim}/X", "build_id": "ab" + "cd" * 19},
               {"path": f"/usr/{up}{victim}/Y", "build_id": "ab" + "cd" * 19},
               {"path": "/usr/lib/z.so", "build_id": f"../../..{victim}/Z"}]
    b = _bundle(tmp_path, real_core, objects, record={"objects": {f"{up}{victim}/W": "ab" + "cd" * 19}})
    before = _tree(tmp_path / "work")
    # WHEN it is analyzed
    r = CliRunner().invoke(cli, ["analyze", "--method", "direct", "--json", str(b)])
    # THEN it was analyzed, and nothing was written: not outside the bundle, not into it (analysis never
    # writes into evidence; its decompressed core and sysroot lie in the cache)
    assert r.exit_code in (0, 4), r.output
    assert list(victim.iterdir()) == []
    assert _tree(tmp_path / "work") == before


def test_analyze_bundle_follows_no_planted_symlink_out(real_core, tmp_path):
    # GIVEN a bundle whose sysroot and store directories are symlinks to a directory outside it
    victim = tmp_path / "victim"
    victim.mkdir()
    b = _bundle(tmp_path, real_core, [{"path": "/usr/lib/libplanted.so", "build_id": "ab" + "cd" * 19}])
    os.symlink(victim, b / ".sysroot")
    # WHEN it is analyzed
    r = CliRunner().invoke(cli, ["analyze", "--method", "direct", "--json", str(b)])
    # THEN nothing is written through the link (nothing is written into a bundle at all)
    assert r.exit_code in (0, 4), r.output
    assert list(victim.iterdir()) == []
    # AND with the link gone and the core's place planted with a link to a host file, the host file is not read
    os.unlink(b / ".sysroot")
    secret = tmp_path / "secret"
    secret.write_bytes(b"not a core\n")
    (b / "50-core/core.zst").unlink()
    (b / "50-core/core").unlink(missing_ok=True)
    os.symlink(secret, b / "50-core/core")
    r = CliRunner().invoke(cli, ["analyze", "--method", "direct", "--json", str(b)])
    assert r.exit_code == 1 and "not a core" not in r.output, r.output
    assert secret.read_bytes() == b"not a core\n"
