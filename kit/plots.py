"""Figures the notebooks and the CLI share, saved as PNG next to the results."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence


def loss_curves(runs: Mapping[str, Sequence[float]], path: str | os.PathLike | None = None,
                title: str = "Training loss per step", xlabel: str = "step"):
    """One line per run (label → loss per step); saved to ``path`` as PNG when given."""
    import matplotlib.pyplot as plt  # headless machines fall back to the Agg backend by themselves

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, losses in runs.items():
        ax.plot(range(1, len(losses) + 1), losses, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig



def recovery(baseline: Mapping[int, float], with_failure: Mapping[int, float], kill_step: int,
             resume_step: int, path: str | os.PathLike | None = None, title: str | None = None):
    """Loss against global step for a run without and one with a failure, the failure marked.

    ``baseline`` and ``with_failure`` map global step → loss; ``kill_step`` is the last step
    before the kill, ``resume_step`` the first step after the restart.
    """
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(list(baseline), list(baseline.values()), label="no failure", color="tab:blue")
    ax.plot(list(with_failure), list(with_failure.values()), label="worker killed, resumed",
            color="tab:orange", linestyle="--")
    ax.axvline(kill_step, color="tab:red", alpha=0.7, label=f"killed after step {kill_step}")
    ax.axvline(resume_step, color="tab:green", alpha=0.7, linestyle=":",
               label=f"resumed at step {resume_step}")
    ax.set_xlabel("global step")
    ax.set_ylabel("loss (running mean within the epoch)")
    ax.set_title(title or "Training through a failure")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig
