"""The two gdb scripts share one namespace inside gdb (``source`` runs them in ``__main__``): neither may
overwrite a name the other defined, in either order (issue #14 item 5: the native script's MAX_FRAMES
was the Python script's)."""
from __future__ import annotations

import subprocess

import pytest

from forensics.gdb import find_gdb_scripts

SNAPSHOT = ("python import __main__, types; __main__._forensics_first = {k: v for k, v in vars(__main__).items() "
            "if k not in __main__._forensics_before and not isinstance(v, types.ModuleType)}")
CHECK = ("python import __main__; print('CLOBBERED', sorted(k for k, v in __main__._forensics_first.items() "
         "if k != '_forensics_before' and vars(__main__).get(k) is not v))")


@pytest.mark.parametrize("first,second", [("forensics_native.py", "forensics_python.py"),
                                          ("forensics_python.py", "forensics_native.py")],
                         ids=["native-then-python", "python-then-native"])
def test_scripts_do_not_overwrite_each_others_names(first, second):
    scripts = find_gdb_scripts()
    p = subprocess.run(
        ["gdb", "-nx", "-batch",
         "-ex", "python import __main__; __main__._forensics_before = set(vars(__main__))",
         "-ex", f"source {scripts / first}", "-ex", SNAPSHOT,
         "-ex", f"source {scripts / second}", "-ex", CHECK],
        capture_output=True, text=True, timeout=120,
    )
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("CLOBBERED")), None)
    assert line is not None, p.stdout + p.stderr
    assert line == "CLOBBERED []", f"{second} overwrites names of {first}: {line}"
