"""Each incident class as one row (:class:`~.row.IncidentRule`): when it holds (its criteria over the typed
facts), its words, who gets which report, the runbook's steps, the conclusion's claims and its titles.  The
decision (:mod:`..decision`) tries every class's criteria in their rank order and takes the first that holds;
the conclusion (:mod:`..verdict`) and the titles (:mod:`..titles`) read the decided class's row.  A class is one
module here, and one row of :data:`RULES` (``tests/unit/test_report_rules.py`` checks every class has a row with
a title, a route and a step for every template).

The decision order (the ranks):

- 10 **driver fault** (:mod:`.driver`): the C reproducer crashed, or the core's heap shows the driver writing
  past a correctly sized buffer (or overflowing one of its own) and the Python reproducer did not crash alone;
- 20 **shadowed install** (:mod:`.install`): the code that ran is not the installed distribution's;
- 30 **binding fault** (:mod:`.binding`): the core's heap shows nvidia-ml-py passing a count larger than its
  buffer; 40: only the Python reproducer crashes while C does not (the calling pattern);
- 50 **known issue** (:mod:`.known_issue`): a known crash whose whole definition holds, fixed in a later release;
- 55 **a kill** (:mod:`.kill`): the process was stopped from outside (an OOM kill, an eviction, a failed liveness
  probe, a signal another process sent) and no crash core says otherwise;
- 60 **no crash observed** (:mod:`.no_crash`): no crash core and every reproducer ran clean;
- 70 **the program's own bug**, 71 **a crash outside NVML** (:mod:`.not_nvml`): no NVML call in progress, the
  innermost frame past libc the interpreter's or ctypes', or another library's;
- 80 **unsupported install** (:mod:`.install`): the setup is outside what a package declares;
- 1000 **undetermined** (:mod:`.undetermined`): what is missing to decide is said.

Two causes at once: a kill beside a crash, a shadowed install beside the driver's fault.  The decided class is
the incident's; the other is a second cause, and the causes are fixed in their rows' ``fix_order`` (the kill
first, then the install, then the fault), each with its own evidence, routes and steps.
"""
from __future__ import annotations

from ..incident import IncidentClass
from . import binding, driver, install, kill, known_issue, no_crash, not_nvml, undetermined
from .row import Criterion, Found, IncidentRule

__all__ = ["RULES", "CRITERIA", "rule_for", "IncidentRule", "Criterion", "Found"]

RULES: tuple[IncidentRule, ...] = (driver.RULE, binding.RULE, install.RULE, known_issue.RULE, not_nvml.PROGRAM,
                                   not_nvml.OUTSIDE_NVML, no_crash.RULE, kill.RULE, undetermined.RULE)
_BY_CLASS = {r.incident: r for r in RULES}
#: every class's criteria, in the decision's order: (rank, criterion, its class's row)
CRITERIA: tuple[tuple[Criterion, IncidentRule], ...] = tuple(sorted(
    ((c, r) for r in RULES for c in r.criteria), key=lambda cr: cr[0].rank))


def rule_for(incident: IncidentClass) -> IncidentRule:
    """The row of ``incident``."""
    return _BY_CLASS[incident]
