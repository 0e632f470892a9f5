"""The fleet table's one boundary rule and summary tail (forensics/fleet/model.py), used by `fleet --from` and
`fleet --prometheus` alike: the cases the rule decides, and that both readers reach it."""
from __future__ import annotations

import ast
from pathlib import Path

from forensics.fleet import summarize_fleet
from forensics.fleet.model import (DEFAULT_GROUP_LABELS, MAX_BOUNDARY_VALUES, FleetGroup, boundary_lines,
                                  finish_summary, group_key)
from tests.fleetgen import incident_fleet


def test_a_label_whose_values_split_crashing_from_clean_nodes_is_the_boundary():
    per = {"gpu": {"H20": (108, 106), "Ada": (99, 0)}, "zone": {"a": (100, 50), "b": (107, 56)}}
    assert boundary_lines(per, nodes=207, crashing=106) == [
        "gpu: H20 (106 of 108 nodes crashing) vs Ada (99 nodes, none crashing)"]


def test_no_boundary_when_no_node_or_every_node_crashes():
    per = {"gpu": {"H20": (2, 2), "Ada": (2, 0)}}
    assert boundary_lines(per, nodes=4, crashing=0) == []
    assert boundary_lines(per, nodes=4, crashing=4) == []


def test_a_value_half_crashing_is_hot_but_one_crashing_a_little_spoils_the_label():
    assert boundary_lines({"d": {"580": (2, 1), "570": (3, 0)}}, nodes=5, crashing=1) == [
        "d: 580 (1 of 2 nodes crashing) vs 570 (3 nodes, none crashing)"]
    # 570 has a crashing node but less than half: neither hot nor cold
    assert boundary_lines({"d": {"580": (2, 2), "570": (3, 1)}}, nodes=5, crashing=3) == []


def test_the_crashing_values_must_cover_nine_tenths_of_the_crashing_nodes():
    # 9 of the 10 crashing nodes have the label's hot value: enough; 8 of 10: not a boundary
    assert boundary_lines({"x": {"a": (9, 9), "b": (5, 0)}}, nodes=20, crashing=10)
    assert boundary_lines({"x": {"a": (8, 8), "b": (5, 0)}}, nodes=20, crashing=10) == []


def test_per_node_labels_and_skipped_labels_are_never_a_boundary():
    many = {f"n{i}": (1, 1 if i < 8 else 0) for i in range(MAX_BOUNDARY_VALUES + 1)}
    assert boundary_lines({"serial": many}, nodes=17, crashing=8) == []
    few = {"a": (1, 1), "b": (1, 0)}
    assert boundary_lines({"kubernetes.io/hostname": few, "feature.node.kubernetes.io/cpu": few},
                          nodes=2, crashing=1) == []


def test_lines_come_by_label_name():
    few = {"a": (1, 1), "b": (1, 0)}
    lines = boundary_lines({"z.io/x": few, "a.io/x/y": few, "a.io/x": few}, nodes=2, crashing=1)
    assert [x.split(":")[0] for x in lines] == ["a.io/x", "a.io/x/y", "z.io/x"]


def _group(name: str, pods: int, restarting: int, restarts: int) -> FleetGroup:
    return FleetGroup(key=(("gpu", name),), nodes=pods, pods=pods, pods_with_restarts=restarting,
                      total_restarts=restarts, max_restarts=restarts, exit_codes={}, reasons={}, crash_loop=0,
                      images={})


def test_the_summary_tail_sorts_and_names_crashing_and_clean_groups():
    s = finish_summary([_group("Ada", 99, 0, 0), _group("T4", 10, 1, 3), _group("H20", 108, 106, 11648)],
                       group_by=("gpu",), nodes=217, boundary=["b"], source="x")
    assert [g.name for g in s.groups] == ["H20", "T4", "Ada"]
    assert s.pods == 217 and s.crashing_groups == ("H20",) and s.clean_groups == ("Ada",)
    assert s.boundary == ("b",) and s.source == "x"


def test_a_node_without_gpu_labels_falls_back_to_its_instance_type_only_for_the_default_labels():
    labels = {"node.kubernetes.io/instance-type": "g5"}
    assert group_key(labels, DEFAULT_GROUP_LABELS) == (("node.kubernetes.io/instance-type", "g5"),)
    assert group_key(labels, ("nvidia.com/gpu.product",)) == ()


def test_fleet_from_pod_objects_names_the_incident_boundary():
    pods, nodes = incident_fleet()
    s = summarize_fleet(pods, nodes)
    assert "nvidia.com/gpu.product: NVIDIA-H20 (106 of 108 nodes crashing) vs NVIDIA-RTX-6000-Ada-Generation " \
           "(99 nodes, none crashing)" in s.boundary


def test_both_readers_call_the_one_rule_and_define_none_of_their_own():
    root = Path(__file__).resolve().parents[2] / "forensics"
    for module in ("fleet/__init__.py", "fleet/prom.py"):
        tree = ast.parse((root / module).read_text())
        called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert {"boundary_lines", "finish_summary"} <= called, module
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        assert not defined & {"FleetGroup", "FleetSummary", "_group_values", "group_key"}, module
