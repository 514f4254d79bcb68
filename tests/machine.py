"""What this machine's kernel lets a process do without a capability, asked of the
kernel itself (not of the daemon under test): a test that runs the daemon without
CAP_NET_ADMIN asserts what follows from these answers, so that it holds on every
kernel, whichever way it decides.

Each probe is a few raw socket calls run by a fresh interpreter under ``setpriv``,
as the daemon is started; the answers are kept for the session.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys

# A daemon as root but without CAP_NET_ADMIN: DaemonProcess.prefix.
WITHOUT_NET_ADMIN = ["setpriv", "--bounding-set=-net_admin", "--inh-caps=-net_admin"]

# The proc connector: bind to its multicast group and ask it to send (the kernel
# refuses one or the other without CAP_NET_ADMIN, depending on its version).
_PROC_CONNECTOR = """
import socket, struct
s = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 11)  # NETLINK_CONNECTOR
s.bind((0, 1))  # CN_IDX_PROC
op = struct.pack("=I", 1)  # PROC_CN_MCAST_LISTEN
body = struct.pack("=IIIIHH", 1, 1, 0, 0, len(op), 0) + op  # cn_msg
s.send(struct.pack("=IHHII", 16 + len(body), 3, 0, 0, 0) + body)  # NLMSG_DONE
"""

# sock_diag's TCP destroy groups (IPv4 and IPv6): older kernels let only
# CAP_NET_ADMIN join.
_DESTROY_GROUPS = """
import socket
s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4)  # NETLINK_SOCK_DIAG
s.bind((0, 0))
for group in (1, 3):  # SKNLGRP_INET_TCP_DESTROY, SKNLGRP_INET6_TCP_DESTROY
    s.setsockopt(270, 1, group)  # SOL_NETLINK, NETLINK_ADD_MEMBERSHIP
"""


def _allowed_without_net_admin(code: str) -> bool:
    """Whether ``code`` runs to its end in a process without CAP_NET_ADMIN; a refusal
    is a PermissionError, anything else is the probe's own fault and raises."""
    if shutil.which("setpriv") is None:
        raise RuntimeError("setpriv (util-linux) is needed to drop a capability")
    code = f"try:\n{_indent(code)}\nexcept PermissionError:\n    raise SystemExit(13)\n"
    done = subprocess.run(
        [*WITHOUT_NET_ADMIN, sys.executable, "-c", code],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    if done.returncode not in (0, 13):
        raise RuntimeError(f"the probe failed: {done.stderr.strip()}")
    return done.returncode == 0


def _indent(code: str) -> str:
    return "\n".join(f"    {line}" for line in code.strip().splitlines())


@functools.lru_cache(maxsize=None)  # 3.8: no functools.cache
def proc_connector_without_net_admin() -> bool:
    """Whether a process without CAP_NET_ADMIN may listen to the kernel's process
    events (fork, exec, exit)."""
    return _allowed_without_net_admin(_PROC_CONNECTOR)


@functools.lru_cache(maxsize=None)  # 3.8: no functools.cache
def destroy_groups_without_net_admin() -> bool:
    """Whether a process without CAP_NET_ADMIN may hear TCP sockets destroyed."""
    return _allowed_without_net_admin(_DESTROY_GROUPS)


@functools.lru_cache(maxsize=None)  # 3.8: no functools.cache
def user_namespace_as(uid: int) -> str | None:
    """Why a process of ``uid`` may not make a user namespace of its own here (the
    sysctls, a security module); None where it may."""
    if shutil.which("unshare") is None:
        return "no unshare (util-linux)"
    done = subprocess.run(
        ["unshare", "--user", "true"], user=uid, group=uid, cwd="/",
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    return None if done.returncode == 0 else done.stderr.strip() or "unshare --user failed"
