"""The package's structure: no import cycle, every arrow points down, only the CLI layer speaks click,
the CLI loads a command's code only when that command runs, and only the bundle package spells a bundle's items."""
from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest

from tests.import_graph import PACKAGE_DIR, find_cycles, module_files, read_graph, string_literals, unit_of

# The package's units by floor: a unit imports only units on a lower line (and itself).
# A new module joins its unit; a new unit takes the line its imports put it on.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("records", "modes"),  # the record decorator, below every record; analyze's modes (enum only)
    # records, errors, pure helpers, the resolver; SHA-256 without hashlib (digest); another program run bounded in
    # time and bytes (subproc)
    ("errors", "model", "cache", "redact", "rootpath", "digest", "subproc"),
    # shared formats, shipped files, the one kube client; who a PID is (/proc/PID/stat); the one reader of /proc/PID;
    # views of an analysis record (its signature, its merged stacks), below every reader of one
    # how a parser of untrusted bytes runs (sandbox)
    ("output", "resources", "guard", "kubectl", "pidstat", "procfs", "views", "sandbox"),
    # records back from the JSON another command wrote (analyze, reproduce, fleet...); the command line's options as
    # records, without click (-o checks its path through output)
    ("jsonrecords", "argspec"),
    # reading cores; the fleet's restarts (its table's records, from pods or from Prometheus); click's options, made
    # from argspec's records
    ("core", "fleet", "options"),
    # stacks by gdb / our reader / libdw; capture bundles; glibc heap; systemd-coredump's store (its compressed
    # cores, its journal)
    ("gdb", "pyread", "bundle", "unwind", "heap", "coredumpd"),
    # analyze's pipeline; verify-imports' library; bundles in S3 buckets; the node side's manifests and Helm chart
    ("analyze", "imports", "objstore", "deploy"),
    # the public API; renderers; capture on nodes; gdb opened on a core for a person (forensics debug)
    ("forensics", "format", "canary", "simnvml", "capture", "debugger"),
    ("reproduce", "agent"),  # the reproducers, and their result read back; the node agent (agent serve)
    ("report",),  # evidence -> the incident's reports
    ("text",),  # plain text for people: every command's renderers
    ("demo",),
    ("commands",),  # one module per command
    ("cli",),  # the group, its error handler, main
    ("__main__",),
)
FLOOR = {unit: i for i, units in enumerate(LAYERS) for unit in units}
CLI_LAYER = ("forensics.cli", "forensics.commands", "forensics.options")


@pytest.fixture(scope="module")
def graph():
    return read_graph()


def test_no_import_cycle(graph):
    # lazy imports (inside functions) are arrows too: a lazy import that hides a cycle is a cycle
    assert find_cycles(graph) == []


def test_every_module_belongs_to_a_unit_with_a_floor(graph):
    assert sorted({unit_of(m) for m in graph} - set(FLOOR)) == []


def test_every_arrow_points_down(graph):
    upward = sorted(
        f"{a} -> {b}" for a, targets in graph.items() for b in targets
        if unit_of(a) != unit_of(b) and FLOOR[unit_of(b)] >= FLOOR[unit_of(a)]
    )
    assert upward == [], "what two units share belongs in a neutral module below both"


def test_only_the_cli_layer_imports_click():
    speaking = []
    for path in PACKAGE_DIR.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts).removesuffix(".__init__")
        if module.startswith(CLI_LAYER):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "click" or n.startswith("click.") for n in names):
                speaking.append(module)
    assert speaking == []


