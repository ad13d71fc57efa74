"""The lessons' site (``make site``: out/executed/ -> out/site/) as a reader opens it: every page in Chromium.

``make check`` builds the site after the notebooks ran (``make notebooks`` and tests/test_browser.py keep them with
their outputs in out/executed/, tools/build_site.py renders them) and then runs this test. It serves out/site/ on
127.0.0.1 (as GitHub Pages would serve it; nothing else is reachable: every other request is refused and
recorded), opens the index and every notebook's page in Debian's headless Chromium (playwright, as
tests/test_browser.py), and checks what a reader sees:

- every numbered notebook has a page, and every page's navigation lists every notebook;
- no error output (a cell output of type error, a traceback in a stderr block), except in a cell tagged
  ``raises-exception``; no uncaught script error in the page;
- every image loaded (``naturalWidth > 0``): the PNG figures the notebooks drew and the concept figures;
- a notebook's checks (its collapsed cells) are collapsed, each with the line it printed in view;
- every exercise's answer is there and collapsed: as many closed ``<details>`` "Answer" as exercises, each as
  tall as its summary line;
- every live-view table shows its tasks' final states ("done" or "failed");
- each page, its HTML and its images, under :data:`MAX_PAGE_BYTES` (the theme's shared CSS, JS and fonts not
  counted: a browser loads them once for the whole site).

Without out/site/ it skips and says how to build it, except on CI (``CI`` set), where ``make check`` builds it
first and a skip would hide a site that was not built. On CI it also fails if a notebook that ``make notebooks``
or the browser test runs has no executed copy (its page would show no outputs); notebook 11, which needs root
and an emulated cluster (its metadata ``kit.not_on_binder``), is shown without outputs and says so.

What it leaves: out/site-test.json, each page's size (HTML, images, total), load time and refused requests.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import os
import threading
import time
from typing import Any, Iterator
from urllib.parse import unquote, urlparse

import pytest

import exercise_list
from conftest import CHROMIUM, REPO

SITE = REPO / "out" / "site"
RECORD = REPO / "out" / "site-test.json"
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]*-*.ipynb"))
#: A page's bytes: its HTML and the images it shows. Measured (2 cores, the pages of notebooks 00, 00b and 02
#: executed, 08 executed in part with its first figure): 90 to 280 KB per page, the largest notebook 08's; a page
#: without outputs 100 to 200 KB, the index 42 KB. A figure adds 15 to 60 KB. The bound leaves room for a
#: notebook that grows (five times the largest measured) and fails a page that embeds what it should not (a
#: widget state, dozens of figures, a whole training log).
MAX_PAGE_BYTES = 1_500_000
VIEWPORT = {"width": 1280, "height": 900}
LOAD_S = 30.0   # a page and its images, from 127.0.0.1 (well under a second measured)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

#: What a page shows a reader: navigation, outputs, images, checks, live views.
PAGE_JS = """() => {
  const text = el => (el.textContent || '').trim();
  const cells = Array.from(document.querySelectorAll('div.cell'));
  const tagged = (cell, tag) => cell.classList.contains('tag_' + tag);
  return {
    title: document.title,
    nav: Array.from(document.querySelectorAll('nav.bd-docs-nav a.reference.internal'))
      .map(a => new URL(a.href).pathname.split('/').pop() || 'index.html'),
    errors: cells.filter(cell => !tagged(cell, 'raises-exception')).flatMap(cell =>
      Array.from(cell.querySelectorAll('.cell_output .output.traceback, .cell_output .output.stderr'))
        .filter(el => el.classList.contains('traceback') || text(el).includes('Traceback (most recent call last)'))
        .map(el => text(el).slice(0, 300))),
    images: Array.from(document.images).map(img => ({src: img.getAttribute('src'), width: img.naturalWidth,
                                                     complete: img.complete})),
    checks: cells.filter(cell => tagged(cell, 'check')).map(cell => ({
      collapsed: !!cell.querySelector('details.hide') && !cell.querySelector('details.hide').open,
      printed: text(cell.querySelector('.cell_output') || document.createElement('div')).slice(0, 200)})),
    outputs: document.querySelectorAll('.cell_output').length,
    answers: Array.from(document.querySelectorAll('details'))
      .filter(d => text(d.querySelector('summary') || document.createElement('div')) === 'Answer')
      .map(d => ({open: d.open, height: d.getBoundingClientRect().height,
                  summary: d.querySelector('summary').getBoundingClientRect().height})),
    views: Array.from(document.querySelectorAll('table.kit-view tr[data-kit-task]'))
      .map(row => [row.getAttribute('data-kit-task'), row.getAttribute('data-kit-state')]),
  };
}"""


def missing_prerequisites() -> list[str]:
    missing = []
    if not (SITE / "pages.json").is_file():
        missing.append("the site: `make notebooks` (or the notebooks you want), then `make site` (out/site/)")
    if not os.access(CHROMIUM, os.X_OK):
        missing.append(f"Chromium at {CHROMIUM}: `sudo apt-get install chromium` (`make check` does it as root)")
    if importlib.util.find_spec("playwright") is None:
        missing.append("playwright: `pip install -e '.[dev]'`")
    return missing


@pytest.fixture(scope="module", autouse=True)
def prerequisites() -> None:
    """Skip, naming what to run, where the site or Chromium is missing; fail instead on CI, where `make check`
    builds the site before this test and installs Chromium."""
    missing = missing_prerequisites()
    if missing and os.environ.get("CI"):
        pytest.fail("on CI `make check` builds the site and installs Chromium before this test, yet these are "
                    "missing: " + "; ".join(missing))
    if missing:
        pytest.skip("needs " + "; ".join(missing))


@pytest.fixture(scope="module")
def pages() -> list[dict]:
    return json.loads((SITE / "pages.json").read_text())


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """out/site/ over HTTP on 127.0.0.1 and a free port, for as long as the module's tests run."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(SITE)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def record() -> Iterator[dict]:
    """out/site-test.json, written when the module's tests are done."""
    seen: dict[str, Any] = {"max_page_bytes": MAX_PAGE_BYTES, "pages": {}}
    yield seen
    RECORD.write_text(json.dumps(seen, indent=1) + "\n")


