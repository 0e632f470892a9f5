"""Hostile and malformed images, made here, each read by the CLI: a clear error or a result, never a hang,
a traceback or "internal error" (#13 items 3a, 6, 7), and the bounded fuzz target over the image reader."""
from __future__ import annotations

import json
import tarfile
import time

import pytest
from click.testing import CliRunner

from forensics.cli import cli
from tests.fuzz_images import SeedImage
from tests.fuzzing import fuzz_count, fuzz_seed, run_target


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, ["verify-imports", *args], catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr if r.stderr_bytes is not None else ""


def test_the_seed_image_is_read(tmp_path):
    # GIVEN the fuzz target's seed (so that every mutant starts from something the reader accepts)
    code, out, err = run(SeedImage().write_oci(tmp_path / "oci"), "--json")
    doc = json.loads(out)["result"]
    # THEN it is a result, with the seed's facts (the .pth's legacy tree, the sitecustomize edit, dpkg's file)
    assert code == 3 and "internal error" not in err, err
    assert {m["module"]: m["verdict"] for m in doc["modules"]} == {"nvitop": "SHADOWED", "nvitop_exporter": "MISSING",
                                                                   "pynvml": "OK"}
    assert doc["python"]["customize"][0]["edits"] == ["line 2: sys.path.append('/opt/extra')"]
    code, out, err = run(SeedImage().write_archive(tmp_path / "img.tar"), "--json")
    assert code == 3 and json.loads(out)["result"]["python"]["working_dir"] == "/app"


# -- #13 item 3a: docker-archive symlinks that never end --------------------------------------------------

def _link(name: str, target: str) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type, ti.linkname = tarfile.SYMTYPE, target
    return ti


@pytest.mark.parametrize("links,config", [
    ([("loop.json", "loop.json")], "loop.json"),
    ([("a.json", "b.json"), ("b.json", "a.json")], "a.json"),
    ([(f"l{i}.json", f"l{i + 1}.json") for i in range(100)], "l0.json"),
], ids=["self", "pair", "chain-of-100"])
def test_archive_config_symlink_loops_end_with_a_clear_error(tmp_path, links, config):
    img = SeedImage()
    ref = img.write_archive(tmp_path / "img.tar", [(_link(n, t), None) for n, t in links],
                            [{"Config": config, "RepoTags": ["x:1"], "Layers": []}])
    t = time.monotonic()
    code, _, err = run(ref)
    assert time.monotonic() - t < 10
    assert code == 1 and err.startswith("forensics: error:") and ("symlink loop" in err or "symlinks in a row" in err)


# -- #13 item 6: malformed metadata, each a clear one-line error ---------------------------------------------

def _set(doc: dict, path: str, value) -> None:
    keys = path.split(".")
    for k in keys[:-1]:
        doc = doc[k]
    doc[keys[-1]] = value


METADATA = [
    ("config", "config.Entrypoint", 5, "Entrypoint: expected a list of strings, got an integer"),
    ("config", "config.Env", 7, "Env: expected a list of strings, got an integer"),
    ("config", "config", [1, 2], "config: expected an object, got a list"),
    ("config", "config.Entrypoint", [["python3"]], "Entrypoint: expected a list of strings, item 0 is a list"),
    ("config", "config.WorkingDir", 5, "WorkingDir: expected a string, got an integer"),
    ("config", "config.WorkingDir", "/" + "d" * 5000, "longer than 4095 bytes"),
    ("config", "config.User", 1000, "User: expected a string, got an integer"),
    ("config", "rootfs.diff_ids", 5, "diff_ids: expected a list, got an integer"),
    ("index", "manifests", "sha256:abc", "manifests: expected a list, got a string"),
    ("index", "manifests", 3, "manifests: expected a list, got an integer"),
    ("index", "manifests", ["x"], "manifests[0]: expected an object, got a string"),
    ("manifest", "layers", {"a": 1}, "layers: expected a list, got an object"),
    ("manifest", "layers", [{"mediaType": "x", "size": 1}], "layers[0].digest: missing"),
    ("manifest", "layers", [{"digest": 5}], "digest: expected a string, got an integer"),
    ("manifest", "layers", [{"digest": "sha512:zz"}], "not a valid sha512 digest"),
    ("manifest", "layers", [{"digest": "md5:" + "0" * 32}], "cannot be verified"),
    ("manifest", "config", None, "config: no config descriptor"),
    ("manifest", "config", {"digest": "sha256:" + "a" * 64, "size": "big"}, "size: expected an integer, got a string"),
]


@pytest.mark.parametrize("doc,path,value,message", METADATA,
                         ids=[f"{d}.{p}={json.dumps(v)[:20]}" for d, p, v, _ in METADATA])
def test_malformed_metadata_is_a_clear_error(tmp_path, doc, path, value, message):
    img = SeedImage()
    _set(getattr(img, doc), path, value)
    code, _, err = run(img.write_oci(tmp_path / "oci"))
    assert code == 1 and "internal error" not in err, err
    assert err.startswith("forensics: error:") and message in err, err


