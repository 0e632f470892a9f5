"""The checkout's scripts (``tests/fuzz_*.py``, ``.ci/image/build.py``) run with the checkout's interpreter,
``.venv/bin/python`` (``bash .ci/setup`` makes it, with forensics and its test extra installed): run by another
interpreter, such as the system's ``python3``, they end in one line naming that fix, not in a traceback."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from collections.abc import Sequence

__all__ = ["require_checkout_python"]

DISTRIBUTION = "crash-forensics"


def require_checkout_python(script: str, modules: Sequence[str] = ()) -> None:
    """Exit (status 1, one line on stderr) unless this interpreter has forensics installed and ``modules``.

    :param script: the script's path from the checkout's root, as the fix names it
    :param modules: the modules it imports beyond forensics' own dependencies
    """
    try:
        importlib.metadata.distribution(DISTRIBUTION)
        missing = [m for m in modules if importlib.util.find_spec(m) is None]
    except (importlib.metadata.PackageNotFoundError, ImportError, ValueError):
        missing = [DISTRIBUTION]
    else:
        if not missing:
            return
    sys.exit(f"{script}: error: this interpreter ({sys.executable}) lacks {', '.join(missing)}; run it with the "
             f"checkout's: .venv/bin/python {script} (bash .ci/setup makes .venv)")
