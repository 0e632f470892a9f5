"""Native stacks of a core without gdb: elfutils' libdwfl, called in-process through ctypes.

:func:`unwind_core` returns every thread's native frames as records
(:class:`~forensics.model.NativeStack` of :class:`~forensics.model.NativeFrame`), the
records gdb's ``forensics-native`` output is parsed into (:mod:`forensics.gdb`), so the
two methods are interchangeable thread by thread.

Which files libdwfl reads is decided here, never by libdwfl: each object the
core maps is reported at the address the core maps it, and when libdwfl asks for
its ELF file the answer is the file the core reader found and build-id checked
(``--sysroot``, a bundle's objects, this machine on an equal build-id); a
library that is missing or of another build gets no file, so its frames stay
unnamed rather than misnamed.  Separate debug files come from
:func:`forensics.core.debugfiles.find_debug_file` (by build-id).  libdwfl's own
lookups (paths read from the core, debuginfod) are never reached: both of its
finder callbacks are ours.

A frame is named as gdb names it: by its DWARF function (inlined functions
become frames of their own that share the physical frame's pc, marked
``inlined``, with no offset), else by its ELF symbol.  The physical frame's
offset is the pc's offset into its ELF symbol (what ``info symbol`` says), given
only when that symbol starts where the DWARF function does: for a DWARF-named
frame, when the pc lies in the function's first address range (its ELF symbol
starts there; a cold part has another).  For a caller frame the lookup address is
``pc - 1`` (the call instruction), as gdb and eu-stack do -- except at qemu-user's AArch64 sigreturn
trampoline (:func:`forensics.core.rtsigframe.is_anonymous_trampoline`), an anonymous page a handler returns
to without a call: its frame is its own, in no object (``pc - 1`` is the end of whatever lies below it).
libdwfl has no CFI for that page, so the unwind stops at its frame and starts again from the registers the
signal frame at its stack pointer saved (the ``rt_sigframe``'s ``uc_mcontext``): the interrupted pc, then
its callers -- gdb's ``<signal handler called>`` and what follows, by the same registers.

Symbolization results are cached per process by (build-id, files the symbols came
from, address relative to the object), so a batch of cores of one crash loop reads
each library's DWARF once.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import stat
import threading
from collections import OrderedDict
from ctypes import byref, c_bool, c_int, c_size_t, c_uint64, c_void_p

from .. import rootpath
from ..core.arch import spec_of
from ..core.debugfiles import find_debug_file
from ..core.memory import CoreMemory
from ..core.rtsigframe import is_anonymous_trampoline, read_saved_registers
from ..core.symtab import file_identity
from ..errors import UnwinderUnavailable
from ..model import Arch, CoreFile, FrameRegisters, Library, LibraryStatus, NativeFrame, NativeStack
from ..modes import Unwinder
from . import libdw as L
from .coreattach import CoreState
from .debugcache import decompressed_debug_file

__all__ = ["MAX_FRAMES", "MAX_THREADS", "unwind_core", "clear_symbol_cache"]

MAX_FRAMES = 512  # per thread, physical frames; a stack that loops (a frame of the same pc and stack
# pointer as an earlier one) is cut where it starts again
MAX_THREADS = 4096
MAX_RESUMES = 16  # signal frames of one thread an unwind goes on below (qemu-user's trampoline, no CFI)
_MAX_SYMBOL_CACHE = 1 << 16
_USABLE = (LibraryStatus.OK, LibraryStatus.UNVERIFIED)
_FUNCTION_TAGS = (L.DW_TAG_subprogram, L.DW_TAG_inlined_subroutine, L.DW_TAG_entry_point)
_CODE_TAGS = _FUNCTION_TAGS + (L.DW_TAG_lexical_block,)
_MAX_DEPTH = 256  # nesting of scopes walked
_MAX_VDSO = 1 << 20
_MAX_ROWS_AT_ONE_ADDRESS = 64  # line-table rows of one address searched for a statement

# (build-id and the files read, address relative to the object's base, is activation) -> frame templates
_symbols: OrderedDict[tuple, tuple[dict, ...]] = OrderedDict()
_symbols_lock = threading.Lock()


def clear_symbol_cache() -> None:
    """Forget every cached symbolization (tests; a long-lived process that swaps files)."""
    with _symbols_lock:
        _symbols.clear()


def _open_regular(path: str, sysroot: str | None) -> int | None:
    """A read-only descriptor of the regular file at ``path``, or None.

    A file inside ``sysroot`` is opened by the one resolver (:func:`forensics.rootpath.open_in_root`:
    one component at a time on descriptors, never out of the root); a file of this machine
    non-blocking (a FIFO put where a library was expected cannot hang us).  Either is checked
    regular after opening: what is opened is what is checked.
    """
    try:
        root = os.path.abspath(sysroot).rstrip("/") if sysroot else None
        if root and path.startswith(root + "/"):
            fd = rootpath.open_in_root(root, path[len(root):], os.O_RDONLY | os.O_NONBLOCK)
        else:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


class _Unwinder:
    """One core's libdwfl session: modules, callbacks, threads.  Not reusable."""

    def __init__(self, lib: L.Lib, core: CoreFile, sysroot: str | None) -> None:
        self.lib = lib
        self.core = core
        self.sysroot = sysroot
        self.dwarf_sp = spec_of(core.arch).dwarf_sp  # the stack pointer's DWARF number on the core's machine
        self.dwarf_names = spec_of(core.arch).dwarf_registers  # the registers' names by DWARF number
        self.callee_saved = spec_of(core.arch).callee_saved
        self.crashed_tid = core.crashed_tid  # the thread whose frames' registers are kept
        self.modules: dict[int, Library] = {}  # Dwfl_Module* -> the library it stands for
        self.given: set[int] = set()  # the modules whose file libdwfl was given
        self._keys: dict[int, tuple] = {}
        self.debug_files: dict[int, str | None] = {}  # Dwfl_Module* -> debug file handed to libdwfl
        self.mem: CoreMemory | None = None  # the core's memory while run() unwinds
        self._sigtramps: dict[int, bool] = {}  # pc -> whether it is qemu-user's sigreturn trampoline
        # keep the ctypes callbacks alive as long as libdwfl may call them
        self._find_elf = L.FIND_ELF(self._on_find_elf)
        self._find_debuginfo = L.FIND_DEBUGINFO(self._on_find_debuginfo)
        self.callbacks = L.DwflCallbacks(self._find_elf, self._find_debuginfo, lib.offline_section_address, None)

    # -- libdwfl's callbacks (never raise: an exception would be lost inside C) --------------

    def _on_find_elf(self, mod, userdata, modname, base, file_name, elfp) -> int:
        try:
            library = self.modules.get(mod or 0)
            if library is None:
                return -1
            if library.path == "[vdso]":
                fd = self._vdso_fd(library)
            elif library.status in _USABLE and library.file_path:
                fd = _open_regular(library.file_path, self.sysroot)
            else:
                return -1  # missing, or another build: withheld, its frames stay unnamed
            if fd is None:
                return -1
            elf = self.lib.elf_begin(fd, L.ELF_C_READ_MMAP, None)
            if not elf:
                os.close(fd)
                return -1
            if library.build_id and self._elf_build_id(elf) not in (None, library.build_id):
                # the file changed between the core reader's check and this open
                self.lib.elf_end(elf)
                os.close(fd)
                return -1
            elfp[0] = elf
            self.given.add(mod)
            return fd
        except Exception:  # noqa: BLE001 - a C callback must return, not raise
            return -1

    def _on_find_debuginfo(self, mod, userdata, modname, base, file_name, debuglink, crc, debug_name) -> int:
        try:
            library = self.modules.get(mod or 0)
            build_id = (library.build_id or library.file_build_id) if library is not None else None
            path = find_debug_file(build_id, self.sysroot, library.path) if library is not None and build_id else None
            if path is None or not build_id:
                self.debug_files[mod] = None
                return -1
            plain = decompressed_debug_file(path, build_id.lower())
            fd = _open_regular(plain, None if plain != path else self.sysroot)
            if fd is None:
                return -1
            # what libdw reads is what was checked: the build-id of the file now open
            elf = self.lib.elf_begin(fd, L.ELF_C_READ_MMAP, None)
            found = self._elf_build_id(elf) if elf else None
            if elf:
                self.lib.elf_end(elf)
            if found != build_id.lower():
                os.close(fd)
                return -1
            self.debug_files[mod] = plain
            return fd
        except Exception:  # noqa: BLE001
            return -1

    def _elf_build_id(self, elf: int) -> str | None:
        ptr = c_void_p()
        n = self.lib.dwelf_elf_gnu_build_id(elf, byref(ptr))
        return ctypes.string_at(ptr.value, n).hex() if n > 0 and ptr.value else None

    def _vdso_fd(self, library: Library) -> int | None:
        """The vDSO as the core holds it (the kernel dumps it whole), in a memory file."""
        from ..core.memory import CoreMemory, MemoryNotInCore

        end = self._module_end(library)
        if not 0 < end - library.base <= _MAX_VDSO:
            return None
        try:
            with CoreMemory.open(self.core.path) as mem:
                data = mem.read(library.base, end - library.base)
        except (MemoryNotInCore, OSError, ValueError):
            return None
        fd = os.memfd_create("forensics-vdso", os.MFD_CLOEXEC)
        os.write(fd, data)
        return fd

    # -- the job --------------------------------------------------------------------------------

    def _module_end(self, library: Library) -> int:
        bases = sorted(lib.base for lib in self.core.libraries)
        later = [b for b in bases if b > library.base]
        limit = later[0] if later else 1 << 64
        ends = [m.end for m in self.core.mappings if m.path == library.path and library.base <= m.start < limit]
        return max(ends, default=library.base)

    def _report(self, dwfl: int) -> None:
        lib = self.lib
        lib.dwfl_report_begin(dwfl)
        for library in sorted(self.core.libraries, key=lambda x: x.base):
            end = self._module_end(library)
            if end <= library.base:
                continue
            mod = lib.dwfl_report_module(dwfl, library.path.encode("utf-8", "surrogateescape"), library.base, end)
            if mod:
                self.modules[mod] = library
        lib.dwfl_report_end(dwfl, None, None)

    def _thread_pcs(self, dwfl: int, thread: int, state: CoreState
                    ) -> tuple[list[tuple[int, bool]], str | None, bool, list[tuple[tuple[str, int], ...]] | None]:
        """The thread's (pc, is activation) list, why it stopped short (None: it reached its outermost
        frame), whether it stopped in an object whose file was withheld (missing, another build), and (the
        crashed thread only, else None) the registers libdwfl recovered in each of those frames.

        At qemu-user's sigreturn trampoline the unwind goes on from the registers its signal frame saved."""
        pcs: list[tuple[int, bool]] = []
        # (pc, stack pointer) -> frame number: a frame equal to an earlier one starts the same frames again
        seen: dict[tuple[int, int], int] = {}
        tid = self.lib.dwfl_thread_tid(thread)
        regs_of: list[tuple[tuple[str, int], ...]] | None = \
            [] if tid == self.crashed_tid and self.lib.dwfl_frame_reg is not None else None
        try:
            for _ in range(MAX_RESUMES + 1):
                error, withheld, tramp_sp = self._unwind_from(dwfl, thread, pcs, seen, regs_of)
                if tramp_sp is None:
                    return pcs, error, withheld, regs_of
                assert self.mem is not None
                regs = read_saved_registers(self.mem, tramp_sp)
                if regs is None:
                    return pcs, (f"unwinding stopped at frame {len(pcs)}, qemu-user's sigreturn trampoline: no "
                                 f"signal frame at its stack pointer {tramp_sp:#x} to go on from"), False, regs_of
                state.resume[tid] = regs
            return pcs, f"stopped after {MAX_RESUMES} signal frames", False, regs_of
        finally:
            state.resume.pop(tid, None)

    def _frame_registers(self, frame) -> tuple[tuple[str, int], ...]:
        """The registers libdwfl knows in ``frame`` (dwfl_frame_reg: all in the innermost frame, the ones the
        callees' CFI restores in a caller), by name."""
        value = c_uint64()
        out = []
        frame_reg = self.lib.dwfl_frame_reg
        assert frame_reg is not None  # only asked for where libdw has it (_thread_pcs)
        for number, name in enumerate(self.dwarf_names):
            if frame_reg(frame, number, byref(value)) == 0:
                out.append((name, value.value))
        return tuple(out)

    def _unwind_from(self, dwfl: int, thread: int, pcs: list[tuple[int, bool]], seen: dict[tuple[int, int], int],
                     regs_of: list[tuple[tuple[str, int], ...]] | None = None) -> tuple[str | None, bool, int | None]:
        """One unwind of the thread (from its registers, or those :attr:`CoreState.resume` holds for it), its
        frames added to ``pcs`` (and, when ``regs_of`` is a list, each frame's registers to it): (why it stopped
        short, whether in a withheld object, and the stack pointer of qemu-user's sigreturn trampoline where it
        stopped there to go on from its signal frame)."""
        lib = self.lib
        loop: list[str] = []
        tramp: list[int] = []

        def on_frame(frame, arg) -> int:
            pc, activation = c_uint64(), c_bool()
            if not lib.dwfl_frame_pc(frame, byref(pc), byref(activation)):
                return -1
            sp = _stack_pointer(lib, frame, self.dwarf_sp)
            if sp is not None:
                earlier = seen.setdefault((pc.value, sp), len(pcs))
                if earlier != len(pcs):
                    loop.append(f"stopped after {len(pcs)} frames: the stack loops (frame #{len(pcs)} repeats "
                                f"frame #{earlier}: pc {pc.value:#x}, stack pointer {sp:#x})")
                    return L.DWARF_CB_ABORT
            pcs.append((pc.value, activation.value))
            if regs_of is not None:
                regs_of.append(self._frame_registers(frame))
            if len(pcs) >= MAX_FRAMES:
                return L.DWARF_CB_ABORT
            if sp is not None and not activation.value and self._at_sigtramp(pc.value):
                tramp.append(sp)  # the handler's CFA: its signal frame; below here libdwfl would guess
                return L.DWARF_CB_ABORT
            return L.DWARF_CB_OK

        callback = L.FRAME_CALLBACK(on_frame)
        rc = lib.dwfl_thread_getframes(thread, callback, None)
        if rc == L.DWARF_CB_ABORT and loop:
            return loop[0], False, None
        if rc == L.DWARF_CB_ABORT and len(pcs) >= MAX_FRAMES:
            return f"stopped after {MAX_FRAMES} frames", False, None
        if rc == L.DWARF_CB_ABORT and tramp:
            return None, False, tramp[0]
        if rc != -1:
            return None, False, None
        return *self._stopped_why(dwfl, pcs), None

    def _stopped_why(self, dwfl: int, pcs: list[tuple[int, bool]]) -> tuple[str, bool]:
        """Why libdwfl's unwind stopped after ``pcs``, and whether in an object whose file was withheld."""
        lib = self.lib
        reason = lib.errmsg()
        if not pcs:
            return f"no frame: {reason}", False
        pc, activation = pcs[-1]
        mod = lib.dwfl_addrmodule(dwfl, pc if activation or not pc else pc - 1)
        library = self.modules.get(mod or 0)
        if library is None:
            return f"unwinding stopped at frame {len(pcs)}, at {pc:#x} outside every mapped object: {reason}", True
        if mod not in self.given:
            if library.status is LibraryStatus.MISMATCH:
                why = "its file is of another build"
            else:
                why = "its file was not found"
            return (f"unwinding stopped at frame {len(pcs)} in {library.name}: {why}, so there is no unwind "
                    f"table to go on (libdwfl: {reason})"), True
        return f"unwinding stopped at frame {len(pcs)} in {library.name}: {reason}", False

    def run(self) -> tuple[NativeStack, ...]:
        lib = self.lib
        fd = os.open(self.core.path, os.O_RDONLY | os.O_CLOEXEC)
        elf = dwfl = None
        stack = contextlib.ExitStack()
        try:
            # the core through pread, never mapped whole: libelf reads the headers, the notes and the few
            # words of stack each frame needs (an address space the size of the core would be the cost otherwise)
            elf = lib.elf_begin(fd, L.ELF_C_READ, None)
            if not elf:
                raise UnwinderUnavailable(f"libelf cannot read {self.core.path}")
            dwfl = lib.dwfl_begin(byref(self.callbacks))
            if not dwfl:
                raise UnwinderUnavailable(f"dwfl_begin: {lib.errmsg()}")
            self._report(dwfl)
            # the threads' registers and memory from our reader (coreattach: linear in the words read)
            mem = self.mem = stack.enter_context(CoreMemory.open(self.core.path))
            state = CoreState(lib, self.core, mem)
            if not state.attach(dwfl, elf):
                raise UnwinderUnavailable(f"cannot read the core's threads: {lib.errmsg()}")
            raw: list[tuple[int, list[tuple[int, bool]], str | None, bool, list | None]] = []

            def on_thread(thread, arg) -> int:
                try:
                    pcs, error, withheld, regs_of = self._thread_pcs(dwfl, thread, state)
                except Exception as e:  # noqa: BLE001 - keep the other threads
                    pcs, error, withheld, regs_of = [], f"unwinding failed: {e}", False, None
                raw.append((lib.dwfl_thread_tid(thread), pcs, error, withheld, regs_of))
                return L.DWARF_CB_ABORT if len(raw) >= MAX_THREADS else L.DWARF_CB_OK

            callback = L.THREAD_CALLBACK(on_thread)
            lib.dwfl_getthreads(dwfl, callback, None)
            threads = []
            # threads stopped at the same pcs (a pool's workers waiting) have the same frames: named and made
            # records once (frozen records, shared), each distinct pc named once
            stacks: dict[tuple, tuple[tuple[NativeFrame, ...], tuple[tuple[int, str, int], ...]]] = {}
            named: dict[tuple[int, bool], list[dict]] = {}
            for num, (tid, pcs, error, withheld, regs_of) in enumerate(raw, 1):
                key = tuple(pcs)
                built = stacks.get(key)
                if built is None:
                    frames: list[dict] = []
                    for pc_activation in pcs:
                        described = named.get(pc_activation)
                        if described is None:
                            described = named[pc_activation] = self._symbolize(dwfl, *pc_activation)
                        frames.extend(described)
                    built = stacks[key] = (_records(frames), _statement_rows(frames))
                # withheld: no file to unwind further with, gdb has none either
                threads.append(NativeStack(num=num, tid=tid, frames=built[0], error=error, method=Unwinder.LIBDW,
                                           stopped_in_withheld=withheld, statement_rows=built[1],
                                           frame_registers=_frame_registers(pcs, regs_of, named, self.dwarf_names,
                                                                            self.callee_saved, self.dwarf_sp)))
            return tuple(threads)
        finally:
            if dwfl:
                lib.dwfl_end(dwfl)
            if elf:
                lib.elf_end(elf)
            os.close(fd)
            stack.close()

    # -- naming frames ----------------------------------------------------------------------------

    def _at_sigtramp(self, pc: int) -> bool:
        """Whether ``pc`` is qemu-user's AArch64 sigreturn trampoline (an anonymous page, no CFI)."""
        if self.core.arch is not Arch.AARCH64 or self.mem is None or not pc:
            return False
        found = self._sigtramps.get(pc)
        if found is None:
            found = self._sigtramps[pc] = is_anonymous_trampoline(self.core, self.mem, pc)
        return found

    def _symbolize(self, dwfl: int, pc: int, activation: bool) -> list[dict]:
        if self._at_sigtramp(pc):
            # in no object: libdwfl's module of the object below may reach over it (its end rounded up to the
            # segments' alignment), and pc - 1 is that object's last byte
            return [_frame(pc, None, None, None, None, None, False)]
        addr = pc if activation or pc == 0 else pc - 1
        mod = self.lib.dwfl_addrmodule(dwfl, addr)
        library = self.modules.get(mod or 0)
        mapping = self.core.find_mapping(addr)
        where = mapping.path if mapping is not None and mapping.path else (library.path if library else None)
        if not mod or library is None:
            return [_frame(pc, None, None, where, None, None, False)]
        key = (self._module_key(mod, library), addr - library.base, activation)
        with _symbols_lock:
            cached = _symbols.get(key)
            if cached is not None:
                _symbols.move_to_end(key)
        if cached is None:
            cached = tuple(self._describe(mod, addr, activation))
            with _symbols_lock:
                _symbols[key] = cached
                if len(_symbols) > _MAX_SYMBOL_CACHE:
                    _symbols.popitem(last=False)
        return [{"pc": pc, **f, "library": where} for f in cached]

    def _module_key(self, mod: int, library: Library) -> tuple:
        """What a frame's description depends on besides its address: the object's build and the files
        its symbols come from (a stripped copy and the full file of one build-id name frames differently)."""
        key = self._keys.get(mod)
        if key is None:
            build_id = library.build_id or library.file_build_id
            debug = find_debug_file(build_id, self.sysroot, library.path) if build_id else None
            key = (build_id, library.status.value, file_identity(library.file_path), file_identity(debug))
            self._keys[mod] = key
        return key

    def _describe(self, mod: int, addr: int, activation: bool) -> list[dict]:
        """What a frame at ``addr`` is: the inlined functions there and the physical one, innermost first."""
        lib = self.lib
        file = line = None
        src = lib.dwfl_module_getsrc(mod, addr)
        statement = None
        if src:
            lineno = c_int()
            name = lib.dwfl_lineinfo(src, None, byref(lineno), None, None, None)
            if name:
                file, line = name.decode("utf-8", "replace"), (lineno.value or None)
                statement = self._statement_row(src)
        adjust = 0 if activation else 1
        chain = self._function_scopes(mod, addr)
        if not chain or chain[-1][0] == L.DW_TAG_inlined_subroutine or chain[-1][1] is None:
            # no DWARF function (or an unnamed one): the ELF symbol names the frame.  libdwfl finds it by
            # scanning the symbol table, so this is done only here.
            offset, sym = c_uint64(), L.GElfSym()
            raw = lib.dwfl_module_addrinfo(mod, addr, byref(offset), byref(sym), None, None, None)
            elf_name = raw.decode("utf-8", "replace") if raw else None
            if not chain:
                return [{"function": elf_name, "offset": offset.value + adjust if raw else None, "file": file,
                         "line": line, "inlined": False}]
            tag, _, first, call_file, call_line = chain[-1]
            chain[-1] = (tag, elf_name, first if raw and first and first[0] == addr - offset.value else None,
                         call_file, call_line)
        out = []
        for tag, name, first, call_file, call_line in chain:
            physical = tag != L.DW_TAG_inlined_subroutine
            off = None
            # The offset is the pc's into the function's ELF symbol, which starts where the function's
            # code does (the first of its ranges, where gdb puts its start); in another range of it (a
            # cold part) the ELF symbol is another one, and no offset is given, as gdb gives none.
            if physical and first is not None and first[0] <= addr < first[1]:
                off = addr - first[0] + adjust
            out.append({"function": name, "offset": off, "file": file, "line": line, "inlined": not physical})
            file, line = call_file, call_line  # where this function was called from, for the next frame out
        if statement is not None:
            out[0]["statement_row"] = statement
        return out

    def _statement_row(self, src: int) -> tuple[str, int] | None:
        """Where the line-table row libdw chose (``src``: the last row of its address) is not a statement, the
        last statement row of that address: (file, line) -- the row gdb names (DWARF 5 location views give
        one address several rows).  None when the row is a statement, or its address has no other."""
        lib = self.lib
        flag, bias = c_bool(), L.Dwarf_Addr()
        line = lib.dwfl_dwarf_line(src, byref(bias))
        if not line or lib.dwarf_linebeginstatement(line, byref(flag)) != 0 or flag.value:
            return None
        at, count = L.Dwarf_Addr(), c_size_t()
        cu = lib.dwfl_linecu(src)
        if not lib.dwfl_lineinfo(src, byref(at), None, None, None, None) or not cu \
                or lib.dwfl_getsrclines(cu, byref(count)) != 0:
            return None
        lo, hi = 0, count.value  # the rows are in address order: the first row past ``at``
        while lo < hi:
            mid = (lo + hi) // 2
            if self._row_address(cu, mid) <= at.value:
                lo = mid + 1
            else:
                hi = mid
        for i in range(lo - 1, max(lo - 1 - _MAX_ROWS_AT_ONE_ADDRESS, -1), -1):
            row = lib.dwfl_onesrcline(cu, i)
            addr, lineno = L.Dwarf_Addr(), c_int()
            name = lib.dwfl_lineinfo(row, byref(addr), byref(lineno), None, None, None) if row else None
            if not name or addr.value != at.value:
                return None
            raw = lib.dwfl_dwarf_line(row, byref(bias))
            if raw and lib.dwarf_linebeginstatement(raw, byref(flag)) == 0 and flag.value and lineno.value:
                return name.decode("utf-8", "replace"), lineno.value
        return None

    def _row_address(self, cu: int, i: int) -> int:
        addr = L.Dwarf_Addr()
        row = self.lib.dwfl_onesrcline(cu, i)
        if not row or not self.lib.dwfl_lineinfo(row, byref(addr), None, None, None, None):
            return -1
        return addr.value

    def _function_scopes(self, mod: int, addr: int) -> list[tuple]:
        """(tag, name, first address range, call file, call line) of each function scope holding ``addr``,
        innermost first, up to and including the physical (non-inlined) function."""
        lib = self.lib
        bias = c_uint64()
        cu = lib.dwfl_module_addrdie(mod, addr, byref(bias))
        if not cu:
            return []
        innermost = self._innermost_function(cu, addr - bias.value)
        if innermost is None:
            return []
        # the concrete chain of scopes holding it, up to the CU (as eu-stack does)
        chain = ctypes.POINTER(L.DwarfDie)()
        n = lib.dwarf_getscopes_die(byref(innermost), byref(chain))
        if n <= 0:
            return []
        out = []
        try:
            files = c_void_p()
            have_files = lib.dwarf_getsrcfiles(cu, byref(files), None) == 0
            for i in range(n):
                die = ctypes.pointer(chain[i])
                tag = lib.dwarf_tag(die)
                if tag not in _FUNCTION_TAGS:
                    continue
                call_file = call_line = None
                if tag == L.DW_TAG_inlined_subroutine:
                    attr, value = L.DwarfAttribute(), c_uint64()
                    if have_files and lib.dwarf_formudata(lib.dwarf_attr(die, L.DW_AT_call_file, byref(attr)),
                                                          byref(value)) == 0:
                        raw = lib.dwarf_filesrc(files, value.value, None, None)
                        call_file = raw.decode("utf-8", "replace") if raw else None
                    if lib.dwarf_formudata(lib.dwarf_attr(die, L.DW_AT_call_line, byref(attr)), byref(value)) == 0:
                        call_line = value.value or None
                first = self._first_range(die)
                out.append((tag, self._die_name(die),
                            None if first is None else (first[0] + bias.value, first[1] + bias.value),
                            call_file, call_line))
                if tag != L.DW_TAG_inlined_subroutine:
                    break
        finally:
            lib.free(ctypes.cast(chain, c_void_p))
        return out

    def _innermost_function(self, cu, addr: int):
        """The innermost function or inlined-function DIE whose code holds ``addr`` (an address of the DWARF,
        without the load bias), or None."""
        lib = self.lib
        scopes = ctypes.POINTER(L.DwarfDie)()
        n = lib.dwarf_getscopes(cu, addr, byref(scopes))
        if n > 0:
            try:
                for i in range(n):
                    if lib.dwarf_tag(ctypes.pointer(scopes[i])) in _FUNCTION_TAGS:
                        return L.DwarfDie.from_buffer_copy(scopes[i])
            finally:
                lib.free(ctypes.cast(scopes, c_void_p))
            return None
        if n < 0:
            return None
        # dwarf_getscopes of libdw before 0.189 finds nothing for a pc inside an inlined function whose
        # abstract origin is in another CU (gcc -flto: Debian's CPython); walk the CU's code scopes instead
        innermost, parent = None, L.DwarfDie.from_buffer_copy(cu.contents)
        for _ in range(_MAX_DEPTH):
            child, found = L.DwarfDie(), None
            rc = lib.dwarf_child(byref(parent), byref(child))
            while rc == 0:
                if lib.dwarf_tag(byref(child)) in _CODE_TAGS and lib.dwarf_haspc(byref(child), addr) == 1:
                    found = child
                    break
                sibling = L.DwarfDie()
                rc = lib.dwarf_siblingof(byref(child), byref(sibling))
                child = sibling
            if found is None:
                break
            if lib.dwarf_tag(byref(found)) in _FUNCTION_TAGS:
                innermost = L.DwarfDie.from_buffer_copy(found)
            parent = found
        return innermost

    def _first_range(self, die) -> tuple[int, int] | None:
        """The function's first address range: [low_pc, high_pc), or for code in several ranges the first
        one listed, whose start is where gdb (13) says the function starts."""
        base, start, end = c_uint64(), c_uint64(), c_uint64()
        if self.lib.dwarf_ranges(die, 0, byref(base), byref(start), byref(end)) > 0:
            return start.value, end.value
        return None

    def _die_name(self, die) -> str | None:
        """The function's name as gdb shows it for C: its linkage name when it has one, else DW_AT_name
        (both looked up through DW_AT_abstract_origin / DW_AT_specification)."""
        lib = self.lib
        attr = L.DwarfAttribute()
        for code in (0x2007, 0x6E, L.DW_AT_name):  # DW_AT_MIPS_linkage_name, DW_AT_linkage_name, DW_AT_name
            raw = lib.dwarf_formstring(lib.dwarf_attr_integrate(die, code, byref(attr)))
            if raw:
                return raw.decode("utf-8", "replace")
        return None


