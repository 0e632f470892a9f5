"""Pure parts of verify-imports: versions, markers, .pth lines, command lines, manifests, sys.path, verdicts."""
from __future__ import annotations

import pytest

from forensics.imports.model import ImageConfig, ManifestKind, PathOrigin, Platform, Transport
from forensics.imports.procfs import parse_maps_extensions, parse_status_ids
from forensics.imports.pyenv import command_line, describe_command
from forensics.imports.syspath import apply_pth_imports, compute_python_setup, parse_pth
from forensics.imports.rootfs import Node, RootFS
from forensics.imports.imagemeta import read_manifest
from forensics.imports.sources import classify_manifest, parse_config, parse_image_ref, select_platform
from forensics.imports.verdict import check_known_issues, load_known_issues
from forensics.imports.versions import (evaluate_marker, find_static_version, parse_requirement, specifier_contains,
                                        version_key)


class MemFS(RootFS):
    """A root built from a dict: path -> bytes (file), None (dir) or ('link', target)."""

    def __init__(self, tree: dict) -> None:
        self.nodes: dict[str, Node] = {"/": Node("dir")}
        self.data: dict[str, bytes] = {}
        for path, v in tree.items():
            parts = path.strip("/").split("/")
            for i in range(1, len(parts)):
                self.nodes.setdefault("/" + "/".join(parts[:i]), Node("dir"))
            if v is None:
                self.nodes[path] = Node("dir")
            elif isinstance(v, tuple):
                self.nodes[path] = Node("symlink", target=v[1])
            else:
                data = v.encode() if isinstance(v, str) else v
                self.nodes[path] = Node("file", len(data), 0o755)
                self.data[path] = data

    def lstat(self, path):
        return self.nodes.get(path)

    def _listdir(self, path):
        prefix = path.rstrip("/") + "/"
        return [p[len(prefix):] for p in self.nodes if p.startswith(prefix) and "/" not in p[len(prefix):]]

    def _read(self, path, limit):
        return self.data.get(path)


# -- versions ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec,version,ok", [
    ("<12.571.0a0,>=11.450.51", "12.570.86", True),
    ("<12.571.0a0,>=11.450.51", "12.575.51", False),
    ("<13.581.0a0,>=11.450.51", "13.580.126", True),
    ("~=1.7.1", "1.7.3", True),
    ("~=1.7.1", "1.8.0", False),
    ("==1.5.*", "1.5.3", True),
    ("!=1.5.0", "1.5.0", False),
    (">=580", "580.126.09", True),
    ("<1.7.1", "1.7.1rc1", True),
], ids=lambda x: str(x))
def test_specifier_contains(spec, version, ok):
    assert specifier_contains(spec, version) is ok


def test_version_ordering_of_prereleases_and_dev():
    assert (version_key("1.0.dev1") < version_key("1.0a1") < version_key("1.0rc1") < version_key("1.0")
            < version_key("1.0.post1"))
    assert version_key("1.7.0") == version_key("1.7")


def test_requirement_and_marker():
    r = parse_requirement('colorama>=0.4.0; platform_system == "Windows"')
    assert (r.name, r.specifier) == ("colorama", ">=0.4.0")
    linux = {"platform_system": "Linux", "python_version": "3.11"}
    assert evaluate_marker(r.marker, linux) is False
    assert evaluate_marker('python_version >= "3.8" and (os_name == "posix" or sys_platform == "x")',
                           {**linux, "os_name": "posix", "sys_platform": "linux"}) is True
    assert evaluate_marker('extra == "lint"', linux) is None
    assert parse_requirement("nvitop~=1.5.0").specifier == "~=1.5.0"


def test_static_version_follows_from_import():
    # GIVEN nvitop's layout: __init__ imports __version__ from nvitop.version
    files = {"/s/nvitop/__init__.py": "from nvitop.version import __version__\n",
             "/s/nvitop/version.py": "__version__ = '1.5.0'\n__release__ = True\n",
             "/s/other/__init__.py": "from .version import version as __version__\n",
             "/s/other/version.py": "version = __version__ = '2.0'\n"}
    # THEN the literal is found without importing
    assert find_static_version(files.get, "/s/nvitop/__init__.py", "nvitop", ("/s/nvitop",)) == "1.5.0"
    assert find_static_version(files.get, "/s/other/__init__.py", "other", ("/s/other",)) == "2.0"


# -- .pth files ---------------------------------------------------------------------------------------

