"""Real Debian images for the verify-imports tests: bookworm from mmdebstrap, packages from apt and
PyPI installed by the image's own pip, assembled by umoci, with the ground truth the image's own
interpreter prints.

* The base layer is a cached Debian root (:func:`tests.roots.build_root`: bookworm with python3,
  python3-pip, python3-venv, python3-psutil), packed whole as a root file system is packed
  (``/dev`` nodes, setuid bits and all).
* Each scenario's upper layer is what real commands wrote: the root's own ``python3 -m pip
  install --break-system-packages`` and ``python3 -m venv``, run with bubblewrap over the
  read-only root with only the scenario's directories writable, offline, from wheels cached
  from PyPI; plus files the test writes itself (a stale checkout, a sitecustomize.py, a .pth).
* umoci assembles the OCI layout (``umoci raw add-layer``, ``umoci config``).
* The ground truth is taken from what umoci unpacks (``umoci unpack``: an extraction that is
  not ours) by running the image's interpreter with bubblewrap from the working directory,
  with the environment and user of the runtime bundle's ``config.json``: the file and
  ``__version__`` of each module, sys.path, and ``pip check``.

Everything is built once under ``<forensics cache>/images/debian-<key>``: the key is what it
is built from (the root, the wheels, the scenarios, this builder); built under an exclusive
file lock into a temporary directory and renamed into place, as the roots are.

Usable from a shell: ``python tests/debian_images.py`` prints the directory and the truths.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.roots import RootUnavailable, build_root

__all__ = ["DebianImages", "SCENARIOS", "Scenario", "debian_images", "ORACLE"]

BUILDER = "debian-images v1"
SUITE = "bookworm"
PACKAGES = ("python3", "python3-pip", "python3-venv", "python3-psutil")
PY = "3.11"
DIST = f"/usr/local/lib/python{PY}/dist-packages"  # where the image's pip installs (Debian's layout)
WHEELS = {  # file name stems in the wheel cache, fetched from PyPI by pip download
    "nvitop-1.5.0": ("nvitop", "1.5.0"), "nvitop-1.7.1": ("nvitop", "1.7.1"),
    "nvitop-exporter-1.7.1": ("nvitop-exporter", "1.7.1"), "nvidia-ml-py-12.575.51": ("nvidia-ml-py", "12.575.51"),
    "nvidia-ml-py-12.570.86": ("nvidia-ml-py", "12.570.86"), "nvidia-ml-py-13.580.126": ("nvidia-ml-py", "13.580.126"),
    "pynvml-11.5.3": ("pynvml", "11.5.3"), "prometheus-client": ("prometheus-client", None), "psutil": ("psutil", None),
}

# the image's own interpreter answers: for each module, the file it imports and its __version__
ORACLE = r"""
import importlib, importlib.util, json, os, sys
names = json.loads(sys.argv[1])
out = {"sys_path": [p or os.getcwd() for p in sys.path], "modules": {}}
for n in names:
    try:
        spec = importlib.util.find_spec(n)
    except Exception as e:
        out["modules"][n] = {"error": type(e).__name__}
        continue
    if spec is None:
        out["modules"][n] = {"file": None}
        continue
    r = out["modules"][n] = {"file": spec.origin if spec.has_location else None, "version": None}
    try:
        m = importlib.import_module(n)
    except Exception as e:
        r["import_error"] = "%s: %s" % (type(e).__name__, e)
        continue
    v = getattr(m, "__version__", None)
    r.update(file=getattr(m, "__file__", None), version=None if v is None else str(v))
print("ORACLE " + json.dumps(out))
"""


@dataclass(frozen=True)
class Scenario:
    """One image: what is installed on top of the Debian root, and how it runs."""

    name: str
    describe: str
    install: tuple[tuple[str, ...], ...] = ()  # commands run in the root (bubblewrap), writing only `writable`
    writable: tuple[str, ...] = ("/usr/local",)
    stale: tuple[tuple[str, str, str], ...] = ()  # (wheel, package, directory): a plain copy of the package's source
    files: tuple[tuple[str, bytes], ...] = ()  # (in-root path, bytes) written by the test
    entrypoint: tuple[str, ...] = ("python3", "-m", "nvitop")
    workdir: str = "/srv"
    env: tuple[str, ...] = ()
    oracle: tuple[str, ...] = ("python3",)  # the interpreter (and flags) the entrypoint runs
    modules: tuple[str, ...] = ("nvitop", "pynvml", "psutil")
    pip_check: bool = True


def _pip(*wheels: str, python: str = "python3", system: bool = True) -> tuple[str, ...]:
    cmd = (python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-cache-dir",
           "--disable-pip-version-check")
    return cmd + (("--break-system-packages",) if system else ()) + tuple(f"@{w}" for w in wheels)


_STACK_171 = _pip("nvitop-1.7.1", "nvitop-exporter-1.7.1", "nvidia-ml-py-13.580.126", "prometheus-client")
_SITECUSTOMIZE = b"""# install the apport exception handler if available
try:
    import apport_python_hook
