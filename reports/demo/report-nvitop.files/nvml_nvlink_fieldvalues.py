#!/usr/bin/env python3
"""Minimal reproducer: NVLink throughput field values through nvidia-ml-py, from threads.

Needs only nvidia-ml-py (``import pynvml``) and the standard library; Python 3.8+.

    python nvml_nvlink_fieldvalues.py [--iterations N] [--threads T] [--duration S]
                                      [--shutdown-race] [--malloc-check] [--json]

It initializes NVML and, from T background threads (0 = the main thread), makes the call
nvitop's ``Device.nvlink_throughput()`` makes (nvitop/api/device.py): on every GPU, one
``nvmlDeviceGetFieldValues`` call of NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX (138) x scopeId
0..links-1 followed by NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX (139) x scopeId 0..links-1 --
N times or for S seconds, keeping each GPU's previous sample until the next one replaces it
(as a rate computation does).  nvitop's link-count rule: a GPU whose
NVML_FI_DEV_NVLINK_LINK_COUNT (91) query fails, or reports 0 links, is skipped.
``--shutdown-race`` calls ``nvmlShutdown`` from the main thread while the threads are
still querying.

Output: an environment header for the upstream report (each GPU with its index, UUID and
PCI bus id), then one line starting with ``VERDICT: ``.  A crash without ``--malloc-check``
prints no verdict: the exit signal and the core are the result.  Run
``nvml_nvlink_fieldvalues.c`` on the same node too: if only this one crashes, suspect the
binding or the threads; if both do, the driver.
"""
from __future__ import print_function

import argparse
import ctypes
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time

__all__ = ["main"]

