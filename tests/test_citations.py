"""Every source a lesson names is one click away, and every link inside the repository leads to a file.

(a) A paragraph of a notebook's markdown that names a source (TensorFlow's tutorial, a guide, a paper, an API
page or docstring, an issue such as keras-team/keras#20585) holds a hyperlink to a page on the web.
(b) A Markdown link or image whose target is a path (not http(s), mailto, a notebook attachment or an #anchor)
in notebooks/*.ipynb, README.md, notebooks/README.md and docs/*.md leads to a file or folder that exists.

Plain text only: json and the standard library, no TensorFlow, no notebook run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
MARKDOWN_FILES = [REPO / "README.md", REPO / "notebooks" / "README.md", *sorted((REPO / "docs").glob("*.md"))]

#: The first cell of every notebook (its title, what you will learn, its figure) is left out of (a): another
#: change owns it (badges and figure attachments), and adds its links there. Its links are checked by (b).
HEADER_CELL = 0

#: Words that name a source. Whitespace is any whitespace, since the notebooks wrap their lines.
SOURCE = re.compile(r"""
      TensorFlow's\s+(?:distributed-training\s+)?(?:tutorials?|guides?)\b
    | Keras's\s+guides?\b
    | Horovod's\s+(?:Keras\s+)?(?:docs|examples?)\b(?!/)  # (not "Horovod's examples/s")
    | [\w.]+'s\s+(?:documentation|docs)\b           # TensorFlow's / JAX's / tf.data's documentation
    | \bdocumentation\s+of\b
    | \b(?:tutorial|guide)\s+["“*]                   # a page named in quotes or italics
    | \bthe\s+paper\b | \barXiv\b
    | \bet\s+al\.                                    # a paper, by its authors
    | \b[\w.-]+/[\w.-]+\#\d+\b                       # an issue: owner/repository#number
    | \b(?:keras|tensorflow|jax|horovod)\#\d+\b      # an issue: keras#20585
    | \bAPI\s+page\b | \bdocstring\b | \brelease\s+notes\b
""", re.X)
#: A hyperlink to a page on the web: [text](https://...) or <https://...>.
WEB_LINK = re.compile(r"\]\(\s*<?https?://|<https?://")
#: Every Markdown link or image target, also one inside another link's text (a badge): ](target "title").
LINK_TARGET = re.compile(r"\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
#: A reference-style definition, [label]: target, and an HTML href or src.
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.M)
HTML_TARGET = re.compile(r"""<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*["']([^"']+)["']""", re.I)
#: Targets that are not a path in the repository.
SCHEMES = ("http", "https", "mailto", "attachment")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s|^\s*\||^\s*#")


def _markdown_cells(path: Path) -> list[tuple[int, str]]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return [(i, "".join(c["source"])) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "markdown"]


def paragraphs(text: str) -> list[str]:
    """The text's paragraphs: blocks between blank lines, with each list item, table row and heading a
    paragraph of its own (an item's indented continuation lines stay with it). Code blocks and figure lines
    (``![``) are left out."""
    text = FENCE.sub("", text)
    found: list[str] = []
    for block in re.split(r"\n\s*\n", text):
        current: list[str] = []
        for line in block.splitlines():
            if "![" in line:
                continue
            if ITEM.match(line) and current:
                found.append("\n".join(current))
                current = []
            current.append(line)
        if current:
            found.append("\n".join(current))
    return found


def unlinked_sources(text: str) -> list[tuple[str, str]]:
    """(phrase, paragraph) for every paragraph of ``text`` that names a source and holds no web link."""
    misses = []
    for paragraph in paragraphs(text):
        named = SOURCE.search(paragraph)
        if named and not WEB_LINK.search(paragraph):
            misses.append((" ".join(named.group(0).split()), paragraph))
    return misses


def link_targets(text: str) -> list[str]:
    """Every link and image target of a Markdown text, outside code."""
    text = FENCE.sub("", text)
    text = re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", " ", text, flags=re.S)  # inline code is not a link
    found = [m.group(1) for pattern in (LINK_TARGET, REFERENCE) for m in pattern.finditer(text)]
    found += HTML_TARGET.findall(text)
    return [t[1:-1] if t.startswith("<") and t.endswith(">") else t for t in found]


def broken_target(target: str, folder: Path) -> str | None:
    """Why ``target``, linked from a file in ``folder``, leads nowhere; None when it leads somewhere."""
    scheme = re.match(r"([a-zA-Z][a-zA-Z0-9+.-]*):", target)
    if scheme:
        if scheme.group(1).lower() in SCHEMES:
            return None
        return f"its scheme {scheme.group(1)}: is neither a web page nor a file of the repository"
    path = unquote(target.split("#", 1)[0].split("?", 1)[0])
    if not path:
        return None  # an anchor in the same file
    resolved = (REPO / path.lstrip("/")) if path.startswith("/") else (folder / path)
    if resolved.exists():
        return None
    return f"{resolved.relative_to(REPO) if resolved.is_relative_to(REPO) else resolved} does not exist"


# ----- (a) every source a notebook names is linked -----------------------------------------------------------
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:3])
def test_every_source_a_notebook_names_is_linked(path):
    failures = []
    for i, text in _markdown_cells(path):
        if i == HEADER_CELL:
            continue
        for phrase, paragraph in unlinked_sources(text):
            start = " ".join(paragraph.split())[:100]
            failures.append(f"{path.name}, cell {i}: names a source ({phrase!r}) in a paragraph without a link: "
                            f"\"{start}...\". Fix: make the source's name in that paragraph a Markdown link to its "
                            "page, as in [Goyal et al.](https://arxiv.org/abs/1706.02677) or TensorFlow's tutorial "
                            "[Multi-worker training with Keras]"
                            "(https://www.tensorflow.org/tutorials/distribute/multi_worker_with_keras)")
    assert not failures, "\n".join(failures)


# ----- (b) every link inside the repository leads to a file --------------------------------------------------
def _documents() -> list[tuple[str, Path, list[tuple[int | None, str]]]]:
    documents = [(p.name, p.parent, _markdown_cells(p)) for p in NOTEBOOKS]
    documents += [(str(p.relative_to(REPO)), p.parent, [(None, p.read_text(encoding="utf-8"))])
                  for p in MARKDOWN_FILES if p.exists()]
    return documents


DOCUMENTS = _documents()


@pytest.mark.parametrize("name, folder, texts", DOCUMENTS, ids=[name for name, _, _ in DOCUMENTS])
def test_every_link_inside_the_repository_leads_to_a_file(name, folder, texts):
    failures = []
    for i, text in texts:
        where = f"{name}, cell {i}" if i is not None else name
        for target in link_targets(text):
            why = broken_target(target, folder)
            if why:
                failures.append(f"{where}: the link to {target!r} leads nowhere: {why}. Fix: point it at a file "
                                f"that exists, relative to {folder.relative_to(REPO) or '.'}/, or link the page's "
                                "https:// address")
    assert not failures, "\n".join(failures)


# ----- the checks themselves ---------------------------------------------------------------------------------
def test_a_named_source_without_a_link_is_found_and_a_linked_one_is_not():
    unlinked = ("The data, as TensorFlow's tutorial \"Multi-worker training with Keras\" loads it.\n\n"
                "- fails under Keras 3 (keras-team/keras#20585)\n"
                "- Goyal et al. warm up over 5 epochs\n\n"
                "Its docstring says so.")
    assert [phrase for phrase, _ in unlinked_sources(unlinked)] == [
        "TensorFlow's tutorial", "keras-team/keras#20585", "et al.", "docstring"]
    linked = ("The data, as TensorFlow's tutorial [Multi-worker training with Keras]"
              "(https://www.tensorflow.org/tutorials/distribute/multi_worker_with_keras) loads it.\n\n"
              "- fails under Keras 3 ([keras-team/keras#20585](https://github.com/keras-team/keras/issues/20585))\n"
              "- [Goyal et al.](https://arxiv.org/abs/1706.02677) warm up over 5 epochs\n\n"
              "```\n# TensorFlow's tutorial in a code block is code\n```\n"
              "![TensorFlow's tutorial, in a figure's description](figures/x.svg)\n\n"
              "papermill runs the notebook; the tutorial's model is not a source's name.")
    assert unlinked_sources(linked) == []


def test_a_link_to_a_missing_file_is_found_and_the_others_are_not(tmp_path):
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "a.svg").write_text("<svg/>")
    text = ("[![Binder](https://mybinder.org/badge_logo.svg)](https://mybinder.org/v2/gh/o/r/main) "
            "![a](figures/a.svg) ![b](attachment:b.svg) [c](figures/a.svg#top \"title\") [d](#deeper) "
            "[e](mailto:x@example.org) `[f](not/a/link.md)` [g](figures/missing.svg) [h](<figures/a.svg>)\n\n"
            "[i]: figures/gone.md\n<img src=\"figures/none.png\">")
    targets = link_targets(text)
    assert "not/a/link.md" not in targets
    broken = [t for t in targets if broken_target(t, tmp_path)]
    assert broken == ["figures/missing.svg", "figures/gone.md", "figures/none.png"]
    assert "does not exist" in broken_target("figures/missing.svg", tmp_path)
    assert "scheme" in broken_target("file:///etc/passwd", tmp_path)
