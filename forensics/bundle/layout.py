"""The bundle's layout: the name of every item, in the order an on-call engineer reads them.

::

    00-identity.json          pod / job / node UIDs, container, image, timestamps
    10-kubernetes/            pod, events, node (scheduling state)            [--pod]
    20-node/                  kubelet, container runtime, device plugin lines, the node's os-release
    30-kernel/                NVRM / Xid kernel log lines, nvidia-smi output, NVIDIA's bug report
    40-process/               the process snapshot, its arming and the /proc files as read
    50-core/                  the compressed core (or, in a pod bundle, the handler's earlier crashes)
    metadata.json             the core handler's record of the crash (its decision, sizes, objects)
    60-analysis/              the agent's analysis of the crash (analysis.json or failed.json)
    70-upload.json            where agent serve --upload put the bundle (what stays on the node after it)
    objects/                  the ELF objects the core maps, by build-id      [pod bundles; node bundles
                                                                               share the core directory's]
    left-on-node.json         what did not fit the pod log                    [pod bundles]
    MANIFEST.json             every item: path, size, sha256, what it is

and the core directory the core handler writes (``CORE_DIR``): ``crashes/<id>/`` (one bundle per crash),
``objects/`` (the build-id store its bundles share), ``index.jsonl`` (one line per crash), and the agent's
``agent-index.json`` and ``upload-attempts.json``.

Every other module names an item by these constants, never by its spelling
(``tests/unit/test_import_graph.py`` checks it).
"""
from __future__ import annotations

__all__ = [
    "IDENTITY", "KUBERNETES_EVENTS", "KUBERNETES_SCHEDULING", "KUBERNETES_POD", "KUBERNETES_NODE",
    "NODE_OS_RELEASE", "node_log", "KERNEL_DIR", "KERNEL_LOG", "NVIDIA_SMI", "BUG_REPORT_NOTE", "BUG_REPORT_LOGS",
    "PROCESS_SNAPSHOT", "PROCESS_ARMING", "PROCESS_OS_RELEASE", "process_file",
    "CORE_DIR", "CORE_WHOLE", "CORE_TRUNCATED", "CORE_PARTIAL", "CORE_PLAIN", "NOT_A_CORE", "CORE_NAMES", "CORE_TMP",
    "core_item", "RECORD", "ANALYSIS_DIR", "ANALYSIS", "ANALYSIS_FAILED", "ANALYSIS_ATTEMPTS", "ANALYSIS_POD",
    "OBJECTS", "LEFT_ON_NODE", "MANIFEST", "RESERVE", "UPLOADED", "UPLOAD_ATTEMPTS",
    "CRASHES", "INDEX", "HANDLER_STATE", "AGENT_INDEX", "BUNDLES", "RESERVATIONS",
]

IDENTITY = "00-identity.json"
KUBERNETES_EVENTS = "10-kubernetes/events.json"
KUBERNETES_SCHEDULING = "10-kubernetes/scheduling.json"
KUBERNETES_POD = "10-kubernetes/pod.json"
KUBERNETES_NODE = "10-kubernetes/node.json"
_NODE_DIR = "20-node"
NODE_OS_RELEASE = f"{_NODE_DIR}/os-release"
KERNEL_DIR = "30-kernel"
KERNEL_LOG = f"{KERNEL_DIR}/kernel-nvidia.log"
NVIDIA_SMI = f"{KERNEL_DIR}/nvidia-smi.txt"
BUG_REPORT_NOTE = f"{KERNEL_DIR}/nvidia-bug-report.txt"
#: NVIDIA's bug report as nvidia-bug-report.sh leaves it, compressed first
BUG_REPORT_LOGS = (f"{KERNEL_DIR}/nvidia-bug-report.log.gz", f"{KERNEL_DIR}/nvidia-bug-report.log")
_PROCESS_DIR = "40-process"
PROCESS_SNAPSHOT = f"{_PROCESS_DIR}/snapshot.json"
PROCESS_ARMING = f"{_PROCESS_DIR}/arming.json"
PROCESS_OS_RELEASE = f"{_PROCESS_DIR}/os-release"
CORE_DIR = "50-core"
CORE_WHOLE = "core.zst"
CORE_TRUNCATED = "core.truncated.zst"  # a valid zstd stream of the core's first bytes
CORE_PARTIAL = "core.partial.zst"  # ends in the middle of a zstd frame (the disk filled up)
CORE_PLAIN = "core"  # an uncompressed core (a bundle made by hand)
NOT_A_CORE = "stream.zst"  # what the kernel sent when it was not a core
CORE_TMP = ".core.zst.tmp"  # the core while it streams in
#: Core file names in ``50-core``, whole first
CORE_NAMES = (CORE_WHOLE, CORE_TRUNCATED, CORE_PARTIAL)
RECORD = "metadata.json"
ANALYSIS_DIR = "60-analysis"
ANALYSIS = f"{ANALYSIS_DIR}/analysis.json"
ANALYSIS_FAILED = f"{ANALYSIS_DIR}/failed.json"
ANALYSIS_ATTEMPTS = f"{ANALYSIS_DIR}/attempts.json"
ANALYSIS_POD = f"{ANALYSIS_DIR}/pod.json"
OBJECTS = "objects"
UPLOADED = "70-upload.json"  # written by agent serve --upload after a verified upload, never uploaded itself
LEFT_ON_NODE = "left-on-node.json"
MANIFEST = "MANIFEST.json"
RESERVE = ".reserve"  # room held for the end of a kept core's frame on a full disk

# the core directory
CRASHES = "crashes"
INDEX = "index.jsonl"
HANDLER_STATE = "handler.json"
BUNDLES = "bundles"  # capture --pid's bundles, by default
AGENT_INDEX = "agent-index.json"
UPLOAD_ATTEMPTS = "upload-attempts.json"  # agent serve --upload's failed attempts of each crash waiting, by its id
RESERVATIONS = ".reservations"  # one file per handler that keeps a core, while it runs (the crash-loop limit)


def node_log(name: str) -> str:
    """The item of the node's log lines from ``name`` (kubelet, containerd...).

    >>> node_log("kubelet")
    '20-node/kubelet'
    """
    return f"{_NODE_DIR}/{name}"


def process_file(name: str) -> str:
    """The item of ``/proc/PID/name`` as read.

    >>> process_file("limits")
    '40-process/limits'
    """
    return f"{_PROCESS_DIR}/{name}"


def core_item(name: str) -> str:
    """The item of a file of ``50-core`` (a core, or a pod bundle's earlier crash).

    >>> core_item(CORE_WHOLE)
    '50-core/core.zst'
    """
    return f"{CORE_DIR}/{name}"