SCHEMA_VERSION = 1
_CHILD_ENV = "FORENSICS_REPRO_BREADCRUMBS"  # set in the --malloc-check child: where to log calls
_MALLOC_DEBUG_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/lib",
    "/lib",
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=1000, help="queries per GPU per thread (default 1000)")
    p.add_argument("--threads", type=int, default=2, help="querying threads; 0 = the main thread (default 2)")
    p.add_argument("--duration", type=float, default=None, help="stop after S seconds even if iterations remain")
    p.add_argument("--shutdown-race", action="store_true", help="call nvmlShutdown while threads still query")
    p.add_argument("--malloc-check", action="store_true", help="run under glibc's checking allocator (child)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    return p.parse_args(argv)


# ---- environment header --------------------------------------------------------------


def _binding_version():
    try:
        from importlib.metadata import version  # Python 3.8+

        return version("nvidia-ml-py")
    except Exception:  # noqa: BLE001 -- not installed as a distribution, or an old pynvml
        return "unknown"


def _loaded_nvml():
    """The libnvidia-ml file this process mapped (after nvmlInit)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if "libnvidia-ml" in line:
                    return line.split(None, 5)[-1].strip()
    except OSError:
        pass
    return "unknown"


def _text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def collect_header(pynvml, handles):
    def q(fn, *a):
        try:
            return fn(*a)
        except Exception as e:  # noqa: BLE001 -- a header field the driver lacks
            return "n/a ({})".format(e)

    cuda = q(pynvml.nvmlSystemGetCudaDriverVersion)
    names = [_text(q(pynvml.nvmlDeviceGetName, h)) for h in handles]
    devices = []
    for index, h in enumerate(handles):
        pci = q(pynvml.nvmlDeviceGetPciInfo, h)
        devices.append({
            "index": index,
            "name": names[index],
            "uuid": _text(q(pynvml.nvmlDeviceGetUUID, h)),
            "bus_id": _text(pci.busId) if hasattr(pci, "busId") else str(pci),
        })
    return {
        "gpu_count": len(handles),
        "gpus": sorted(set(names)),
        "devices": devices,
        "driver": _text(q(pynvml.nvmlSystemGetDriverVersion)),
        "nvml": _text(q(pynvml.nvmlSystemGetNVMLVersion)),
        "cuda_driver": "{}.{}".format(cuda // 1000, cuda % 1000 // 10) if isinstance(cuda, int) else cuda,
        "libnvidia_ml": _loaded_nvml(),
        "binding": "nvidia-ml-py {} ({})".format(_binding_version(), getattr(pynvml, "__file__", "?")),
        "python": "{} {} ({})".format(platform.python_implementation(), platform.python_version(), sys.executable),
        "glibc": " ".join(platform.libc_ver()),
        "kernel": "{} {}".format(platform.release(), platform.machine()),
        "malloc_check": bool(os.environ.get(_CHILD_ENV)),
    }


def format_header(h, args):
    yield "nvml_nvlink_fieldvalues (Python, nvidia-ml-py): NVLink throughput field values on every link"
    yield "  GPU:            {} x {}".format(h["gpu_count"], ", ".join(h["gpus"]))
    for key, label in (
        ("driver", "driver"),
        ("nvml", "NVML"),
        ("cuda_driver", "CUDA driver"),
        ("libnvidia_ml", "libnvidia-ml"),
        ("binding", "binding"),
        ("python", "Python"),
        ("glibc", "glibc"),
        ("kernel", "kernel"),
    ):
        yield "  {:<15} {}".format(label + ":", h[key])
    for d in h.get("devices") or ():
        yield "  GPU {}:{}{}, {}, PCI bus {}".format(d["index"], " " * (10 if d["index"] < 10 else 9), d["name"],
                                                     d["uuid"], d["bus_id"])
    yield ("  call:           nvmlDeviceGetFieldValues(device, 2 x links, values): fieldId {} "
           "(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX) x scopeId 0..links-1, then fieldId {} "
           "(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX) x scopeId 0..links-1; "
           "one call per GPU per iteration".format(138, 139))
    yield "  calling thread: {}".format("main" if args.threads == 0 else "{} background thread(s)".format(args.threads))
    yield "  iterations:     {}{}{}".format(
        args.iterations,
        ", duration {}s".format(args.duration) if args.duration else "",
        ", with a concurrent nvmlShutdown" if args.shutdown_race else "",
    )
    yield "  malloc check:   {}".format("on (glibc.malloc.check=3, libc_malloc_debug)" if h["malloc_check"] else "off")


# ---- the test --------------------------------------------------------------------------


class Breadcrumbs(object):
    """In the --malloc-check child: one line per call before it starts and after its check."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600) if path else None

    def write(self, line):
        if self.fd is not None:
            os.write(self.fd, (line + "\n").encode())


def check_heap_after_nvmlDeviceGetFieldValues(pynvml, handle, fields):
    """Call nvmlDeviceGetFieldValues and free its result array at once, in this frame.

    Under glibc.malloc.check=3 the free validates the array's chunk and its neighbours,
    and a malloc/free round trip afterwards exercises the arena, so a corruption caused by
    the call aborts here -- with this function on the stack -- and not at a later free.
    """
    values = pynvml.nvmlDeviceGetFieldValues(handle, fields)
    out = [(v.nvmlReturn, v.value.ullVal, v.timestamp) for v in values]
    del values  # the only reference: the array is freed now
    canary = ctypes.create_string_buffer(4096)
    del canary
    return out


class Worker(threading.Thread):
    def __init__(self, pynvml, devices, args, crumbs, deadline, halfway, shutdown_done, name):
        threading.Thread.__init__(self, name=name)
        self.daemon = True
        self.pynvml, self.devices, self.args, self.crumbs = pynvml, devices, args, crumbs
        self.deadline, self.halfway, self.shutdown_done = deadline, halfway, shutdown_done
        self.calls = 0
        self.iterations = 0
        self.field_errors = 0
        self.after_shutdown = 0  # queries answered NVML_ERROR_UNINITIALIZED after nvmlShutdown
        self.error = None
        self.released = False

    def run(self):
        try:
            self.query_loop()
        except Exception as e:  # noqa: BLE001 -- reported in the verdict
            self.error = "{}: {}".format(type(e).__name__, e)
        finally:
            self.release_halfway()

    def release_halfway(self):
        # once per worker, also when it ended early: the --shutdown-race thread waits for it
        if self.args.shutdown_race and not self.released:
            self.released = True
            self.halfway.release()

    def query_loop(self):
        pynvml, args = self.pynvml, self.args
        checked = bool(self.crumbs.fd is not None)
        previous = {}
        half = max(1, args.iterations // 2)
        tid = threading.get_ident()
        for it in range(args.iterations):
            if self.deadline is not None and time.monotonic() >= self.deadline:
                break
            if args.shutdown_race and it == half:
                self.release_halfway()
                self.shutdown_done.wait(1.0)
            for index, handle, fields in self.devices:
                self.crumbs.write(
                    "B {}|{}|nvmlDeviceGetFieldValues(gpu {}, {} NVLink throughput fields) call #{}".format(
                        tid, self.name, index, len(fields), self.calls + 1
                    )
                )
                try:
                    if checked:
                        sample = check_heap_after_nvmlDeviceGetFieldValues(pynvml, handle, fields)
                        self.field_errors += sum(1 for r, _v, _t in sample if r != 0)
                    else:
                        values = pynvml.nvmlDeviceGetFieldValues(handle, fields)
                        self.field_errors += sum(1 for v in values if v.nvmlReturn != 0)
                        old = previous.get(index)
                        if old is not None:  # the rate an exporter reports, from the previous sample
                            _rates = [
                                (n.value.ullVal - o.value.ullVal) * 1e6 / max(1, n.timestamp - o.timestamp)
                                # both samples are of the same fields; zip(strict=) is 3.10+, this runs on 3.8
                                for o, n in zip(old, values)  # noqa: B905
                            ]
                        previous[index] = values  # frees the previous array
                except pynvml.NVMLError as e:
                    if args.shutdown_race and e.value == pynvml.NVML_ERROR_UNINITIALIZED:
                        self.after_shutdown += 1
                        self.crumbs.write("E {}".format(tid))
                        return
                    raise
                self.calls += 1
                self.crumbs.write("E {}".format(tid))
            self.iterations += 1


def _nvlink_devices(pynvml, handles, crumbs):
    """nvitop's link-count rule: (index, handle, fields) per GPU with NVLinks, and why the others are skipped."""
    devices = []
    skipped = []
    for index, handle in enumerate(handles):
        # nvitop's rule (Device.nvlink_link_count): the field's value when the call and the field
        # succeed, else 0 -- and a GPU with 0 links gets no NVLink throughput call at all
        links, why = 0, "0 NVLinks"
        tid = threading.get_ident()
        crumbs.write("B {}|MainThread|nvmlDeviceGetFieldValues(gpu {}, NVLINK_LINK_COUNT)".format(tid, index))
        try:
            (count,) = pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT])
            if count.nvmlReturn == 0:
                links = count.value.uiVal
            else:
                why = "the link count field returned {}".format(count.nvmlReturn)
        except pynvml.NVMLError as e:
            why = "the link count query failed: {}".format(e)
        crumbs.write("E {}".format(tid))
        if links == 0:
            skipped.append("GPU {}: {}".format(index, why))
        fields = [(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link) for link in range(links)]
        fields += [(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link) for link in range(links)]
        if fields:
            devices.append((index, handle, fields))
    return devices, skipped


