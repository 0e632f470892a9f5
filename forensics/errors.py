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
    "ForensicsError",
    "InputNotFound",
    "NotACoreFile",
    "UnsupportedTarget",
    "CoreReadError",
    "GdbNotFound",
    "GdbError",
    "GdbTimeout",
    "OutputExists",
]

EXIT_OK = 0
EXIT_ERROR = 1  # a ForensicsError: the command could not do its job
EXIT_USAGE = 2  # click's usage errors
EXIT_FINDINGS = 3  # the command ran and found problems (failed checks, failed cores in a batch)
EXIT_PARTIAL = 4  # the command ran but its result is incomplete (no gdb, no CPython symbols, truncated core)


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
    help_text = "Check the path; a core written by the kernel is named by kernel.core_pattern."

    def __init__(self, path: str) -> None:
        super().__init__(f"{path}: no such file or directory", path=path)


class NotACoreFile(ForensicsError, ValueError):
    """The input exists but is not an ELF core file; ``what`` says what it is instead."""

    help_text = "Pass the core file itself (ELF type CORE), e.g. the 'core' or 'core.<pid>' the kernel wrote."

    def __init__(self, path: str, what: str, hint: str = "") -> None:
        msg = f"{path}: not a core file: {what}"
        if hint:
            msg += f"; {hint}"
        super().__init__(msg, path=path, what=what)


class UnsupportedTarget(ForensicsError, ValueError):
    help_text = "forensics reads cores of x86-64 Linux processes; analyze this core on a matching tool."

    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"{path}: unsupported core: {what}", path=path, what=what)


class CoreReadError(ForensicsError, OSError):
    help_text = "The core could not be read; it may be damaged beyond the parts forensics can skip."

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: cannot read core: {reason}", path=path, reason=reason)


class GdbNotFound(ForensicsError, FileNotFoundError):
    help_text = "Install gdb (Debian/Ubuntu: apt-get install -y gdb) or pass --gdb PATH."

    def __init__(self, gdb: str) -> None:
        super().__init__(f"gdb not found: {gdb!r} is not an executable on PATH", gdb=gdb)


class GdbError(ForensicsError, RuntimeError):
    help_text = "Re-run with -v to see gdb's output."

    def __init__(self, stage: str, detail: str) -> None:
        super().__init__(f"gdb failed {stage}: {detail}", stage=stage, detail=detail)


class GdbTimeout(GdbError, TimeoutError):
    help_text = "Raise --timeout, or check that the core and binaries are on a local disk."

    def __init__(self, stage: str, seconds: float) -> None:
        ForensicsError.__init__(
            self, f"gdb timed out after {seconds:g}s {stage}", stage=stage, detail="timeout", seconds=seconds
        )


class OutputExists(ForensicsError, FileExistsError):
    help_text = "Choose another --output path, or pass --force to replace it."

    def __init__(self, path: str) -> None:
        super().__init__(f"{path}: already exists (not overwritten)", path=path)
