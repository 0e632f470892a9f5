"""A container runtime stand-in for the kube stand-in's kubelet: each container of a pod run as its spec says.

:class:`PodRuntime` turns a container of a pod spec into the command line that runs it on this machine, minus
Kubernetes: bubblewrap gives it a root of its own (the "image": this machine's ``/usr`` and ``/etc``, the Python
and checkout forensics runs from, and an installation at ``/opt/forensics``), its volumes at their mount paths
(hostPath directories bound, read-only where the mount says so; emptyDirs as directories of the runtime's own), a
read-only root where ``readOnlyRootFilesystem`` says so, ``/proc/sys`` read-only unless privileged; and setpriv
gives it the securityContext's uid, capability bounding set (the runtime's default set unless the spec drops and
adds) and no_new_privs (``allowPrivilegeEscalation: false``). A container named in ``no_userns`` runs in a user
namespace of its own where no user namespace can be made (tests/userns.py), as a runtime's default seccomp profile
refuses them. The RuntimeDefault seccomp profile itself is not applied.

:func:`make_install` lays out a small installation of this checkout's forensics, the way the agent image's
``/opt/forensics`` is laid out (``bin/forensics`` runs ``bin/python``, which runs this checkout).
"""
from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

__all__ = ["PodRuntime", "make_install", "DEFAULT_CAPS"]

ROOT = Path(__file__).resolve().parents[1]
#: containerd's and Docker's default capability set of a container that is not privileged
DEFAULT_CAPS = ("chown", "dac_override", "fsetid", "fowner", "mknod", "net_raw", "setgid", "setuid", "setfcap",
                "setpcap", "net_bind_service", "sys_chroot", "kill", "audit_write")
WRAPPER = """#!/bin/sh
# forensics of this checkout, through this installation's interpreter (as the agent image's /opt/forensics does)
here=$(dirname "$(readlink -f "$0")")/..
exec "$here/bin/python" -m forensics "$@"
"""


def make_install(dest: Path) -> Path:
    """``dest`` as an installation of this checkout's forensics: a virtual environment over this test run's, with
    ``bin/forensics``. It is copied as it is (``cp -a``) into a host prefix, and runs from there."""
    base = Path(os.path.realpath(sys._base_executable))  # type: ignore[attr-defined]
    (dest / "bin").mkdir(parents=True)
    (dest / "pyvenv.cfg").write_text(f"home = {base.parent}\ninclude-system-site-packages = false\n"
                                     f"version = {sys.version.split()[0]}\n")
    (dest / "bin/python").symlink_to(base)
    site = dest / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    site.mkdir(parents=True)
    here = sysconfig.get_paths()["purelib"]
    (site / "forensics-checkout.pth").write_text(f"import site; site.addsitedir({here!r})\n{ROOT}\n")
    (dest / "bin/forensics").write_text(WRAPPER)
    (dest / "bin/forensics").chmod(0o755)
    return dest


def _dirs_to(path: str, made: set[str], bound: set[str]) -> list[str]:
    """bwrap's arguments that make the directories on the way to ``path`` searchable, as a runtime or an image has
    them (bwrap makes a mount point's missing parents 700); none made already (``made``), none inside a directory
    bound from this machine (``bound``)."""
    out = []
    parts = path.split("/")
    for i in range(2, len(parts)):
        d = "/".join(parts[:i])
        if d in made or d in bound or any(d.startswith(b + "/") for b in bound):
            continue
        out += ["--perms", "0755", "--dir", d]
        made.add(d)
    return out


class PodRuntime:
    """Command lines of a pod's containers (``runtime(pod, container, argv)``, the kube stand-in's hook)."""

    def __init__(self, *, install: Path, no_userns: tuple[str, ...] = ()) -> None:
        self.install = install
        self.no_userns = no_userns
        self.scratch = Path(tempfile.mkdtemp(prefix="podrt-"))  # the emptyDirs
        self.bound: set[str] = set()  # the image's directories (no mount point is made inside one)
        self.made: set[str] = set()  # the directories made on the way to them

    def image_binds(self) -> list[str]:
        """The image: this machine's system directories, the interpreter and checkout forensics runs from."""
        out = []
        for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
            if os.path.islink(top):
                out += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                out += ["--ro-bind", top, top]
        out += ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
        python_home = Path(os.path.realpath(sys._base_executable)).parents[1]  # type: ignore[attr-defined]
        made: set[str] = set()
        bound = {"/usr", "/etc"}
        for d in sorted({str(python_home), str(ROOT), os.path.realpath(sys.prefix)}):
            if not any(d.startswith(b + "/") for b in bound):
                out += [*_dirs_to(d, made, bound), "--ro-bind", d, d]
                bound.add(d)
        out += [*_dirs_to("/opt/forensics", made, bound), "--ro-bind", str(self.install), "/opt/forensics"]
        self.made, self.bound = made, {*bound, "/opt/forensics"}
        return out

    def volumes(self, pod: dict, container: dict) -> list[str]:
        by_name = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        out: list[str] = []
        made = set(self.made)
        for m in container.get("volumeMounts", []):
            v = by_name[m["name"]]
            if "hostPath" in v:
                src = v["hostPath"]["path"]
                if v["hostPath"].get("type") == "DirectoryOrCreate":
                    os.makedirs(src, exist_ok=True)
            else:  # emptyDir: one directory per pod and volume, made as the kubelet makes it (0777)
                src = str(self.scratch / f"{pod['metadata']['name']}-{m['name']}")
                os.makedirs(src, exist_ok=True)
                os.chmod(src, 0o777)
            out += [*_dirs_to(m["mountPath"], made, self.bound), "--ro-bind" if m.get("readOnly") else "--bind", src,
                    m["mountPath"]]
        return out

    def __call__(self, pod: dict, container: dict, argv: list[str]) -> list[str]:
        sc = container.get("securityContext") or {}
        privileged = bool(sc.get("privileged"))
        userns = container["name"] in self.no_userns
        cmd = ["bwrap", *self.image_binds(), "--dev", "/dev", "--proc", "/proc",
               *(["--unshare-pid"] if userns else []),  # a proc of its own needs a PID namespace of the user's
               *(["--ro-bind", "/proc/sys", "/proc/sys"] if not privileged else []),
               *self.volumes(pod, container),
               *(["--remount-ro", "/"] if sc.get("readOnlyRootFilesystem") else []), "--chdir", "/", "--"]
        if not privileged:
            caps = sc.get("capabilities") or {}
            keep = [] if "ALL" in caps.get("drop", []) else [c for c in DEFAULT_CAPS
                                                               if c.upper() not in caps.get("drop", [])]
            keep += [c.lower() for c in caps.get("add", [])]
            uid, gid = sc.get("runAsUser", 0), sc.get("runAsGroup", 0)
            cmd += [shutil.which("setpriv") or "setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                    "--inh-caps=-all", "--bounding-set=" + ",".join(["-all", *(f"+{c}" for c in keep)]),
                    *(["--no-new-privs"] if sc.get("allowPrivilegeEscalation") is False else []), "--"]
        cmd += argv
        if userns:
            cmd = [sys.executable, str(ROOT / "tests/userns.py"), "--max-user-namespaces", "0", "--", *cmd]
        return cmd

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