def test_a_docker_archive_manifest_that_is_not_json_or_not_a_list(tmp_path):
    for i, raw in enumerate((b"{not json", b'{"Config": "x"}', b"[]", b'[{"Config": 5}]', b"[" * 100000)):
        img = SeedImage()
        img.raw_docs["archive"] = raw
        code, _, err = run(img.write_archive(tmp_path / f"{i}.tar"))
        assert code == 1 and err.startswith("forensics: error:") and "manifest.json" in err, (raw[:20], err)


def test_an_index_that_is_not_an_object_or_nested_too_deep(tmp_path):
    for i, raw in enumerate((b"[1, 2]", b"[" * 100000 + b"]" * 100000, b"\xff\xfe")):
        img = SeedImage()
        img.raw_docs["index"] = raw
        code, _, err = run(img.write_oci(tmp_path / f"oci{i}"))
        assert code == 1 and err.startswith("forensics: error:") and "index.json" in err, err


def test_passwd_and_user_that_do_not_parse(tmp_path):
    # an /etc/passwd line with uid 'abc' is skipped, as getpwnam skips it; a User of non-ASCII digits
    # names nobody, and the runtime would refuse to start the container: a finding, not a crash
    img = SeedImage()
    img.layers[0] = [(ti, b"app:x:abc:1000::/home/app:/bin/sh\n" if ti.name == "etc/passwd" else d)
                     for ti, d in img.layers[0]]
    img.config["config"]["User"] = "\u00b2"  # SUPERSCRIPT TWO: str.isdigit() is True, int() raises
    code, out, err = run(img.write_oci(tmp_path / "oci"), "--json")
    doc = json.loads(out)["result"]
    assert code == 3 and "internal error" not in err
    assert doc["findings"][0]["kind"] == "user-not-found"


@pytest.mark.parametrize("user,refused", [
    (None, False),  # no User: uid 0, which needs no /etc/passwd (runc's GetExecUser)
    ("1000", False),  # a numeric uid runs as it is
    ("1000:1000", False),
    ("root", True),  # a name needs the file that lists it: "unable to find user root"
    ("0:wheel", True),  # so does a group name
], ids=["no-user", "uid", "uid-gid", "root-by-name", "group-by-name"])
def test_a_scratch_style_image_without_passwd_runs_as_the_runtime_runs_it(tmp_path, user, refused):
    # GIVEN an image with no /etc/passwd and no /etc/group (FROM scratch plus an interpreter)
    img = SeedImage()
    img.layers = [[(ti, d) for ti, d in layer if ti.name not in ("etc/passwd", "etc/group")] for layer in img.layers]
    if user is None:
        del img.config["config"]["User"]
    else:
        img.config["config"]["User"] = user
    # WHEN it is verified
    code, out, err = run(img.write_oci(tmp_path / "oci"), "--json")
    doc = json.loads(out)["result"]
    # THEN only a user or group given by name is "the runtime refuses to start the container"
    kinds = [f["kind"] for f in doc["findings"]]
    assert ("user-not-found" in kinds) is refused, doc["findings"]
    assert code == 3 and "internal error" not in err


def test_user_ids_are_what_runc_gives_without_and_with_passwd(tmp_path):
    from forensics.imports.checks import lookup_user
    from forensics.imports.rootfs import DirFS

    fs = DirFS(str(tmp_path))  # no /etc/passwd at all
    assert lookup_user(fs, "") == (0, 0, None, None)
    assert lookup_user(fs, "1000") == (1000, 0, None, None)  # `docker run --user 1000`: uid=1000 gid=0(root)
    assert lookup_user(fs, "1000:5") == (1000, 5, None, None)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n")
    assert lookup_user(fs, "") == (0, 0, "/root", None)
    assert lookup_user(fs, "app") == (1000, 1001, "/home/app", None)
    assert lookup_user(fs, "1000") == (1000, 1001, "/home/app", None)
    assert lookup_user(fs, "2000") == (2000, 0, None, None)


@pytest.mark.parametrize("source", ["1" + "+1" * 200_000, "-" * 200_000 + "1", "x = (" * 300 + "1" + ")" * 300],
                         ids=["recursion", "memory", "nesting"])
def test_an_entrypoint_script_that_breaks_the_parser(tmp_path, source):
    img = SeedImage()
    img.layers[1].append((tarfile.TarInfo("app/run.py"), f"#!/usr/local/bin/python3\n{source}\n".encode()))
    img.config["config"]["Entrypoint"] = ["/usr/local/bin/python3", "/app/run.py"]
    code, out, err = run(img.write_oci(tmp_path / "oci"), "--json")
    assert code in (0, 3) and "internal error" not in err, err
    assert json.loads(out)["result"]["python"]["entrypoint"]["mode"] == "script"


