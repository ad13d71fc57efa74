"""Notebook 10's concept figure is the sketch kit.tools.critical_batch_figures.concept draws, and says it is one."""

import json
import re
from pathlib import Path

from kit.tools import critical_batch_figures

REPO = Path(__file__).resolve().parent.parent
COMMITTED = REPO / "notebooks" / critical_batch_figures.CONCEPT_FIGURE
REDRAW = ('cd notebooks && python -c "from kit.tools import critical_batch_figures as c; '
          'c.concept(c.CONCEPT_FIGURE)"')


def labels(svg: Path) -> list[str]:
    """The figure's words: the SVG keeps its text as text (svg.fonttype none)."""
    return [re.sub(r"\s+", " ", t).strip() for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg.read_text())]


def test_the_committed_figure_is_what_the_helper_draws_and_calls_itself_a_sketch(tmp_path):
    first, second = tmp_path / "first.svg", tmp_path / "second.svg"
    critical_batch_figures.concept(first)
    critical_batch_figures.concept(second)
    assert first.read_bytes() == second.read_bytes(), "two drawings differ: the SVG carries a date or random ids"
    assert labels(COMMITTED) == labels(first), f"{COMMITTED.name} is out of date: {REDRAW}"
    assert "A sketch of the model, not a measurement" in labels(first)
    assert {"perfect scaling", "diminishing returns", "maximal data parallelism", "B_crit ≈ B_noise"} <= set(labels(first))


def test_notebook_10_shows_it_after_what_you_will_learn():
    first_cell = "".join(json.loads((REPO / "notebooks" / "10-critical-batch-size.ipynb").read_text())["cells"][0]["source"])
    image = first_cell.index(f"](attachment:{Path(critical_batch_figures.CONCEPT_FIGURE).name})")
    assert first_cell.index("**What you will learn**") < image
