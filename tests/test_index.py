"""notebooks/README.md is the index tools/make_index.py generates from the notebooks' first cells."""

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]*-*.ipynb"))


def load_tool():
    spec = importlib.util.spec_from_file_location("make_index", REPO / "tools" / "make_index.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_notebook(path, first_cell):
    path.write_text(json.dumps({"cells": [{"cell_type": "markdown", "metadata": {}, "source": first_cell}],
                                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))


def test_index_is_up_to_date():
    tool = load_tool()
    assert (REPO / "notebooks" / "README.md").read_text() == tool.render(), \
        "notebooks/README.md is out of date: run python tools/make_index.py"


def test_every_notebook_and_every_planned_one_has_a_row():
    text = (REPO / "notebooks" / "README.md").read_text()
    for path in NOTEBOOKS:
        assert f"]({path.name})" in text, f"{path.name} is missing from the index"
    for stem in load_tool().PLANNED:
        assert f"| {stem.split('-')[0]} |" in text


def test_title_and_first_paragraph_are_read_from_the_first_cell():
    tool = load_tool()
    cell = "# 07 · Parameter servers\n\nFirst line\nof the paragraph.\n\nSecond paragraph.\n\n**What you will learn**\n- x"
    assert tool.title_and_summary(cell, "07") == ("Parameter servers", "First line of the paragraph.")
    assert tool.title_and_summary("no title here") == ("", "")
    assert tool.title_and_summary("# 01 · Only a title\n\n**What you will learn**\n- a", "01") == ("Only a title", "")


def test_rows_link_present_notebooks_and_name_planned_ones(tmp_path):
    tool = load_tool()
    write_notebook(tmp_path / "00-first.ipynb", ["# 00 · First | one\n", "\n", "Does a thing.\n"])
    rows = tool.rows(tmp_path)
    colab = tool.colab.colab_url("00-first.ipynb")  # tools/colab.py, from pyproject's [project.urls]
    assert rows[0] == f"| 00 | [First &#124; one](00-first.ipynb) | [open]({colab}) | Does a thing. |"
    assert [row.split("|")[1].strip() for row in rows] == ["00", "05", "06", "07", "08"]
    assert "not written yet" in rows[1]


def test_check_mode_reports_a_stale_index(tmp_path, monkeypatch, capsys):
    tool = load_tool()
    monkeypatch.setattr(tool, "INDEX", tmp_path / "README.md")
    monkeypatch.setattr(tool, "REPO", tmp_path)
    (tmp_path / "README.md").write_text("stale\n")
    assert tool.main(["--check"]) == 1
    assert "out of date" in capsys.readouterr().err
    assert tool.main([]) == 0 and tool.main(["--check"]) == 0


def test_the_index_has_a_glossary_of_the_words_the_notebooks_use():
    text = (REPO / "notebooks" / "README.md").read_text()
    glossary = text[text.index("## Glossary"):]
    for word in ("task", "worker", "chief", "replica", "device", "engine"):
        assert f"| **{word}** |" in glossary, f"the glossary lacks {word}"
