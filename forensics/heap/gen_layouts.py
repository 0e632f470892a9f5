"""Generate ``layouts.json``: glibc 2.31-2.43 heap struct layouts, from DWARF where it exists, else from a model.

Run it where libc debug files are (Debian's ``libc6-dbg`` in some roots)::

    python -m forensics.heap.gen_layouts [-o forensics/heap/layouts.json] LIBC [LIBC ...]

For each ``libc.so.6`` given it reads the version (the banner in the file), the
build-id, finds the debug file (``usr/lib/debug/.build-id`` beside it, in the same
root) and reads the structs the heap reader uses from its DWARF
(:func:`forensics.heap.debuginfo.read_struct_layouts`).  Every version 2.31-2.43
gets an entry: the DWARF one where a debug file was given, else :func:`model_structs`,
a model of the structs as glibc's sources declare them (``malloc/malloc.c``,
``malloc/arena.c`` at each release tag).  The model is checked against every
DWARF read: a difference stops the generator, so the versions known only by the
model share its code with the ones that were checked.

The changes the model follows (glibc git history, release tags):

* 2.35: ``heap_info.pagesize``; ``malloc_par.thp_pagesize``, ``hp_pagesize``, ``hp_flags``
* 2.42: ``tcache_perthread_struct.counts[64]`` -> ``num_slots[76]`` (12 large bins),
  ``malloc_par.tcache_bins`` -> ``tcache_small_bins``
* 2.43: fastbins removed (``malloc_state.have_fastchunks``, ``fastbinsY``);
  ``malloc_par.thp_mode``
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from forensics.core.symtab import read_symbols
from forensics.heap.debuginfo import DebugInfoError, find_libc_debug_file, read_struct_layouts
from forensics.heap.layout import NEWEST, OLDEST

__all__ = ["model_structs", "read_dwarf_entry", "generate", "main"]

_ANCHORS = ("_int_malloc", "_int_free", "__libc_malloc")


def _lay_out(fields: list[tuple[str, int, int]]) -> dict:
    """C layout of (name, element size, count) members with natural alignment (x86-64)."""
    members, off, align_max = {}, 0, 1
    for name, size, count in fields:
        align = min(size, 8)
        off = (off + align - 1) // align * align
        members[name] = {"offset": off, "size": size, "count": count}
        off += size * count
        align_max = max(align_max, align)
    return {"size": (off + align_max - 1) // align_max * align_max, "members": members}


def model_structs(minor: int) -> dict:
    """The heap structs of glibc 2.<minor> as its sources declare them (x86-64).

    >>> model_structs(36)["malloc_state"]["size"], model_structs(43)["malloc_state"]["size"]
    (2200, 2112)
    """
    state = [("mutex", 4, 1), ("flags", 4, 1)]
    if minor < 43:
        state += [("have_fastchunks", 4, 1), ("fastbinsY", 8, 10)]
    state += [("top", 8, 1), ("last_remainder", 8, 1), ("bins", 8, 254), ("binmap", 4, 4), ("next", 8, 1),
              ("next_free", 8, 1), ("attached_threads", 8, 1), ("system_mem", 8, 1), ("max_system_mem", 8, 1)]
    par = [("trim_threshold", 8, 1), ("top_pad", 8, 1), ("mmap_threshold", 8, 1), ("arena_test", 8, 1),
           ("arena_max", 8, 1)]
    if minor >= 43:
        par.append(("thp_mode", 4, 1))
    if minor >= 35:
        par += [("thp_pagesize", 8, 1), ("hp_pagesize", 8, 1), ("hp_flags", 4, 1)]
    par += [("n_mmaps", 4, 1), ("n_mmaps_max", 4, 1), ("max_n_mmaps", 4, 1), ("no_dyn_threshold", 4, 1),
            ("mmapped_mem", 8, 1), ("max_mmapped_mem", 8, 1), ("sbrk_base", 8, 1),
            ("tcache_small_bins" if minor >= 42 else "tcache_bins", 8, 1), ("tcache_max_bytes", 8, 1),
            ("tcache_count", 8, 1), ("tcache_unsorted_limit", 8, 1)]
    heap = [("ar_ptr", 8, 1), ("prev", 8, 1), ("size", 8, 1), ("mprotect_size", 8, 1)]
    if minor >= 35:
        heap += [("pagesize", 8, 1), ("pad", 1, 8)]  # pad[-3 * SIZE_SZ & MALLOC_ALIGN_MASK]
    else:
        heap += [("pad", 1, 0)]  # pad[-6 * SIZE_SZ & MALLOC_ALIGN_MASK]
    # 2.42: num_slots[] of 76 bins replaced counts[] of 64
    tcache = [("num_slots", 2, 76), ("entries", 8, 76)] if minor >= 42 else [("counts", 2, 64), ("entries", 8, 64)]
    return {
        "malloc_state": _lay_out(state),
        "malloc_par": _lay_out(par),
        "_heap_info": _lay_out(heap),
        "tcache_perthread_struct": _lay_out(tcache),
        "tcache_entry": _lay_out([("next", 8, 1), ("key", 8, 1)]),
        "malloc_chunk": _lay_out([("mchunk_prev_size", 8, 1), ("mchunk_size", 8, 1), ("fd", 8, 1), ("bk", 8, 1),
                                  ("fd_nextsize", 8, 1), ("bk_nextsize", 8, 1)]),
    }


def _comparable(structs: dict) -> dict:
    """Sizes and member offsets/sizes/counts only (what the reader depends on)."""
    out = {}
    for name, st in structs.items():
        out[name] = {"size": st["size"],
                     "members": {m: (v["offset"], v["size"], v["count"]) for m, v in st["members"].items()}}
    return out


def _root_of(libc: str) -> str | None:
    """The root a libc file lives in (the directory above ``lib``/``usr``), for its debug file."""
    parts = os.path.realpath(libc).split(os.sep)
    for marker in ("usr", "lib", "lib64"):
        if marker in parts:
            root = os.sep.join(parts[: parts.index(marker)]) or os.sep
            return root
    return None


def read_dwarf_entry(libc: str) -> tuple[tuple[int, int], dict, str]:
    """(version, structs, provenance) of one libc file, from its debug file's DWARF.

    :raises DebugInfoError: when the version, the build-id or the debug file cannot be found
    """
    from forensics.core.buildid import read_build_id_from_file
    from forensics.heap.locate import read_glibc_version_file

    found = read_glibc_version_file(libc)
    if found is None:
        raise DebugInfoError(f"{libc}: no glibc version banner")
    version, banner = found
    build_id = read_build_id_from_file(libc)
    root = _root_of(libc)
    debug = find_libc_debug_file(build_id, sysroot=root if root not in (None, os.sep) else None)
    if debug is None:
        raise DebugInfoError(f"{libc}: no debug file for build-id {build_id} (install libc6-dbg there)")
    syms = read_symbols(debug, _ANCHORS)
    anchor = next((syms[a].value for a in _ANCHORS if a in syms), None)
    if anchor is None:
        raise DebugInfoError(f"{debug}: none of {', '.join(_ANCHORS)} in its symbol table")
    structs = read_struct_layouts(debug, anchor)
    return version, structs, f"DWARF of {banner.strip()}, build-id {build_id}"


def generate(libcs: list[str]) -> dict:
    """The ``layouts.json`` document for 2.31-2.43, DWARF entries for ``libcs`` and the model elsewhere.

    :raises SystemExit: when a DWARF entry differs from the model
    """
    dwarf: dict[str, tuple[dict, str]] = {}
    for libc in libcs:
        version, structs, source = read_dwarf_entry(libc)
        key = f"{version[0]}.{version[1]}"
        model = _comparable(model_structs(version[1]))
        got = _comparable({k: v for k, v in structs.items() if k in model})
        if got != model:
            diff = [k for k in model if model[k] != got.get(k)]
            raise SystemExit(f"the model of glibc {key} differs from {source} in {', '.join(diff)}:\n"
                             f"model {json.dumps({k: model[k] for k in diff})}\n"
                             f"dwarf {json.dumps({k: got.get(k) for k in diff})}")
        dwarf[key] = (structs, source)
    layouts = {}
    for minor in range(OLDEST[1], NEWEST[1] + 1):
        key = f"2.{minor}"
        if key in dwarf:
            structs, source = dwarf[key]
        else:
            structs, source = model_structs(minor), f"model of the glibc-2.{minor} sources, checked against " + (
                ", ".join(sorted(dwarf)) if dwarf else "no DWARF")
        layouts[key] = {"source": source, "structs": _comparable_json(structs)}
    return {
        "generator": "python -m forensics.heap.gen_layouts",
        "note": "x86-64 (and AArch64: the same LP64 layout) glibc heap structs; 'source' says whether an entry was "
                "read from DWARF or modelled",
        "layouts": layouts,
    }


def _comparable_json(structs: dict) -> dict:
    return {name: {"size": st["size"], "members": {m: dict(v) for m, v in st["members"].items()}}
            for name, st in sorted(structs.items())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("libcs", nargs="*", help="libc.so.6 files whose debug files are installed beside them")
    p.add_argument("-o", "--output", default=os.path.join(os.path.dirname(__file__), "layouts.json"))
    args = p.parse_args(argv)
    try:
        doc = generate(args.libcs)
    except DebugInfoError as e:
        print(f"gen_layouts: {e}", file=sys.stderr)
        return 1
    with open(args.output, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {args.output}: " + ", ".join(f"{k} ({'dwarf' if v['source'].startswith('DWARF') else 'model'})"
                                               for k, v in doc["layouts"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
