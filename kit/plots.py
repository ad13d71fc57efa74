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

