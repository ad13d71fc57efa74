"""What the notebooks read back after a run: the files a callback wrote, and whether TensorBoard is installed."""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path


def tensorboard_installed() -> bool:
    """Whether the ``tensorboard`` package is importable (Keras's TensorBoard callback needs it).

    TensorFlow 2.21 no longer installs it: without it, ``fit`` with a TensorBoard callback fails
    with ``TBNotInstalledError`` at the first summary.
    """
    return find_spec("tensorboard") is not None


def files_under(root: str | os.PathLike) -> list[str]:
    """Every file below ``root``, as sorted paths relative to it ([] when ``root`` does not exist)."""
    base = Path(root)
    if not base.is_dir():
        return []

    def vanished(error: OSError) -> None:
        # Other tasks delete their temporary checkpoint folders (workertemp_N) while this one
        # lists the tree: a folder that is gone has no files to list. Anything else is an error.
        if not isinstance(error, FileNotFoundError):
            raise error

    return sorted(str((Path(folder) / name).relative_to(base))
                  for folder, _, names in os.walk(base, onerror=vanished) for name in names)


