"""Whose user namespace a peer runs in: the person its uids belong to where
/etc/subuid does not say (core/persons.py).

A user with a namespace of her own runs as any uid its map gives her. /etc/subuid
names the ranges newuidmap hands out from that file, but not those it takes from
elsewhere (libsubid's nss sources, such as sssd), nor those root maps for a user.
The kernel knows who made each namespace: ``NS_GET_OWNER_UID`` on it, walked with
``NS_GET_PARENT`` up to the daemon's own namespace. The owner that counts is the
outermost one that is not root: a user's nested namespaces are hers, and a namespace
root made (a container's) says nothing of who runs in it.

Only a connected peer has a pid to ask (SO_PEERCRED's, taken at connect), and a pid
may be reused once its process ends. So the process is held while it is read (a
/proc/PID directory opened stays that process's), and it must be the peer: with the
peer's pidfd (SO_PEERPIDFD, Linux 6.5) it is alive after the directory was opened,
so the pid was not reused; without one, it runs as the peer's uid, which a stranger's
namespace cannot map (newuidmap maps a user only her own ranges). Anything else
answers None: the peer is placed by its uid alone.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import socket
import struct

NS_GET_PARENT = 0xB702  # _IO(0xb7, 2): the parent namespace, as a new descriptor
NS_GET_OWNER_UID = 0xB704  # _IO(0xb7, 4): the uid that made the namespace
SO_PEERPIDFD = 77  # socket.SO_PEERPIDFD on Python 3.14+
MAX_DEPTH = 33  # the kernel nests user namespaces 32 deep


def peer_pidfd(sock: socket.socket) -> int | None:
    """A pidfd of the process that connected ``sock`` (the caller closes it); None
    where the kernel gives none (before Linux 6.5)."""
    try:
        return int(sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD))
    except OSError:
        return None


def _alive(pidfd: int) -> bool:
    send = getattr(signal, "pidfd_send_signal", None)  # Python 3.9+
    if send is None:
        return False
    try:
        send(pidfd, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, and not ours to signal
        return True
    return True


def _euid(directory: int) -> int | None:
    """The effective uid of the process whose /proc directory is open at ``directory``."""
    fd = os.open("status", os.O_RDONLY, dir_fd=directory)
    with os.fdopen(fd, "rb") as f:
        for line in f:
            if line.startswith(b"Uid:"):
                return int(line.split()[2])
    return None


def _owner_uid(namespace: int) -> int:
    found = bytearray(4)
    fcntl.ioctl(namespace, NS_GET_OWNER_UID, found, True)
    return int(struct.unpack("=I", found)[0])


def owners(namespace: int, own: int) -> list[int]:
    """The owners of the user namespace open at ``namespace`` and of its parents, the
    innermost first, up to (not counting) the namespace whose inode is ``own``; [] for
    that one. Raises OSError for one that is not below ``own``."""
    found: list[int] = []
    fd = os.dup(namespace)
    try:
        while os.fstat(fd).st_ino != own:
            if len(found) == MAX_DEPTH:
                raise OSError(errno.ELOOP, "user namespaces nested too deep")
            found.append(_owner_uid(fd))
            parent = fcntl.ioctl(fd, NS_GET_PARENT)  # EPERM: past the top we see
            os.close(fd)
            fd = parent
    finally:
        os.close(fd)
    return found


def own_namespace() -> int:
    """The inode of the daemon's own user namespace."""
    return os.stat("/proc/self/ns/user").st_ino


def namespace_owner(pid: int, uid: int, pidfd: int | None, proc: str = "/proc") -> int | None:
    """The uid that owns the user namespace the peer ``pid`` (running as ``uid``, from
    SO_PEERCRED) runs in: the outermost owner below the daemon's namespace that is not
    root. None where it runs in the daemon's namespace, in root's namespaces only, or
    cannot be read as that very peer (gone, its pid reused, not ours to read)."""
    try:
        directory = os.open(f"{proc}/{pid}", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        namespace = os.open("ns/user", os.O_RDONLY, dir_fd=directory)
        try:
            # Checked after both were opened: they are the peer's, not a successor's.
            if pidfd is not None:
                if not _alive(pidfd):
                    return None
            elif _euid(directory) != uid:
                return None
            chain = owners(namespace, own_namespace())
        finally:
            os.close(namespace)
    except OSError:  # it ended meanwhile, or lives where we cannot look
        return None
    finally:
        with contextlib.suppress(OSError):
            os.close(directory)
    for owner in reversed(chain):  # outermost first
        if owner != 0:
            return owner
    return None