def _print_links(devices, skipped, handles):
    for line in skipped:
        print("    {} -> skipped, as nvitop does".format(line))
    counts = {len(f) // 2 for _i, _h, f in devices}
    if len(counts) == 1 and len(devices) == len(handles):
        print("  NVLinks:        {} on each of {} GPUs (NVML_FI_DEV_NVLINK_LINK_COUNT)".format(
            counts.pop(), len(handles)))
    else:
        print("  NVLinks:        {} (NVML_FI_DEV_NVLINK_LINK_COUNT)".format(
            ", ".join("GPU {}: {}".format(i, len(f) // 2) for i, _h, f in devices) or "none"))
    sys.stdout.flush()


def _run_workers(pynvml, devices, args, crumbs):
    """Query from the main thread or from args.threads threads; return (workers, elapsed seconds)."""
    deadline = time.monotonic() + args.duration if args.duration else None
    halfway = threading.Semaphore(0)
    shutdown_done = threading.Event()
    n_threads = max(0, args.threads)
    workers = [
        Worker(pynvml, devices, args, crumbs, deadline, halfway, shutdown_done, "nvml-query-{}".format(i))
        for i in range(max(1, n_threads))
    ]
    started = time.monotonic()
    shut_down = False
    if n_threads == 0:
        if args.shutdown_race:
            # a timer thread races the main thread's queries
            def _shutdown():
                halfway.acquire()
                pynvml.nvmlShutdown()
                shutdown_done.set()

            racer = threading.Thread(target=_shutdown, name="nvml-shutdown", daemon=True)
            racer.start()
            shut_down = True
        workers[0].run()
        if args.shutdown_race:
            racer.join()  # every thread ends before the verdict
    else:
        for w in workers:
            w.start()
        if args.shutdown_race:
            for _ in workers:
                halfway.acquire()
            pynvml.nvmlShutdown()
            shut_down = True
            shutdown_done.set()
        for w in workers:
            w.join()
    elapsed = time.monotonic() - started
    if not shut_down:
        pynvml.nvmlShutdown()
    return workers, elapsed


def run_test(args):
    """Run the queries in this process; return the JSON-able result (a crash never returns)."""
    try:
        import pynvml
    except ImportError:
        return {"verdict": "error: could not start: nvidia-ml-py is not installed (pip install nvidia-ml-py)",
                "status": "not-started"}
    crumbs = Breadcrumbs(os.environ.get(_CHILD_ENV))
    try:
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except pynvml.NVMLError as e:
        return {"verdict": "error: could not start: NVML initialization failed: {}".format(e), "status": "not-started"}
    header = collect_header(pynvml, handles)
    crumbs.write("H " + json.dumps(header))
    if not args.json:
        for line in format_header(header, args):
            print(line)
        sys.stdout.flush()
    devices, skipped = _nvlink_devices(pynvml, handles, crumbs)
    max_links = max([len(f) // 2 for _i, _h, f in devices] or [0])
    header["nvlinks"] = [len(f) // 2 for _i, _h, f in devices]
    if not args.json:
        _print_links(devices, skipped, handles)
    if not devices:
        pynvml.nvmlShutdown()
        return {"header": header, "status": "not-started",
                "verdict": "error: could not start: no GPU reports NVLinks, nothing to query "
                           "(nvitop makes no NVLink throughput call here)"}

    n_threads = max(0, args.threads)
    workers, elapsed = _run_workers(pynvml, devices, args, crumbs)
    calls = sum(w.calls for w in workers)
    iterations = min(w.iterations for w in workers)
    errors = [w.error for w in workers if w.error]
    field_errors = sum(w.field_errors for w in workers)
    after_shutdown = sum(w.after_shutdown for w in workers)
    what = "{} GPUs x {} links x {} iterations".format(len(handles), max_links, iterations)
    extra = " ({} calls in {}, {:.2f}s{})".format(
        calls,
        "the main thread" if n_threads == 0 else "{} thread(s)".format(n_threads),
        elapsed,
        ", {} queries after nvmlShutdown answered Uninitialized".format(after_shutdown) if args.shutdown_race else "",
    )
    if errors:
        verdict, status = "error: {}{}; first: {}".format(what, extra, errors[0]), "error"
    elif field_errors:
        verdict = "errors: {}, no crash, {} field values returned an error{}".format(what, field_errors, extra)
        status = "errors"
    else:
        verdict, status = "clean: {}, no crash{}".format(what, extra), "clean"
    return {
        "header": header,
        "verdict": verdict,
        "status": status,
        "calls": calls,
        "iterations": iterations,
        "links": max_links,
        "field_errors": field_errors,
        "queries_after_shutdown": after_shutdown,
        "elapsed_s": round(elapsed, 3),
    }


# ---- --malloc-check: the parent ----------------------------------------------------------


def find_malloc_debug():
    for d in _MALLOC_DEBUG_DIRS:
        p = os.path.join(d, "libc_malloc_debug.so.0")
        if os.path.exists(p):
            return p
    return None  # glibc < 2.34: the checks are built into libc (MALLOC_CHECK_)


def _parse_breadcrumbs(path):
    header, open_calls = None, {}
    try:
        with open(path) as f:
            for line in f:
                kind, _, rest = line.rstrip("\n").partition(" ")
                if kind == "H":
                    header = json.loads(rest)
                elif kind == "B":
                    tid, name, call = rest.split("|", 2)
                    open_calls[tid] = (name, call)
                elif kind == "E":
                    open_calls.pop(rest, None)
    except (OSError, ValueError):
        pass
    return header, list(open_calls.values())


def _glibc_message(stderr_text):
    for line in stderr_text.splitlines():
        s = line.strip()
        if any(k in s for k in ("corruption", "free():", "malloc():", "realloc():", "corrupted", "invalid")):
            return s
    return None


def run_checked(args, argv):
    fd, crumbs = tempfile.mkstemp(prefix="nvml-repro-", suffix=".log")
    os.close(fd)
    env = dict(os.environ)
    tunables = env.get("GLIBC_TUNABLES")
    env["GLIBC_TUNABLES"] = "glibc.malloc.check=3" + (":" + tunables if tunables else "")
    env["MALLOC_CHECK_"] = "3"
    debug = find_malloc_debug()
    if debug:
        env["LD_PRELOAD"] = debug + (" " + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    env[_CHILD_ENV] = crumbs
    child_argv = [a for a in argv if a not in ("--malloc-check", "--json")] + ["--json"]
    try:
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__)] + child_argv,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            universal_newlines=True,
        )
        header, open_calls = _parse_breadcrumbs(crumbs)
    finally:
        os.unlink(crumbs)
    sys.stderr.write(proc.stderr)
    if proc.returncode >= 0:
        try:
            result = json.loads(proc.stdout)
        except ValueError:
            result = {"verdict": "error: child exited {} without a result".format(proc.returncode), "status": "error"}
        result["malloc_check"] = debug or "MALLOC_CHECK_=3"
        return result
    sig = -proc.returncode
    try:
        signame = signal.Signals(sig).name
    except ValueError:
        signame = "signal {}".format(sig)
    message = _glibc_message(proc.stderr)
    if open_calls:
        name, call = open_calls[0]
        where = "{} in thread {}".format(call, name)
    else:
        where = None
    if where and sig == signal.SIGABRT:
        verdict = "heap corruption detected at {}: {}".format(where, message or "glibc abort")
    elif where:
        verdict = "crash ({}) in {}".format(signame, where)
    else:
        verdict = "crash ({}) outside the NVML field-value calls{}".format(signame, ": " + message if message else "")
    return {
        "header": header,
        "verdict": verdict,
        "status": "heap-corruption" if where and sig == signal.SIGABRT else "crash",
        "signal": signame,
        "glibc_message": message,
        "culprit_call": where,
        "malloc_check": debug or "MALLOC_CHECK_=3",
    }


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.malloc_check and not os.environ.get(_CHILD_ENV):
        result = run_checked(args, argv)
        if not args.json and result.get("header"):
            for line in format_header(result["header"], args):
                print(line)
    else:
        result = run_test(args)
    if args.json:
        doc = {"schema_version": SCHEMA_VERSION, "command": "nvml_nvlink_fieldvalues", "args": vars(args)}
        doc.update(result)
        print(json.dumps(doc, sort_keys=True))
    else:
        print("VERDICT: " + result["verdict"])
    return {"clean": 0, "errors": 3, "error": 2, "not-started": 2}.get(result.get("status"), 1)


if __name__ == "__main__":
    sys.exit(main())