except ImportError:
    pass
else:
    apport_python_hook.install()
"""

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("deb-clean", "Debian's layout: nvitop 1.7.1 stack pip-installed into "
                          "/usr/local/lib/python3.11/dist-packages, psutil from apt", install=(_STACK_171,),
             entrypoint=("python3", "-m", "nvitop_exporter"),
             modules=("nvitop", "nvitop_exporter", "pynvml", "psutil")),
    Scenario("deb-incident", "the incident on Debian: WORKDIR /app holds nvitop 1.5.0 source over the 1.7.1 stack",
             install=(_STACK_171,), stale=(("nvitop-1.5.0", "nvitop", "/app"),), workdir="/app",
             entrypoint=("python3", "-m", "nvitop_exporter"),
             modules=("nvitop", "nvitop_exporter", "pynvml", "psutil")),
    Scenario("deb-venv-system-site", "a --system-site-packages venv: nvitop 1.5.0 in dist-packages, "
                                     "nvidia-ml-py 12.575.51 in the venv (#15 item 2)",
             install=(_pip("nvitop-1.5.0", "nvidia-ml-py-12.570.86"),
                      ("python3", "-m", "venv", "--system-site-packages", "/opt/venv"),
                      _pip("nvidia-ml-py-12.575.51", python="/opt/venv/bin/python", system=False)),
             writable=("/usr/local", "/opt"), entrypoint=("/opt/venv/bin/python", "-m", "nvitop"),
             oracle=("/opt/venv/bin/python",)),
    Scenario("deb-sitecustomize", "/etc/python3.11/sitecustomize.py puts /opt/override (nvitop 1.7.1) first; "
                                  "nvitop 1.5.0 in dist-packages (#15 item 3)",
             install=(_pip("nvitop-1.5.0", "nvidia-ml-py-12.570.86"),),
             stale=(("nvitop-1.7.1", "nvitop", "/opt/override"),),
             files=((f"/etc/python{PY}/sitecustomize.py",
                     _SITECUSTOMIZE + b"import sys\nsys.path.insert(0, '/opt/override')\n"),)),
    Scenario("deb-sitecustomize-dynamic", "sitecustomize.py puts a directory named by the environment first: "
                                          "not decidable statically (#15 item 3, --execute disagrees)",
             install=(_pip("nvitop-1.5.0", "nvidia-ml-py-12.570.86"),),
             stale=(("nvitop-1.7.1", "nvitop", "/opt/override"),),
             files=((f"/etc/python{PY}/sitecustomize.py",
                     _SITECUSTOMIZE + b"import os, sys\n"
                                      b"sys.path.insert(0, os.environ.get('OVERRIDE', '/opt/override'))\n"),)),
    Scenario("deb-pip-over-apt", "pip's psutil in /usr/local hides apt's python3-psutil (#15 item 4)",
             install=(_pip("psutil"),), modules=("psutil",),
             entrypoint=("python3", "-c", "import psutil; print(psutil.cpu_count())")),
    Scenario("deb-apt-modified", "apt's psutil/__init__.py edited after install (dpkg md5sums)",
             modules=("psutil",), entrypoint=("python3", "-c", "import psutil; print(psutil.cpu_count())")),
    Scenario("deb-two-owners", "nvidia-ml-py 12.575.51 (pynvml.py) and the deprecated pynvml 11.5.3 (pynvml/) in one "
                               "directory (#15 item 5)",
             install=(_pip("nvitop-1.7.1", "nvidia-ml-py-12.575.51", "pynvml-11.5.3"),)),
    Scenario("deb-python-missing", "Entrypoint `python` on Debian, which has only python3 (#15 item 7)",
             install=(_STACK_171,), entrypoint=("python", "-m", "nvitop_exporter"),
             modules=("nvitop", "nvitop_exporter", "pynvml")),
    Scenario("deb-bad-pth", "a .pth that is not UTF-8: the interpreter dies at start-up (#13 item 7)",
             install=(_STACK_171,), files=((f"{DIST}/legacy.pth", b"/opt/l\xe9gacy\n"),), pip_check=False),
    Scenario("deb-missing-lib", "PyPI's psutil (its extension needs libpthread.so.0) over the 1.7.1 stack, and an "
                                "upper layer deleting libc6's libpthread.so.0: `import nvitop` fails (#41 item 1)",
             install=(_STACK_171, _pip("psutil")),
             files=(("/usr/lib/x86_64-linux-gnu/.wh.libpthread.so.0", b""),),
             entrypoint=("python3", "-m", "nvitop_exporter"), modules=("nvitop", "nvitop_exporter", "psutil"),
             pip_check=False),
)}


def _apt_modified_files(root: Path) -> tuple[tuple[str, bytes], ...]:
    p = "/usr/lib/python3/dist-packages/psutil/__init__.py"
    return ((p, (root / p.lstrip("/")).read_bytes() + b"\n# patched in place after apt installed it\n"),)


def _wheel_files() -> dict[str, Path]:
    from tests.integration.test_verify_imports_helpers import wheel

    return {stem: wheel(name, version) for stem, (name, version) in WHEELS.items()}


def _key(root: Path, wheels: dict[str, Path]) -> str:
    spec = [BUILDER, ORACLE, root.name, sorted((k, p.name) for k, p in wheels.items()),
            [asdict(s) for s in SCENARIOS.values()]]
    return hashlib.sha256(json.dumps(spec, default=lambda b: b.hex() if isinstance(b, bytes) else str(b))
                          .encode()).hexdigest()[:16]


def _run(cmd: list[str], what: str, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{what} exited {p.returncode}: {' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p


def _sandbox(root: Path, upper: Path, writable: tuple[str, ...], wheels: Path, argv: list[str]) -> list[str]:
    cmd = ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", str(root), "/"]
    for w in writable:
        cmd += ["--bind", str(upper / w.lstrip("/")), w]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/root", "--ro-bind", str(wheels),
            "/mnt", "--chdir", "/", "--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
            "--setenv", "HOME", "/root", "--setenv", "PIP_ROOT_USER_ACTION", "ignore", "--", *argv]
    return cmd


def _stale_tree(upper: Path, whl: Path, package: str, dest: str) -> None:
    with zipfile.ZipFile(whl) as z:
        for n in z.namelist():
            if n.startswith(package + "/") and not n.endswith("/"):
                out = upper / dest.lstrip("/") / n
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(z.read(n))


def _build_upper(root: Path, s: Scenario, work: Path, wheels: dict[str, Path]) -> Path:
    upper = work / "uppers" / s.name
    for w in s.writable:
        src, dst = root / w.lstrip("/"), upper / w.lstrip("/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, symlinks=True)  # what the root has there, visible to the commands
        else:
            dst.mkdir(parents=True)
    wheel_dir = wheels[next(iter(wheels))].parent
    for argv in s.install:
        argv = [f"/mnt/{wheels[a[1:]].name}" if a.startswith("@") else a for a in argv]
        what = f"{s.name}: {argv[0]} {argv[2] if len(argv) > 2 else ''}"
        _run(_sandbox(root, upper, s.writable, wheel_dir, argv), what)
    for whl, package, dest in s.stale:
        _stale_tree(upper, wheels[whl], package, dest)
    files = s.files if s.name != "deb-apt-modified" else _apt_modified_files(root)
    for path, data in files:
        out = upper / path.lstrip("/")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
    for d in (s.workdir,):
        (upper / d.lstrip("/")).mkdir(parents=True, exist_ok=True)
    return upper


def _layer_tar(tree: Path, out: Path, *, skip: tuple[str, ...] = ()) -> Path:
    """A layer of everything under ``tree`` (GNU tar: device nodes, modes and owners as they are)."""
    cmd = ["tar", "--numeric-owner", "--xattrs", "-C", str(tree), "-cf", str(out)]
    cmd += [f"--exclude=./{s}" for s in skip] + ["."]
    _run(cmd, "tar")
    return out


def _config_args(s: Scenario) -> list[str]:
    args = []
    for a in s.entrypoint:
        args += ["--config.entrypoint", a]
    args += ["--config.workingdir", s.workdir]
    for e in ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",) + s.env:
        args += ["--config.env", e]
    return args


def oracle_command(rootfs: Path, config: dict, argv: list[str]) -> list[str]:
    """``argv`` run in ``rootfs`` the way the runtime bundle's config.json says: cwd, env, uid/gid."""
    proc = config["process"]
    cmd = ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", str(rootfs), "/", "--proc", "/proc",
           "--dev", "/dev"]
    if not any((rootfs / "tmp").iterdir()):
        cmd += ["--tmpfs", "/tmp"]
    cmd += ["--chdir", proc.get("cwd", "/"), "--clearenv"]
    for item in proc.get("env", []):
        k, _, v = item.partition("=")
        cmd += ["--setenv", k, v]
    user = proc.get("user", {})
    cmd += ["--uid", str(user.get("uid", 0)), "--gid", str(user.get("gid", 0)), "--", *argv]
    return cmd


