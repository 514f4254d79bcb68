"""Registered targets: identity, labels, lifecycle, bounded history and summaries.

One module per concern, the public names re-exported here:

- row.py: SampleRow, a sample as a history keeps it (each figure by name, plus the
  monotonic time durations come from); SAMPLE_FIELDS and SAMPLE_UNITS.
- history.py: History (the bounded ring of rows and the figures that outlive it) and
  Phase (a named span between two rows); the phase name's rule.
- summary.py: what was consumed between two rows, a phase's and a target's summary
  JSON, the phases exported each pass: pure functions.
- target.py: Target = Identity (fixed at registration, what the state file keeps) +
  Observed (what the last pass saw) + the live handle, holders and its end.
- access.py: who may register a process or a cgroup and act on a target; Limits (how
  many run, how long the exited are kept).
- resolve.py: Resolver, a pid pinned or a cgroup name looked up (within the user's
  lookup bounds), checked against the caller's rights.
- persistence.py: a target's state-file entry, and the ordered hand-off of the state.
- errors.py: the refusals by kind, without HTTP (exporter/api.py maps them).
- table.py: TargetTable, the one locked table the API and the sampler share; Held, a
  registration's outcome (a new target, or a live one joined).
"""

from edgewatt.core.targets.access import Limits
from edgewatt.core.targets.errors import (
    Conflict,
    Forbidden,
    NotFound,
    TargetError,
    TooMany,
    TooManyLookups,
)
from edgewatt.core.targets.history import MAX_PHASE_NAME, MAX_PHASES, History, Phase
from edgewatt.core.targets.resolve import Resolver
from edgewatt.core.targets.row import SAMPLE_FIELDS, SAMPLE_UNITS, SampleRow
from edgewatt.core.targets.summary import PhaseFigures
from edgewatt.core.targets.table import MAX_SAMPLE_AGE_S, Held, TargetTable
from edgewatt.core.targets.target import Identity, Observed, Target

__all__ = [
    "MAX_PHASES",
    "MAX_PHASE_NAME",
    "MAX_SAMPLE_AGE_S",
    "SAMPLE_FIELDS",
    "SAMPLE_UNITS",
    "Conflict",
    "Forbidden",
    "Held",
    "History",
    "Identity",
    "Limits",
    "NotFound",
    "Observed",
    "Phase",
    "PhaseFigures",
    "Resolver",
    "SampleRow",
    "Target",
    "TargetError",
    "TargetTable",
    "TooMany",
    "TooManyLookups",
]
