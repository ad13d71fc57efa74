"""Build the lessons' static site from the executed notebooks: ``make site`` (out/executed/ -> out/site/).

    python tools/build_site.py                      # out/executed/*.ipynb -> out/site/index.html, a page per notebook
    python tools/build_site.py --strict             # fail if a notebook has no executed copy

Nothing is executed here. ``make notebooks`` keeps every notebook it ran with its outputs in out/executed/
(tools/nbval_executed.py), and tests/test_browser.py keeps the three it runs in JupyterLab there too. This
script stages one page source per numbered notebook of notebooks/ in out/site-src/, then runs Sphinx
(myst-nb, sphinx-book-theme; docs/site/conf.py says why) on it:

- the index page: docs/site/index.md, then notebooks/README.md (the table of lessons, its links now links
  to the pages), then every notebook in the navigation in the order of their numbers;
- a notebook's page: its executed copy, with a line under its title saying when that run was; a cell whose
  input JupyterLab shows collapsed (``jupyter.source_hidden``, the ``check`` cells) gets myst-nb's tag
  ``hide-input``: collapsed, its printed line in view; a JupyterLab widget output keeps the HTML its page
  showed (the browser test saves it beside the widget) and loses the widget itself, which has no saved
  state to render;
- a notebook without an executed copy (notebook 11, which needs root and an emulated cluster, is not run by
  ``make notebooks``; or a run that failed before it was written): its stored copy, without outputs, a note
  at its top saying so, and a warning of this build listing it. ``--strict`` makes that an error instead.

Also written: out/site/pages.json, one entry per notebook (its page, whether it was executed, when), which
tests/test_site.py reads.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nbformat

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
CONF = REPO / "docs" / "site"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
#: the numbered lessons, as tools/make_index.py and the tests find them
LESSON_GLOB = "[0-9][0-9]*-*.ipynb"


def lessons() -> list[Path]:
    return sorted(NOTEBOOKS.glob(LESSON_GLOB))


def title_of(notebook: dict) -> str:
    for cell in notebook["cells"]:
        if cell["cell_type"] == "markdown":
            found = re.search(r"^#\s+(.+)$", _text(cell["source"]), re.M)
            if found:
                return found.group(1).strip()
    return ""


def _text(source: Any) -> str:
    return "".join(source) if isinstance(source, list) else source


def _markdown(text: str, cell_id: str) -> dict:
    return {"cell_type": "markdown", "id": cell_id, "metadata": {}, "source": text}


def run_note(notebook: dict) -> str:
    """The line under a page's title about the run whose outputs it shows."""
    executed = notebook["metadata"].get("executed", {})
    when = (executed.get("finished") or executed.get("started") or "")[:10]
    cores = executed.get("cores")
    where = f" on a {cores}-core machine" if cores else ""
    failed = executed.get("failed_cells") or []
    text = (f"*The outputs on this page are those of one run{where}{', on ' + when if when else ''}: "
            "times, speeds and losses will differ on yours.*")
    if failed:
        text += (f"\n\n```{{warning}}\nIn this run {len(failed)} cell(s) failed (code cells "
                 f"{', '.join(str(n + 1) for n in failed)}); their errors are shown where they happened.\n```")
    return text


def missing_note(notebook: dict) -> str:
    reason = notebook["metadata"].get("kit", {}).get("not_on_binder")
    why = (f"it is not run for this site: {reason}" if reason else
           "it has no run for this site (its run failed, or did not take place)")
    return f"```{{note}}\nThis page shows the notebook without its outputs: {why}. Open it in JupyterLab to run it.\n```"


def prepare(notebook: dict, executed: bool) -> dict:
    """The page source of one notebook: collapsed cells tagged hide-input, widgets replaced by what they
    showed, and a note under the title (see the module docstring)."""
    notebook = copy.deepcopy(notebook)
    for cell in notebook["cells"]:
        if cell.pop("attachments", None):  # a concept figure (tools/colab.py): the page shows figures/'s file
            cell["source"] = _text(cell["source"]).replace("](attachment:", "](figures/")
        if cell["cell_type"] != "code":
            continue
        metadata = cell.setdefault("metadata", {})
        tags = metadata.setdefault("tags", [])
        if metadata.get("jupyter", {}).get("source_hidden") or "check" in tags:
            if "hide-input" not in tags:
                tags.append("hide-input")
            if "check" in tags:
                metadata["mystnb"] = {"code_prompt_show": "Show the check", "code_prompt_hide": "Hide the check"}
        outputs = []
        for output in cell.get("outputs", []):
            data = output.get("data")
            if data and WIDGET_VIEW in data:
                data = {mime: value for mime, value in data.items() if mime != WIDGET_VIEW}
                if not data:
                    continue
                output = dict(output, data=data)
            outputs.append(output)
        cell["outputs"] = outputs
    note = _markdown(run_note(notebook) if executed else missing_note(notebook), "kit-site-run-note")
    first = next((i for i, c in enumerate(notebook["cells"]) if c["cell_type"] == "markdown"), -1)
    notebook["cells"].insert(first + 1, note)
    # a notebook's widget state (none is kept) would make myst-nb load a widget manager
    notebook["metadata"].pop("widgets", None)
    # IPython's lexer: cells with `!grep ...` lines are IPython, not plain Python
    notebook["metadata"].setdefault("language_info", {}).setdefault("pygments_lexer", "ipython3")
    return notebook