def _loaded_after(code: str) -> list[str]:
    probe = code + ("\nimport sys\n"
                    "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] == 'forensics')),"
                    " file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stderr.split()


def test_importing_the_cli_loads_no_command():
    assert _loaded_after("import forensics.cli") == ["forensics", "forensics.cli", "forensics.errors"]


def test_help_loads_the_commands_but_none_of_their_work():
    # GIVEN `forensics --help` and `forensics analyze --help`
    for argv in (["--help"], ["analyze", "--help"]):
        loaded = _loaded_after(
            "from forensics.cli import cli\n"
            f"try:\n    cli({argv!r}, prog_name='forensics')\nexcept SystemExit:\n    pass")
        # THEN only the command layer, the shared output helpers, analyze's modes and the options' records were
        # imported
        assert [m for m in loaded if not m.startswith(CLI_LAYER + ("forensics.errors", "forensics.output",
                                                                   "forensics.modes", "forensics.argspec",
                                                                   "forensics.records"))] \
            == ["forensics"], argv


def test_a_command_loads_only_its_own_module():
    loaded = _loaded_after(
        "from forensics.cli import cli\n"
        "try:\n    cli(['guard', '--help'], prog_name='forensics')\nexcept SystemExit:\n    pass")
    assert [m for m in loaded if m.startswith("forensics.commands.")] == ["forensics.commands.guard"]


# What names a bundle's item: the numbered items and folders, the records, the core's file names.  Matched at the
# start of a string constant (a path, or the first piece of an f-string), so prose that mentions one is not.
_BUNDLE_ITEM = re.compile(r"""(?x)
    [0-6]0-(identity|kubernetes|node|kernel|process|core|analysis)\b
  | (metadata|snapshot|arming|left-on-node|attempts|failed)\.json$ | MANIFEST\.json$ | index\.jsonl$
  | (core|core\.truncated|core\.partial|stream)\.zst$ | \.core\.zst\.tmp$
""")


def bundle_item_literals(root=PACKAGE_DIR) -> list[str]:
    """``module:line: 'text'`` of each string constant outside the bundle package that spells a bundle item."""
    return [f"{module}:{line}: {text!r}" for module, path in sorted(module_files(root).items())
            if not module.startswith("forensics.bundle")
            for line, text in string_literals(path) if _BUNDLE_ITEM.match(text)]


def test_no_module_but_the_bundle_package_spells_a_bundle_item():
    # GIVEN every module of the package; WHEN their string constants are read (docstrings aside)
    # THEN none names an item of the bundle: its layout is forensics.bundle.layout's, imported by name
    assert bundle_item_literals() == []


def test_the_bundle_item_check_sees_a_spelled_item(tmp_path):
    # GIVEN a package whose capture module writes a record by its spelling, and documents another
    (tmp_path / "forensics" / "capture").mkdir(parents=True)
    (tmp_path / "forensics" / "capture" / "m.py").write_text(
        '"""Writes 40-process/snapshot.json."""\nimport os\n\n\ndef f(d, name):\n'
        '    return os.path.join(d, "metadata.json"), f"50-core/{name}", "the agent sent no arming.json"\n')
    # THEN the code's two spellings are found; the docstring and the prose are not
    assert bundle_item_literals(tmp_path / "forensics") == [
        "forensics.capture.m:6: 'metadata.json'", "forensics.capture.m:6: '50-core/'"]


def test_boto3_is_loaded_only_where_an_object_store_is_used():
    # GIVEN the modules of analyze's start-up path, the object store's package and its reader and uploader
    probe = ("import sys\n"
             "import forensics.cli, forensics.commands.analyze_run\n"
             "import forensics.objstore.fetch, forensics.objstore.upload\n"
             "print(' '.join(m for m in sys.modules if m.split('.')[0] in ('boto3', 'botocore', 's3transfer')))")
    # WHEN they are imported
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    # THEN no S3 library was (a client is made, and boto3 imported, only when an s3:// URL is used)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == []


# The unwinders: where a native stack may be a dict (libdw's frame templates, gdb's JSON as it arrives).
UNWINDERS = ("forensics.unwind", "forensics.gdb")


def test_no_dict_shaped_native_stack_past_the_unwinders():
    # GIVEN every module but the unwinders; WHEN their string constants are read
    # THEN none keys a native stack's thread as gdb's wire JSON does ("lwp"): past the unwinders a stack is a record
    spelled = [f"{module}:{line}" for module, path in sorted(module_files().items())
               if not module.startswith(UNWINDERS) for line, text in string_literals(path) if text == "lwp"]
    assert spelled == []
    # and what the unwinders hand on is typed so: libdw's unwind_core, gdb's GdbResult.native
    unwind = ast.parse((PACKAGE_DIR / "unwind" / "__init__.py").read_text())
    (returns,) = [n.returns for n in unwind.body if isinstance(n, ast.FunctionDef) and n.name == "unwind_core"]
    gdb = ast.parse((PACKAGE_DIR / "gdb.py").read_text())
    (result,) = [n for n in gdb.body if isinstance(n, ast.ClassDef) and n.name == "GdbResult"]
    (native,) = [n.annotation for n in result.body if isinstance(n, ast.AnnAssign) and n.target.id == "native"]
    assert ast.unparse(returns) == "tuple[NativeStack, ...]"
    assert ast.unparse(native) == "tuple[NativeStack, ...] | None"


def errors_outside_the_catalogue(root=PACKAGE_DIR) -> list[str]:
    """``module:Class`` of each class outside ``errors.py`` that derives from one of the catalogue's classes."""
    catalogue = {n.name for n in ast.walk(ast.parse((root / "errors.py").read_text())) if isinstance(n, ast.ClassDef)}
    return sorted(f"{module}:{node.name}" for module, path in module_files(root).items() if module != "forensics.errors"
                  for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)
                  and {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases} & catalogue)


def test_every_error_the_tool_reports_is_in_the_catalogue():
    # GIVEN every module but errors.py; THEN none defines a ForensicsError of its own: the catalogue holds each
    # class with its fields, help text and exit code, and the raising module imports it
    assert errors_outside_the_catalogue() == []


def test_the_catalogue_check_sees_an_error_defined_elsewhere(tmp_path):
    (tmp_path / "forensics").mkdir()
    (tmp_path / "forensics" / "errors.py").write_text("class ForensicsError(Exception):\n    pass\n")
    (tmp_path / "forensics" / "m.py").write_text(
        "from . import errors\nfrom .errors import ForensicsError\n\n\n"
        "class A(ForensicsError, ValueError):\n    pass\n\n\n"
        "class B(errors.ForensicsError):\n    pass\n\n\nclass C(ValueError):\n    pass\n")
    assert errors_outside_the_catalogue(tmp_path / "forensics") == ["forensics.m:A", "forensics.m:B"]


