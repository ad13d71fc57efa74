"""A private network namespace for a local cluster's engines, so that no other host can reach them.

TensorFlow's gRPC server binds every interface (``[::]:PORT``) whatever TF_CONFIG says, and it runs
any op an unauthenticated client sends (``tf.io.read_file``, ``tf.io.write_file``). A local cluster
therefore runs its engines in a network namespace of their own that has nothing but a loopback
interface: the tasks reach each other on 127.0.0.1 inside it, and nothing outside can connect to
them. The notebook kernel reaches the controller, and the controller the engines, through unix
sockets in the cluster's 0700 profile folder, which cross namespaces (docs/security.md).

One small *holder* process makes the namespace and keeps it alive::

    python -m kit.core._netns        # unshare(CLONE_NEWNET), as root; unprivileged: CLONE_NEWUSER too

It prints ``ready`` once the loopback interface is up, and exits when its owner (the kernel) is gone
(:mod:`kit.core._lifeline`) or when the cluster stops it. Each engine joins it first thing, in
:mod:`kit.core._boot`, with ``KIT_NETNS=pid:start_time`` of the holder in its environment.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading

from . import _lifeline

#: An engine's variable naming the holder of its cluster's private network, "pid:start_time" (kit.core._boot).
NETNS_VAR = "KIT_NETNS"
READY = "ready"
#: How long the holder may take to make the namespace (measured: 43-64 ms, mostly Python's start-up;
#: docs/performance.md, change 12).
START_TIMEOUT_S = 10.0

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_PR_SET_DUMPABLE = 4
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


class Unavailable(Exception):
    """No private network namespace can be made here; the message says why."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _call(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _loopback_up() -> None:
    """Bring ``lo`` up (a new namespace starts with it down), as ``ip link set lo up`` would."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH22s", b"lo", 0, b"")
        flags = struct.unpack("16sH22s", fcntl.ioctl(s, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH22s", b"lo", flags | _IFF_UP, b""))


def create() -> None:
    """Move this (single-threaded) process into a new network namespace with loopback up.

    With the capability for it (root), only the network namespace is new. Without, a user namespace
    comes first, in which this process holds the capabilities a network namespace needs; it maps
    only the caller's own uid and gid, so files and signals work as before.
    """
    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWNET) != 0:
        _call(libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET), "unshare(CLONE_NEWUSER | CLONE_NEWNET)")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _keep_inspectable(libc)
    _loopback_up()


def enter(token: str) -> None:
    """Join the namespace held by the process ``token`` ("pid:start_time"); call before any thread starts."""
    (pid, start_time), = _lifeline.parse(token)
    if not _lifeline.is_alive(pid, start_time):
        raise RuntimeError(f"the cluster's network namespace holder (pid {pid}) is gone; "
                           "stop the cluster and start it again")
    libc = _libc()
    user = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY)
    net = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    try:
        if not _lifeline.is_alive(pid, start_time):  # the pid was recycled between the checks
            raise RuntimeError(f"the cluster's network namespace holder (pid {pid}) is gone")
        if os.fstat(user).st_ino != os.stat("/proc/self/ns/user").st_ino:
            _call(libc.setns(user, _CLONE_NEWUSER), "setns(user namespace)")
        _call(libc.setns(net, _CLONE_NEWNET), "setns(network namespace)")
    finally:
        os.close(user)
        os.close(net)
    _keep_inspectable(libc)


def _keep_inspectable(libc: ctypes.CDLL) -> None:
    """Gaining capabilities (a new or joined user namespace) makes a process non-dumpable, which
    hides its /proc/PID/environ from its own user, and with it from the kit's census of its
    processes (:func:`kit.core.cluster.kit_processes`). Undo that."""
    _call(libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")


class PrivateNetwork(_lifeline.Held):
    """The holder of one cluster's network namespace, seen from the process that started it."""

    def __init__(self, process: subprocess.Popen):
        super().__init__(process)
        self.token = _lifeline.token(process.pid)

    @classmethod
    def start(cls, lifeline: str, timeout: float = START_TIMEOUT_S) -> "PrivateNetwork":
        """Start a holder that lives as long as the processes in ``lifeline``; raise :class:`Unavailable`."""
        if not sys.platform.startswith("linux"):
            raise Unavailable(f"network namespaces are Linux only (this is {sys.platform})")
        with tempfile.TemporaryFile("w+") as errors:  # a file, not a pipe: the holder may outlive us
            process = subprocess.Popen(
                [sys.executable, "-m", "kit.core._netns"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=errors, text=True, env={**os.environ, _lifeline.LIFELINE_VAR: lifeline},
            )
            how = _lifeline.await_ready(process, timeout, READY)
            if how is not None:
                errors.seek(0)
                said = errors.read().strip().splitlines()
                raise Unavailable((said or [f"the network namespace holder (pid {process.pid}) {how}"])[-1])
        return cls(process)

    # stop(): the namespace goes when its last process (an engine) has exited


def main() -> None:
    try:
        create()
    except OSError as error:
        print(f"cannot make a private network namespace: {error}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    _lifeline.start()  # only now: unshare(CLONE_NEWUSER) needs a process with a single thread
    print(READY, flush=True)
    threading.Event().wait()  # until the owner is gone (lifeline) or the cluster kills this process


if __name__ == "__main__":
    main()
