"""Notebook 04's plumbing: the tables and strips of which worker saw which example of the TFRecord files.

The lesson's TensorFlow code (the id pipelines, the auto-shard policies, ``experimental_distribute_dataset``,
manual sharding with ``InputContext``, the TFRecord files with their ids) is 04's own cells, tagged
``sharding``; tests/test_sharding.py runs those cells on a cluster (``kit.tools.cells.run_tagged``). What is
left here is what the lesson does not teach: the pure helpers that turn the ids each worker saw into the
notebook's tables, checks and figure. Every example carries its ``id``: its index in MNIST's
training set.
"""

from __future__ import annotations

import os
from typing import Iterable, Mapping, Sequence

import numpy as np

from ..core.errors import OptionError
from ..core.files import save_figure


# ----- files ------------------------------------------------------------------------------------
def block_ids(examples: int, num_files: int) -> list[list[int]]:
    """The ids each file holds: ``examples`` ids cut into ``num_files`` contiguous blocks."""
    if num_files < 1 or examples < num_files:
        raise OptionError("num_files", f"cannot cut {examples} examples into {num_files} non-empty files",
                          f"give 1 <= num_files <= examples ({examples})")
    return [block.tolist() for block in np.array_split(np.arange(examples), num_files)]


def files_of_worker(files: Sequence[str], worker: int, workers: int) -> list[str]:
    """The files FILE sharding gives to ``worker`` of ``workers``: every ``workers``-th, from ``worker``."""
    return list(files[worker::workers])


# ----- looking at the results (pure) ------------------------------------------------------------
def ids_seen(result: Mapping) -> list[int]:
    """The ids one worker saw, all steps in order: ``result["steps"]`` (a list of id lists per step) flattened."""
    return [i for step in result["steps"] for i in step]


def compact(ids: Iterable[int]) -> str:
    """Ids as sorted ranges, e.g. ``[0, 1, 2, 5, 7, 8]`` → ``"0-2, 5, 7-8"`` (repeats are dropped)."""
    values = sorted(set(int(i) for i in ids))
    parts: list[str] = []
    start = previous = None
    for value in values + [None]:
        if start is not None and (value is None or value != previous + 1):
            parts.append(f"{start}" if start == previous else f"{start}-{previous}")
            start = None
        if value is not None and start is None:
            start = value
        previous = value
    return ", ".join(parts)


def ownership(seen: Sequence[Iterable[int]], examples: int) -> np.ndarray:
    """``counts[w, i]``: how often worker ``w`` saw example ``i`` (ids outside range are ignored)."""
    counts = np.zeros((len(seen), examples), dtype=int)
    for w, ids in enumerate(seen):
        for i in ids:
            if 0 <= i < examples:
                counts[w, i] += 1
    return counts


def owner_codes(counts: np.ndarray) -> np.ndarray:
    """Per example: -1 nobody saw it, ``w`` only worker ``w`` saw it (once or more), ``W`` several did."""
    seen_by = counts > 0
    codes = np.where(seen_by.sum(axis=0) > 1, counts.shape[0], seen_by.argmax(axis=0))
    return np.where(seen_by.any(axis=0), codes, -1)


def plot_ownership(rows: Mapping[str, Sequence[Iterable[int]]], examples: int,
                   path: str | os.PathLike | None = None, title: str = "Which worker saw each example"):
    """One strip per case (label → ids seen by each worker): each example coloured by who saw it."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    workers = max(len(seen) for seen in rows.values())
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#17becf"][:workers]
    colours = ["white"] + palette + ["#d62728"]  # -1 nobody, 0..W-1 one worker, W several
    grid = np.array([owner_codes(ownership(list(seen) + [[]] * (workers - len(seen)), examples)) + 1
                     for seen in rows.values()])
    fig, ax = plt.subplots(figsize=(10, 0.9 + 0.5 * len(rows)))
    ax.imshow(grid, aspect="auto", cmap=ListedColormap(colours), vmin=-0.5, vmax=workers + 1.5,
              interpolation="nearest")
    for y in range(len(rows) - 1):  # white gaps between the strips
        ax.axhline(y + 0.5, color="white", linewidth=4)
    ax.set_yticks(range(len(rows)), list(rows))
    ax.set_xlabel("example id")
    ax.set_title(title)
    handles = [Patch(color=c, label=f"worker:{w} only") for w, c in enumerate(palette)]
    handles += [Patch(color="#d62728", label="several workers"),
                Patch(facecolor="white", edgecolor="grey", label="nobody")]
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    return save_figure(fig, path, bbox_inches="tight")  # the legend is outside the axes
