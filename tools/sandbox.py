"""Run a command as learners on Binder run the kit: an ordinary user, with new namespaces refused.

    python tools/sandbox.py --user kitlearner [--no-namespaces] -- COMMAND ARGS...   (as root)
    python tools/sandbox.py --user kitlearner --no-namespaces --hand-over CONNECTION_FILE --into DIR \
        -- python -m ipykernel_launcher -f CONNECTION_FILE        (a notebook kernel: tools/binder_cgroup.py --as-user)

mybinder.org (and most JupyterHubs) run each session in a Docker container as user ``jovyan``, under Docker's
default seccomp profile: ``unshare`` and ``setns`` fail with EPERM, ``clone`` with any CLONE_NEW* flag fails with
EPERM, and ``clone3`` with ENOSYS (so that glibc falls back to ``clone``, where the flags can be seen). This tool
drops to ``--user`` (created with ``useradd -m`` if missing) and, with ``--no-namespaces``, installs that same
filter (a seccomp BPF program of the same rules, on x86_64 and aarch64) before it execs COMMAND; the filter is
inherited by every process COMMAND starts, as in the container. What it does not reproduce: the container's
other limits (memory and CPU: tools/binder_cgroup.py does those) and its own file system.

The user must be able to reach the interpreter: where Python lives under /root (pyenv), ``grant_reach`` gives the
user search permission on the folders above it (an ACL entry for that user only, removed by ``revoke_reach``).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import pwd
import shutil
import struct
import subprocess
import sys
from pathlib import Path

#: (audit arch, unshare, setns, clone, clone3) per machine: linux/audit.h and the syscall tables.
_ARCH = {"x86_64": (0xC000003E, 272, 308, 56, 435), "aarch64": (0xC00000B7, 97, 268, 220, 435)}
#: CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
CLONE_NEW_ANY = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_EPERM, _ENOSYS = 1, 38
_LD_W_ABS, _JEQ_K, _JSET_K, _RET_K = 0x20, 0x15, 0x45, 0x06
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def no_namespaces_program(machine: str | None = None) -> bytes:
    """The BPF program of Docker's rules for namespaces: unshare, setns → EPERM; clone with a CLONE_NEW* flag →
    EPERM; clone3 → ENOSYS; everything else allowed (another architecture's calls too)."""
    arch, unshare, setns, clone, clone3 = _ARCH[machine or platform.machine()]
    return b"".join([
        _insn(_LD_W_ABS, 0, 0, 4),                 # 0: A = seccomp_data.arch
        _insn(_JEQ_K, 1, 0, arch),                 # 1: ours → 3
        _insn(_RET_K, 0, 0, _ALLOW),               # 2
        _insn(_LD_W_ABS, 0, 0, 0),                 # 3: A = seccomp_data.nr
        _insn(_JEQ_K, 6, 0, unshare),              # 4: → 11 EPERM
        _insn(_JEQ_K, 5, 0, setns),                # 5: → 11 EPERM
        _insn(_JEQ_K, 5, 0, clone3),               # 6: → 12 ENOSYS
        _insn(_JEQ_K, 0, 2, clone),                # 7: clone → 8, else → 10 ALLOW
        _insn(_LD_W_ABS, 0, 0, 16),                # 8: A = low 32 bits of args[0], clone's flags
        _insn(_JSET_K, 1, 0, CLONE_NEW_ANY),       # 9: any CLONE_NEW* → 11 EPERM
        _insn(_RET_K, 0, 0, _ALLOW),               # 10
        _insn(_RET_K, 0, 0, _ERRNO | _EPERM),      # 11
        _insn(_RET_K, 0, 0, _ERRNO | _ENOSYS),     # 12
    ])


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def refuse_namespaces() -> None:
    """Install the filter on this process (and so on everything it starts from now on); it cannot be removed."""
    program = no_namespaces_program()
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or \
            libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "could not install the seccomp filter (prctl)")


