"""A pytest plugin: keep the notebooks nbval ran, with their outputs, without running them again.

nbval runs each code cell of a notebook in one kernel and keeps what the cell produced in its test item
(``IPyNbCell.test_outputs``: streams, display data, results, errors, as nbformat outputs); it saves nothing.
This plugin collects those outputs, cell by cell, and when the last cell of a notebook has run writes the
notebook with them to ``DIR/<name>.ipynb``: the stored notebook's cells and metadata, each code cell with
its outputs and execution count (cells nbval skipped have none). The repository's notebooks stay as they
are, without outputs. ``make site`` builds the site of the lessons from these files (tools/build_site.py).

    python -m pytest --nbval-lax -p tools.nbval_executed --nbval-executed out/executed notebooks/

Notebooks under ``notebooks/`` keep their place below it (``notebooks/trials/x.ipynb`` ->
``DIR/trials/x.ipynb``). The notebook's metadata gets ``executed``: who ran it, when, with which view
(``$KIT_VIEW``) and which cells failed, so a reader of the file (and the site) can tell. A notebook whose
run was cut short (a time limit, Ctrl-C) is still written at the end of the session, with the cells that ran.
"""

from __future__ import annotations

import copy
import datetime
import os
import socket
from pathlib import Path
from typing import Any

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("nbval").addoption(
        "--nbval-executed", metavar="DIR", default=None,
        help="write each notebook nbval ran, with its outputs, to DIR/<name>.ipynb (tools/nbval_executed.py)")


def pytest_configure(config: pytest.Config) -> None:
    folder = config.getoption("--nbval-executed")
    if folder:
        config.pluginmanager.register(Keeper(Path(folder)), "nbval-executed-keeper")


def target(folder: Path, notebook: Path) -> Path:
    """Where the executed copy of ``notebook`` goes: its path below notebooks/, or its name."""
    notebook = notebook.resolve()
    try:
        return folder / notebook.relative_to(NOTEBOOKS)
    except ValueError:
        return folder / notebook.name


def executed_notebook(stored: Any, outputs: dict[int, list | None], failed: set[int],
                      started: str) -> nbformat.NotebookNode:
    """The stored notebook ``stored`` (as nbval read it) with each code cell's ``outputs`` (by nbval's
    cell number, counting code cells; None: not run) and execution counts in the order the cells ran."""
    notebook = copy.deepcopy(stored)
    count, number = 0, 0
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        ran = outputs.get(number)
        if ran is None:
            cell.outputs, cell.execution_count = [], None
        else:
            count += 1
            cell.outputs = [nbformat.from_dict(dict(output)) for output in ran]
            cell.execution_count = count
            for output in cell.outputs:
                if output.output_type == "execute_result":
                    output.execution_count = count
        number += 1
    notebook.metadata["executed"] = {
        "by": "nbval (make notebooks)", "started": started,
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(), "cores": os.cpu_count(), "view": os.environ.get("KIT_VIEW", "auto"),
        "cells_run": count, "code_cells": number, "failed_cells": sorted(failed),
    }
    return notebook


class Keeper:
    """The outputs of every nbval cell, by notebook, written out when a notebook's last cell has run."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.outputs: dict[Any, dict[int, list | None]] = {}   # notebook (IPyNbFile) -> cell number -> outputs
        self.failed: dict[Any, set[int]] = {}
        self.started: dict[Any, str] = {}
        self.written: set[Any] = set()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """An older executed copy of a notebook about to run goes first: a run that fails to start must not
        leave last week's outputs to be published as this run's."""
        for notebook in {item.parent for item in session.items if self._is_cell(item)}:
            target(self.folder, Path(str(notebook.path))).unlink(missing_ok=True)

    @staticmethod
    def _is_cell(item: pytest.Item) -> bool:
        return type(item).__name__ == "IPyNbCell" and hasattr(item, "cell_num")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        if self._is_cell(item):
            self.started.setdefault(item.parent, datetime.datetime.now(datetime.timezone.utc)
                                    .isoformat(timespec="seconds"))
        yield
        if not self._is_cell(item):
            return
        self.outputs.setdefault(item.parent, {})[item.cell_num] = item.test_outputs
        if nextitem is None or nextitem.parent is not item.parent:
            self.write(item.parent)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        outcome = yield
        report = outcome.get_result()
        if self._is_cell(item) and report.when == "call" and report.failed:
            self.failed.setdefault(item.parent, set()).add(item.cell_num)

    def write(self, notebook: Any) -> None:
        path = target(self.folder, Path(str(notebook.path)))
        path.parent.mkdir(parents=True, exist_ok=True)
        executed = executed_notebook(notebook.nb, self.outputs.get(notebook, {}), self.failed.get(notebook, set()),
                                     self.started.get(notebook, ""))
        partial = path.with_name(path.name + ".part")
        nbformat.write(executed, str(partial))
        partial.replace(path)
        self.written.add(notebook)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """A notebook cut short (interrupted, a fatal error) is still written with the cells that ran."""
        for notebook in list(self.outputs):
            if notebook not in self.written:
                self.write(notebook)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.written:
            terminalreporter.write_line(f"nbval-executed: {len(self.written)} executed notebook(s) with their "
                                        f"outputs in {self.folder}/")
