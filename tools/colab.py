"""Write each notebook's way in from Colab, from pyproject.toml's ``[project.urls] Repository`` (one place):

- the "Open in Colab" and "View on GitHub" links of that notebook, under its title;
- a code cell after the title that installs the kit and its tested dependencies where the kit is missing (Colab, a
  fresh runtime): ``pip install --no-deps`` of the repository at its branch, then :mod:`kit.tools.install`;
- each concept figure (notebooks/figures/*.svg, the source) as an attachment of the markdown cell that shows it, so
  that a notebook opened alone (Colab, a download) shows it too; `make site` writes them back as files;
- the Colab column of notebooks/README.md's table (tools/make_index.py reads :func:`colab_url`), and the README's
  line of Colab links under its gallery (between the markers of :data:`README_MARKS`).

    python tools/colab.py          # make badges; tests/test_colab.py checks that every notebook agrees

A fork that changes the Repository line and runs it points every link and install at itself.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]*-*.ipynb"))
BRANCH = "main"
INSTALL_ID = "install-the-kit"


@functools.cache
def repository() -> str:
    """``OWNER/NAME`` of the repository on GitHub, from pyproject.toml (read once)."""
    url = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
    match = re.fullmatch(r"https://github\.com/([^/]+/[^/]+?)/?", url)
    if not match:
        raise SystemExit(f"pyproject.toml [project.urls] Repository = {url!r}: not https://github.com/OWNER/NAME. "
                         "Fix: give the repository's GitHub address")
    return match[1]


def colab_url(notebook: str) -> str:
    return f"https://colab.research.google.com/github/{repository()}/blob/{BRANCH}/notebooks/{notebook}"


def install_source() -> str:
    """What the install cell gives pip: the repository at its branch."""
    return f"kit @ git+https://github.com/{repository()}@{BRANCH}"


def badge_line(notebook: str) -> str:
    github = f"https://github.com/{repository()}/blob/{BRANCH}/notebooks/{notebook}"
    return f"[Open in Colab]({colab_url(notebook)}) · [View on GitHub]({github})"


BADGE = re.compile(r"^\[Open in Colab\]\(.*\n\n", re.M)


def with_badge(title: dict, notebook: str) -> dict:
    """The title cell with the notebook's links on the line after its heading (replaced if there)."""
    text = BADGE.sub("", "".join(title["source"]))
    heading, _, rest = text.partition("\n")
    text = f"{heading}\n\n{badge_line(notebook)}\n{rest}"
    return {**title, "source": text.splitlines(keepends=True)}


def install_cell() -> dict:
    source = f'''\
#@title Install the kit where it is missing (Colab): run this cell first
# Colab, or any Python without the kit: install it, with the versions it is tested with for this Python
import importlib.util
if importlib.util.find_spec("kit") is None:
    %pip install --quiet --no-deps "{install_source()}"
    import kit.tools.install
    kit.tools.install.dependencies()  # says whether the runtime must restart, and why
import kit.tools.install
kit.tools.install.lessons()  # on Colab: work beside a copy of the lessons' files (figures, results, docs)'''
    # collapsed, as the checks are: Colab shows its title (cellView "form"), JupyterLab a collapsed input; its output,
    # what it installed and whether to restart, shows in both
    return {"cell_type": "code", "execution_count": None, "id": INSTALL_ID,
            "metadata": {"cellView": "form", "jupyter": {"source_hidden": True}}, "outputs": [],
            "source": source.splitlines(keepends=True)}


FIGURE = re.compile(r"(!\[[^\]]*\]\()(?:figures/|attachment:)([\w.-]+\.svg)\)")


def with_figures(cell: dict) -> dict:
    """A markdown cell whose figures (``figures/NAME.svg``) are its attachments, from notebooks/figures."""
    text = "".join(cell["source"])
    names = [m[2] for m in FIGURE.finditer(text)]
    if cell["cell_type"] != "markdown" or not names:
        return cell
    attachments = {name: {"image/svg+xml": base64.b64encode((REPO / "notebooks" / "figures" / name).read_bytes())
                          .decode()} for name in names}
    text = FIGURE.sub(lambda m: f"{m[1]}attachment:{m[2]})", text)
    return {**cell, "attachments": attachments, "source": text.splitlines(keepends=True)}


def with_colab_cells(notebook: dict, name: str) -> dict:
    """``notebook`` with its links under the title and its install cell right after the title cell (replaced if
    there)."""
    cells = [with_figures(c) for c in notebook["cells"] if c.get("id") != INSTALL_ID]
    return {**notebook, "cells": [with_badge(cells[0], name), install_cell(), *cells[1:]]}


README_MARKS = ("<!-- colab links: tools/colab.py -->\n", "<!-- end of colab links -->\n")


def readme_links(text: str) -> str:
    """The README with its line of Colab links, one per notebook, between :data:`README_MARKS`."""
    begin, end = README_MARKS
    links = " · ".join(f"[{path.name.split('-')[0]}]({colab_url(path.name)})" for path in NOTEBOOKS)
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    if not rest:
        raise SystemExit(f"README.md has no line {begin.strip()!r}: put it where the Colab links go")
    return f"{head}{begin}Open in Colab: {links}\n{end}{tail}"


def main() -> None:
    readme = REPO / "README.md"
    readme.write_text(readme_links(readme.read_text()))
    for path in NOTEBOOKS:
        notebook = json.loads(path.read_text())
        path.write_text(json.dumps(with_colab_cells(notebook, path.name), indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
