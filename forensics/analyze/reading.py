"""One analysis' open core, :class:`CoreReading`: the core's record and memory, and what more than one reader
asks of it (the interpreter, the sigreturn trampolines), found once."""
from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a start-up cost of every analysis)
if TYPE_CHECKING:
    from ..core.memory import CoreMemory
    from ..model import CoreFile, PythonStacks
    from ..pyread import Interpreter

__all__ = ["CoreReading"]


class CoreReading:
    """One analysis' open core: its record, its memory (open while the analysis runs) and what more than one
    reader needs from it, computed once on first ask -- the interpreter (:func:`forensics.pyread.find_interpreter`:
    the walker, the crashing thread's locals and the heap's owner search read with it) and the sigreturn
    trampolines in the C library's text (the snapshot and the unwinding of handler threads ask)."""

    def __init__(self, core: CoreFile, mem: CoreMemory, sysroot: str | None) -> None:
        self.core = core
        self.mem = mem
        self.sysroot = sysroot
        self._interpreter: Interpreter | PythonStacks | None = None
        self._text: tuple[int, ...] | None = None

    def interpreter(self) -> Interpreter | PythonStacks:
        if self._interpreter is None:
            from ..pyread import find_interpreter

            self._interpreter = find_interpreter(self.core, self.mem, sysroot=self.sysroot)
        return self._interpreter

    def text_trampolines(self) -> tuple[int, ...]:
        if self._text is None:
            from .sigframe import text_trampolines

            self._text = text_trampolines(self.core, self.mem)
        return self._text
