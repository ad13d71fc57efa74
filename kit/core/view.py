"""The live view of a ``cluster.run``: one row per task with its state, progress, loss and speed.

The state of every task lives in one :class:`RunView`; how it is shown is chosen once
(``ClusterOptions.view``), by composition:

- ``widget``: an ipywidgets table, redrawn at most 4 times a second, and each task's output in a
  collapsed panel (its log) instead of a wall of interleaved lines in the cell;
- ``text``: each task's lines printed with its name in front, and its progress at most every
  :data:`TEXT_PROGRESS_SECONDS` (papermill, nbval, a terminal: no widget frontend there).

Tasks send progress with :mod:`kit.train.progress`; the states come from the cluster (``ready``,
``restarting``) and from ipyparallel's metadata of the run (``running``, ``done``, ``failed``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import logging
import os
import sys
import time
from typing import Any, Iterable

from .tfconfig import PROGRESS_KEY as KEY

log = logging.getLogger("kit.core.view")

#: The states a task goes through, in order, and the colour of each in the table.
_COLOURS = {"starting": "#6c757d", "ready": "#6c757d", "running": "#0d6efd", "done": "#198754",
            "failed": "#dc3545", "restarting": "#fd7e14"}
#: The text view prints a task's progress at most this often (seconds): enough to see it move,
#: few enough lines that a 3-minute run adds about 20 per task.
TEXT_PROGRESS_SECONDS = 10.0
#: The widget's table is redrawn at most this often (seconds); each redraw is one comm message.
WIDGET_REDRAW_SECONDS = 0.25


@dataclasses.dataclass
class TaskRow:
    """What the view knows of one task."""

    name: str
    address: str = ""
    pid: int | None = None
    state: str = "ready"
    progress: dict = dataclasses.field(default_factory=dict)
    restarts: int = 0
    note: str = ""  #: why it failed (one line)
    started: float | None = None
    finished: float | None = None

    def fraction(self) -> float | None:
        """How far along the task is (0..1), from its epochs and steps; None if it did not say."""
        p = self.progress
        steps, epochs = p.get("steps"), p.get("epochs")
        if steps:
            done_epochs = max(0, (p.get("epoch") or 1) - 1)
            total = steps * (epochs or 1)
            return min(1.0, (done_epochs * steps + (p.get("step") or 0)) / total)
        if epochs:
            return min(1.0, (p.get("epochs_done") or 0) / epochs)
        return None

    def summary(self) -> str:
        """Progress in words: epoch, step, loss, examples/s (whatever the task published)."""
        p = self.progress
        parts = []
        if p.get("epochs"):
            parts.append(f"epoch {p.get('epoch') or 0}/{p['epochs']}")
        if p.get("steps"):
            parts.append(f"step {p.get('step') or 0}/{p['steps']}")
        elif p.get("step") is not None:
            parts.append(f"step {p['step']}")
        if p.get("loss") is not None:
            parts.append(f"loss {p['loss']:.4f}")
        if p.get("examples_per_second"):
            parts.append(f"{p['examples_per_second']:,.0f} examples/s")
        elif p.get("steps_per_second"):
            parts.append(f"{p['steps_per_second']:.1f} steps/s")
        return "  ".join(parts)

    def lag(self) -> float | None:
        """Seconds from the task's last progress report to its result (None if either is missing).

        A training function's last report comes with its last step (:func:`kit.train.progress.callback`),
        so this is the time the function spent after training: notebook 01 measures with it how
        late ``fit`` returns when TensorFlow's input pipeline is slow to shut down.
        """
        reported = self.progress.get("time")
        if reported is None or self.finished is None or self.state != "done":
            return None
        return max(0.0, self.finished - reported)

    def elapsed(self, now: float | None = None) -> float | None:
        if self.started is None:
            return None
        return (self.finished or now or time.time()) - self.started


def _cell(content: str, style: str = "") -> str:
    return f'<td style="text-align:left;padding:0 .6em;{style}">{content}</td>'


def render_html(title: str, rows: Iterable[TaskRow], now: float | None = None) -> str:
    """The table of tasks as HTML (``table.kit-view``, a ``tr[data-kit-task][data-kit-state]`` per
    task, so that a browser test can read the states)."""
    lines = []
    for row in rows:
        fraction = row.fraction()
        bar = (f'<progress max="1" value="{fraction:.3f}" style="width:9em"></progress> {100 * fraction:.0f}%'
               if fraction is not None else "")
        elapsed = row.elapsed(now)
        cells = [_cell(f"<b>{html.escape(row.name)}</b>"), _cell(f"<code>{html.escape(row.address or '-')}</code>"),
                 _cell(str(row.pid or "")),
                 _cell(row.state, f"color:{_COLOURS.get(row.state, '#000')};font-weight:bold"),
                 _cell(bar), _cell(html.escape(row.summary())),
                 _cell("" if elapsed is None else f"{elapsed:.1f} s"), _cell(str(row.restarts or "")),
                 _cell(html.escape(row.note))]
        lines.append(f'<tr data-kit-task="{html.escape(row.name)}" data-kit-state="{row.state}">{"".join(cells)}</tr>')
    head = "".join(f'<th style="text-align:left;padding:0 .6em">{h}</th>'
                   for h in ("task", "address", "pid", "state", "progress", "latest", "time", "restarts", "note"))
    return (f'<div class="kit-view-title"><b>{html.escape(title)}</b></div>'
            f'<table class="kit-view" style="border-collapse:collapse"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(lines)}</tbody></table>')


def choose(mode: str) -> str:
    """'widget' or 'text' for a ``ClusterOptions.view`` choice ('auto': a widget in a Jupyter kernel
    that has ipywidgets)."""
    if mode != "auto":
        return mode
    try:
        from IPython import get_ipython
        import ipywidgets  # noqa: F401 - only whether it is there
    except ImportError:
        return "text"
    shell = get_ipython()
    return "widget" if shell is not None and getattr(shell, "kernel", None) is not None else "text"


@contextlib.contextmanager
def text_in_kernels_started_here():
    """Kernels started inside this block (papermill's, nbclient's) show runs as text: they have no
    widget frontend, and the notebook they save is read as text. ``$KIT_VIEW`` wins if set."""
    if "KIT_VIEW" in os.environ:
        yield
        return
    os.environ["KIT_VIEW"] = "text"
    try:
        yield
    finally:
        os.environ.pop("KIT_VIEW", None)


class _TextOutput:
    """Prints task lines with the task's name in front, and progress at most every 10 s."""

    def __init__(self, show_lines: bool):
        self.show_lines = show_lines
        self._printed: dict[str, float] = {}

    def line(self, name: str, stream: str, text: str) -> None:
        if self.show_lines:
            print(f"[{name}] {text}", file=sys.stderr if stream == "stderr" else sys.stdout, flush=True)

    def draw(self, title: str, rows: list[TaskRow], final: bool) -> None:
        # at the end of a run (every task done or failed), in a kernel: the table of tasks once, as text for
        # papermill's and nbval's logs and as the widget's HTML table (render_html) for a page of the
        # executed notebook (make site); no second table while nothing changed (a timeout fails each task)
        if final and rows and all(row.state in ("done", "failed") for row in rows):
            from IPython import get_ipython

            shell = get_ipython()
            page = render_html(title, rows)
            if shell is not None and getattr(shell, "kernel", None) is not None and page != getattr(self, "_shown", ""):
                from IPython.display import display

                self._shown = page
                width = max(len(row.name) for row in rows)
                text = "\n".join([title] + [f"{row.name:<{width}}  {row.state:<6}  "
                                            f"{'' if row.elapsed() is None else f'{row.elapsed():6.1f} s'}  "
                                            f"{row.summary()}{f'  restarts {row.restarts}' if row.restarts else ''}"
                                            f"{'  ' + row.note if row.note else ''}".rstrip()
                                            for row in rows])
                display({"text/plain": text, "text/html": page}, raw=True)
        if not self.show_lines:
            return
        now = time.monotonic()
        for row in rows:
            if row.state != "running" or not row.progress.get("step"):
                continue
            if now - self._printed.get(row.name, now - TEXT_PROGRESS_SECONDS - 1) >= TEXT_PROGRESS_SECONDS:
                self._printed[row.name] = now
                print(f"[{row.name}] {row.summary()}", flush=True)

    def event(self, text: str) -> None:
        print(f"[kit] {text}", file=sys.stderr, flush=True)