def _stack_pointer(lib: L.Lib, frame, dwarf_sp: int) -> int | None:
    """The frame's stack pointer (a caller frame's: its CFA); None when libdw is older than 0.188 or does
    not know it."""
    if lib.dwfl_frame_reg is None:
        return None
    value = c_uint64()
    if lib.dwfl_frame_reg(frame, dwarf_sp, byref(value)) != 0:
        return None
    return value.value


def _frame_registers(pcs: list[tuple[int, bool]], regs_of: list | None, named: dict[tuple[int, bool], list[dict]],
                     names: tuple[str, ...], callee_saved: tuple[str, ...], dwarf_sp: int
                     ) -> tuple[FrameRegisters, ...]:
    """Each physical frame's registers as records, indexed as its frame among the stack's named frames (the
    physical frame is the last of the frames its pc names: its inlined frames come before it).

    A frame reached through a return address keeps the callee-saved registers and its stack pointer only, and a
    callee-saved register libdwfl does not know there has its callee frame's value: the psABI's rule for a
    register the callee's CFI does not say it saved, which gdb applies too.  libdwfl 0.188's x86-64 ABI rules
    name DWARF register 0 (%rax) where %rbx (3) is meant: it carries %rax, a caller-saved register, into
    every caller unchanged and leaves %rbx unknown in a caller whose callee did not save it (glibc's noreturn
    ``malloc_printerr`` saves none, so ``_int_free``'s %rbx -- its chunk pointer -- was lost)."""
    if not regs_of:
        return ()
    out: list[FrameRegisters] = []
    index = 0
    kept = (*callee_saved, names[dwarf_sp])
    for (pc, activation), regs in zip(pcs, regs_of, strict=False):
        index += len(named[(pc, activation)])
        if out and not activation:
            known = {n: v for n, v in regs if n in kept}
            for name in callee_saved:
                if name not in known:
                    inner = out[-1].register(name)
                    if inner is not None:
                        known[name] = inner
            regs = tuple((n, known[n]) for n in names if n in known)
        out.append(FrameRegisters(index=index - 1, pc=pc, activation=activation, registers=regs))
    return tuple(out)


