"""A uid's person where no subuid file is read (the client, tests, a table without a
daemon): the uid itself. Apart from persons.py, which looks users up by name (pwd:
Unix only), so that what the client loads on any platform imports nothing Unix-only."""

from __future__ import annotations


def alone(uid: int) -> int:
    """The person of ``uid`` where no subuid file is read: ``uid`` itself."""
    return uid
