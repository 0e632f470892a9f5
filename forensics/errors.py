"""The forensics error hierarchy.

Every error the tool reports on purpose is a :class:`ForensicsError`.  Each
class carries the facts as fields, builds its one-line message in ``__str__``,
says how to fix it in ``help_text`` and names its process exit code.  Third
party errors are translated into these only at the I/O boundary
(``raise ... from e``).
"""
from __future__ import annotations

__all__ = [
    "EXIT_OK",
    "EXIT_ERROR",
    "EXIT_USAGE",
    "EXIT_FINDINGS",
    "EXIT_PARTIAL",
    "EXIT_INTERRUPTED",
    "EXIT_TERMINATED",
    "Terminated",
    "EXIT_BROKEN_PIPE",
    "ForensicsError",
    "InputNotFound",
    "CoreNotFound",
    "InputUnreadable",
    "check_input_exists",
    "NotACoreFile",
    "NoCoreKept",
    "CapturedBeforeCrash",
    "UnsupportedTarget",
    "CoreReadError",
    "CacheUnavailable",
    "GdbNotFound",
    "GdbError",
    "GdbTimeout",
    "UnwinderUnavailable",
    "OutputExists",
    "OutputUnwritable",
    "BuildError",
]

EXIT_OK = 0
EXIT_ERROR = 1  # a ForensicsError: the command could not do its job
EXIT_USAGE = 2  # click's usage errors
EXIT_FINDINGS = 3  # the command ran and found problems (failed checks, failed cores in a batch)
EXIT_PARTIAL = 4  # the command ran but its result is incomplete (no gdb, no CPython symbols, truncated core)
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as shells report it
EXIT_TERMINATED = 143  # SIGTERM (128 + 15): kill, systemd, a pod's deletion
EXIT_BROKEN_PIPE = 141  # the reader of stdout went away (128 + SIGPIPE): `forensics ... | head`


class Terminated(BaseException):
    """SIGTERM, raised in the main thread as KeyboardInterrupt is for SIGINT, so that every ``finally`` runs:
    children killed, temporary roots removed.  Not an Exception: no ``except Exception`` swallows it."""


class ForensicsError(Exception):
    """Root of every error forensics reports to the user."""

    exit_code = EXIT_ERROR
    help_text = ""

    def __init__(self, message: str = "", **fields: object) -> None:
        super().__init__(message)
        self.message = message
        for k, v in fields.items():
            setattr(self, k, v)

    def __str__(self) -> str:
        return self.message


class InputNotFound(ForensicsError, FileNotFoundError):
    help_text = "Check the path (a typo, or a file on another machine or in a container's root)."

    def __init__(self, path: str, hint: str | None = None) -> None:
        super().__init__(f"{path}: no such file or directory", path=path)
        if hint:
            self.help_text = hint


class CoreNotFound(InputNotFound):
    """The core file given to analyze (or report) does not exist."""

    help_text = ("Check the path; a core written by the kernel is named by kernel.core_pattern "
                 "(cat /proc/sys/kernel/core_pattern), or kept by the core handler under its directory.")


class InputUnreadable(ForensicsError, PermissionError):
    """An input exists but this user may not read it (permission denied): not a missing file."""

    help_text = ("Run as a user allowed to read it: root for other users' files; for /proc/PID/root, root with "
                 "ptrace rights over that process (sudo, and a container granting CAP_SYS_PTRACE); or copy the "
                 "files out first (forensics capture --pid PID keeps the process's objects).")

    def __init__(self, path: str, reason: str = "permission denied") -> None:
        super().__init__(f"{path}: {reason}", path=path, reason=reason)


def check_input_exists(path: str, missing: type[InputNotFound] | None = None, hint: str | None = None) -> None:
    """Say why ``path`` cannot be used when it is not there: a directory on the way this user may not search
    is ``permission denied`` (InputUnreadable), not ``no such file``.

    :raises InputUnreadable: when looking it up is refused
    :raises InputNotFound: (or ``missing``) when it does not exist
    """
    import os

    try:
        os.lstat(path)
    except PermissionError:
        raise InputUnreadable(path) from None
    except (OSError, ValueError):
        if missing is not None:
            raise missing(path) from None
        raise InputNotFound(path, hint) from None