def _records(frames: list[dict]) -> tuple[NativeFrame, ...]:
    """The frames as the unwinder returns them: records, innermost first."""
    return tuple(NativeFrame(index=i, pc=f["pc"], symbol=f["function"] or None, offset=f["offset"],
                             library=f["library"], file=f["file"], line=f["line"], inlined=bool(f["inlined"]))
                 for i, f in enumerate(frames))


def _statement_rows(frames: list[dict]) -> tuple[tuple[int, str, int], ...]:
    """(index, file, line) of the frames whose address' statement row is not the row libdw chose."""
    return tuple((i, f["statement_row"][0], f["statement_row"][1]) for i, f in enumerate(frames)
                 if f.get("statement_row"))


def _frame(pc, function, offset, library, file, line, inlined) -> dict:
    return {"pc": pc, "function": function, "offset": offset, "library": library, "file": file, "line": line,
            "inlined": inlined}


def unwind_core(core: CoreFile, *, sysroot: str | None = None) -> tuple[NativeStack, ...]:
    """Every thread's native stack, unwound by libdwfl from the core and the files the core reader checked.

    :param core: the core, as :func:`forensics.core.open_core` read it (its libraries' files are used)
    :param sysroot: the crashed machine's root, searched for separate debug files
    :return: each thread's stack (``method`` "libdw"), as libdwfl numbers the threads
    :raises UnwinderUnavailable: when libdw cannot be loaded or cannot read the core
    """
    return _Unwinder(L.load(), core, sysroot).run()