def test_pth_insert_and_easy_install_idiom():
    path = ["/lib", "/site"]
    state: dict = {}
    assert apply_pth_imports("import sys; sys.path.insert(0, '/opt/legacy')", path, state)
    assert path[0] == "/opt/legacy"
    # setuptools' easy-install.pth moves its eggs to the front
    path = ["/lib", "/site"]
    assert apply_pth_imports("import sys; sys.__plen = len(sys.path)", path, state)
    path.append("/site/nvitop-1.5.0-py3.11.egg")
    assert apply_pth_imports("import sys; new = sys.path[sys.__plen:]; del sys.path[sys.__plen:]; "
                             "p = getattr(sys, '__egginsert', 0); sys.path[p:p] = new; sys.__egginsert = p + len(new)",
                             path, state)
    assert path == ["/site/nvitop-1.5.0-py3.11.egg", "/lib", "/site"]
    # unknown code that touches sys.path is reported, harmless code is not
    assert not apply_pth_imports("import x; x.fix(sys.path)", path, state)
    assert apply_pth_imports("import _virtualenv", path, state)
    paths, imports, _ = parse_pth("# comment\n\n../../legacy\nimport os\n", "/usr/lib/python3.11/site-packages")
    assert paths == ["/usr/lib/legacy"] and imports == ["import os"]


# -- command lines and sys.path ----------------------------------------------------------------------

def test_command_line_unwraps_shell_env_and_tini():
    cfg = ImageConfig(entrypoint=("/usr/bin/tini", "--"),
                      cmd=("sh", "-c", "exec env PYTHONSAFEPATH=1 python3 -m nvitop_exporter --port 9000 && true"))
    argv, extra, notes = command_line(cfg)
    assert argv == ("python3", "-m", "nvitop_exporter", "--port", "9000")
    assert extra == {"PYTHONSAFEPATH": "1"}
    assert command_line(cfg, "python -I app.py")[0] == ("python", "-I", "app.py")


PY_ROOT = {
    "/usr/local/bin/python3.11": b"\x7fELF",
    "/usr/local/bin/python3": ("link", "python3.11"),
    "/usr/local/lib/python3.11/os.py": "",
    "/usr/local/lib/python3.11/lib-dynload": None,
    "/usr/local/lib/python3.11/site-packages/nvitop/__init__.py": "__version__ = '1.7.1'\n",
    "/usr/local/lib/python3.11/site-packages/nvitop-1.7.1.dist-info/METADATA": "Name: nvitop\nVersion: 1.7.1\n",
    "/usr/local/lib/python3.11/site-packages/nvitop-1.7.1.dist-info/RECORD": "nvitop/__init__.py,,\n",
    "/app/nvitop/__init__.py": "__version__ = '1.5.0'\n",
    "/srv/run.py": "import nvitop\n",
    "/usr/local/bin/tool": "#!/usr/bin/env python3\nimport nvitop\n",
}


@pytest.mark.parametrize("argv,env,first,safe", [
    (("python3", "-m", "nvitop_exporter"), {}, ("/app", PathOrigin.WORKDIR), False),
    (("python3", "-c", "import nvitop"), {}, ("/app", PathOrigin.WORKDIR), False),
    (("python3", "/srv/run.py"), {}, ("/srv", PathOrigin.SCRIPT_DIR), False),
    (("tool",), {}, ("/usr/local/bin", PathOrigin.SCRIPT_DIR), False),
    (("python3", "-m", "x"), {"PYTHONSAFEPATH": "1"}, None, True),
    (("python3", "-P", "-m", "x"), {}, None, True),
    (("python3", "-I", "-m", "x"), {"PYTHONPATH": "/opt"}, None, True),
], ids=["-m", "-c", "script", "shebang", "PYTHONSAFEPATH", "-P", "-I"])
def test_sys_path_zero(argv, env, first, safe):
    fs = MemFS(PY_ROOT)
    env = {"PATH": "/usr/local/bin:/usr/bin", **env}
    entry, _ = describe_command(fs, argv, env, "/app")
    setup = compute_python_setup(fs, entry, env, "/app")
    assert entry.version == "3.11" and setup.prefix == "/usr/local"
    assert setup.safe_path is safe
    if first:
        assert (setup.sys_path[0].path, setup.sys_path[0].origin) == first
    else:
        assert setup.sys_path[0].path == "/usr/local/lib/python311.zip"
    assert setup.sys_path[-1].path == "/usr/local/lib/python3.11/site-packages"


