"""Stacks -> snapshot: the core reader's facts joined with the native and Python stacks into one
:class:`~forensics.model.ProcessSnapshot` (its threads, signal frames, status lines and warnings)."""
from __future__ import annotations

from ..model import (
    CoreFile,
    LibraryStatus,
    NativeFrame,
    NativeStack,
    ProcessSnapshot,
    PythonMethod,
    PythonStacks,
    PythonStatus,
    Source,
)
from ..modes import NativeMethod, StackMethod, UnwoundBy
from .classify import is_python_process
from .sigframe import attach_signal_frames
from .stacks import build_threads, python_status_line

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a start-up cost of every analysis)
if TYPE_CHECKING:
    from .reading import CoreReading

__all__ = ["registers_only", "build_snapshot"]


def registers_only(core: CoreFile,
                   reason: str = "native stack not unwound: program counter only") -> tuple[NativeStack, ...]:
    """Each thread's program counter only, as its native stack (no unwinder ran, or none could)."""
    return tuple(NativeStack(num=i + 1, tid=t.tid, error=reason,
                             frames=(NativeFrame(index=0, pc=t.pc or 0, symbol=None, offset=None, library=None),))
                 for i, t in enumerate(core.threads))


def build_snapshot(core: CoreFile, native: tuple[NativeStack, ...] | None, python: PythonStacks | None, *,
                   sysroot: str | None,
                   native_method: UnwoundBy, python_method: PythonMethod,
                   requested: StackMethod = StackMethod.AUTO,
                   problems: tuple[str, ...] = (), disagreements: tuple[str, ...] = (),
                   requested_native: NativeMethod = NativeMethod.AUTO, native_disagreements: tuple[str, ...] = (),
                   reading: CoreReading | None = None) -> ProcessSnapshot:
    """Join the core reader's facts with the native and Python stacks into one snapshot.

    The Python stacks' status is said once, in ``python_stack_status`` (the ``Stacks:``
    line); ``problems`` are other methods' reasons and unwinders' errors, each one line.

    :param reading: the analysis' open core (None: the core is opened again to find signal frames)
    """
    warnings: list[str] = list(problems)
    threads = build_threads(core, native if native is not None else registers_only(core), python)
    threads = attach_signal_frames(core, threads) if reading is None else \
        attach_signal_frames(core, threads, mem=reading.mem, text=reading.text_trampolines())
    python_process = is_python_process(core) or (python is not None and python.version is not None)
    status = python_status_line(python, python_process=python_process)
    if python is None:
        py_status = PythonStatus.FAILED if python_process else PythonStatus.NOT_PYTHON
    elif not python_process and python.status is not PythonStatus.OK:
        py_status = PythonStatus.NOT_PYTHON
    else:
        py_status = python.status
    if core.truncated and python_process and py_status is not PythonStatus.OK:
        # what is missing is the memory, not the debug symbols: say the cause that applies
        truncated = (f"the core is truncated ({core.size:,} of {core.expected_size:,} bytes were written: core "
                     "size limit or full disk)")
        if py_status is PythonStatus.PARTIAL and python is not None and python.threads:
            status = f"partial: {truncated}; the interpreter's state is read only as far as the core goes"
        else:
            status = f"unavailable: {truncated}; the interpreter's state lies in the part not written"
    for t in threads:
        if t.signal_frames_cut:
            warnings.append(f"thread {t.tid}: {t.signal_frames_cut}")
    for d in disagreements:
        warnings.append(f"methods disagree: {d}")
    for d in native_disagreements:
        warnings.append(f"native unwinders disagree: {d}")
    for p in core.problems:
        warnings.append(f"core: {p}")
    if core.truncated:
        warnings.append(
            f"core is truncated: {core.size} of {core.expected_size} bytes were written "
            "(core size limit or full disk); parts of memory are missing: stacks and glibc's abort message "
            "may lie there (raise the limit: ulimit -c unlimited, or the core handler's --max-core-size)"
        )
    for lib in core.libraries:
        if lib.status is LibraryStatus.MISMATCH:
            warnings.append(
                f"{lib.path}: the file at {lib.file_path} is build {lib.file_build_id}, the core ran build "
                f"{lib.build_id}; it was left out, so its frames are unnamed (pass --sysroot with the original files)"
            )
        elif lib.status is LibraryStatus.MISSING:
            warnings.append(f"{lib.path}: not found{' under the sysroot' if sysroot else ''}; its frames are unnamed")
    return ProcessSnapshot(
        source=Source.CORE,
        core=core,
        threads=threads,
        python_version=python.version if python is not None else None,
        python_status=py_status,
        python_stack_status=status,
        python_layout=python.layout if python is not None else None,
        native_method=native_method,
        python_method=python_method if python else PythonMethod.NONE,
        requested_method=requested,
        method_disagreements=tuple(disagreements),
        sysroot=sysroot,
        warnings=tuple(warnings),
        requested_native_method=requested_native,
        native_disagreements=tuple(native_disagreements),
    )