class NotACoreFile(ForensicsError, ValueError):
    """The input exists but is not an ELF core file; ``what`` says what it is instead."""

    help_text = "Pass the core file itself (ELF type CORE), e.g. the 'core' or 'core.<pid>' the kernel wrote."

    def __init__(self, path: str, what: str, hint: str = "") -> None:
        msg = f"{path}: not a core file: {what}"
        if hint:
            msg += f"; {hint}"
        super().__init__(msg, path=path, what=what)


class NoCoreKept(ForensicsError, LookupError):
    """A capture bundle whose core was not kept (the core handler recorded the crash's metadata only)."""

    help_text = ("The core handler keeps metadata only when RLIMIT_CORE is below one page, past the crash-loop "
                 "limit or without room; analyze another crash of the same container (forensics analyze DIR "
                 "lists them), or raise the limit that applied.")

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: metadata only (no core kept: {reason})", path=path, reason=reason)


class CapturedBeforeCrash(NoCoreKept):
    """A bundle ``capture --pid`` / ``--pod`` wrote of a live process: evidence taken before any crash, no core."""

    def __init__(self, path: str, core_dir: str | None = None) -> None:
        ForensicsError.__init__(self, f"{path}: a capture of a live process (forensics capture), taken before any "
                                      "crash: it holds no core", path=path, reason="captured before any crash")
        self.help_text = ("Its core comes when the process crashes, where its 40-process/arming.json says (the "
                          "kernel's core_pattern); analyze that core, or the core handler's bundle of the crash"
                          + (f" (forensics analyze {core_dir})" if core_dir else "") + ".")


class UnsupportedTarget(ForensicsError, ValueError):
    help_text = "forensics reads cores of x86-64 Linux processes; analyze this core on a matching tool."

    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"{path}: unsupported core: {what}", path=path, what=what)


class CoreReadError(ForensicsError, OSError):
    help_text = "The core could not be read; it may be damaged beyond the parts forensics can skip."

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: cannot read core: {reason}", path=path, reason=reason)


class CacheUnavailable(ForensicsError, OSError):
    """The forensics cache cannot take what a command must put there (a bundle's decompressed core)."""

    help_text = ("Point FORENSICS_CACHE at a writable directory with room for the decompressed core "
                 "(analysis never writes into the bundle itself).")

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: cannot use the forensics cache: {reason}", path=path, reason=reason)


class GdbNotFound(ForensicsError, FileNotFoundError):
    help_text = "Install gdb (Debian/Ubuntu: apt-get install -y gdb) or pass --gdb PATH."

    def __init__(self, gdb: str) -> None:
        super().__init__(f"gdb not found: {gdb!r} is not an executable on PATH", gdb=gdb)


class GdbError(ForensicsError, RuntimeError):
    help_text = ("gdb's own message is above; forensics analyze --native-method libdw --method direct CORE "
                 "reads the core without gdb.")

    def __init__(self, stage: str, detail: str) -> None:
        super().__init__(f"gdb failed {stage}: {detail}", stage=stage, detail=detail)


class GdbTimeout(GdbError, TimeoutError):
    help_text = "Raise --timeout, or check that the core and binaries are on a local disk."

    def __init__(self, stage: str, seconds: float) -> None:
        ForensicsError.__init__(
            self, f"gdb timed out after {seconds:g}s {stage}", stage=stage, detail="timeout", seconds=seconds
        )


class UnwinderUnavailable(ForensicsError, OSError):
    """The libdw unwinder cannot run here: elfutils' libdw.so.1 (or libelf.so.1) is not installed."""

    help_text = ("Install elfutils' libraries (Debian/Ubuntu: apt-get install -y libdw1), "
                 "or pass --native-method gdb.")

    def __init__(self, detail: str) -> None:
        super().__init__(f"libdw unwinder unavailable: {detail}", detail=detail)


class OutputExists(ForensicsError, FileExistsError):
    """A file the command would write exists; ``option`` names the option that chose where (-o/--output,
    guard's --out, demo's --out)."""

    def __init__(self, path: str, option: str = "--output") -> None:
        super().__init__(f"{path}: already exists (not overwritten)", path=path, option=option)
        self.help_text = f"Choose another {option} path, or pass --force to replace it."


