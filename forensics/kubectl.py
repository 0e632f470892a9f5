"""The one Kubernetes client: the real ``kubectl``, with the user's kubeconfig, context and namespace.

Every command that talks to a cluster (``fleet``, ``canary --pod``, ``capture --pod``) goes
through :func:`run_kubectl` / :func:`get_json`, so they fail alike: kubectl missing is
:class:`~forensics.errors.KubectlNotFound`, a failed call :class:`~forensics.errors.KubeError`
naming the action and kubectl's last line, a call without an answer the same after ``timeout``.
The API's objects are read through :func:`as_dict`, :func:`as_list`, :func:`as_str` and
:func:`as_count`: an answer (or a saved file) may hold anything where an object, a list, a
string or a count is due, and each reads it as absent rather than failing on it.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

from .errors import KubeError, KubectlNotFound
from .subproc import OutputTooLarge, run_bounded

__all__ = ["KubeOptions", "run_kubectl", "get_json", "as_dict", "as_list", "as_str", "as_count", "KUBECTL_MAX_BYTES"]

#: the most of one kubectl answer read (a pod list of 10,000 pods as the API writes them is ~100-200 MiB)
KUBECTL_MAX_BYTES = 512 << 20


@dataclass(frozen=True, slots=True)
class KubeOptions:
    """Which kubectl, and the cluster and namespace it talks to (None: kubectl's defaults)."""

    kubectl: str = "kubectl"
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None

    def argv(self, namespaced: bool = True) -> list[str]:
        """The kubectl command line up to the verb.

        :raises KubectlNotFound: when ``kubectl`` is not an executable on PATH
        """
        exe = shutil.which(self.kubectl)
        if exe is None:
            raise KubectlNotFound(self.kubectl)
        out = [exe]
        if self.kubeconfig:
            out += ["--kubeconfig", self.kubeconfig]
        if self.context:
            out += ["--context", self.context]
        if namespaced and self.namespace:
            out += ["--namespace", self.namespace]
        return out


def run_kubectl(opts: KubeOptions, action: str, args: list[str], *, stdin: str | None = None, namespaced: bool = True,
                timeout: float = 60.0, max_bytes: int = KUBECTL_MAX_BYTES) -> str:
    """kubectl's stdout for ``args``; ``action`` names the call in errors ("get pod", "create agent pod").
    kubectl runs bounded (:func:`forensics.subproc.run_bounded`): an answer past ``max_bytes`` is an error.

    :raises KubectlNotFound: kubectl is missing
    :raises KubeError: kubectl failed (its last line), did not answer within ``timeout`` or answered more than
        ``max_bytes``
    """
    cmd = opts.argv(namespaced) + args
    try:
        p = run_bounded(cmd, input=stdin, timeout=timeout, max_stdout=max_bytes)
    except subprocess.TimeoutExpired as e:
        raise KubeError(action, f"no answer in {timeout:g}s") from e
    except OutputTooLarge as e:
        raise KubeError(action, f"an answer larger than {max_bytes >> 20} MiB (stopped); narrow it with -n/-l") from e
    except OSError as e:
        raise KubectlNotFound(opts.kubectl) from e
    if p.returncode != 0:
        raise KubeError(action,
                        (p.stderr.strip() or p.stdout.strip() or f"exit status {p.returncode}").splitlines()[-1])
    return p.stdout


def get_json(opts: KubeOptions, action: str, args: list[str], **kw: Any) -> dict[str, Any]:
    """``kubectl ARGS -o json`` as a dict (see :func:`run_kubectl` for ``kw`` and errors)."""
    out = run_kubectl(opts, action, args + ["-o", "json"], **kw)
    try:
        doc = json.loads(out)
    except (ValueError, RecursionError) as e:  # RecursionError: nested deeper than the parser goes
        raise KubeError(action, f"not JSON: {out[:200]!r}") from e
    if not isinstance(doc, dict):
        raise KubeError(action, f"not a JSON object: {out[:200]!r}")
    return doc


def as_dict(v: object) -> dict:
    """``v`` when it is an object, else an empty one.

    >>> as_dict({"a": 1}), as_dict("x"), as_dict(None)
    ({'a': 1}, {}, {})
    """
    return v if isinstance(v, dict) else {}


def as_list(v: object) -> list:
    """``v`` when it is a list, else an empty one."""
    return v if isinstance(v, list) else []


def as_str(v: object) -> str | None:
    """``v`` when it is a string, else None."""
    return v if isinstance(v, str) else None


def as_count(v: object) -> int:
    """A count from the API (``restartCount``): a non-negative integer, else 0 (a float, a string or a bool
    is not one).

    >>> as_count(5), as_count("5"), as_count(True), as_count(-1), as_count(10 ** 30)
    (5, 0, 0, 0, 0)
    """
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 53 else 0
