"""The daemon's socket for a command that needs one, found as clients find it."""

from __future__ import annotations

import sys

from edgewatt.core import transport


def find(command: str, socket: str | None) -> str | None:
    """The daemon's socket this user may trust (``socket`` if given), or None after
    saying where ``edgewatt command`` looked and how to start one."""
    found = transport.find_daemon(socket)
    if found.path is None:
        print(
            f"edgewatt {command}: no daemon answering; looked at {found.looked}. Start one: "
            "sudo systemctl start edgewatt, or edgewatt serve",
            file=sys.stderr,
        )
    return found.path