class OutputUnwritable(ForensicsError, OSError):
    """A file the command was asked to write (``-o``) cannot be made there: its directory does not exist
    (forensics creates none for ``-o``), is not a directory, or may not be written; the file is not a
    regular file."""

    def __init__(self, path: str, reason: str, option: str = "--output") -> None:
        super().__init__(f"{path}: cannot write it: {reason}", path=path, reason=reason, option=option)
        self.help_text = (f"Choose another {option} path in a directory that exists and that you may write "
                          f"(forensics creates no directory for it), or {option} - for standard output.")


class BuildError(ForensicsError, RuntimeError):
    """A build step forensics runs itself failed: gcc for the simulated NVML or a
    reproducer, or pip for a cached test stack; ``what`` names the artifact."""

    help_text = "Install gcc (Debian/Ubuntu: apt-get install -y gcc) and check network access to PyPI for stack venvs."

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(f"cannot build {what}: {detail}", what=what, detail=detail)


# -- capture (forensics capture, core-handler, agent) -------------------------------------------


class ProcessGone(ForensicsError, ProcessLookupError):
    help_text = "The process exited (or never existed); check the PID with ps, or capture its core instead."

    def __init__(self, pid: int, detail: str = "") -> None:
        msg = f"process {pid} does not exist" + (f" ({detail})" if detail else "")
        super().__init__(msg, pid=pid, detail=detail)


class ProcessExited(ProcessGone):
    """The process was there when the command began and exited while it was read: what was read of it is
    no verdict on it."""

    help_text = ("It exited (or was restarted) while forensics read it; run the command again on its new PID, or "
                 "analyze the core it left (forensics analyze DIR).")

    def __init__(self, pid: int, during: str) -> None:
        ForensicsError.__init__(self, f"process {pid} exited during {during}", pid=pid, detail=during)


class KernelThread(ForensicsError, ValueError):
    """The PID is a kernel thread (kthreadd, a kworker): no user memory, no core, no Python."""

    help_text = "Give the PID of a user process, e.g. the exporter's: pgrep -f nvitop_exporter."

    def __init__(self, pid: int, comm: str) -> None:
        super().__init__(f"process {pid} ({comm}) is a kernel thread: it has no user memory and writes no core",
                         pid=pid, comm=comm)


class NotRoot(ForensicsError, PermissionError):
    help_text = "Run as root (sudo), or on Kubernetes use forensics capture --pod, which runs a privileged agent."

    def __init__(self, action: str) -> None:
        super().__init__(f"{action} needs root (effective uid {_geteuid()})", action=action)


class UnsafeContainerPath(ForensicsError, PermissionError):
    """A path inside a container's root could not be resolved without leaving that root."""

    help_text = ("A symlink in the container's filesystem points elsewhere; forensics never follows it out of the "
                 "container root.")

    def __init__(self, root: str, path: str, reason: str) -> None:
        super().__init__(f"{path} (in {root}): {reason}", root=root, path=path, reason=reason)


class UnsafeBundle(ForensicsError, ValueError):
    """A capture bundle that would make forensics write outside its own directory."""

    help_text = "Remove the named entry (forensics makes it anew inside the bundle), or unpack the bundle again."

    def __init__(self, bundle: str, reason: str) -> None:
        super().__init__(f"{bundle}: {reason}", bundle=bundle, reason=reason)


class CoreDirectoryError(ForensicsError, OSError):
    help_text = "Choose a --core-dir on a local filesystem with free space, writable by root."

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"core directory {path}: {reason}", path=path, reason=reason)


class KubectlNotFound(ForensicsError, FileNotFoundError):
    help_text = ("Install kubectl (https://kubernetes.io/docs/tasks/tools/) or put it on PATH (capture --pod: "
                 "--kubectl PATH); fleet also reads saved `kubectl get -o json` files (--from, --nodes).")

    def __init__(self, kubectl: str) -> None:
        super().__init__(f"kubectl not found: {kubectl!r} is not an executable on PATH", kubectl=kubectl)


class KubeError(ForensicsError, RuntimeError):
    help_text = ("Check the kubeconfig, context and namespace (kubectl config current-context), "
                 "and that the API server is reachable.")
    action: str  # set by ForensicsError from the fields
    detail: str

    def __init__(self, action: str, detail: str) -> None:
        super().__init__(f"kubectl {action} failed: {detail}", action=action, detail=detail)