def test_empty_pythonpath_entry_is_the_working_directory_even_when_safe():
    fs = MemFS(PY_ROOT)
    env = {"PATH": "/usr/local/bin", "PYTHONPATH": ":/opt/x", "PYTHONSAFEPATH": "1"}
    entry, _ = describe_command(fs, ("python3", "-m", "x"), env, "/app")
    setup = compute_python_setup(fs, entry, env, "/app")
    assert [e.path for e in setup.sys_path[:2]] == ["/app", "/opt/x"]


def test_pythonsafepath_is_ignored_before_311():
    tree = {k.replace("3.11", "3.10").replace("311", "310"): v for k, v in PY_ROOT.items() if "python3\x00" not in k}
    tree["/usr/local/bin/python3"] = ("link", "python3.10")
    fs = MemFS(tree)
    env = {"PATH": "/usr/local/bin", "PYTHONSAFEPATH": "1"}
    entry, _ = describe_command(fs, ("python3", "-m", "x"), env, "/app")
    setup = compute_python_setup(fs, entry, env, "/app")
    assert not setup.safe_path and setup.sys_path[0].path == "/app"
    assert any("no effect on Python 3.10" in n for n in setup.notes)


def test_usercustomize_runs_after_sitecustomize_and_only_with_the_user_site():
    # GIVEN a sitecustomize that appends and a usercustomize (in the user site) that inserts first
    tree = dict(PY_ROOT)
    tree["/usr/local/lib/python3.11/sitecustomize.py"] = "import sys\nsys.path.append('/opt/late')\n"
    tree["/root/.local/lib/python3.11/site-packages/usercustomize.py"] = (
        "import site, sys\nsys.path[:0] = ['/opt/first']\nsite.addsitedir('/opt/plugins')\n")
    tree["/opt/late"] = tree["/opt/first"] = None
    tree["/opt/plugins/extra.pth"] = "/opt/from-pth\n"
    tree["/opt/from-pth"] = None
    fs = MemFS(tree)
    env = {"PATH": "/usr/local/bin", "HOME": "/root"}
    entry, _ = describe_command(fs, ("python3", "-m", "x"), env, "/app")
    # WHEN sys.path is built
    setup = compute_python_setup(fs, entry, env, "/app")
    # THEN both ran, in site's order, their edits applied and named
    paths = [e.path for e in setup.sys_path]
    assert paths[:2] == ["/app", "/opt/first"] and paths[-3:] == ["/opt/late", "/opt/plugins", "/opt/from-pth"]
    assert [c.module for c in setup.customize] == ["sitecustomize", "usercustomize"]
    assert {e.path: e.origin for e in setup.sys_path}["/opt/first"] is PathOrigin.SITECUSTOMIZE
    assert setup.findings == ()
    # with -s (no user site) usercustomize does not run
    entry, _ = describe_command(fs, ("python3", "-s", "-m", "x"), env, "/app")
    setup = compute_python_setup(fs, entry, env, "/app")
    assert [c.module for c in setup.customize] == ["sitecustomize"]
    assert "/opt/first" not in [e.path for e in setup.sys_path]


@pytest.mark.parametrize("source,edits,unevaluated", [
    ("import sys\nsys.path.insert(0, '/a')\n", 1, 0),
    ("import sys, os\nsys.path.insert(0, os.path.join('/opt', 'a'))\n", 1, 0),
    ("import sys\nP = '/a'\nsys.path.append(P)\n", 1, 0),
    ("import sys, os\nsys.path.insert(0, os.environ['X'])\n", 0, 1),
    ("import importlib\nimportlib.import_module('x')\n", 0, 1),
    ("import sys\ndef f():\n    sys.path.append('/a')\nf()\n", 0, 1),
    ("import warnings\nwarnings.filterwarnings('ignore')\n", 0, 0),
    ("import sys\nif sys.version_info >= (3, 8):\n    pass\n", 0, 0),
    ("try:\n    import not_there\nexcept ImportError:\n    import sys\n    sys.path.append('/b')\n", 1, 0),
], ids=["insert", "os.path.join", "a name", "environ", "importlib", "a function", "warnings", "version check",
        "except ImportError"])
def test_sitecustomize_statements(source, edits, unevaluated):
    import ast

    from forensics.imports.customize import evaluate_customize

    path = ["/usr/lib/python3.11"]
    stdlib = {"sys", "os", "importlib", "warnings", "site"}
    effect = evaluate_customize(ast.parse(source), source, path, addsitedir=path.append,
                                classify=lambda m: "stdlib" if m.split(".")[0] in stdlib else None)
    assert (len(effect.edits), len(effect.unevaluated)) == (edits, unevaluated), (effect.edits, effect.unevaluated)