def page_bytes(page: str, images: list[str]) -> dict[str, int]:
    """The bytes of a page's HTML and of the distinct local images it shows."""
    html = (SITE / page).stat().st_size
    files = {SITE / unquote(urlparse(src).path).lstrip("/") for src in images if src and not src.startswith("data:")}
    pictures = sum(path.stat().st_size for path in files if path.is_file())
    inline = sum(len(src) for src in images if src and src.startswith("data:"))
    return {"html": html, "images": pictures + inline, "total": html + pictures + inline}


@pytest.fixture(scope="module")
def reader(browser: Any, server: str) -> Iterator[dict]:
    """One browser tab for every page, offline: requests to anything but the site's server are refused and
    recorded; uncaught script errors are recorded too."""
    context = browser.new_context(viewport=VIEWPORT)
    seen: dict[str, Any] = {"refused": [], "errors": []}

    def route(request_route: Any) -> None:
        if request_route.request.url.startswith(server + "/"):
            request_route.continue_()
        else:
            seen["refused"].append(request_route.request.url)
            request_route.abort()

    try:
        page = context.new_page()
        page.route("**/*", route)
        page.on("pageerror", lambda error: seen["errors"].append(str(error)[:300]))
        seen["page"] = page
        yield seen
    finally:
        context.close()


def open_page(reader: dict, server: str, page_name: str) -> tuple[dict, list[str], list[str], float]:
    """Open one page; what it shows (PAGE_JS), its uncaught script errors, the requests refused, seconds."""
    reader["refused"].clear()
    reader["errors"].clear()
    page = reader["page"]
    start = time.monotonic()
    page.goto(f"{server}/{page_name}", wait_until="load", timeout=LOAD_S * 1000)
    page.wait_for_function("() => Array.from(document.images).every(img => img.complete)",
                           timeout=LOAD_S * 1000, polling=100)
    seconds = time.monotonic() - start
    return page.evaluate(PAGE_JS), list(reader["errors"]), list(reader["refused"]), seconds


