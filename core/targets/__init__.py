"""Registered targets: identity, labels, lifecycle, bounded history and summaries.

row.py: the sample row a history keeps (SampleRow, SAMPLE_FIELDS, SAMPLE_UNITS);
history.py: the ring of rows, running figures and phases; summary.py: what a span
of rows or a phase consumed, and the summary's JSON, as pure functions; target.py:
a target (persisted Identity, Observed per pass); access.py: who may register and act
on what, and the table's bounds; resolve.py: a pid or cgroup name pinned and checked;
persistence.py: a target's state-file entry; errors.py: refusals, without HTTP;
table.py: TargetTable, the locked table the API and the sampler share.
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
from edgewatt.core.targets.history import MAX_PHASES, History, Phase
from edgewatt.core.targets.resolve import Resolver
from edgewatt.core.targets.row import SAMPLE_FIELDS, SAMPLE_UNITS, SampleRow
from edgewatt.core.targets.summary import PhaseFigures
from edgewatt.core.targets.table import MAX_PHASE_NAME, MAX_SAMPLE_AGE_S, TargetTable
from edgewatt.core.targets.target import Identity, Observed, Target

__all__ = [
    "MAX_PHASES",
    "MAX_PHASE_NAME",
    "MAX_SAMPLE_AGE_S",
    "SAMPLE_FIELDS",
    "SAMPLE_UNITS",
    "Conflict",
    "Forbidden",
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