class _WidgetOutput:
    """An ipywidgets table and a collapsed log panel per task."""

    def __init__(self, names: list[str], show_logs: bool = True):
        import ipywidgets as widgets
        from IPython.display import display

        self.table = widgets.HTML()
        self.events = widgets.HTML()
        self.logs = {name: widgets.Output(layout=widgets.Layout(max_height="24em", overflow="auto"))
                     for name in names}
        self.counts = dict.fromkeys(names, 0)
        self.pending: dict[str, list[tuple[str, str]]] = {name: [] for name in names}
        self.panel = widgets.Accordion(children=list(self.logs.values()), selected_index=None)
        self._titles()
        self._last = 0.0
        self._html = ""
        # stream=False: the table alone (the logs stay in cluster.output)
        display(widgets.VBox([self.table, self.events, self.panel] if show_logs else [self.table, self.events]))

    def _titles(self) -> None:
        for i, name in enumerate(self.logs):
            count = self.counts[name]
            self.panel.set_title(i, f"{name} log ({count} line{'' if count == 1 else 's'})")

    def line(self, name: str, stream: str, text: str) -> None:
        self.pending[name].append((stream, text))

    def draw(self, title: str, rows: list[TaskRow], final: bool) -> None:
        now = time.monotonic()
        if not final and now - self._last < WIDGET_REDRAW_SECONDS:
            return
        self._last = now
        for name, lines in self.pending.items():
            for stream in ("stdout", "stderr"):
                text = "".join(f"{line}\n" for s, line in lines if s == stream)
                if text:
                    (self.logs[name].append_stderr if stream == "stderr" else self.logs[name].append_stdout)(text)
            self.counts[name] += len(lines)
            lines.clear()
        self._titles()
        page = render_html(title, rows)
        if page != self._html:
            self._html = page
            self.table.value = page

    def event(self, text: str) -> None:
        self.events.value += f"<div>{html.escape(text)}</div>"


