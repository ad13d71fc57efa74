"""Parameter sweeps over a notebook with papermill, and the results table they build.

    table = kit.tools.experiments.sweep("trials/scaling-trial.ipynb",
                                  {"workers": [1, 2], "lr_rule": ["none", "linear"]}, "out/sweep")

runs the notebook once per grid point, each run in a fresh kernel (so each notebook starts, and
stops, its own cluster), with the point's values injected after the notebook's ``parameters`` cell.
Every executed notebook is kept under ``out_dir`` with a name built from its parameters
(``scaling-trial_lr_rule-linear_workers-2.ipynb``). The notebook hands its metrics back with

    kit.tools.experiments.record(RESULTS_PATH, accuracy=0.97, examples_per_second=1800.0)

where ``RESULTS_PATH`` is a parameter (default ``None``) that the sweep sets to a JSON file next to
the executed notebook. A notebook without ``RESULTS_PATH`` is swept too: its rows hold the point's
parameters, ``status`` and ``seconds`` (wall time). The sweep gathers parameters + metrics into ``results.csv`` and
``results.json`` in ``out_dir`` (:func:`load_results` reads them back as a pandas DataFrame). A run
that fails becomes a row with its error, its partial notebook is kept (papermill saves it with the
error at the top), and the sweep goes on. With ``resume=True`` a point whose metrics file exists,
recorded with the same parameters, is not run again: an interrupted sweep loses nothing.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..core.errors import GridError, KitError
from ..core.files import write_atomic
from ..core.view import text_in_kernels_started_here

#: The parameter through which a sweep tells the notebook where to record its metrics.
RESULTS_PARAMETER = "RESULTS_PATH"
TABLE_CSV = "results.csv"
TABLE_JSON = "results.json"
METRICS_SUFFIX = ".metrics.json"
#: Columns the sweep adds to each row; notebooks cannot record metrics with these names.
RESERVED = ("status", "error", "notebook", "seconds", "reused")
_SCALARS = (str, int, float, bool, type(None))


# ----- inside the notebook ----------------------------------------------------------------------
def record(results_path: str | os.PathLike | None, **metrics: Any) -> dict[str, Any]:
    """Hand this run's metrics to the sweep running the notebook; return them (JSON-ready).

    ``results_path`` is the notebook's ``RESULTS_PATH`` parameter: ``None`` when the notebook runs
    on its own (nothing is written), a file path when :func:`sweep` runs it. Values may be numbers,
    strings, booleans, lists (e.g. a loss curve) or numpy scalars and arrays; NaN and infinities
    (a diverged loss) become ``None`` (JSON has no NaN).
    """
    taken = [name for name in metrics if name in RESERVED]
    if taken:
        raise KitError(f"metric name(s) {', '.join(taken)} are reserved for the sweep's own columns "
                       f"({', '.join(RESERVED)}). Fix: rename them, e.g. {taken[0]}_value=...")
    clean = {name: _jsonable(value, name) for name, value in metrics.items()}
    if results_path is not None:
        from . import results
        results.save_results(results_path, {"metrics": clean})
    return clean


def _jsonable(value: Any, name: str) -> Any:
    if isinstance(value, float) or type(value).__name__.startswith("float"):
        number = float(value)
        return number if math.isfinite(number) else None
    if isinstance(value, (bool, int, str, type(None))):
        return value
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return _jsonable(value.tolist(), name)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, name) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, name) for k, v in value.items()}
    raise KitError(f"metric {name!r} is a {type(value).__name__}, which JSON cannot hold. Fix: record "
                   "numbers, strings, booleans, or lists and dicts of them")


# ----- the grid ---------------------------------------------------------------------------------
def grid_points(grid: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The points of ``grid``: the Cartesian product of a mapping name → values, in order.

    A list of mappings is taken as the points themselves (all with the same names). A value that is
    not a list or tuple counts as a single value.
    """
    if isinstance(grid, Mapping):
        axes = {}
        for name, values in grid.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise GridError(str(name), "is not a Python identifier",
                                "name the grid entries after the notebook's parameters")
            values = list(values) if isinstance(values, (list, tuple)) else [values]
            if not values:
                raise GridError(name, "has no values", f"give at least one, e.g. {{{name!r}: [1, 2]}}")
            for value in values:
                _check_scalar(name, value)
            repeated = sorted({repr(v) for v in values if values.count(v) > 1})
            if repeated:
                raise GridError(name, f"lists {', '.join(repeated)} more than once",
                                "give each value once")
            axes[name] = values
        return [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]
    if isinstance(grid, (str, bytes)) or not isinstance(grid, Iterable):
        raise GridError(None, f"is a {type(grid).__name__}",
                        "give a dict of parameter name → list of values, or a list of such dicts")
    points = [dict(p) if isinstance(p, Mapping) else p for p in grid]
    if not points or not all(isinstance(p, dict) for p in points):
        raise GridError(None, "is not a non-empty list of dicts",
                        "give e.g. [{'workers': 1}, {'workers': 2}]")
    names = list(points[0])
    for point in points:
        if set(point) != set(names):
            odd = sorted(set(point) ^ set(names))[0]
            raise GridError(odd, f"is in some points and not in others ({point})",
                            "give every point the same parameters")
        for name, value in point.items():
            _check_scalar(name, value)
    return points