class PodNotFound(KubeError, LookupError):
    help_text = "Check the pod name and namespace: kubectl get pods -n NAMESPACE."

    def __init__(self, pod: str, namespace: str) -> None:
        ForensicsError.__init__(self, f"pod {namespace}/{pod} not found", pod=pod, namespace=namespace,
                                action="get pod", detail="not found")


class ContainerNotRunning(ForensicsError, RuntimeError):
    help_text = ("Capture arms a running container; for one that already crashed, read the cores the core handler "
                 "kept (forensics agent manifest).")

    def __init__(self, pod: str, container: str, state: str) -> None:
        super().__init__(f"container {container!r} of pod {pod} is not running ({state})",
                         pod=pod, container=container, state=state)


class NodeUnreachable(ForensicsError, ConnectionError):
    help_text = "The node is not Ready or its kubelet does not answer; check kubectl describe node."

    def __init__(self, node: str, detail: str) -> None:
        super().__init__(f"node {node} unreachable: {detail}", node=node, detail=detail)


class AgentFailed(ForensicsError, RuntimeError):
    help_text = "Check the agent image (--agent-image) and the pod's events; the agent pod was deleted."

    def __init__(self, pod: str, detail: str) -> None:
        super().__init__(f"agent pod {pod} failed: {detail}", pod=pod, detail=detail)


__all__ += [
    "ProcessGone",
    "ProcessExited",
    "KernelThread",
    "NotRoot",
    "UnsafeContainerPath",
    "UnsafeBundle",
    "CoreDirectoryError",
    "KubectlNotFound",
    "KubeError",
    "PodNotFound",
    "ContainerNotRunning",
    "NodeUnreachable",
    "AgentFailed",
]


def _geteuid() -> int:
    import os

    return os.geteuid()


# -- verify-imports (forensics/imports) -----------------------------------------------------------


class ImageRefError(ForensicsError, ValueError):
    """The image reference names nothing readable: no such layout/archive, no such tag, no such platform."""

    help_text = ("Name the image the way skopeo does: oci:DIR[:TAG], docker-archive:FILE.tar, dir:ROOTFS, "
                 "HOST[:PORT]/REPO:TAG or docker://...; pass --platform for multi-platform images.")

    def __init__(self, ref: str, reason: str) -> None:
        super().__init__(f"{ref}: {reason}", ref=ref, reason=reason)


class PlatformNotInIndex(ImageRefError):
    """The reference is an image index (a multi-platform image) without an image of the platform asked for:
    this machine's, or ``--platform``'s.  The platforms it lists are data (``available``)."""

    help_text = ("Pass --platform OS/ARCH with one of the platforms the index lists (the node's, for a check of "
                 "what that node runs), or build and push the image for this platform too.")

    def __init__(self, ref: str, requested: str, source: str, available: tuple[str, ...]) -> None:
        listed = ", ".join(available[:16]) + (f" and {len(available) - 16} more" if len(available) > 16 else "")
        whose = "this machine's platform" if source == "host" else "--platform"
        ImageRefError.__init__(self, ref, f"the image index has no {requested} image ({whose}); it lists "
                                          f"{listed or 'no image platform'}")
        self.requested, self.source, self.available = requested, source, available


class ImageFormatError(ForensicsError, ValueError):
    """A manifest, config or layout file is malformed, or a blob does not match its digest."""

    help_text = "The image is damaged or not an image; re-pull it (skopeo copy) and check it with skopeo inspect."

    def __init__(self, ref: str, what: str, reason: str) -> None:
        super().__init__(f"{ref}: {what}: {reason}", ref=ref, what=what, reason=reason)


class LayerRejected(ForensicsError, ValueError):
    """A layer tries to write outside the root, or breaks a bound; nothing of it was written."""

    help_text = ("The layer is hostile or damaged (a path outside the image root, a link through or to "
                 "outside, a device node, or beyond the size bounds); do not deploy this image.")

    def __init__(self, layer: str, member: str, reason: str) -> None:
        super().__init__(f"layer {layer}: {member!r}: {reason}", layer=layer, member=member, reason=reason)


class LayerLimitExceeded(LayerRejected):
    help_text = ("The image exceeds the bounds set for reading it (--max-size, --max-files, the compression "
                 "ratio bound); raise them only for an image you trust.")