class RunView:
    """The state of every task during one ``cluster.run`` (restarts included), shown one way."""

    def __init__(self, title: str, tasks: list, mode: str = "text", show_lines: bool = True):
        self.title = title
        self.rows = {t.name: TaskRow(t.name, address=t.address or t.host, pid=t.pid) for t in tasks}
        self.mode = mode
        self.output = _WidgetOutput(list(self.rows), show_lines) if mode == "widget" else _TextOutput(show_lines)
        self.draw()

    # ----- from the cluster ------------------------------------------------------------------
    def line(self, name: str, stream: str, text: str) -> None:
        """One line of a task's output (for its log)."""
        self.output.line(name, stream, text)

    def follow(self, result: Any, names: list[str]) -> None:
        """Read the states and the newest progress of ``names`` from an ipyparallel AsyncResult."""
        for name, meta in zip(names, result.metadata):  # a view on a list of engines: one each
            row = self.rows[name]
            progress = (meta.get("data") or {}).get(KEY)
            if progress:
                row.progress.update(progress)
            status = meta.get("status")
            if status == "ok" and row.state != "done":
                row.state, row.finished = "done", time.time()
            elif status == "error" and row.state != "failed":
                row.state, row.finished = "failed", time.time()
                error = meta.get("error")
                row.note = f"{getattr(error, 'ename', 'error')}: {getattr(error, 'evalue', '')}"[:160]
        self.draw()

    def submitted(self, names: list[str]) -> None:
        """``names`` were given the function: running from now (the engines are idle, so they
        start at once; ipyparallel's own "started" time only arrives with the reply)."""
        now = time.time()
        for name in names:
            row = self.rows[name]
            row.state, row.started, row.finished, row.note = "running", now, None, ""
        self.draw()

    def fail(self, name: str, note: str) -> None:
        row = self.rows[name]
        row.state, row.note, row.finished = "failed", note[:160], time.time()
        self.draw(final=True)

    def restarting(self, text: str) -> None:
        for row in self.rows.values():
            row.state = "restarting"  # every engine is replaced, the failed one's note stays
        self.event(text)
        self.draw(final=True)

    def restarted(self, tasks: list, text: str) -> None:
        for task in tasks:
            row = self.rows.get(task.name)
            if row is None:
                continue
            row.address, row.pid = task.address or task.host, task.pid
            row.state, row.restarts, row.note = "ready", row.restarts + 1, ""
            row.progress.clear()
            row.started = row.finished = None
        self.event(text)
        self.draw(final=True)

    def event(self, text: str) -> None:
        """A line about the whole run (a failure, a restart, giving up): shown, and logged to the
        ``kit.core.view`` logger (INFO), the one channel for supervision messages."""
        log.info("%s: %s", self.title, text)
        self.output.event(text)

    def draw(self, final: bool = False) -> None:
        self.output.draw(self.title, list(self.rows.values()), final)

    def states(self) -> dict[str, str]:
        return {name: row.state for name, row in self.rows.items()}

    def lags(self) -> dict[str, float | None]:
        """Each task's :meth:`TaskRow.lag`: seconds from its last progress report to its result."""
        return {name: row.lag() for name, row in self.rows.items()}

    def measurements(self) -> dict[str, dict]:
        """What each task reported (``kit.Progress``'s ``examples_per_second``, ``epoch_seconds``,
        ``step_loss``, ``logged_loss``, or any field a callback published), with ``wall_seconds`` (from the
        function's start to its result) and ``lag_seconds`` (:meth:`TaskRow.lag`) that the kit measured."""
        return {name: {**{k: v for k, v in row.progress.items() if k != "time"},
                       "wall_seconds": row.elapsed(), "lag_seconds": row.lag()}
                for name, row in self.rows.items()}

    def _repr_html_(self) -> str:
        return render_html(self.title, self.rows.values())