def demote_headings(text: str) -> str:
    """Every markdown heading one level down (outside code fences): the README's "# Notebooks" becomes a
    section of the index page, whose title is docs/site/index.md's."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        lines.append("#" + line if not fenced and re.match(r"#{1,5}\s", line) else line)
    return "\n".join(lines) + "\n"


def stage(executed_dir: Path, src: Path) -> list[dict[str, Any]]:
    """Write the page sources into ``src``; returns one entry per notebook for pages.json."""
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    shutil.copytree(NOTEBOOKS / "figures", src / "figures")  # the concept figures the text shows
    pages = []
    for stored in lessons():
        copy_ = executed_dir / stored.name
        executed = copy_.is_file()
        notebook = json.loads((copy_ if executed else stored).read_text())
        try:
            nbformat.validate(nbformat.from_dict(notebook))
        except nbformat.ValidationError as error:
            raise SystemExit(f"make site: {copy_ if executed else stored} is not a valid notebook: "
                             f"{str(error).splitlines()[0]}")
        (src / stored.name).write_text(json.dumps(prepare(notebook, executed), indent=1) + "\n")
        run = notebook["metadata"].get("executed", {})
        pages.append({"notebook": stored.name, "page": stored.stem + ".html", "title": title_of(notebook),
                      "executed": executed, "run_finished": run.get("finished"), "run_by": run.get("by"),
                      "failed_cells": run.get("failed_cells", [])})
    index = (CONF / "index.md").read_text() + "\n" + demote_headings((NOTEBOOKS / "README.md").read_text())
    index += "\n```{toctree}\n:hidden:\n:maxdepth: 1\n\n" + "\n".join(p.stem for p in lessons()) + "\n```\n"
    (src / "index.md").write_text(index)
    return pages


def build(src: Path, out: Path, log: Path) -> tuple[int, list[str]]:
    """Sphinx from ``src`` into ``out`` (removed first: no page of an older build stays); its exit code and
    its warnings."""
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    warnings = out.parent / "site-warnings.txt"
    command = [sys.executable, "-m", "sphinx", "-b", "html", "-c", str(CONF), "-E", "-q", "--keep-going",
               "-w", str(warnings), str(src), str(out)]
    with log.open("w") as handle:
        code = subprocess.run(command, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT).returncode
    said = [line for line in warnings.read_text().splitlines() if line.strip()] if warnings.exists() else []
    return code, said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--executed", type=Path, default=REPO / "out" / "executed",
                        help="the executed notebooks (default: out/executed)")
    parser.add_argument("--src", type=Path, default=REPO / "out" / "site-src", help="staged page sources")
    parser.add_argument("--out", type=Path, default=REPO / "out" / "site", help="the site (default: out/site)")
    parser.add_argument("--strict", action="store_true", help="fail if a notebook has no executed copy")
    args = parser.parse_args(argv)

    start = time.monotonic()
    pages = stage(args.executed, args.src)
    missing = [p["notebook"] for p in pages if not p["executed"]]
    code, warnings = build(args.src, args.out, args.out.parent / "site-build.log")
    if code == 0:
        (args.out / "pages.json").write_text(json.dumps(pages, indent=1) + "\n")
    for line in warnings:
        print(f"sphinx: {line}", file=sys.stderr)
    if missing:
        print(f"WARNING: make site: {len(missing)} of {len(pages)} notebooks have no executed copy in "
              f"{args.executed}, so their pages show them without outputs: {', '.join(missing)}"
              + ("" if len(missing) < len(pages) else " (run `make notebooks` first)"), file=sys.stderr)
    seconds = time.monotonic() - start
    if code != 0:
        print(f"make site: Sphinx failed (exit {code}); its log: {args.out.parent / 'site-build.log'}",
              file=sys.stderr)
        return code
    print(f"make site: {args.out}/index.html, {len(pages)} notebook pages ({len(pages) - len(missing)} executed), "
          f"{len(warnings)} Sphinx warning(s), {seconds:.0f} s")
    if missing and args.strict:
        print("make site --strict: every notebook needs an executed copy", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