class SkopeoNotFound(ForensicsError, FileNotFoundError):
    help_text = ("Install skopeo (Debian/Ubuntu: apt-get install -y skopeo), or export the image with skopeo/docker "
                 "save and pass oci:DIR or docker-archive:FILE.")

    def __init__(self, ref: str) -> None:
        super().__init__(f"{ref}: reading a registry or daemon image needs skopeo, which is not on PATH", ref=ref)


class SkopeoError(ForensicsError, RuntimeError):
    """skopeo could not fetch an image; ``detail`` is its message, cause first (:func:`forensics.imports.sources`'s
    reading of skopeo's log line), and the hint fits the cause where it is a known one."""

    help_text = ("Check the reference, --creds/--authfile and --tls-verify=false for a plain-HTTP registry "
                 "(skopeo's message, cause first, is above).")

    def __init__(self, ref: str, action: str, detail: str, hint: str = "") -> None:
        super().__init__(f"{ref}: skopeo {action} failed: {detail}", ref=ref, action=action, detail=detail)
        if hint:
            self.help_text = hint


class ExecuteError(ForensicsError, RuntimeError):
    """--execute could not run the image's interpreter (no sandbox tool, the interpreter failed)."""

    help_text = ("--execute needs bubblewrap (apt-get install -y bubblewrap) for images, and root for --pid (it "
                 "enters the process's namespaces with its credentials).")

    def __init__(self, what: str, detail: str, hint: str | None = None) -> None:
        extra = {"help_text": hint} if hint is not None else {}
        super().__init__(f"--execute: {what}: {detail}", what=what, detail=detail, **extra)


__all__ += [
    "ImageRefError",
    "PlatformNotInIndex",
    "ImageFormatError",
    "LayerRejected",
    "LayerLimitExceeded",
    "SkopeoNotFound",
    "SkopeoError",
    "ExecuteError",
]


class LimitNotRaised(ForensicsError, PermissionError):
    help_text = ("Raising a hard limit needs CAP_SYS_RESOURCE: run as real root (not a capability-reduced container), "
                 "or start the process with a non-zero hard RLIMIT_CORE (ulimit -Hc unlimited).")

    def __init__(self, pid: int, hard: str, detail: str) -> None:
        super().__init__(f"process {pid}: RLIMIT_CORE not raised: hard limit {hard}; {detail}", pid=pid, hard=hard,
                         detail=detail)


__all__ += ["LimitNotRaised"]


# -- reading back what another command wrote (forensics.jsonrecords) -------------------------------


class ArtifactFormatError(ForensicsError, ValueError):
    """A JSON document another forensics command writes (``analyze``, ``reproduce``, ``verify-imports``,
    ``fleet`` ``--json``) that is not one this version reads: the wrong or no ``schema_version``, another
    command's document, or a value of the wrong type or form (``where``: its path in the document)."""

    help_text = ("Pass the --json document the command wrote, from a forensics of the same schema version; "
                 "write it again with this version when it came from another.")

    def __init__(self, command: str, reason: str, where: str = "") -> None:
        super().__init__(f"not a `forensics {command} --json` document this version reads: "
                         + (f"{where}: " if where else "") + reason, command=command, reason=reason, where=where)


__all__ += ["ArtifactFormatError"]


class ObjectStoreError(ForensicsError, OSError):
    """An S3-compatible object store could not do what was asked (``forensics upload``, an ``s3://`` input).
    ``url`` is the object's ``s3://bucket/key``; the message never holds a credential."""

    help_text = ("Check the endpoint (AWS_ENDPOINT_URL or --endpoint-url), the region and the bucket; "
                 "nothing on this node was deleted.")
    url: str
    reason: str

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{url}: {reason}", url=url, reason=reason)


class ObjectStoreDenied(ObjectStoreError, PermissionError):
    """The object store refused the credentials, or found none (what the AWS SDKs' chain reads)."""

    help_text = ("Give credentials as the AWS SDKs read them: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY "
                 "(AWS_SESSION_TOKEN), AWS_PROFILE with a config file, or AWS_WEB_IDENTITY_TOKEN_FILE and "
                 "AWS_ROLE_ARN (EKS); nothing on this node was deleted.")


