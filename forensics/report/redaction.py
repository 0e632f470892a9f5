"""What a report replaces in its evidence before anything is picked out of it, and says it replaced: the host,
node and pod names the evidence names, this machine's local paths, every string's control characters, and
the footer counting each kind."""
from __future__ import annotations

import re
from pathlib import Path

from .evidence import Evidence
from ..format import load_analysis
from ..imports.format import load_import_report
from ..output import escape_text
from ..redact import Redactor
from ..reproduce import load_reproduce

__all__ = ["TEXT_KEYS", "escape_value", "hosts_in", "local_prefixes", "footer_lines"]


def hosts_in(ev: Evidence) -> dict[str, str]:
    """Node, pod and host names the evidence names, to be replaced consistently: the capture's identity and
    scheduling, and the values of --hostname / --host / --node-name options in the command lines."""
    out: dict[str, str] = {}
    caps = ev.captures()
    for cap in caps:
        for name, kind in cap.host_names:
            out.setdefault(name, kind)
    texts = [load_analysis(doc).snapshot.core.args for doc in ev.all("analyze")]
    texts += [cap.snapshot.cmdline for cap in caps]
    for doc in ev.all("verify-imports"):
        python = load_import_report(doc).python
        texts.append(" ".join(python.entrypoint.argv) if python else "")
    for t in texts:
        for m in re.finditer(r"--(?:hostname|host|node-name|nodename)(?:=|\s+)([A-Za-z0-9][A-Za-z0-9.-]{0,252})", t):
            if not re.fullmatch(r"[\d.]+", m.group(1)) and m.group(1) not in ("localhost",):
                out.setdefault(m.group(1), "host")
    return out


#: evidence strings that are many lines by nature (they keep their newlines and tabs, nothing else)
TEXT_KEYS = frozenset({"nvidia_smi", "kernel_log", "bug_report_text", "os_release_image", "os_release_node",
                       "stderr_tail"})


def escape_value(value: str, key: str | None) -> str:
    """A string of the evidence tree with its control characters escaped, before anything is picked out of
    it: a command line, a thread, frame or file name, a dict key (what the crashed process controls) can
    neither forge a line in a fenced block nor drive the terminal the report is read on.  The texts of
    :data:`TEXT_KEYS` keep their line breaks and tabs; any other string loses the line end it may close with.

    >>> escape_value("x\\r\\nThread 1 [FORGED]", "args"), escape_value("a\\nb\\tc\\x1b[2J", "kernel_log")
    ('x\\\\x0d\\\\x0aThread 1 [FORGED]', 'a\\nb\\tc\\\\x1b[2J')
    """
    if key in TEXT_KEYS:
        return escape_text(value, keep="\n\t")
    return escape_text(value.rstrip("\r\n"))  # a line's own end forges nothing


_HOST_KINDS = {"host names": ("host name", "host names"), "IP addresses": ("IP address", "IP addresses"),
               "node names": ("node name", "node names"), "pod names": ("pod name", "pod names")}


def _count_phrase(what: str, n: int) -> str:
    """``3 bearer tokens``, ``1 bearer token``: the redactor counts by plural phrases; the head noun is
    the first word ending in s of the phrase's last part (``passwords in URLs`` -> ``password in URLs``)."""
    one, many = _HOST_KINDS.get(what, (None, what))
    if one is None:
        words = what.split(" ")
        cut = min([words.index(w) for w in ("in", "with") if w in words] or [len(words)])
        for i in range(cut - 1, -1, -1):
            if words[i].endswith("s") and not words[i].endswith("ss"):
                words[i] = words[i][:-1]
                break
        one = " ".join(words)
    return f"{n} {one if n == 1 else many}"


def footer_lines(redactor: Redactor, localizer, upstream: bool, hosts: bool) -> list[str]:
    """What was replaced in the evidence before this report was written, by kind."""
    secrets = [_count_phrase(w, n) for w, n in sorted(redactor.counts.items()) if w not in _HOST_KINDS]
    out = ["secrets: " + (", ".join(secrets) if secrets else
                          "none found (URL credentials, NAME=value and option pairs with secret-like names, tokens, "
                          "private keys)")]
    if hosts:
        names = [_count_phrase(w, n) for w, n in sorted(redactor.counts.items()) if w in _HOST_KINDS]
        out.append("host, node and pod names and IPs: " + (", ".join(names) + " (now host-N, node-N, pod-N, ip-N)"
                                                           if names else "none found"))
    if upstream:
        out.append("local paths: " + (", ".join(localizer.summary()) if localizer.summary() else "none found"))
    return out


def local_prefixes(ev: Evidence) -> tuple[str, ...]:
    """This machine's places the evidence names: where its files and bundles are, the reproducers' work
    directory, forensics' cache and checkout, the user's home."""
    out = {str(Path.home())}
    for item in ev.items:
        out.add(str(Path(item.path).resolve().parent))
    for cap in ev.captures():
        if cap.bundle_dir:
            out.add(str(Path(cap.bundle_dir).parent))
    for doc in ev.all("reproduce"):
        for r in load_reproduce(doc).runs:
            out.add(str(Path(r.run_dir).parent.parent))  # <workdir>/reproduce-<stamp>/<name>
    for doc in ev.all("analyze"):
        core = load_analysis(doc).snapshot.core.path
        if core.startswith("/"):
            out.add(str(Path(core).parent))
    try:
        from ..cache import cache_dir

        out.add(str(cache_dir()))
    except Exception:  # noqa: BLE001 - no cache configured: nothing to learn
        pass
    out.add(str(Path(__file__).resolve().parents[2]))  # the checkout or site-packages forensics runs from
    return tuple(sorted(p for p in out if p not in ("/", "")))
