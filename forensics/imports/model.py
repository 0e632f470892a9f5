"""Records of ``verify-imports``: image references, manifests, the Python set-up, verdicts.

Every record is frozen; derived facts are properties.  This module imports only
forensics' own records (:class:`~forensics.model.Severity`), so every other module of the
subpackage can import it.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..model import Severity

__all__ = [
    "Transport",
    "ManifestKind",
    "Verdict",
    "PathOrigin",
    "EditableFinder",
    "ModuleKind",
    "ImageRef",
    "Platform",
    "PlatformSource",
    "PlatformChoice",
    "ImageConfig",
    "ImageInfo",
    "Entrypoint",
    "PathEntry",
    "PthFile",
    "CustomizeFile",
    "PythonSetup",
    "Distribution",
    "Resolution",
    "ModuleCheck",
    "RequirementProblem",
    "KnownIssueHit",
    "ExecutedModule",
    "ExecuteResult",
    "Guard",
    "FindingKind",
    "ReportFinding",
    "HiddenCopy",
    "ImportReport",
]


class Transport(enum.Enum):
    """How an image (or a process) is reached; named the way skopeo names its transports."""

    OCI = "oci"  # an OCI image layout directory, read directly
    DOCKER_ARCHIVE = "docker-archive"  # `docker save` output, read directly
    DIR = "dir"  # an unpacked root file system (or a skopeo `dir:` copy, detected)
    DOCKER = "docker"  # a registry reference, fetched by skopeo
    DOCKER_DAEMON = "docker-daemon"  # fetched by skopeo
    CONTAINERS_STORAGE = "containers-storage"  # fetched by skopeo
    PID = "pid"  # a live process through /proc/PID


class ManifestKind(enum.Enum):
    """What the reference points at, before platform resolution."""

    DOCKER_V2 = "docker-schema2-manifest"
    DOCKER_MANIFEST_LIST = "docker-manifest-list"
    OCI_MANIFEST = "oci-manifest"
    OCI_INDEX = "oci-index"
    OCI_INDEX_WITH_ATTESTATIONS = "oci-index-with-attestations"
    DOCKER_ARCHIVE = "docker-archive"  # docker save's manifest.json (no registry manifest involved)
    RUNTIME_BUNDLE = "oci-runtime-bundle"  # an unpacked root beside the config.json an unpacker wrote (umoci)
    NONE = "none"  # an unpacked root or a process: no manifest at all


class Verdict(enum.Enum):
    OK = "OK"
    SHADOWED = "SHADOWED"
    UNMANAGED = "UNMANAGED"
    MISSING = "MISSING"
    VERSION_MISMATCH = "VERSION-MISMATCH"
    CONFLICT = "CONFLICT"  # two distributions install the same top-level module in one directory


class PathOrigin(enum.Enum):
    """Why an entry is on sys.path."""

    WORKDIR = "working-directory"  # sys.path[0] for -m, -c, the REPL
    SCRIPT_DIR = "script-directory"  # sys.path[0] for `python script.py`
    PYTHONPATH = "PYTHONPATH"
    STDLIB = "stdlib"
    SITE = "site-packages"
    USER_SITE = "user-site-packages"
    PTH = "pth"  # a path line of a .pth file
    PTH_IMPORT = "pth-import"  # added by an `import` line of a .pth file (evaluated statically)
    SITECUSTOMIZE = "sitecustomize"  # a literal sys.path edit in sitecustomize.py / usercustomize.py (read, never run)
    EDITABLE = "editable-finder"  # not on sys.path: an editable install's finder on sys.meta_path maps it


class ModuleKind(enum.Enum):
    PACKAGE = "package"
    MODULE = "module"
    EXTENSION = "extension"
    BYTECODE = "bytecode"
    NAMESPACE = "namespace"


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageRef:
    """A parsed image reference: ``oci:DIR[:TAG]``, ``docker-archive:FILE[:REF]``, ``dir:ROOT``, ``HOST/REPO:TAG``."""

    transport: Transport
    path: str  # the directory / file for local transports, the reference for the others
    tag: str | None = None

    def __str__(self) -> str:
        return f"{self.transport.value}:{self.path}" + (f":{self.tag}" if self.tag else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class Platform:
    os: str = "linux"
    architecture: str = "amd64"
    variant: str | None = None

    def __str__(self) -> str:
        return f"{self.os}/{self.architecture}" + (f"/{self.variant}" if self.variant else "")


class PlatformSource(enum.Enum):
    """Who named the platform read from an image index."""

    HOST = "host"  # this machine's (the default: the node verify-imports runs on)
    OPTION = "option"  # --platform


@dataclass(frozen=True, slots=True, kw_only=True)
class PlatformChoice:
    """The image an index (OCI image index, Docker manifest list) led to, and why that one."""

    requested: str  # "linux/arm64": what was asked for
    source: PlatformSource
    chosen: str  # the platform of the index's entry that was read ("linux/arm64/v8" for a "linux/arm64" request)
    digest: str  # that entry's manifest digest
    available: tuple[str, ...] = ()  # every image platform the index lists (attestations left out)


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageConfig:
    """The parts of the image config (or a process's state) that decide what Python imports."""

    working_dir: str = "/"
    env: tuple[tuple[str, str], ...] = ()
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    user: str = ""

    def getenv(self, name: str) -> str | None:
        for k, v in self.env:
            if k == name:
                return v
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageInfo:
    """Where the image came from and what kind of manifest delivered it."""

    ref: str
    transport: Transport
    manifest_kind: ManifestKind
    manifest_digest: str | None = None  # the platform manifest that was read
    platform: str | None = None
    layers: int = 0
    index_platforms: tuple[str, ...] = ()  # platforms listed by an index
    attestations: int = 0  # attestation manifests in the index
    warnings: tuple[str, ...] = ()
    config_source: str | None = None  # a dir: root's config: the runtime bundle's config.json it was read from
    root: str | None = None  # --pid: the process's root as the host sees it, when it is not /
    platform_choice: PlatformChoice | None = None  # the reference is an index: which of its images was read

    @property
    def has_config(self) -> bool:
        """Whether an image config (or a process's own state) says how the container runs."""
        return not (self.transport is Transport.DIR and self.manifest_kind is ManifestKind.NONE)


@dataclass(frozen=True, slots=True, kw_only=True)
class Entrypoint:
    """The Python command line the image runs, as CPython will see it."""

    argv: tuple[str, ...]  # the full command line (Entrypoint + Cmd, or --entrypoint, or /proc/PID/cmdline)
    interpreter: str | None  # the interpreter path inside the root (after PATH and shebang lookup)
    interpreter_real: str | None  # the same with symlinks resolved inside the root
    version: str | None  # "3.11"
    mode: str  # "module", "script", "command", "interactive", "not-python"
    target: str | None  # the module for -m, the script path, the -c code
    flags: tuple[str, ...] = ()  # interpreter options seen (-I, -P, -E, -s, -S, -B, ...)
    via_shebang: str | None = None  # the script whose #! line named the interpreter
    exec_error: str | None = None  # the runtime cannot start the command (not found: exit 127); verdicts then
    # assume `python3 -c`


@dataclass(frozen=True, slots=True, kw_only=True)
class PathEntry:
    path: str
    origin: PathOrigin
    exists: bool
    note: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class PthFile:
    path: str
    paths: tuple[str, ...] = ()  # directories its path lines added
    imports: tuple[str, ...] = ()  # its `import` lines, executed by site at start-up
    unevaluated: tuple[str, ...] = ()  # import lines whose effect on sys.path could not be decided statically


@dataclass(frozen=True, slots=True, kw_only=True)
class CustomizeFile:
    """``sitecustomize`` / ``usercustomize`` as site imports it at start-up, read statically (never run)."""

    module: str  # "sitecustomize" or "usercustomize"
    path: str  # the file that imports (Debian: /usr/lib/python3.X/sitecustomize.py -> /etc/python3.X/...)
    edits: tuple[str, ...] = ()  # sys.path edits applied ("line 3: sys.path.insert(0, '/opt/x')")
    unevaluated: tuple[str, ...] = ()  # statements that may change sys.path, not evaluated
    stopped: str | None = None  # the module stops early at start-up (an import that fails, an exception)


@dataclass(frozen=True, slots=True, kw_only=True)
class EditableFinder:
    """A finder an editable install's .pth ``import`` line appends to ``sys.meta_path``."""

    style: str  # "setuptools" (MAPPING name -> source dir or module stem) or "editables" (name -> file)
    pth: str  # the .pth file whose import line installs it
    module_file: str  # the finder module, in the site directory
    mapping: tuple[tuple[str, str], ...]  # top-level name -> where it is taken from
    path_placeholder: str | None = None  # setuptools appends this to sys.path when it maps namespaces


@dataclass(frozen=True, slots=True, kw_only=True)
class PythonSetup:
    """sys.path and everything that went into it."""

    entrypoint: Entrypoint
    prefix: str | None
    working_dir: str
    safe_path: bool  # no sys.path[0] (PYTHONSAFEPATH on 3.11+, -P, -I)
    sys_path: tuple[PathEntry, ...]
    pth_files: tuple[PthFile, ...] = ()
    notes: tuple[str, ...] = ()
    finders: tuple[EditableFinder, ...] = ()  # editable installs' meta-path finders, in sys.meta_path order
    site_layout: str = "upstream"  # the interpreter's site.py: "upstream" (site-packages) or "debian" (dist-packages)
    customize: tuple[CustomizeFile, ...] = ()
    findings: tuple[ReportFinding, ...] = ()  # start-up problems: a .pth site cannot read, unevaluated edits


@dataclass(frozen=True, slots=True, kw_only=True)
class Distribution:
    """An installed distribution (dist-info / egg-info) found on sys.path, or a Debian package's files."""

    name: str
    version: str
    metadata_dir: str
    location: str  # the sys.path entry holding it
    top_level: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()  # Requires-Dist lines
    installer: str | None = None
    editable: str | None = None  # an editable install: its source directory (direct_url.json)
    package: str | None = None  # the Debian package whose files these are (dpkg's file list), e.g. python3-psutil
    package_version: str | None = None  # that package's version (5.9.4-1+b1)

    @property
    def manager(self) -> str:
        """Who installed it: dpkg (apt), or the INSTALLER the metadata names (pip, uv), or unknown."""
        return "dpkg" if self.package else (self.installer or "unknown")

    @property
    def label(self) -> str:
        """``nvitop 1.7.1``, or ``psutil 5.9.4 (Debian package python3-psutil 5.9.4-1+b1)``."""
        text = f"{self.name} {self.version}"
        return text + (f" (Debian package {self.package} {self.package_version})" if self.package else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class Resolution:
    """Where one module resolves on one sys.path entry (or overall)."""

    module: str
    kind: ModuleKind
    file: str | None  # None for a namespace package
    path_entry: str
    path_index: int
    search_locations: tuple[str, ...] = ()  # a package's / namespace package's directories
    finder: str | None = None  # found by an editable install's finder: the .pth that installs it


@dataclass(frozen=True, slots=True, kw_only=True)
class HiddenCopy:
    """Another copy of a module further down sys.path that the winner hides (an apt copy under pip's)."""

    file: str | None
    path_entry: str
    distribution: Distribution | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ModuleCheck:
    """The verdict on one module."""

    module: str
    verdict: Verdict
    resolved: Resolution | None
    origin: PathOrigin | None = None  # why the winning sys.path entry is there
    static_version: str | None = None  # __version__ read with ast, never imported
    distribution: Distribution | None = None  # the distribution that installed the resolved file
    installed_file: bool = False  # the resolved file is in that distribution's RECORD
    record_hash_ok: bool | None = None  # its sha256 matches the RECORD (None: no hash to compare)
    expected: Resolution | None = None  # what a managed install would have given (for SHADOWED)
    expected_distribution: Distribution | None = None
    expected_version: str | None = None
    loaded_file: str | None = None  # --pid: the file /proc/PID/maps shows loaded (extension modules)
    role: str = "default"  # why it is checked: default, requested (--module), entrypoint, loaded (--pid maps)
    reason: str = ""
    fix: str = ""
    hidden: tuple[HiddenCopy, ...] = ()  # managed copies further down sys.path that the winner hides
    owners: tuple[Distribution, ...] = ()  # CONFLICT: every distribution installing this name in the winner's directory

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.OK

    @property
    def fails(self) -> bool:
        """Not OK, and it matters: the application's own unpackaged code (the entrypoint's modules, or
        extension modules found loaded) may be UNMANAGED without failing the check."""
        if self.verdict is Verdict.OK:
            return False
        return not (self.role in ("entrypoint", "loaded") and self.verdict is Verdict.UNMANAGED)

    @property
    def effective_version(self) -> str | None:
        """The version that runs: the module's own ``__version__``, else its distribution's."""
        if self.static_version:
            return self.static_version
        return self.distribution.version if self.distribution else None


@dataclass(frozen=True, slots=True, kw_only=True)
class RequirementProblem:
    """A declared requirement that the installed (or the effectively imported) versions break."""

    dist: str
    dist_version: str
    requirement: str
    found: str | None  # "nvidia-ml-py 12.575.51", or None when not installed
    effective: bool = False  # judged against the version that imports, not the one installed
    message: str = ""  # pip check's words (effective ones: what pip check cannot see)
    note: str = ""  # when other code imports than pip recorded: which, and whether it satisfies the requirement


@dataclass(frozen=True, slots=True, kw_only=True)
class KnownIssueHit:
    id: str
    severity: Severity
    summary: str
    detail: str
    fix: str
    sources: tuple[str, ...]
    matched: tuple[str, ...]  # the facts it matched: "nvitop 1.5.0", "driver 580.126.09"


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutedModule:
    module: str
    file: str | None
    version: str | None
    error: str | None = None  # the import raised (or finding it did): the image cannot import it, whatever file it is
    agrees: bool = True
    static_file: str | None = None
    static_version: str | None = None
    missing: str | None = None  # what the failed import could not find: a shared object (libpthread.so.0)
    provided_by: str | None = None  # the image's package database on it: "libc6 lists /lib/.../libpthread.so.0 ..."

    @property
    def import_fails(self) -> bool:
        """The image's own interpreter could not import it: NOT OK, whatever file it resolves to."""
        return self.error is not None

    @property
    def failure(self) -> str:
        """Why it cannot be imported, in a few words: the missing file (and its package) where known."""
        if self.missing:
            return f"{self.module} cannot be imported: {self.missing} missing" + (
                f" ({self.provided_by})" if self.provided_by else "")
        return f"{self.module} cannot be imported: {self.error}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecuteResult:
    """Ground truth: what the image's own interpreter imported, run as the runtime would."""

    method: str  # "bubblewrap", "nsenter"
    command: tuple[str, ...]
    sys_path: tuple[str, ...]
    modules: tuple[ExecutedModule, ...]
    sys_path_agrees: bool = True
    notes: tuple[str, ...] = ()
    startup_error: str | None = None  # the interpreter died before running the probe (its last stderr lines)
    difference: str | None = None  # when it disagrees: which sys.path entry made the difference, and what put it there

    @property
    def agrees(self) -> bool:
        return self.sys_path_agrees and all(m.agrees for m in self.modules)


@dataclass(frozen=True, slots=True, kw_only=True)
class Guard:
    """A ``forensics guard`` found installed: a .pth import line loading a module with a FORENSICS_GUARD dict."""

    pth: str
    file: str
    target: str  # module:attr it replaces
    env: str  # the switch that turns it off
    returns: str  # the JSON value the replacement returns
    active: bool = True  # False when the run environment sets the switch to 0/false/off/no


class FindingKind(enum.Enum):
    """What is wrong with the image as a whole, before any module is judged."""

    ENTRYPOINT_NOT_FOUND = "entrypoint-not-found"  # the runtime cannot start the command: exit 127
    NO_INTERPRETER = "no-interpreter"  # nothing can be judged
    NO_CONFIG = "no-config"  # an unpacked root without its image config: the verdict depends on the command
    USER_NOT_FOUND = "user-not-found"  # the runtime refuses a User that /etc/passwd does not list
    STARTUP_FAILS = "startup-fails"  # the interpreter dies in site before running anything (a non-UTF-8 .pth)
    UNCERTAIN = "uncertain"  # start-up code whose effect on sys.path was not evaluated statically


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportFinding:
    kind: FindingKind
    summary: str
    fix: str = ""
    source: str | None = None  # the file or field it comes from

    @property
    def fails(self) -> bool:
        """An uncertainty is not a failure once --execute has given the ground truth (see ImportReport)."""
        return self.kind is not FindingKind.UNCERTAIN


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportReport:
    image: ImageInfo
    config: ImageConfig
    python: PythonSetup | None
    modules: tuple[ModuleCheck, ...]
    distributions: tuple[Distribution, ...] = ()
    requirement_problems: tuple[RequirementProblem, ...] = ()
    known_issues: tuple[KnownIssueHit, ...] = ()
    driver: str | None = None
    execute: ExecuteResult | None = None
    guards: tuple[Guard, ...] = ()
    warnings: tuple[str, ...] = field(default_factory=tuple)  # findings about delivery (attestations, platform)
    findings: tuple[ReportFinding, ...] = ()  # the image as a whole: first in the output
    notes: tuple[str, ...] = ()  # facts that change no verdict (setuid bits dropped, device nodes skipped)

    def failures(self, *, strict: bool = False) -> tuple[str, ...]:
        """Why the result is not OK, shortest first; empty when it is.  One definition for the
        exit status and the last line of the text output.

        Fails: a finding about the image, a module not OK, a module the image's own interpreter cannot import
        (--execute), --execute disagreeing, a known issue of
        severity error, an uncertain static verdict that --execute did not settle; with ``strict``
        also requirement conflicts, any known issue and delivery warnings.
        """
        out = [f.summary for f in self.findings if f.fails]
        out += [f"{m.module} {m.verdict.value}" for m in self.modules if m.fails]
        if self.execute is not None:
            out += [m.failure for m in self.execute.modules if m.import_fails]
            if not self.execute.agrees:
                out.append("--execute disagrees")
        if self.execute is None or not self.execute.agrees:
            out += [f"uncertain: {f.summary}" for f in self.findings if not f.fails]
        errors = [k for k in self.known_issues if k.severity is Severity.ERROR]
        out += [f"known issue {k.id} (error)" for k in errors]
        if strict:
            if self.requirement_problems:
                out.append(f"--strict: {len(self.requirement_problems)} requirement conflict(s)")
            if len(self.known_issues) > len(errors):
                out.append(f"--strict: {len(self.known_issues) - len(errors)} known issue(s)")
            if self.warnings:
                out.append(f"--strict: {len(self.warnings)} warning(s)")
        return tuple(out)

    @property
    def ok(self) -> bool:
        """Nothing fails (see :meth:`failures`): every module OK, no finding, --execute agrees when it ran."""
        return not self.failures()
