"""Channel counts (core/channels.py) as the tests write them: by name, in the
declaration's order, 0 for every channel not named, so a new channel leaves them as
they are."""

from __future__ import annotations

from edgewatt.core.channels import NAMES


def counts(**by_name: int) -> tuple[int, ...]:
    unknown = by_name.keys() - set(NAMES)
    assert not unknown, f"not a channel: {unknown}"
    return tuple(by_name.get(name, 0) for name in NAMES)


def switches(voluntary: int, involuntary: int) -> tuple[int, ...]:
    return counts(context_switches_voluntary=voluntary, context_switches_involuntary=involuntary)
