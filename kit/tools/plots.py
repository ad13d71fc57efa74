"""Figures the notebooks and the CLI share, saved as PNG next to the results."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..core.files import save_figure


def loss_curves(runs: Mapping[str, Sequence[float]], path: str | os.PathLike | None = None,
                title: str = "Training loss per step", xlabel: str = "step"):
    """One line per run (label → loss per step); saved to ``path`` as PNG when given."""
    import matplotlib.pyplot as plt  # headless machines fall back to the Agg backend by themselves

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, losses in runs.items():
        ax.plot(range(1, len(losses) + 1), losses, label=label)
    _finish(fig, ax, xlabel, "loss", title)
    return save_figure(fig, path)



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
    _finish(fig, ax, "global step", "loss (running mean within the epoch)",
            title or "Training through a failure")
    return save_figure(fig, path)


# ----- scaling studies (notebook 08, `kit plot DIR`) ---------------------------------------------
#: File names :func:`plot_results` gives its figures.
FIGURES = {"accuracy_vs_batch": "accuracy-vs-batch.png", "loss_vs_examples": "loss-vs-examples.png",
           "throughput": "throughput.png"}
_RULE_COLOURS = {"none": "tab:gray", "linear": "tab:blue", "sqrt": "tab:orange"}


def series_label(lr_rule: str, warmup: object = False) -> str:
    """``linear``, or ``linear + warmup``: how a run's learning-rate schedule is named in legends."""
    return f"{lr_rule} + warmup" if _truthy(warmup) else str(lr_rule)


def _truthy(value: object) -> bool:
    if value is None:
        return False
    if isinstance(value, float) and value != value:  # NaN: a table without warmup for that row
        return False
    return bool(value)


def _ok_rows(table, needed: Sequence[str]):
    """The table's successful rows that have ``needed`` columns; KitError naming what is missing."""
    from ..core.errors import KitError

    missing = [c for c in needed if c not in table.columns]
    if missing:
        raise KitError(f"the results table has no column(s) {', '.join(missing)}. Fix: record them "
                       "from the notebook (kit.tools.experiments.record(RESULTS_PATH, ...))")
    rows = table[table["status"] == "ok"] if "status" in table.columns else table
    if rows.empty:
        raise KitError("the results table has no successful run. Fix: look at its error column, "
                       "fix the notebook, and run the sweep again (resume reruns failed points)")
    rows = rows.copy()
    warmup = rows["warmup"] if "warmup" in rows.columns else [False] * len(rows)
    rows["series"] = [series_label(r, w) for r, w in zip(rows["lr_rule"] if "lr_rule" in rows.columns
                                                          else ["run"] * len(rows), warmup)]
    return rows


def _order(series: str) -> tuple:
    """Legend order: none, linear, sqrt (then other rules), each without then with warmup."""
    rule = series.split(" + ")[0]
    known = list(_RULE_COLOURS)
    return (known.index(rule) if rule in known else len(known), rule, series.endswith("warmup"))


def _style(series: str, index: int) -> dict:
    rule = series.split(" + ")[0]
    colour = _RULE_COLOURS.get(rule, f"C{3 + index % 7}")
    return {"color": colour, "linestyle": "--" if series.endswith("warmup") else "-"}


