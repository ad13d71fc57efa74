"""``kit demo``: TensorFlow's tutorial "Multi-worker training with Keras" (notebook 01) on 1 and on N workers, run
with papermill, its table printed. Every value the command accepts runs; nonsense is refused before anything starts."""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

from ..core.view import text_in_kernels_started_here
from .export import DEMO_NOTEBOOK, notebooks_dir


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="train TensorFlow's tutorial 'Multi-worker training with Keras' on 1 and on N "
                                    "workers",
                       description="Runs notebooks/01-single-vs-multi-worker.ipynb (the code of TensorFlow's "
                                   "tutorial 'Multi-worker training with Keras') with papermill: one worker, then "
                                   "MultiWorkerMirroredStrategy on N workers; prints a table and writes the "
                                   "notebook and a loss plot. Every value runs: with one epoch, the notebook "
                                   "checks what one epoch can show and says so.")
    p.add_argument("--workers", type=at_least_one("--workers", 2), default=2,
                   help="workers in the distributed run (default 2; 1 runs it on one worker)")
    p.add_argument("--per-worker-batch", type=at_least_one("--per-worker-batch", 64), default=64,
                   help="batch per worker (default 64)")
    p.add_argument("--epochs", type=at_least_one("--epochs", 3), default=3, help="epochs (default 3)")
    p.add_argument("--steps-per-epoch", type=at_least_one("--steps-per-epoch", 70), default=70,
                   help="steps per epoch (default 70)")
    p.add_argument("--out", default="out", help="output folder (default ./out)")
    p.add_argument("--verbose", action="store_true",
                   help="echo every cell and its output (papermill's log; always written to OUT/demo.log)")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    import papermill

    from .experiments import ipc_kernels

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    output = out / f"01-single-vs-multi-worker_workers-{args.workers}.ipynb"
    notebook = notebooks_dir() / DEMO_NOTEBOOK
    parameters = {"N_WORKERS": args.workers, "PER_WORKER_BATCH": args.per_worker_batch,
                  "EPOCHS": args.epochs, "STEPS_PER_EPOCH": args.steps_per_epoch,
                  "OUT_DIR": str(out)}
    log_file = out / "demo.log"
    shown = ", ".join(f"{k}={v}" for k, v in parameters.items() if k != "OUT_DIR")
    print(f"kit demo: running {notebook.name} ({shown}); "
          f"{'its output follows' if args.verbose else f'its whole log goes to {log_file}'}", flush=True)
    # papermill logs every cell and its output: to the file, and to the terminal only with --verbose;
    # the terminal gets one line per section of the lesson instead
    papermill_log = logging.getLogger("papermill")
    handlers = [logging.FileHandler(log_file, mode="w"), SectionEcho(notebook, prefix="kit demo: ")]
    if args.verbose:
        handlers.append(logging.StreamHandler(sys.stdout))
    for handler in handlers:
        handler.setFormatter(logging.Formatter("%(message)s"))
        papermill_log.addHandler(handler)
    papermill_log.setLevel(logging.INFO)
    papermill_log.propagate = False
    try:
        with text_in_kernels_started_here(), ipc_kernels() as kernels:
            # the kernel works in the output folder: the notebook reads nothing relative to its own
            # folder, and an installed kit's folder (site-packages) need not be writable
            papermill.execute_notebook(str(notebook), str(output), parameters=parameters,
                                       cwd=str(out), kernel_name="python3",
                                       progress_bar=False, log_output=True, **kernels)
    except papermill.PapermillExecutionError as e:
        print(f"kit demo: the notebook failed in cell {e.exec_count}: {e.ename}: {e.evalue}\n"
              f"The partial notebook, with the error at the top, is at {output}; its log is {log_file}",
              file=sys.stderr)
        return 1
    finally:
        for handler in handlers:
            papermill_log.removeHandler(handler)
            handler.close()
    from . import results
    summary = results.read_results(out / "demo-results.json")
    print()
    print(format_table(summary["rows"]))
    agree = summary["workers_agree"]  # None: one worker, no other to agree with
    print(f"\nworkers' losses agree: {'one worker, nothing to compare' if agree is None else agree}")
    print(f"notebook: {output}\nloss curves: {out / 'loss-curves.png'}\nlog: {log_file}")
    return 1 if agree is False else 0


class SectionEcho(logging.Handler):
    """Prints the heading of each section of ``notebook`` (its ``##`` markdown headings) when papermill
    starts the section's first cell, with the seconds since the run began: a few lines of progress.
    ``injected``: papermill added its cell of parameters after the cell tagged ``parameters`` (it does when
    given parameters, as ``kit demo`` does), so the cells after it count one more."""

    def __init__(self, notebook: Path, prefix: str = "", injected: bool = True):
        import time

        super().__init__()
        self.prefix, self.started, self.clock = prefix, time.monotonic(), time.monotonic
        self.sections: dict[int, str] = {}  # papermill's cell number (1-based, every cell) -> heading
        heading, number = "", 0
        for cell in json.loads(notebook.read_text())["cells"]:
            for line in "".join(cell["source"]).splitlines() if cell["cell_type"] == "markdown" else []:
                if line.startswith("## "):
                    heading = line[3:].strip()
            number += 1
            self.sections[number] = heading
            if injected and "parameters" in cell.get("metadata", {}).get("tags", []):
                number += 1  # papermill's cell of injected parameters, after the cell tagged `parameters`
                self.sections[number] = heading
        self.shown = ""

    def emit(self, record: logging.LogRecord) -> None:
        match = re.match(r"Executing Cell (\d+)", record.getMessage())
        heading = self.sections.get(int(match.group(1)), "") if match else ""
        if heading and heading != self.shown:
            self.shown = heading
            print(f"{self.prefix}{self.clock() - self.started:5.1f}s  {heading}", flush=True)


def format_table(rows: list[dict]) -> str:
    """A fixed-width text table of the demo's per-task rows (a value not measured shows as "-")."""
    def number(value: float | None, width: int, digits: int) -> str:
        return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"

    header = f"{'run':<16}{'task':<10}{'final loss':>11}{'accuracy':>10}{'examples/s':>12}{'wall s':>8}"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r['run']:<16}{r['task']:<10}{number(r['loss'], 11, 4)}{number(r['accuracy'], 10, 4)}"
                     f"{number(r['examples_per_second'], 12, 0)}{number(r['wall_seconds'], 8, 1)}")
    return "\n".join(lines)


def at_least_one(option: str, example: int):
    """argparse type for ``option``: a whole number of at least 1, else refused before the demo starts anything."""
    def parse(text: str) -> int:
        if not re.fullmatch(r"\s*\d+\s*", text) or int(text) < 1:
            raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}. Fix: e.g. {option} "
                                             f"{example}")
        return int(text)
    return parse
