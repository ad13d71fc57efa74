"""The figures of notebook 10 (the critical batch size): steps to a target against the batch, and the all-reduce
over emulated links. Each takes the notebook's tables, draws, saves to ``path`` (None: nothing saved) and returns
the figure. And :func:`concept`, the sketch at the notebook's top, committed as :data:`CONCEPT_FIGURE`."""

from __future__ import annotations

import os
from typing import Any, Mapping

from ..core.files import save_figure


def steps_to_target(full, fit: Mapping[str, float], target: float, path: str | os.PathLike | None = None) -> Any:
    """Steps (left) and examples (right) to ``target`` against the batch size: the tuned runs with and without
    warmup (``full``: BATCH, WARMUP, steps, examples, linear_steps), the linear rule's runs, and the fit
    S_min (1 + B_crit / B) (``fit``: s_min, b_crit, e_min, from :func:`kit.train.batch_size.fit_critical_batch`)."""
    import matplotlib.pyplot as plt
    import numpy as np

    batches = np.geomspace(full["BATCH"].min(), full["BATCH"].max(), 200)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for warm, style, colour in ((False, "o-", "C0"), (True, "s--", "C1")):
        part = full[full["WARMUP"] == warm]
        label = "tuned, warmup" if warm else "tuned"
        axes[0].plot(part["BATCH"], part["steps"], style, color=colour, label=label)
        axes[1].plot(part["BATCH"], part["examples"], style, color=colour, label=label)
        linear = part[part["linear_steps"].notna()]
        axes[0].plot(linear["BATCH"], linear["linear_steps"], "x", ms=9, color=colour,
                     label="linear rule" + (", warmup" if warm else ""))
    axes[0].plot(batches, fit["s_min"] * (1 + fit["b_crit"] / batches), color="grey", lw=1, label="S_min (1 + B_crit/B)")
    axes[1].plot(batches, fit["e_min"] * (1 + batches / fit["b_crit"]), color="grey", lw=1, label="E_min (1 + B/B_crit)")
    for ax, what in zip(axes, ("steps", "examples")):
        ax.axvline(fit["b_crit"], color="grey", ls=":", lw=1)
        ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel=f"{what} to {target} test accuracy")
        ax.legend(fontsize=8)
    axes[0].set_title("perfect scaling, diminishing returns, maximal data parallelism", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def all_reduce_over_links(links, path: str | os.PathLike | None = None) -> Any:
    """The all-reduce per step against the link's bandwidth, measured (dots), the ring model with the host's cost
    (lines) and the link alone (dotted), and the 2 workers' scaling efficiency; one colour per model and dtype
    (``links``: the table ``kit bench --only links`` writes)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for (model, dtype), part in links.groupby(["model", "dtype"]):
        part = part.sort_values("bandwidth_bps")
        mbit = part["bandwidth_bps"] / 1e6
        line, = axes[0].plot(mbit, part["all_reduce_s"] * 1e3, "o", label=f"{model} {dtype}")
        axes[0].plot(mbit, part["model_s"] * 1e3, "-", color=line.get_color(), lw=1)
        axes[0].plot(mbit, part["model_link_only_s"] * 1e3, ":", color=line.get_color(), lw=1)
        axes[1].plot(mbit, part["efficiency"], "o-", color=line.get_color(), label=f"{model} {dtype}")
    axes[0].set(xscale="log", yscale="log", xlabel="link bandwidth (Mbit/s)", ylabel="all-reduce per step (ms)",
                title="measured (dots), model (lines), link only (dotted)")
    axes[1].set(xscale="log", xlabel="link bandwidth (Mbit/s)", ylabel="scaling efficiency, 2 workers", ylim=(0, 1.1),
                title="training: 2 workers' examples/s / (2 x one)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


#: The file of notebook 10's concept figure, drawn by :func:`concept`, relative to the notebooks' folder.
CONCEPT_FIGURE = "figures/10-critical-batch-size.svg"


def concept(path: str | os.PathLike | None = None, b_crit: float = 256.0) -> Any:
    """Notebook 10's concept figure, a sketch with no measured point: the steps to a target accuracy against
    the batch size, from McCandlish et al.'s model S(B) = S_min (1 + B_crit / B); the linear-scaling line
    S_min B_crit / B that it follows well below the knee, the plateau S_min it approaches well above, and the
    knee B_crit ≈ B_noise, where a run takes twice the fewest steps. The three regimes are shaded where the
    slope d log S / d log B is below −0.8 (B < B_crit / 4) and above −0.2 (B > 4 B_crit). Saved as SVG with
    text kept as text and no date, so that the same call writes the same file (``path``: see
    :data:`CONCEPT_FIGURE`)."""
    import matplotlib.pyplot as plt
    import numpy as np

    batches = np.geomspace(b_crit / 64, b_crit * 64, 200)
    below = batches[batches <= b_crit]
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": "kit-concept-10", "font.size": 10}):
        fig, ax = plt.subplots(figsize=(7.6, 3.8))
        for start, end, colour, text in ((batches[0], b_crit / 4, "C2", "perfect scaling"),
                                         (b_crit / 4, b_crit * 4, "C1", "diminishing returns"),
                                         (b_crit * 4, batches[-1], "C0", "maximal data parallelism")):
            ax.axvspan(start, end, color=colour, alpha=0.12, lw=0)
            ax.text((start * end) ** 0.5, 110, text, ha="center", va="center", fontsize=9)
        ax.plot(below, b_crit / below, ":", color="C2", lw=1.8, label="linear scaling: 2 × the batch, ½ the steps")
        ax.axhline(1, ls=":", color="C0", lw=1.8, label="S_min: the fewest steps any batch reaches")
        ax.plot(batches, 1 + b_crit / batches, color="black", lw=2.2, label="steps to target: S_min (1 + B_crit / B)")
        ax.vlines(b_crit, 0.5, 50, color="grey", ls="--", lw=1)
        ax.plot([b_crit], [2], "o", color="black")
        ax.annotate("B_crit ≈ B_noise\n(the knee: 2 × S_min)", (b_crit, 2), xytext=(10, 10),
                    textcoords="offset points", fontsize=9)
        ax.set(xscale="log", yscale="log", ylim=(0.5, 200), xlim=(batches[0], batches[-1]),
               xlabel="batch size B (more workers: a larger global batch) →",
               ylabel="steps to a target accuracy →")
        ax.set_xticks([]), ax.set_yticks([])
        ax.minorticks_off()
        ax.set_title("A sketch of the model, not a measurement", fontsize=10)
        ax.legend(loc="center right", fontsize=8.5, framealpha=0.9)
        fig.tight_layout()
        return save_figure(fig, path, metadata={"Date": None})
