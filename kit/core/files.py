"""The files the kit writes: results and tables atomically (:func:`write_atomic`), figures (:func:`save_figure`);
and where the files it ships are (:func:`shipped`).

Pure Python, no TensorFlow or matplotlib import: every layer uses these two, the engines' code
(kit.train) as the tooling (kit.tools).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: Resolution of every figure the kit saves.
FIGURE_DPI = 120


def shipped(folder: str, marker: str) -> Path | None:
    """The kit's ``folder`` (``locks``, ``notebooks``, ``docs``): ``kit/<folder>`` in an installed wheel (package data),
    else the checkout's ``<folder>/`` (an editable install, or kit imported from a checkout); the first that holds
    ``marker``, None if neither does."""
    package = Path(__file__).resolve().parents[1]
    return next((c for c in (package / folder, package.parent / folder) if (c / marker).exists()), None)


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path``, creating its folder, so that a reader finds the old file or the new
    one, never half of one: the text goes to ``<name>.partial`` beside it, which then replaces ``path``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.write_text(text)
    os.replace(partial, target)
    return target


def save_figure(fig: Any, path: str | os.PathLike | None, **savefig: Any) -> Any:
    """Save a matplotlib ``fig`` to ``path`` (creating its folder) at :data:`FIGURE_DPI`; return ``fig``.

    ``path=None`` saves nothing. ``savefig`` adds options for ``Figure.savefig`` (e.g. ``bbox_inches``).
    """
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=FIGURE_DPI, **savefig)
    return fig