def ensure_user(name: str) -> pwd.struct_passwd:
    """The user ``name``, created (with a home folder) if missing; root only."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True, capture_output=True)
        return pwd.getpwnam(name)


def _closed_folders(path: Path) -> list[Path]:
    """The folders above ``path`` that others cannot search (e.g. /root above a pyenv Python)."""
    return [p for p in Path(path).resolve().parents if not os.stat(p).st_mode & 0o001]


def grant_reach(user: str, path: str = sys.executable) -> list[Path]:
    """Let ``user`` reach ``path`` (by default this Python's real file): search permission (x) on each closed
    folder above it, as an ACL entry for that user alone. Returns the folders changed (for :func:`revoke_reach`)."""
    folders = _closed_folders(Path(os.path.realpath(path)))
    if folders and shutil.which("setfacl") is None:
        raise RuntimeError(f"{folders[0]} is closed to other users and setfacl is missing. Fix: apt-get install acl")
    for folder in folders:
        subprocess.run(["setfacl", "-m", f"u:{user}:x", str(folder)], check=True, capture_output=True)
    return folders


def revoke_reach(user: str, folders: list[Path]) -> None:
    for folder in folders:
        subprocess.run(["setfacl", "-x", f"u:{user}", str(folder)], check=True, capture_output=True)


def extended_acls(folder: Path) -> list[str]:
    """The paths under ``folder`` (itself included) with ACL entries beyond their mode bits."""
    shown = subprocess.run(["getfacl", "-R", "-s", "-p", str(Path(folder).resolve())], capture_output=True, text=True,
                           check=True).stdout
    return [line[len("# file: "):] for line in shown.splitlines() if line.startswith("# file: ")]


def grant_writing(user: str, folder: Path) -> None:
    """Let ``user`` read and write everything under ``folder``, and what is made there later (ACL entries and
    default entries for that user only; :func:`revoke_writing` takes them back)."""
    subprocess.run(["setfacl", "-R", "-m", f"u:{user}:rwX,d:u:{user}:rwX", str(folder)], check=True,
                   capture_output=True)


def revoke_writing(user: str, folder: Path, extended_before: list[str]) -> None:
    """Take :func:`grant_writing` back: the user's entries, and every ACL left on a path that had none before
    (``extended_before``: :func:`extended_acls` then), such as the mask and default entries setfacl keeps."""
    subprocess.run(["setfacl", "-R", "-x", f"u:{user},d:u:{user}", str(folder)], check=True, capture_output=True)
    left = sorted(set(extended_acls(folder)) - set(extended_before))
    for start in range(0, len(left), 200):
        subprocess.run(["setfacl", "-b", *left[start:start + 200]], check=True, capture_output=True)


def become(user: pwd.struct_passwd) -> dict[str, str]:
    """Drop this (root) process to ``user``; return the environment a login would give it."""
    os.setgroups([])
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)
    return {"HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--user", required=True, help="the unprivileged user to run as (created if missing)")
    parser.add_argument("--no-namespaces", action="store_true", help="refuse new namespaces, as Docker's seccomp does")
    parser.add_argument("--hand-over", metavar="FILE", help="a file of root's the command reads (a kernel's connection "
                        "file, in root's 0700 runtime folder): copied into --into for the user, and the command given "
                        "the copy's path instead")
    parser.add_argument("--into", metavar="DIR", help="where --hand-over's copy goes (a folder the user may enter)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    if os.geteuid() != 0:
        parser.error("run it as root (it drops to --user)")
    user = ensure_user(args.user)
    if args.hand_over:
        if not args.into:
            parser.error("--hand-over needs --into DIR")
        copy = Path(args.into) / Path(args.hand_over).name
        shutil.copyfile(args.hand_over, copy)
        os.chown(copy, user.pw_uid, user.pw_gid)
        os.chmod(copy, 0o600)
        command = [str(copy) if arg == args.hand_over else arg for arg in command]
    environment = {**os.environ, **become(user)}
    if args.no_namespaces:
        refuse_namespaces()
    os.execvpe(command[0], command, environment)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