def ground_truth(layout: Path, s: Scenario, work: Path) -> dict:
    """What the image's own interpreter imports, from what umoci unpacks."""
    bundle = work / f"bundle-{s.name}"
    _run(["umoci", "unpack", "--image", f"{layout}:{s.name}", str(bundle)], "umoci unpack")
    try:
        config = json.loads((bundle / "config.json").read_text())
        rootfs = bundle / "rootfs"
        truth: dict = {"args": config["process"]["args"], "cwd": config["process"]["cwd"]}
        p = subprocess.run(oracle_command(rootfs, config, [*s.oracle, "-c", ORACLE, json.dumps(list(s.modules))]),
                           capture_output=True, text=True, timeout=300)
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("ORACLE ")), None)
        if line is not None:
            truth.update(json.loads(line[len("ORACLE "):]))
        else:
            truth["startup_error"] = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
            truth["returncode"] = p.returncode
        exe = s.entrypoint[0]
        q = subprocess.run(oracle_command(rootfs, config, ["/bin/sh", "-c", f'command -v "{exe}"']),
                           capture_output=True, text=True, timeout=60)
        truth["entrypoint_found"] = q.returncode == 0
        if s.pip_check and line is not None:
            q = subprocess.run(oracle_command(rootfs, {"process": {**config["process"], "cwd": "/"}},
                                              [*s.oracle, "-m", "pip", "check"]),
                               capture_output=True, text=True, timeout=300)
            truth["pip_check"] = [ln for ln in q.stdout.splitlines() if ln.strip()]
        return truth
    finally:
        shutil.rmtree(bundle, ignore_errors=True)