def test_rootfs_never_leaves_the_root():
    fs = MemFS({"/etc/passwd": "root", "/a/escape": ("link", "../../../../etc"), "/a/abs": ("link", "/etc/passwd")})
    assert fs.resolve("/a/escape/passwd") == "/etc/passwd"  # '..' stops at the image root
    assert fs.resolve("/a/abs") == "/etc/passwd"  # absolute targets restart at the image root
    loop = MemFS({"/x": ("link", "y"), "/y": ("link", "x")})
    assert loop.resolve("/x") is None


# -- image references and manifests --------------------------------------------------------------------

def test_parse_image_ref_names_like_skopeo(tmp_path):
    assert parse_image_ref("oci:/x/layout:v1").tag == "v1"
    assert parse_image_ref("docker-archive:/x/img.tar").transport is Transport.DOCKER_ARCHIVE
    assert parse_image_ref("dir:/x/root").transport is Transport.DIR
    assert parse_image_ref("registry.local:5000/team/exporter@sha256:" + "a" * 64).transport is Transport.DOCKER
    assert parse_image_ref("docker-daemon:nvitop:1.7.1").transport is Transport.DOCKER_DAEMON
    assert parse_image_ref(str(tmp_path)).transport is Transport.DIR


def test_manifest_kinds_and_attestations():
    a, b, c = ("sha256:" + x * 64 for x in "abc")
    index = read_manifest({"mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
        {"digest": a, "platform": {"os": "linux", "architecture": "arm64"}},
        {"digest": b, "platform": {"os": "linux", "architecture": "amd64"}},
        {"digest": c, "platform": {"os": "unknown", "architecture": "unknown"},
         "annotations": {"vnd.docker.reference.type": "attestation-manifest"}}]}, "img")
    kind, att, plats = classify_manifest(index)
    assert kind is ManifestKind.OCI_INDEX_WITH_ATTESTATIONS and att == 1 and plats == ("linux/arm64", "linux/amd64")
    assert select_platform(index, Platform()).digest == b
    docker = read_manifest({"mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                            "config": {"digest": a}, "layers": []}, "img")
    assert classify_manifest(docker)[0] is ManifestKind.DOCKER_V2
    cfg = parse_config({"config": {"Env": ["PATH=/bin", "A=b=c"], "WorkingDir": "/app", "Entrypoint": ["python"]}})
    assert cfg.getenv("A") == "b=c" and cfg.working_dir == "/app" and cfg.cmd == ()


def test_maps_and_status():
    maps = ("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
            "7f02-7f03 r-xp 0 08:01 2 /site/psutil/_psutil_linux.abi3.so\n"
            "7f04-7f05 r--p 0 08:01 2 /site/psutil/_psutil_linux.abi3.so\n")
    assert parse_maps_extensions(maps) == ("/site/psutil/_psutil_linux.abi3.so",)
    assert parse_status_ids("Uid:\t1000\t1001\t1001\t1001\nGid:\t5\t6\t6\t6\n") == (1001, 6)


# -- known issues -------------------------------------------------------------------------------------

def test_known_issues_every_entry_has_a_source_and_verification():
    for issue in load_known_issues():
        assert issue["sources"] and all(s.startswith("https://") for s in issue["sources"])
        assert issue["verified"] and issue["severity"] in ("info", "warning", "error")


def test_known_issues_match_versions_and_driver():
    hits = {h.id for h in check_known_issues({"nvitop": "1.5.0", "nvidia-ml-py": "12.575.51"}, "580.126.09")}
    assert {"nvitop-1.5.0-nvidia-ml-py-bound", "driver-580-needs-nvitop-1.5.3", "nvitop-exit-nvmlshutdown-race",
            "nvidia-ml-py-12.575.51-field-ids"} <= hits
    assert not check_known_issues({"nvitop": "1.7.1", "nvidia-ml-py": "13.580.126"}, "580.126.09")
    # driver facts need a driver
    assert "driver-580-needs-nvitop-1.5.3" not in {h.id for h in check_known_issues({"nvitop": "1.5.0"}, None)}


def test_driver_version_from_bundle_documents():
    from forensics.imports.driver import find_driver_version

    assert find_driver_version({"a": [{"nvml": {"host_driver_version": "580.126.09"}}]}) == "580.126.09"
    assert find_driver_version({"version": "1.2.3"}) is None
    assert find_driver_version({}, "Driver Version : 575.57.08\n") == "575.57.08"
