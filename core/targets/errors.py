"""Why the table refuses a request: one class per kind of refusal, none of them
knowing HTTP (the API maps each to its status)."""

from __future__ import annotations


class TargetError(Exception):
    """A refused request: what it asked is malformed or names nothing that exists."""

    def __init__(self, error: str, detail: str = "") -> None:
        super().__init__(f"{error}: {detail}" if detail else error)
        self.error = error
        self.detail = detail


class NotFound(TargetError):
    """No target has that id (never registered, unregistered, or purged)."""


class Forbidden(TargetError):
    """The caller has no right to it: another user's process, cgroup or target."""


class Conflict(TargetError):
    """It contradicts the table as it is: registered with other labels, or exited."""


class TooMany(TargetError):
    """Over a bound: the running targets in all, or one user's."""


class TooManyLookups(TooMany):
    """Over the user's name lookup bound (lookups.py); ``retry_s``: when a token comes
    (0: when their running lookup ends)."""

    def __init__(self, detail: str, retry_s: float) -> None:
        super().__init__("too many lookups", detail)
        self.retry_s = retry_s