@dataclass
class DebianImages:
    """The built images: ``ref(name)`` is ``oci:LAYOUT:NAME``; ``truth[name]`` what the image's interpreter said."""

    directory: Path
    root: Path
    truth: dict = field(default_factory=dict)

    @property
    def layout(self) -> Path:
        return self.directory / "oci"

    def ref(self, name: str) -> str:
        return f"oci:{self.layout}:{name}"

    def upper(self, name: str) -> Path:
        return self.directory / "uppers" / name


def _missing() -> str | None:
    for tool in ("umoci", "bwrap", "tar"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (bash .ci/setup installs it)"
    if os.geteuid() != 0:
        return "building Debian images needs root (mmdebstrap, umoci unpack)"
    return None


def debian_images(cache: Path | None = None) -> DebianImages:
    """The Debian images, built once and cached.

    :raises RootUnavailable: no root or no tool to build with (a test should skip)
    """
    why = _missing()
    if why:
        raise RootUnavailable(why)
    root = build_root(SUITE, PACKAGES, cache=cache)
    try:
        wheels = _wheel_files()
    except (subprocess.SubprocessError, OSError, AssertionError) as e:
        raise RootUnavailable(f"the wheels cannot be fetched from PyPI and are not cached: {e}") from e
    images = root.parent.parent / "images"
    images.mkdir(parents=True, exist_ok=True)
    key = _key(root, wheels)
    final = images / f"debian-{key}"
    if not (final / "truth.json").is_file():
        with open(images / f".debian-{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (final / "truth.json").is_file():
                _build(root, final, wheels)
    return DebianImages(directory=final, root=root, truth=json.loads((final / "truth.json").read_text()))


def _build(root: Path, final: Path, wheels: dict[str, Path]) -> None:
    work = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(final, ignore_errors=True)  # a build that died before its truth.json
    work.mkdir(parents=True)
    layout = work / "oci"
    try:
        _run(["umoci", "init", "--layout", str(layout)], "umoci init")
        _run(["umoci", "new", "--image", f"{layout}:base"], "umoci new")
        base = _layer_tar(root, work / "base.tar", skip=(".forensics-root.json",))
        _run(["umoci", "raw", "add-layer", "--image", f"{layout}:base", str(base)], "umoci raw add-layer", 1200)
        base.unlink()
        truth = {}
        for s in SCENARIOS.values():
            upper = _build_upper(root, s, work, wheels)
            layer = _layer_tar(upper, work / f"{s.name}.tar")
            _run(["umoci", "raw", "add-layer", "--image", f"{layout}:base", "--tag", s.name, str(layer)],
                 "umoci raw add-layer")
            layer.unlink()
            _run(["umoci", "config", "--image", f"{layout}:{s.name}", *_config_args(s)], "umoci config")
            truth[s.name] = ground_truth(layout, s, work)
            if s.name != "deb-incident":  # the chroot test builds its root from this one
                shutil.rmtree(upper)
        (work / "truth.json").write_text(json.dumps(truth, indent=1, sort_keys=True) + "\n")
        os.rename(work, final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


if __name__ == "__main__":
    imgs = debian_images()
    print(imgs.directory)
    print(json.dumps(imgs.truth, indent=1))