class ObjectStoreUnavailable(ObjectStoreError, ConnectionError):
    """The object store did not answer, or kept failing, through every retry."""


class EndpointUserinfo(ObjectStoreError, ValueError):
    """An S3 endpoint given with a ``user[:password]@`` part: refused, never printed with it."""

    help_text = ("Give the endpoint without credentials, and the credentials the AWS SDKs' way: AWS_ACCESS_KEY_ID / "
                 "AWS_SECRET_ACCESS_KEY, AWS_PROFILE with a credentials file, or a web-identity token file (EKS); "
                 "a credential in a URL shows in the process list and in every message about the endpoint.")

    def __init__(self, given_as: str, endpoint: str) -> None:
        ForensicsError.__init__(self, f"{given_as}: the endpoint {endpoint} was given with a user:password@ part, "
                                      "which is not taken", url=endpoint, reason="userinfo")


class ObjectNotFound(ObjectStoreError, FileNotFoundError):
    help_text = "Check the bucket and key (forensics upload prints the URL of each bundle it uploads)."


class UploadNotVerified(ObjectStoreError, ValueError):
    """An uploaded object's checksum (or size) is not the bundle's: the node's copy is kept."""

    help_text = ("The bundle changed on disk or the object store holds other bytes; the node's copy was kept. "
                 "Check the bundle (forensics report on it lists files that no longer match MANIFEST.json).")


class UploadConflict(UploadNotVerified):
    """The bucket already holds other bytes at the key of a file the core handler captured (the core, the
    evidence): another bundle went to the same key. No retry changes that; the node's copy is kept."""

    help_text = ("Another upload put other bytes at this key; the node's copy was kept. Compare the two (forensics "
                 "analyze on each), remove the object that is wrong, then upload the bundle again.")


__all__ += ["ObjectStoreError", "ObjectStoreDenied", "ObjectStoreUnavailable", "ObjectNotFound",
            "UploadNotVerified", "UploadConflict", "EndpointUserinfo"]


# -- the commands' own input and run errors (each raised by the module named; imported from here) ------


class FleetInputError(ForensicsError, ValueError):
    """``forensics fleet --from/--nodes``: a document that holds no pods, or nodes where pods were expected
    (:mod:`forensics.fleet`)."""

    help_text = "Pass `kubectl get pods -o json` with --from and `kubectl get nodes -o json` with --nodes."

    def __init__(self, message: str, *, help_text: str | None = None) -> None:
        super().__init__(message)
        if help_text:
            self.help_text = help_text


class SelectorError(ForensicsError, ValueError):
    """A ``-l`` selector that Prometheus cannot be asked exactly (a usage error: exit 2;
    :mod:`forensics.fleet.prom`)."""

    exit_code = EXIT_USAGE
    help_text = ("With --prometheus, -l takes key=value, key!=value, key in (a,b), key notin (a,b), key and !key, "
                 "with non-empty values, over pod labels kube-state-metrics exports (kube_pod_labels).")
    selector: str  # set by ForensicsError from the fields
    detail: str

    def __init__(self, selector: str, detail: str) -> None:
        super().__init__(f"-l {selector[:200]!r}: {detail}", selector=selector, detail=detail)


class PrometheusError(ForensicsError, RuntimeError):
    """Prometheus could not answer, or answered what no Prometheus would (:mod:`forensics.fleet.prom`)."""

    help_text = ("Check the Prometheus URL, its authentication (--bearer-token-file, --basic-auth, --ca-file), "
                 "and that it scrapes kube-state-metrics.")
    what: str
    detail: str

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(f"prometheus: {what}: {detail}", what=what, detail=detail)


class GuardError(ForensicsError, ValueError):
    """``forensics guard``: a target, value or variable it cannot guard (:mod:`forensics.guard`)."""

    help_text = ("Example: forensics guard --target nvitop.api.device:Device.nvlink_throughput --returns '[]' "
                 "--env FORENSICS_GUARD_NVLINK --out SITE_PACKAGES")
    what: str

    def __init__(self, what: str, hint: str | None = None) -> None:
        super().__init__(f"bad guard: {what}", what=what)
        if hint:
            self.help_text = hint


