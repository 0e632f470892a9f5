"""What an API server (a broken one, a proxy, a compromised cluster) may answer through the real kubectl: fields of
the wrong type are read as absent, never "internal error" (#13: kubectl/API answers).

The API stand-in (tests/kube_standin.py) serves pods and nodes with one field of the wrong type each; ``fleet`` and
``capture --pod --dry-run`` read them through kubectl.  Before, each of these was "internal error: AttributeError"
(a status, a container status, a last state, a state that is a string), "TypeError" or "ValueError" (node labels
that are a list).
"""
from __future__ import annotations

import copy
import shutil

import pytest
from click.testing import CliRunner

from forensics.cli import cli

MUTATIONS = {
    "status a string": lambda p, n: p.__setitem__("status", "x"),
    "containerStatuses a string": lambda p, n: p["status"].__setitem__("containerStatuses", "x"),
    "a container status a string": lambda p, n: p["status"].__setitem__("containerStatuses", ["x"]),
    "lastState a string": lambda p, n: p["status"]["containerStatuses"][0].__setitem__("lastState", "x"),
    "terminated a string": lambda p, n: p["status"]["containerStatuses"][0]["lastState"].__setitem__("terminated", "x"),
    "exitCode a string": lambda p, n: p["status"]["containerStatuses"][0]["lastState"]["terminated"].__setitem__(
        "exitCode", "x"),
    "state a string": lambda p, n: p["status"]["containerStatuses"][0].__setitem__("state", "x"),
    "waiting a string": lambda p, n: p["status"]["containerStatuses"][0].__setitem__("state", {"waiting": "x"}),
    "restartCount a string": lambda p, n: p["status"]["containerStatuses"][0].__setitem__("restartCount", "many"),
    "container name a number": lambda p, n: p["status"]["containerStatuses"][0].__setitem__("name", 7),
    "ownerReferences a string": lambda p, n: p["metadata"].__setitem__("ownerReferences", "x"),
    "node labels a list": lambda p, n: n["metadata"].__setitem__("labels", ["x"]),
    "node conditions a string": lambda p, n: n["status"].__setitem__("conditions", "x"),
    "nodeInfo a list": lambda p, n: n["status"].__setitem__("nodeInfo", []),
}


@pytest.mark.parametrize("case", list(MUTATIONS))
def test_a_field_of_the_wrong_type_is_read_as_absent(case, tmp_path):
    from tests.kube_standin import StandIn, make_node, make_pod, write_kubeconfig

    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    # GIVEN an API whose pod (or node) has one field of the wrong type
    pod = make_pod(name="exporter-0", namespace="monitoring", uid="uid-0", node="node-a", container_id="c" * 64,
                   restarts=3, last_exit=139)
    pod["metadata"]["labels"] = {"app": "nvitop-exporter"}
    node = make_node("node-a")
    pod, node = copy.deepcopy(pod), copy.deepcopy(node)
    MUTATIONS[case](pod, node)
    with StandIn(path_env="/usr/bin:/bin") as api:
        api.pods[("monitoring", "exporter-0")] = pod
        api.nodes["node-a"] = node
        kubeconfig = write_kubeconfig(str(tmp_path / "kubeconfig"), api.url, namespace="monitoring")
        # WHEN fleet and capture --pod --dry-run read them through kubectl
        fleet = CliRunner().invoke(cli, ["fleet", "--kubeconfig", kubeconfig, "-n", "monitoring"])
        capture = CliRunner().invoke(cli, ["capture", "--pod", "exporter-0", "--kubeconfig", kubeconfig, "-n",
                                           "monitoring", "--dry-run"])
    # THEN a result or a clear error, never an internal one
    for r in (fleet, capture):
        assert "internal error" not in r.stderr and r.exit_code in (0, 1, 4), (r.exit_code, r.output)
        if r.exit_code == 1:
            assert r.stderr.startswith("forensics: error:"), r.stderr


def _tar_gz(members) -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def test_what_a_node_sends_back_is_unpacked_within_bounds(tmp_path):
    """capture --pod unpacks the node's bundle from the agent's log: a compromised node may send a bomb, a traversal
    or a million files; before, tar's data filter stopped only the traversal, nothing bounded the rest."""
    from forensics.capture.pod import extract_node_bundle

    # GIVEN a 64 MiB member (an 70 KB stream), 50 files, a member named out of the bundle, a broken stream
    bomb = _tar_gz([("00-identity.json", b"{}"), ("50-core/core.zst", bytes(64 << 20))])
    many = _tar_gz([(f"f{i}", b"x") for i in range(50)])
    traversal = _tar_gz([("ok", b"x"), ("../../escaped", b"x")])
    broken = _tar_gz([("a", b"y" * 100000), ("b", bytes(range(256)) * 4000)])
    broken = broken[: len(broken) // 2]
    out = {}
    for name, data in (("bomb", bomb), ("many", many), ("traversal", traversal), ("broken", broken)):
        d = tmp_path / name
        d.mkdir()
        # WHEN each is unpacked under an 8 MiB and 10-file bound
        out[name] = extract_node_bundle(data, str(d), max_bytes=8 << 20, max_files=10)
    # THEN each stops at its bound and says why; what came before is kept; nothing lands outside
    assert out["bomb"] == f"over {8 << 20} bytes decompressed" and (tmp_path / "bomb" / "00-identity.json").exists()
    assert out["many"] == "over 10 files" and len(list((tmp_path / "many").iterdir())) == 10
    assert out["traversal"].startswith("a member was refused") and not (tmp_path.parent / "escaped").exists()
    assert out["broken"].startswith("its stream breaks after")


def test_json_nested_deeper_than_the_parser_goes_is_not_json(tmp_path):
    """kubectl (Go: 10,000 levels) passes on an object nested deeper than Python's json parser goes; that was a
    RecursionError out of capture --pod, now 'not JSON', one line, before anything is created."""
    import json

    from tests.kube_standin import StandIn, make_node, make_pod, write_kubeconfig

    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    depth = 2000
    deep = "[" * depth + "]" * depth
    with pytest.raises(RecursionError):  # past this interpreter's parser, or the test proves nothing
        json.loads(deep)
    # GIVEN an API whose node object carries a field nested 2,000 deep (served as raw bytes)
    pod = make_pod(name="exporter-0", namespace="monitoring", uid="uid-0", node="node-a", container_id="c" * 64,
                   restarts=3, last_exit=139)
    node = json.dumps(make_node("node-a"))
    node = node[:-1] + ', "deep": ' + deep + "}"
    with StandIn(path_env="/usr/bin:/bin") as api:
        api.pods[("monitoring", "exporter-0")] = pod
        api.nodes["node-a"] = node.encode()
        kubeconfig = write_kubeconfig(str(tmp_path / "kubeconfig"), api.url, namespace="monitoring")
        # WHEN capture --pod reads the node through kubectl
        r = CliRunner().invoke(cli, ["capture", "--pod", "exporter-0", "--kubeconfig", kubeconfig, "-n",
                                     "monitoring", "--output", str(tmp_path / "out")])
        created = [k for k in api.pods if k != ("monitoring", "exporter-0")]
    # THEN one line says the answer is not JSON; no traceback, no agent pod
    assert r.exit_code == 1, r.output
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("forensics: error:")]
    assert "get node" in line and "not JSON" in line and "Traceback" not in r.output
    assert created == []