def _blocked(path: str) -> str | None:
    """The first directory on the way to ``path`` (itself included) that other users may not search."""
    parts = path.split("/")
    for i in range(2, len(parts) + 1):
        d = "/".join(parts[:i])
        try:
            if not os.stat(d).st_mode & 0o001:
                return d
        except FileNotFoundError:
            return None
    return None


def searchable_view(*, bind: list[str], homes: list[str] = ()) -> list[str]:
    """A command line prefix: this machine as it is, but each path of ``bind`` (and each of ``homes``, an empty
    directory of the view's own) reachable by any uid, and this test run's interpreter too. The paths of ``bind``
    must exist.

    An on-node analysis runs in its sandbox as an unprivileged uid, which pytest's private temporary directories
    (mode 700) and an interpreter under /root shut out; in a mount namespace of the command's own, a tmpfs of
    searchable directories stands over the first such directory, with the paths bound back into it. Nothing of the
    machine changes: the host's modes stay as they are. The prefix execs the command in its own place (signals
    reach it as they would reach it alone).
    """
    python_home = os.path.realpath(Path(os.path.realpath(sys._base_executable)).parents[1])  # type: ignore[attr-defined]
    ops: list[str] = []
    covered: set[str] = set()
    binds = [*(os.path.realpath(p) for p in bind), python_home]
    for p in sorted({*binds, *(os.path.realpath(h) for h in homes)}, key=len):
        top = _blocked(p)
        if top is None:
            continue
        if top not in covered and not any(top.startswith(c + "/") for c in covered):
            ops += ["--tmpfs", top]
            covered.add(top)
        parts = p.split("/")
        for i in range(len(top.split("/")) + 1, len(parts) + (p not in binds)):
            ops += ["--dir", "/".join(parts[:i])]
        if p in binds:
            ops += ["--bind", p]
    return [sys.executable, str(ROOT / "tests/podruntime.py"), *ops, "--"]


def _view_exec(argv: list[str]) -> None:
    """``podruntime.py [--tmpfs DIR | --dir DIR | --bind PATH]... -- COMMAND``: the mounts of
    :func:`searchable_view` in a mount namespace of its own, then COMMAND in this process's place."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def check(rc: int, what: str) -> None:
        if rc != 0:
            raise OSError(ctypes.get_errno(), what)

    check(libc.unshare(0x00020000), "unshare(CLONE_NEWNS)")  # CLONE_NEWNS
    check(libc.mount(b"none", b"/", None, 0x4000 | 0x40000, None), "make / private")  # MS_REC | MS_PRIVATE
    held: dict[str, int] = {}  # what a tmpfs will hide, opened first and bound back from its descriptor
    i = argv.index("--")
    ops = list(zip(argv[:i:2], argv[1:i:2], strict=True))
    for op, path in ops:
        if op == "--bind":
            held[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
    for op, path in ops:
        if op == "--tmpfs":
            check(libc.mount(b"tmpfs", path.encode(), b"tmpfs", 0, b"mode=0755"), f"tmpfs {path}")
        elif op == "--dir":
            os.makedirs(path, mode=0o755, exist_ok=True)
        else:
            if os.path.isdir(f"/proc/self/fd/{held[path]}"):
                os.makedirs(path, mode=0o755, exist_ok=True)
            elif not os.path.exists(path):
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
            check(libc.mount(f"/proc/self/fd/{held[path]}".encode(), path.encode(), None, 0x1000 | 0x4000, None),
                  f"bind {path}")  # MS_BIND | MS_REC
    os.execvp(argv[i + 1], argv[i + 1:])


if __name__ == "__main__":
    _view_exec(sys.argv[1:])