def _finish(fig, ax, xlabel: str, ylabel: str, title: str) -> None:
    """The look every figure shares: labels, title, light grid, legend, tight layout."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()


def accuracy_vs_batch(table, path: str | os.PathLike | None = None, accuracy: str = "test_accuracy",
                      loss: str = "final_loss", batch: str = "global_batch"):
    """Final accuracy and final loss against the global batch, one line per learning-rate rule.

    Every run saw the same number of examples, so the x axis is also "fewer, larger steps".
    Runs with the same rule and global batch (e.g. 1×128 and 2×64) are averaged; each is a dot.
    """
    import matplotlib.pyplot as plt

    rows = _ok_rows(table, [batch, accuracy, loss, "lr_rule"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, (series, group) in enumerate(sorted(rows.groupby("series"), key=lambda g: _order(g[0]))):
        style = _style(series, i)
        for ax, column in zip(axes, (accuracy, loss)):
            values = group[[batch, column]].astype(float)
            mean = values.groupby(batch)[column].mean()
            ax.plot(mean.index, mean.values, marker="o", label=series, **style)
            ax.scatter(values[batch], values[column], s=12, color=style["color"], alpha=0.5)
    batches = sorted(rows[batch].astype(int).unique())
    for ax, column, title in ((axes[0], accuracy, "final accuracy"), (axes[1], loss, "final loss")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.minorticks_off()
        ax.set_xlabel("global batch (workers × per-worker batch)")
        ax.set_ylabel(column)
        ax.set_title(f"{title} vs global batch (same examples per run)")
        ax.grid(alpha=0.3)
    diverged = rows[rows[loss].isna()]
    if len(diverged):  # NaN loss: mark the run at the top of the loss panel
        top = axes[1].get_ylim()[1]
        for n, (_, row) in enumerate(diverged.iterrows()):
            axes[1].scatter([float(row[batch])], [top], marker="x", s=60, zorder=3,
                            color=_style(row["series"], 0)["color"],
                            label="diverged (NaN), at the top" if n == 0 else None)
        axes[1].legend(fontsize=8)
    axes[0].legend(title="learning-rate rule")
    fig.tight_layout()
    return save_figure(fig, path)


def loss_vs_examples(table, path: str | os.PathLike | None = None, curve: str = "loss_curve",
                     batch: str = "global_batch", smooth_examples: int = 1024, ymax: float = 2.6):
    """Per-step training loss against examples seen: one panel per global batch, one line per rule.

    Each curve is smoothed over about ``smooth_examples`` examples; a loss above ``ymax`` (a run
    that diverged, or NaN) leaves the panel at the top.
    """
    import math

    import matplotlib.pyplot as plt

    from ..train.scaling import smooth

    rows = _ok_rows(table, [batch, curve, "lr_rule"])
    rows = rows[rows[curve].map(lambda c: isinstance(c, (list, tuple)) and len(c) > 0)]
    batches = sorted(rows[batch].astype(int).unique())
    if not batches:
        from ..core.errors import KitError

        raise KitError(f"no successful run has a {curve!r} curve. Fix: record the per-step losses, "
                       f"e.g. kit.tools.experiments.record(RESULTS_PATH, {curve}=[...])")
    columns = min(4, len(batches))
    nrows = math.ceil(len(batches) / columns)
    fig, axes = plt.subplots(nrows, columns, figsize=(3.6 * columns, 3.2 * nrows), squeeze=False,
                             sharey=True)
    series_order = sorted(rows["series"].unique(), key=_order)
    for ax, size in zip(axes.flat, batches):
        group = rows[rows[batch].astype(int) == size]
        group = group.iloc[sorted(range(len(group)), key=lambda n: _order(group["series"].iloc[n]))]
        for _, row in group.iterrows():
            i = series_order.index(row["series"])
            losses = [float("nan") if v is None else float(v) for v in row[curve]]
            y = smooth(losses, max(1, round(smooth_examples / size)))
            x = [(n + 1) * size for n in range(len(y))]
            split = f" ({int(row['workers'])}×{int(row['per_worker_batch'])})" \
                if {"workers", "per_worker_batch"} <= set(row.index) and \
                group["series"].tolist().count(row["series"]) > 1 else ""
            diverged = not all(math.isfinite(v) for v in losses) or (y and y[-1] > ymax)
            ax.plot(x, [min(v, ymax * 1.05) if math.isfinite(v) else ymax * 1.05 for v in y],
                    label=row["series"] + split + (" (diverged)" if diverged else ""),
                    **_style(row["series"], i))
        ax.set_title(f"global batch {size}")
        ax.set_ylim(0, ymax * 1.06)
        ax.set_xlabel("examples seen")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel("training loss (smoothed)")
    for ax in list(axes.flat)[len(batches):]:
        ax.set_visible(False)
    fig.suptitle("Loss vs examples seen, per learning-rate rule")
    fig.tight_layout()
    return save_figure(fig, path)


def warmup_ramp(trial: Mapping[str, Any], path: str | os.PathLike | None = None):
    """The learning rate at every step of one planned ``trial`` (notebook 08's ``plan``: ``learning_rate``,
    ``warmup_steps``, ``warmup_from``, ``steps``, ``global_batch``, ``k``), computed by
    :func:`kit.train.scaling.warmup_learning_rate`, drawn as steps."""
    import matplotlib.pyplot as plt

    from ..train.scaling import warmup_learning_rate

    steps = range(int(trial["steps"]))
    ramp = [warmup_learning_rate(step, trial["learning_rate"], trial["warmup_steps"], trial["warmup_from"])
            for step in steps]
    fig, ax = plt.subplots(figsize=(6, 2.5))
    ax.step(steps, ramp, where="post")
    ax.set(xlabel="step", ylabel="learning rate", title=f"gradual warmup: global batch {trial['global_batch']}, "
           f"k = {trial['k']:g}, {trial['warmup_steps']} of {trial['steps']} steps")
    fig.tight_layout()
    return save_figure(fig, path)


def throughput(table, path: str | os.PathLike | None = None, by: str = "per_worker_batch"):
    """Examples/s and scaling efficiency against the number of workers, one line per ``by`` value.

    Dashed: ideal scaling (N × one worker's throughput). Efficiency = throughput(N) / (N × one worker).
    """
    import matplotlib.pyplot as plt

    from ..train.scaling import scaling_efficiency

    rows = _ok_rows(table, ["workers", by, "examples_per_second"])
    speed = scaling_efficiency(rows, by=by)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    workers = sorted(speed["workers"].astype(int).unique())
    for i, (value, group) in enumerate(speed.groupby(by)):
        colour = f"C{i}"
        axes[0].plot(group["workers"], group["examples_per_second"], marker="o", color=colour,
                     label=f"{by} {value}")
        one = group[group["workers"] == 1]["examples_per_second"]
        if len(one):
            axes[0].plot(workers, [float(one.iloc[0]) * n for n in workers], linestyle="--",
                         color=colour, alpha=0.5)
        axes[1].plot(group["workers"], group["efficiency"], marker="o", color=colour,
                     label=f"{by} {value}")
    axes[1].axhline(1.0, color="black", linewidth=0.8, label="ideal")
    for ax, title in ((axes[0], "examples/s (dashed: N × one worker)"),
                      (axes[1], "scaling efficiency = speed-up / workers")):
        ax.set_xticks(workers)
        ax.set_xlabel("workers")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("examples per second")
    axes[1].set_ylabel("efficiency")
    axes[1].set_ylim(0, max(1.1, float(speed["efficiency"].max()) * 1.1)
                     if speed["efficiency"].notna().any() else 1.1)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_results(source, out_dir: str | os.PathLike | None = None, close: bool = True) -> dict:
    """Every figure the results table allows, saved as PNG in ``out_dir``; returns name → path.

    ``source`` is a sweep's folder (its ``results.json``) or a results DataFrame (then ``out_dir``
    is needed). Figures whose columns the table lacks are left out; none at all is a KitError.
    """
    import matplotlib.pyplot as plt

    from ..core.errors import KitError
    from .experiments import load_results

    if isinstance(source, (str, os.PathLike)):
        table, folder = load_results(source), Path(source)
    else:
        table, folder = source, None
    folder = Path(out_dir) if out_dir is not None else folder
    if folder is None:
        raise KitError("plot_results got a table but no out_dir. Fix: pass out_dir=FOLDER for the PNGs")
    makers = {"accuracy_vs_batch": accuracy_vs_batch, "loss_vs_examples": loss_vs_examples,
              "throughput": throughput}
    written, reasons = {}, []
    for name, maker in makers.items():
        try:
            fig = maker(table, folder / FIGURES[name])
        except KitError as e:
            reasons.append(f"{name}: {e}")
            continue
        written[name] = folder / FIGURES[name]
        if close:
            plt.close(fig)
    if not written:
        raise KitError("no figure fits this results table:\n  " + "\n  ".join(reasons) + "\nFix: record what the "
                       "reasons above name in the sweep's notebook, then run the sweep again")
    return written