def test_every_notebook_has_a_page_and_a_place_in_the_index(pages: list[dict], reader: dict, server: str,
                                                           record: dict) -> None:
    assert [p["notebook"] for p in pages] == [p.name for p in NOTEBOOKS], "pages.json and notebooks/ disagree"
    for page in pages:
        assert (SITE / page["page"]).is_file(), f"no page {page['page']} for {page['notebook']}"
    shown, errors, refused, seconds = open_page(reader, server, "index.html")
    missing = [p["page"] for p in pages if p["page"] not in shown["nav"]]
    assert not missing, f"the index's navigation lacks {missing}; it has {shown['nav']}"
    assert not errors, f"script errors on the index: {errors}"
    record["pages"]["index.html"] = {**page_bytes("index.html", [i["src"] for i in shown["images"]]),
                                     "load_s": round(seconds, 2), "refused": refused}
    if os.environ.get("CI"):
        # every notebook `make notebooks` or the browser test runs must have its outputs on its page
        run_here = [p.name for p in NOTEBOOKS if not json.loads(p.read_text())["metadata"].get("kit", {})
                    .get("not_on_binder")]
        bare = [p["notebook"] for p in pages if p["notebook"] in run_here and not p["executed"]]
        assert not bare, (f"{bare} have no executed copy in out/executed/ (did make notebooks or the browser test "
                          "fail before writing it?): their pages show no outputs")


@pytest.mark.parametrize("notebook", [p.name for p in NOTEBOOKS], ids=lambda name: name.split("-")[0])
def test_page_shows_the_run_without_errors(notebook: str, pages: list[dict], reader: dict, server: str,
                                          record: dict) -> None:
    """One notebook's page: navigation, no error output, images loaded, checks collapsed with their line,
    live views in their final states, size."""
    (entry,) = [p for p in pages if p["notebook"] == notebook]
    shown, errors, refused, seconds = open_page(reader, server, entry["page"])
    size = page_bytes(entry["page"], [i["src"] for i in shown["images"]])
    record["pages"][entry["page"]] = {**size, "load_s": round(seconds, 2), "executed": entry["executed"],
                                      "refused": refused}
    problems = []
    missing = [p["page"] for p in pages if p["page"] not in shown["nav"]]
    if missing:
        problems.append(f"the navigation lacks {missing}")
    problems += [f"error output shown: {text!r}" for text in shown["errors"]]
    problems += [f"script error in the page: {error}" for error in errors]
    problems += [f"image {image['src']} did not load (naturalWidth 0)" for image in shown["images"]
                 if not image["width"]]
    if entry["executed"]:
        if not shown["outputs"]:
            problems.append("an executed notebook whose page shows no output")
        for i, check in enumerate(shown["checks"]):
            if not check["collapsed"]:
                problems.append(f"check {i + 1} is not collapsed")
            if not check["printed"]:
                problems.append(f"check {i + 1} shows no printed line")
        problems += [f"live view: {task} ended {state!r}" for task, state in shown["views"]
                     if state not in ("done", "failed")]
    exercises = len(exercise_list.written(REPO / "notebooks" / notebook))
    if len(shown["answers"]) != exercises:
        problems.append(f"{len(shown['answers'])} answers shown for {exercises} exercises")
    problems += [f"answer {i + 1} is open ({answer['height']:.0f} px, its summary {answer['summary']:.0f} px)"
                 for i, answer in enumerate(shown["answers"]) if answer["open"] or answer["height"] > answer["summary"] + 4]
    if size["total"] > MAX_PAGE_BYTES:
        problems.append(f"{size['total']:,} bytes (HTML {size['html']:,}, images {size['images']:,}), over "
                        f"{MAX_PAGE_BYTES:,}")
    assert not problems, f"{entry['page']} ({SITE / entry['page']}):\n" + "\n".join(problems)