class CanaryError(ForensicsError, ValueError):
    """``forensics canary``: an endpoint or threshold it cannot use (:mod:`forensics.canary`)."""

    help_text = ("The URL must be http:// or https://HOST:PORT/PATH; for https give the server's CA with --ca-file "
                 "(or --insecure-skip-verify), a token with --bearer-token-file.")
    what: str

    def __init__(self, what: str) -> None:
        super().__init__(f"canary: {what}", what=what)


class DemoError(ForensicsError, RuntimeError):
    """``forensics demo``: the step that failed (:mod:`forensics.demo`)."""

    help_text = ("The exporter's log is exporter/exporter.log in the demo directory; the timeline says which step "
                 "failed.")
    step: str
    detail: str

    def __init__(self, step: str, detail: str) -> None:
        super().__init__(f"demo failed at '{step}': {detail}", step=step, detail=detail)


class ReproducerNotStarted(ForensicsError, RuntimeError):
    """A reproducer did not get to make its queries: no evidence about the driver or the binding
    (:mod:`forensics.reproduce`)."""

    help_text = ("Point the reproducers at the driver's library with --nvml FILE (e.g. "
                 "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.<driver>, or the directory holding "
                 "libnvidia-ml.so.1), or use --sim for the simulated NVML.")
    runs: list[str]

    def __init__(self, runs: list[str]) -> None:
        super().__init__("no conclusion: " + "; ".join(runs), runs=runs)


class NvmlLibraryNotFound(InputNotFound):
    """``forensics reproduce --nvml``: no such library or directory (:mod:`forensics.reproduce`)."""

    help_text = ("--nvml takes the driver's libnvidia-ml.so.<driver> (on Debian/Ubuntu under "
                 "/usr/lib/x86_64-linux-gnu/, in a container where the NVIDIA toolkit mounts it) or its directory; "
                 "--sim runs on the simulated NVML.")


class StartupFailed(ExecuteError):
    """The image's interpreter ran and died before the probe's first line: the container would too
    (:mod:`forensics.imports.execute`)."""

    returncode: int
    stderr_tail: str
    command: list[str]  # the sandbox's command line, set by whoever ran it

    def __init__(self, detail: str, returncode: int) -> None:
        super().__init__("the image's interpreter", f"failed at start-up (exit status {returncode}): {detail}",
                         hint="The image's own interpreter fails before running any code (its message is above); "
                              "the container's command fails the same way. Fix the image; the static verdicts "
                              "say what it would import once it starts.")
        self.returncode = returncode
        self.stderr_tail = detail
        self.command = []


__all__ += ["FleetInputError", "SelectorError", "PrometheusError", "GuardError", "CanaryError", "DemoError",
            "ReproducerNotStarted", "NvmlLibraryNotFound", "StartupFailed"]


class ReportInputError(ForensicsError, ValueError):
    """A file given to ``forensics report`` that is no evidence it reads, or whose values have the wrong type or form
    (:mod:`forensics.report.evidence`)."""

    help_text = ("Pass JSON written by `forensics analyze|verify-imports|reproduce|fleet --json`, "
                 "or a capture bundle directory.")
    path: str  # set by ForensicsError from the fields
    reason: str

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: not report evidence: {reason}", path=path, reason=reason)


class IssueFormError(ForensicsError, ValueError):
    """``forensics report --form``: the file is no GitHub issue form (:mod:`forensics.report.form`)."""

    help_text = ("Pass a GitHub issue form (YAML with a 'body' list), e.g. nvitop's "
                 ".github/ISSUE_TEMPLATE/bug-report.yaml.")
    path: str  # set by ForensicsError from the fields
    reason: str

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: not a GitHub issue form: {reason}", path=path, reason=reason)


__all__ += ["ReportInputError", "IssueFormError"]


class SandboxUnavailable(ForensicsError, RuntimeError):
    """``analyze --sandbox`` could not make its sandbox (no bubblewrap, no user namespace, no libseccomp)."""

    help_text = ("analyze --sandbox needs bubblewrap (apt-get install -y bubblewrap), user namespaces (a container's "
                 "default seccomp profile refuses them: run it on the host) and libseccomp2; or analyze without "
                 "--sandbox, as a user who owns nothing else of value.")

    def __init__(self, detail: str) -> None:
        super().__init__(f"--sandbox: {detail}", detail=detail)


__all__ += ["SandboxUnavailable"]
