"""A local cluster's own folder: everything its processes write to a temporary place goes in it.

    /tmp/kit-cluster-XXXXXXXX/      0700, made by the kernel that owns the cluster
        owner                       that kernel's ``pid:start_time`` (:func:`kit.core._lifeline.token`)
        sockets/, security/, log/   the controller's unix sockets, connection files, engine logs
        tmp/worker-0/ ...           each task's TMPDIR

TensorFlow's AutoGraph writes a module per converted function to ``$TMPDIR`` and deletes them at
exit, but the kit ends engines with SIGKILL (their state is thrown away, docs/performance.md, change
10), so no exit handler runs: 1,302 such files were left in /tmp after one ``make test`` before each
task got its own TMPDIR here. The folder goes when the cluster stops. A kernel that was killed stops
nothing; its folder is removed by the next cluster that starts on this machine (:func:`sweep`),
once the ``owner`` file says that kernel is gone.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from . import _lifeline

PREFIX = "kit-cluster-"
OWNER_FILE = "owner"

log = logging.getLogger("kit.core.workdir")


def create(owner_pid: int) -> Path:
    """A new cluster folder (0700: only this user connects to its sockets), owned by ``owner_pid``."""
    folder = Path(tempfile.mkdtemp(prefix=PREFIX))
    (folder / OWNER_FILE).write_text(_lifeline.token(owner_pid))
    return folder


def task_tmpdir(folder: Path, task_folder: str) -> str:
    """Task ``task_folder``'s TMPDIR inside ``folder``, made empty (a replaced engine's files go)."""
    path = folder / "tmp" / task_folder
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, mode=0o700)
    return str(path)


def remove(folder: Path) -> None:
    """Remove a cluster folder and everything in it."""
    shutil.rmtree(folder, ignore_errors=True)


def owner_alive(folder: Path) -> bool | None:
    """Whether the kernel that made ``folder`` still runs; None where the folder says nothing (no owner
    file: another kit version's, or one being made this instant), so it is left alone."""
    try:
        token = (folder / OWNER_FILE).read_text().strip()
        (pid, start_time), = _lifeline.parse(token)
    except (OSError, ValueError):
        return None
    return _lifeline.is_alive(pid, start_time)


def sweep(parent: str | os.PathLike | None = None) -> list[Path]:
    """Remove this user's cluster folders under ``parent`` (default: the temporary folder) whose
    owner is gone; return them. Another user's folders, and those without an owner file, stay."""
    removed = []
    for folder in Path(parent or tempfile.gettempdir()).glob(PREFIX + "*"):
        try:
            mine = folder.is_dir() and folder.stat().st_uid == os.getuid()
        except OSError:
            continue  # removed meanwhile by another sweep
        if mine and owner_alive(folder) is False:
            remove(folder)
            removed.append(folder)
    if removed:
        log.info("removed %d cluster folder(s) whose kernel is gone: %s", len(removed),
                 ", ".join(str(f) for f in removed))
    return removed