def test_a_path_over_path_max_in_a_layer_with_execute(tmp_path):
    img = SeedImage()
    img.layers[1].append((tarfile.TarInfo("app/" + "d/" * 2100 + "f"), b"x"))
    code, _, err = run(img.write_oci(tmp_path / "oci"), "--execute")
    assert code == 1 and "longer than 4095 bytes" in err and "internal error" not in err


# -- #13 item 7 (image part) -------------------------------------------------------------------------------

def test_no_interpreter_and_an_unverifiable_digest_are_not_ok(tmp_path):
    # GIVEN an image with no Python at all
    img = SeedImage()
    img.layers = [[(ti, d) for ti, d in layer if "python3" not in ti.name and "python" not in ti.linkname]
                  for layer in img.layers]
    code, out, err = run(img.write_oci(tmp_path / "a"), "--json")
    doc = json.loads(out)["result"]
    assert code == 3 and [f["kind"] for f in doc["findings"]][-1] == "no-interpreter"
    assert "no Python interpreter" in " ".join(doc["failures"])
    # and a layer digest that cannot be verified is refused, never skipped
    img = SeedImage()
    img.manifest["layers"] = [{"digest": "sha512:zz", "mediaType": "x"}]
    code, _, err = run(img.write_oci(tmp_path / "b"))
    assert code == 1 and "not a valid sha512 digest" in err


# -- findings about the image as a whole ------------------------------------------------------------------

def _exe(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    ti = tarfile.TarInfo(name)
    ti.mode = 0o755
    return ti, data


def test_a_command_that_is_not_python_makes_the_verdict_uncertain(tmp_path):
    # GIVEN an entrypoint script that starts Python later (what it runs is not read)
    img = SeedImage()
    img.layers[1] += [_exe("bin/sh", b"\x7fELF"), _exe("entry.sh", b"#!/bin/sh\nexec python3 -m nvitop\n")]
    img.config["config"]["Entrypoint"] = ["/entry.sh"]
    ref = img.write_oci(tmp_path / "oci")
    # WHEN verified
    code, out, _ = run(ref, "--json", "--only", "-m", "pynvml")
    doc = json.loads(out)["result"]
    # THEN no clean OK: the verdict assumes `python3 -c`, and says so with the fix
    assert code == 3 and [f["kind"] for f in doc["findings"]] == ["uncertain"]
    assert "--entrypoint" in doc["findings"][0]["fix"]
    code, out, _ = run(ref, "--only", "-m", "pynvml")
    assert out.rstrip().splitlines()[-1].startswith("  result: UNCERTAIN (the command '/entry.sh' is not a Python")
    # and with the Python command it starts, the verdict is certain again
    code, out, _ = run(ref, "--json", "--only", "-m", "pynvml", "--entrypoint", "python3 -m pynvml")
    assert code == 0 and json.loads(out)["result"]["findings"] == []


def test_what_the_image_names_is_escaped_in_the_text_output(tmp_path):
    # GIVEN an image whose WorkingDir, command and a stale tree carry terminal control sequences
    img = SeedImage()
    img.config["config"]["WorkingDir"] = "/app\x1b]0;pwned\x07"
    img.config["config"]["Cmd"] = ["--once\r\n  result: OK"]
    img.layers[1].append((tarfile.TarInfo("app\x1b]0;pwned\x07/nvitop/__init__.py"), b"__version__ = '9'\n"))
    # WHEN the text report is printed
    code, out, _ = run(img.write_oci(tmp_path / "oci"))
    # THEN no control character reaches the terminal, and no line is forged
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert "/app\\x1b]0;pwned\\x07" in out and [ln for ln in out.splitlines() if ln.startswith("  result:")] == [
        out.splitlines()[-1]]


# -- the fuzz target ------------------------------------------------------------------------------------

def test_fuzz_the_image_reader(tmp_path):
    """A few hundred seeded mutants (FORENSICS_FUZZ_COUNT=N for more, FORENSICS_FUZZ_SEED=S for others), read
    by the real command line through the harness the core fuzz shares (tests/fuzzing.py): a clear error or a
    result each, within its time and memory bounds, no control character on the terminal, nothing written
    outside its output."""
    # GIVEN the count and the first seed
    count, seed = fuzz_count(), fuzz_seed()
    t = time.monotonic()
    # WHEN the fuzz target runs in a child under RLIMIT_AS, with a TMPDIR and a working directory that must stay
    # empty (THEN: run_target asserts no violation, nothing left behind, the sentinel untouched, memory bounded)
    summary = run_target("tests/fuzz_images.py", ["--count", str(count), "--seed", str(seed)], tmp_path,
                         count=count, timeout=max(600, count * 3))
    print(f"fuzz: {count} mutants, {summary['runs']} runs in {time.monotonic() - t:.0f}s: {summary['summary']}; "
          f"peak {summary['max_rss_mb']} MiB")