def _check_scalar(name: str, value: Any) -> None:
    if not isinstance(value, _SCALARS) or (isinstance(value, float) and not math.isfinite(value)):
        raise GridError(name, f"value {value!r} is a {type(value).__name__}",
                        "use numbers, strings, booleans or None (one value per grid point)")


def _format_value(value: Any) -> str:
    text = repr(value) if isinstance(value, float) else str(value)
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_") or "_"


def point_name(stem: str, point: Mapping[str, Any]) -> str:
    """``stem_name-value_...`` with the names sorted, as papermill's ``parameterize_path`` would."""
    return "_".join([stem, *(f"{k}-{_format_value(point[k])}" for k in sorted(point))])


_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,)}


def validate_grid(notebook: str | os.PathLike, grid: Mapping[str, Any] | Sequence[Mapping[str, Any]],
                  parameters: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Check ``grid`` (and fixed ``parameters``) against the notebook's parameters cell; return the points.

    Every name must be a parameter of the notebook (``papermill.inspect_notebook``), and each value of the
    type of the notebook's default. ``RESULTS_PATH`` is optional: a notebook without it records nothing,
    and its rows keep the parameters, the status and the wall time.
    """
    import papermill

    path = Path(notebook)
    if path.suffix != ".ipynb" or not path.is_file():
        raise KitError(f"{path} is not a notebook file. Fix: give the path of an .ipynb file")
    points = grid_points(grid)
    fixed = dict(parameters or {})
    defined = papermill.inspect_notebook(str(path))
    if not defined:
        raise KitError(f"{path.name} has no cell tagged 'parameters'. Fix: tag the cell that holds its "
                       "tunables with 'parameters' (papermill injects the grid's values after it)")
    both = sorted(set(points[0]) & set(fixed))
    if both:
        raise GridError(both[0], "is both a grid axis and a fixed parameter",
                        "keep it in one of the two")
    for name, value in [*((n, v) for p in points for n, v in p.items()), *fixed.items()]:
        if name == RESULTS_PARAMETER:
            raise GridError(name, "is set by the sweep itself", f"remove {name} from the grid")
        if name not in defined:
            known = ", ".join(n for n in defined if n != RESULTS_PARAMETER)
            raise GridError(name, f"is not a parameter of {path.name} (its parameters cell defines "
                                  f"{known})", "use one of those names (they are case-sensitive), or "
                                               f"add `{name} = ...` to the notebook's parameters cell")
        _check_scalar(name, value)
        expected = _default_type(defined[name])
        types = _TYPES.get(expected)
        if types and value is not None and (not isinstance(value, types) or
                                            (isinstance(value, bool) and bool not in types)):
            raise GridError(name, f"value {value!r} is of type {type(value).__name__}, but the "
                                  f"notebook's default ({defined[name]['default']}) is of type {expected}",
                            f"give {expected} values")
    names = [point_name(path.stem, p) for p in points]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise GridError(None, f"two points get the same file name {clash[0]}",
                        "make the values differ in letters or digits, not only in punctuation")
    return points


def _default_type(parameter: Mapping[str, Any]) -> str | None:
    """The type of a notebook parameter: its annotation, else the type of its default's literal."""
    import ast

    annotated = parameter.get("inferred_type_name")
    if annotated and annotated != "None":
        return str(annotated)
    try:
        default = ast.literal_eval(str(parameter.get("default")))
    except (ValueError, SyntaxError):
        return None  # an expression: any value goes
    return None if default is None else type(default).__name__


def parse_value(text: str, type_name: str | None = None) -> Any:
    """A command-line value as the notebook's parameter wants it (``type_name`` from papermill).

    Without a type: True/False/None, then int, then float, else the text (as ``papermill -p``).
    """
    if type_name == "str":
        return text
    if text in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[text]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def parse_grid_text(notebook: str | os.PathLike, pairs: Sequence[Sequence[str]]) -> dict[str, list]:
    """``[["workers", "1", "2"], ["lr_rule", "none"]]`` → a grid, typed by the notebook's defaults."""
    import papermill

    defined = papermill.inspect_notebook(str(notebook)) if Path(notebook).is_file() else {}
    grid: dict[str, list] = {}
    for name, *values in pairs:
        if not values:
            raise GridError(name, "has no values", f"write e.g. -p {name} 1 2")
        if name in grid:
            raise GridError(name, "is given twice", f"list all its values after one -p {name}")
        type_name = _default_type(defined[name]) if name in defined else None
        grid[name] = [parse_value(v, type_name) for v in values]
    return grid


# ----- the sweep --------------------------------------------------------------------------------
@contextlib.contextmanager
def ipc_kernels():
    """Keyword arguments for ``papermill.execute_notebook`` whose kernel talks to it over unix sockets in
    a private folder (0700, removed afterwards) instead of TCP on localhost: no other local user can
    connect, and ipykernel prints no "Kernel is running over TCP without encryption" warning for
    every run. The folder is under the temporary one: a socket's path must stay under 108 bytes."""
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    folder = tempfile.mkdtemp(prefix="kit-kernel-")

    class IPCKernelManager(AsyncKernelManager):
        transport = "ipc"

        @default("ip")
        def _ip_default(self) -> str:  # the sockets' path prefix; ipykernel adds -1, -2, ...
            return os.path.join(folder, "kernel")

    try:
        yield {"kernel_manager_class": IPCKernelManager}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def sweep(notebook: str | os.PathLike, grid: Mapping[str, Any] | Sequence[Mapping[str, Any]],
          out_dir: str | os.PathLike, resume: bool = True, *, parameters: Mapping[str, Any] | None = None,
          cwd: str | os.PathLike | None = None, kernel_name: str | None = None,
          timeout: float | None = None, progress: bool = True, log_output: bool = False):
    """Run ``notebook`` once per point of ``grid``; return the results table (a pandas DataFrame).

    - ``grid``: parameter name → values (their Cartesian product), or a list of points (dicts).
    - ``parameters``: fixed values for every run (not part of the file names).
    - ``out_dir``: gets one executed notebook and one metrics file per point, and the table
      (``results.csv``, ``results.json``), rewritten after every run.
    - ``resume``: skip points already done with the same parameters (their metrics file exists).
    - ``cwd``: the kernel's working directory (default: the notebook's folder, as in Jupyter).
    - ``timeout``: seconds any one cell may run (default: no limit).

    A point that fails (an exception in a cell, a dead kernel, no metrics recorded) becomes a row
    with ``status="failed"`` and its ``error``; its partial notebook stays in ``out_dir``. A resumed
    sweep runs failed points again.
    """
    import papermill
    from tqdm import tqdm

    source = Path(notebook).resolve()
    fixed = dict(parameters or {})
    points = validate_grid(source, grid, fixed)
    records = RESULTS_PARAMETER in papermill.inspect_notebook(str(source))  # else: parameters, status, time
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    workdir = str(Path(cwd).resolve()) if cwd is not None else str(source.parent)
    engine_kwargs = {"execution_timeout": timeout} if timeout is not None else {}
    rows: list[dict[str, Any]] = []
    bar = tqdm(points, desc=f"sweep {source.stem}", unit="run", file=sys.stderr, disable=not progress,
               dynamic_ncols=True)
    try:
        for point in bar:
            name = point_name(source.stem, point)
            bar.set_postfix_str(name[len(source.stem) + 1:] or name, refresh=True)
            run_parameters = {**fixed, **point}
            output = out / f"{name}.ipynb"
            metrics_file = out / f"{name}{METRICS_SUFFIX}"
            if resume and _already_done(output, metrics_file, run_parameters):
                rows.append(_row(run_parameters, output, "ok", _read_metrics(metrics_file), reused=True))
                continue
            metrics_file.unlink(missing_ok=True)
            started = time.perf_counter()
            error = None
            try:
                with text_in_kernels_started_here(), ipc_kernels() as kernels:
                    papermill.execute_notebook(
                        str(source), str(output),
                        parameters={**run_parameters, **({RESULTS_PARAMETER: str(metrics_file)} if records else {})},
                        cwd=workdir, kernel_name=kernel_name, progress_bar=False, log_output=log_output,
                        **engine_kwargs, **kernels)
            except papermill.PapermillExecutionError as e:
                error = f"cell {e.exec_count}: {e.ename}: {e.evalue}"
            except Exception as e:  # a dead kernel, a timeout: the point fails, the sweep goes on
                error = f"{type(e).__name__}: {e}"
            seconds = time.perf_counter() - started
            if error is None and not metrics_file.is_file():
                if records:  # it defines RESULTS_PATH, so it promised metrics: say that none came
                    error = (f"the notebook finished without recording metrics: call "
                             f"kit.tools.experiments.record({RESULTS_PARAMETER}, ...) in it, or remove "
                             f"{RESULTS_PARAMETER} from its parameters cell to sweep it without metrics")
                else:  # nothing to record: an empty metrics file marks the point done, for resume
                    from . import results
                    results.save_results(metrics_file, {"metrics": {}})
            if error is None:
                rows.append(_row(run_parameters, output, "ok", _read_metrics(metrics_file), seconds))
            else:
                rows.append(_row(run_parameters, output, "failed", {}, seconds, error=error))
                bar.write(f"kit sweep: {name} failed: {error.splitlines()[0]}\n"
                          f"  partial notebook: {output}", file=sys.stderr)
            write_table(rows, out)
    finally:
        bar.close()
        write_table(rows, out)
    return load_results(out)


def _already_done(output: Path, metrics_file: Path, run_parameters: Mapping[str, Any]) -> bool:
    """The point's metrics exist and its executed notebook ran with these very parameters."""
    if not (metrics_file.is_file() and output.is_file()):
        return False
    try:
        ran_with = json.loads(output.read_text())["metadata"]["papermill"]["parameters"]
    except (OSError, ValueError, KeyError, TypeError):
        return False  # unreadable or not a papermill output: run the point again
    ran_with = {k: v for k, v in ran_with.items() if k != RESULTS_PARAMETER}
    return ran_with == json.loads(json.dumps(dict(run_parameters)))


def _read_metrics(path: Path) -> dict[str, Any]:
    from . import results
    return dict(results.read_results(path).get("metrics", {}))


def _row(run_parameters: Mapping[str, Any], output: Path, status: str, metrics: Mapping[str, Any],
         seconds: float | None = None, error: str | None = None, reused: bool = False) -> dict[str, Any]:
    extra = {k: v for k, v in metrics.items() if k not in run_parameters}
    return {**run_parameters, "status": status, **extra, "error": error, "notebook": output.name,
            "seconds": None if seconds is None else round(seconds, 2), "reused": reused}


def write_table(rows: Sequence[Mapping[str, Any]], out_dir: str | os.PathLike) -> tuple[Path, Path]:
    """Write ``results.json`` (every column) and ``results.csv`` (the columns that are not lists)."""
    import pandas as pd

    out = Path(out_dir)
    table = pd.DataFrame(list(rows))
    json_path = write_atomic(out / TABLE_JSON, json.dumps([_jsonable(dict(r), "row") for r in rows], indent=1))
    scalar = [c for c in table.columns if not table[c].map(lambda v: isinstance(v, (list, dict))).any()]
    csv_path = write_atomic(out / TABLE_CSV, table[scalar].to_csv(index=False))
    return json_path, csv_path


def load_results(out_dir: str | os.PathLike):
    """The results table of a sweep (``out_dir/results.json``) as a pandas DataFrame."""
    import pandas as pd

    path = Path(out_dir) / TABLE_JSON
    if not path.is_file():
        raise KitError(f"{path} does not exist. Fix: give the folder a sweep wrote (kit sweep ... --out "
                       "DIR), or run the sweep first")
    table = pd.DataFrame(json.loads(path.read_text()))
    return table.astype(object).where(table.notna(), float("nan")).infer_objects()