def re_exports(root=PACKAGE_DIR) -> list[str]:
    """``module:name`` of each name a module (not a package's ``__init__``, whose API it is) lists in ``__all__``
    but imports from another forensics module: a moved name left behind, so importers never learn its home."""
    out = []
    for module, path in module_files(root).items():
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        imported = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom)
                    and (n.level or (n.module or "").split(".")[0] == "forensics") for a in n.names}
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
                out += [f"{module}:{name}" for name in ast.literal_eval(node.value) if name in imported]
    return sorted(out)


def test_no_module_re_exports_a_name_from_another():
    # GIVEN every module of the package but the packages' __init__; THEN each name in its __all__ is its own
    assert re_exports() == []


def test_the_re_export_check_sees_a_moved_name(tmp_path):
    (tmp_path / "forensics" / "p").mkdir(parents=True)
    (tmp_path / "forensics" / "errors.py").write_text("class E(Exception):\n    pass\n")
    (tmp_path / "forensics" / "p" / "__init__.py").write_text("from ..errors import E\n__all__ = ['E']\n")
    (tmp_path / "forensics" / "p" / "m.py").write_text(
        "from ..errors import E\nfrom forensics.errors import E as F\n__all__ = ['E', 'F', 'g']\n\n\ndef g():\n"
        "    raise E\n")
    assert re_exports(tmp_path / "forensics") == ["forensics.p.m:E", "forensics.p.m:F"]


#: the units `forensics report` loads to make a report of an analysis's JSON: the records, the views of an analysis,
#: the readers of the other commands' documents, the report itself; never a core reader or the analysis pipeline
REPORT_ON_JSON_UNITS = ["argspec", "bundle", "cache", "cli", "commands", "digest", "errors", "fleet", "format", "guard",
                        "imports", "jsonrecords", "kubectl", "model", "modes", "options", "output", "records", "redact",
                        "report", "reproduce", "resources", "rootpath", "subproc", "views"]


def test_report_on_json_loads_no_core_reader_nor_the_pipeline(tmp_path):
    # GIVEN the committed demo's analysis (a JSON document of analyze)
    from pathlib import Path

    analysis = Path(__file__).resolve().parents[2] / "reports" / "demo" / "analysis.json"
    # WHEN `forensics report` makes a report of it
    loaded = _loaded_after(
        "import contextlib, io\nfrom forensics.cli import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        f"    try:\n        cli(['report', '--template', 'runbook', {str(analysis)!r}], prog_name='forensics')\n"
        "    except SystemExit:\n        pass")
    # THEN what it loaded are these units: no module of core/, analyze/, unwind/, pyread/, gdb, heap/ or capture/
    units = sorted({m.split(".")[1] for m in loaded if "." in m})
    assert units == REPORT_ON_JSON_UNITS, loaded
    assert "forensics.report.make" in loaded


# The programs that run with privilege on a node parse only what they must to name and bound a crash (#37): the
# kernel-run core handler (root: the kernel chooses that), the DaemonSet's privileged keeper and `capture --pod`'s
# short-lived agent pod (`agent run`). None of them loads a reader of a core's memory or its debug data: the analysis
# pipeline, the heap reader, the CPython reader (pyread), the unwinders (libdw's, gdb's). Those run only in the
# sandbox of agent serve's analyses.
PRIVILEGED = ("forensics.commands.core_handler", "forensics.capture.handler", "forensics.capture.keeper",
              "forensics.capture.agent")
PARSERS = ("analyze", "heap", "pyread", "unwind", "gdb")


def parsers_reached(graph: dict[str, set[str]], start: str) -> list[str]:
    """Each module of :data:`PARSERS`' units that ``start`` imports, directly or not (lazy imports included), with
    the chain that reaches it: ``a -> b -> forensics.heap.x``."""
    chain = {start: [start]}
    todo = [start]
    while todo:
        m = todo.pop()
        for d in sorted(graph[m]):
            if d not in chain:
                chain[d] = [*chain[m], d]
                todo.append(d)
    return sorted(" -> ".join(c) for m, c in chain.items() if unit_of(m) in PARSERS)


@pytest.mark.parametrize("entry", PRIVILEGED)
def test_a_privileged_program_loads_no_reader_of_a_cores_memory(graph, entry):
    assert parsers_reached(graph, entry) == []


def test_the_privileged_closure_check_sees_a_parser_imported_lazily(tmp_path):
    # GIVEN a handler that imports a module which, inside a function, imports the heap reader
    pkg = tmp_path / "forensics"
    for d in ("capture", "heap"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "capture" / "handler.py").write_text("from . import store\n")
    (pkg / "capture" / "store.py").write_text("def f():\n    from ..heap import walk\n    return walk\n")
    (pkg / "heap" / "walk.py").write_text("")
    # THEN the chain to it is found
    assert parsers_reached(read_graph(pkg), "forensics.capture.handler") == [
        "forensics.capture.handler -> forensics.capture.store -> forensics.heap.walk"]
