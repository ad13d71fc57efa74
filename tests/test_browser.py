"""The browser test: notebooks 00, 01, 05 and 12 as a learner meets them, run in JupyterLab in Chromium.

nbval runs each notebook in a kernel without a frontend, so it cannot see what JupyterLab shows: a
live view that never renders or stays "running", a figure that is an empty box, red blocks of
TensorFlow's start-up noise, an error a learner would read. This test starts the real JupyterLab
(pinned in the ``dev`` extra) on a free port with a token, opens each notebook in headless Chromium
through playwright, clicks Run → Run All Cells, and reads the page.

Prerequisites, installed by ``make check`` (as root it apt-installs Chromium); elsewhere the test
skips and names them:

- Debian's Chromium at /usr/bin/chromium (``sudo apt-get install chromium``); playwright drives it
  with ``executable_path``, since its own browser download is not available everywhere;
- ``pip install -e '.[dev]'`` (jupyterlab, playwright).

What it leaves in ``out/browser/``: ``<notebook>.png`` (the whole notebook after the run, also after
a failure: the picture shows where it stopped), ``<notebook>.json`` (time to open, time of the run,
load average, stderr seen, problems), and ``live-view-01.png`` (notebook 01's two-worker live view,
the README's screenshot: ``cp out/browser/live-view-01.png docs/images/live-view.png``).

Timings are recorded, not asserted: speed targets live in ``kit bench``. Every wait here has a bound
and its error names what it waited for; the bounds only guard against hangs.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import importlib.util
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest

import exercise_list
from conftest import CHROMIUM, REPO, describe, kit_processes

NOTEBOOK_DIR = REPO / "notebooks"
OUT = REPO / "out" / "browser"
#: Each notebook as JupyterLab ran it, with its outputs, for `make site` (tools/build_site.py).
EXECUTED = REPO / "out" / "executed"

NOTEBOOKS = ["00-tf-config-and-clusters.ipynb", "01-single-vs-multi-worker.ipynb", "05-fault-tolerance.ipynb",
             "12-keras3-jax.ipynb"]
#: Notebooks that draw figures: each must show at least one image, and every image must have a size.
PLOTTING = {"01-single-vs-multi-worker.ipynb", "05-fault-tolerance.ipynb"}
#: Notebooks whose runs must show the live view (``table.kit-view``, one ``tr[data-kit-task]`` per task).
LIVE_VIEW = {"01-single-vs-multi-worker.ipynb", "05-fault-tolerance.ipynb", "12-keras3-jax.ipynb"}
#: Runs that fail on purpose, to teach the error: (notebook, function in the view's title or the first
#: line of the cell that runs it, task). Their row must end "failed"; every other row of every view must
#: end "done". (05 runs the same `train` in every cell: its kill is told by the cell.)
FAILS_ON_PURPOSE = {("00-tf-config-and-clusters.ipynb", "fail_on_worker_1", "worker:1"),
                    ("05-fault-tolerance.ipynb", "def kill_after_step(task, step):", "worker:1"),
                    # its peer was killed: TensorFlow aborts its collective (UnavailableError) within a
                    # second, and the kit waits up to LOST_PEERS_GRACE_SECONDS for that before it raises
                    ("05-fault-tolerance.ipynb", "def kill_after_step(task, step):", "worker:0"),
                    # 12's process 1 is killed (process 0's all-reduce then fails at once), then raises (process 0
                    # waits in its all-reduce, and the kit ends it)
                    ("12-keras3-jax.ipynb", "def run_until_stopped(how):", "worker:1"),
                    ("12-keras3-jax.ipynb", "def run_until_stopped(how):", "worker:0"),
                    ("12-keras3-jax.ipynb", 'raised = run_until_stopped("raise")', "worker:1"),
                    ("12-keras3-jax.ipynb", 'raised = run_until_stopped("raise")', "worker:0")}
#: TensorFlow's C++ start-up lines that the kit hides; none may reach a stderr block in the page.
NOISE = ("cuInit", "oneDNN", "cpu_feature_guard", "absl::InitializeLog")

VIEWPORT = {"width": 1280, "height": 900}
#: The tallest full-notebook screenshot (px); Chromium's surfaces end near 16,384.
MAX_SHOT_HEIGHT = 16000

# Bounds (seconds), each a hang guard several times the time measured on 2 cores shared with other
# test runs (load average 1.5 to 6.5).
SERVER_READY_S = 60.0    # JupyterLab answers /api/status (3-5 s measured)
OPEN_S = 90.0            # the notebook is open and its new kernel idle (5-8 s)
RUN_S = 600.0            # Run All Cells until the kernel is idle (00: about 5 s since 00b took its launches; 01: 29-61 s, 05: 105 s, load 7;
                         # on 2026-11-28's slower machines 01 took ~200 s and 05 165 s beside the other tests)
SETTLE_S = 20.0          # images decoded, layout settled for a screenshot
STOP_S = 30.0            # a kernel or the server ends after being asked to
KIT_GONE_S = 30.0        # the kit's processes follow their kernel (the lifeline polls every 0.5 s)
#: pytest-timeout's bound for one notebook: the sum of the bounds above (the server's start counts
#: in the first test), plus a minute for screenshots and reading the page.
TEST_TIMEOUT_S = int(SERVER_READY_S + OPEN_S + RUN_S + SETTLE_S + 2 * STOP_S + KIT_GONE_S + 60)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(TEST_TIMEOUT_S)]


def missing_prerequisites() -> list[str]:
    """What must be installed for this test, in the words of the command that installs it."""
    missing = []
    if not os.access(CHROMIUM, os.X_OK):
        missing.append(f"Chromium at {CHROMIUM}: `sudo apt-get install chromium` (`make check` does it as root)")
    absent = [name for name in ("playwright", "jupyterlab") if importlib.util.find_spec(name) is None]
    if absent:
        missing.append(f"{' and '.join(absent)}: `pip install -e '.[dev]'` (`make check` does it)")
    return missing


@pytest.fixture(scope="module", autouse=True)
def prerequisites() -> None:
    """Skip with the install commands where something is missing, except on CI (root, Debian, through
    `make check`), where everything is installed and a skip would hide a broken install step."""
    missing = missing_prerequisites()
    if missing and os.environ.get("CI"):
        pytest.fail("CI installs these through `make check`, yet they are missing: " + "; ".join(missing))
    if missing:
        pytest.skip("needs " + "; ".join(missing))


# ----- JupyterLab ---------------------------------------------------------------------------------

@dataclasses.dataclass
class Lab:
    """A running JupyterLab server: its process, address and token."""

    process: subprocess.Popen
    url: str
    token: str
    log: Path

    def api(self, method: str, path: str) -> Any:
        """One call to the server's REST API with the token; the decoded JSON answer (None if empty)."""
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _die_with_the_test(libc: ctypes.CDLL) -> None:
    """Runs in the server's process before exec: the kernel sends it SIGTERM when the test process
    dies, even by SIGKILL (a CI time limit), when no ``finally`` runs. Its kernels follow it
    (ipykernel polls its parent), and the kit's processes follow their kernel (kit.core._lifeline).
    ``libc`` is loaded before the fork: loading a library in the child could deadlock."""
    pr_set_pdeathsig = 1
    if libc.prctl(pr_set_pdeathsig, signal.SIGTERM) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def _settings(directory: Path) -> None:
    """User settings for this server only: no autosave (running a notebook must not write its outputs
    into notebooks/, which are committed clean) and no question about Jupyter news over the page."""
    for plugin, values in {"docmanager-extension/plugin": {"autosave": False},
                           "apputils-extension/notification": {"fetchNews": "false",
                                                               "checkForUpdates": False}}.items():
        path = directory / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


def _wait_for_server(process: subprocess.Popen, runtime: Path, token: str) -> str:
    """The server's URL once /api/status answers. The port (0: the system's choice) is read from
    the runtime file the server writes; each try waits on the process, so an exit is seen at once."""
    deadline = time.monotonic() + SERVER_READY_S
    info_file = runtime / f"jpserver-{process.pid}.json"
    url, last_error = None, "no runtime file yet"
    while time.monotonic() < deadline:
        try:
            if url is None:
                url = f"http://127.0.0.1:{json.loads(info_file.read_text())['port']}"
            request = urllib.request.Request(f"{url}/api/status", headers={"Authorization": f"token {token}"})
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200:
                    return url
        except FileNotFoundError:
            last_error = "no runtime file yet"  # the server writes it once it listens
        except (json.JSONDecodeError, KeyError) as error:
            url, last_error = None, f"runtime file incomplete ({error!r})"  # being written
        except OSError as error:  # connection refused, or an HTTP error: not ready yet
            last_error = repr(error)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=0.2)
        if process.returncode is not None:
            raise AssertionError(f"JupyterLab exited with code {process.returncode} before answering "
                                 f"/api/status")
    raise AssertionError(f"JupyterLab did not answer /api/status within {SERVER_READY_S:.0f} s "
                         f"(last: {last_error})")


def _stop_server(process: subprocess.Popen) -> list[str]:
    """Stop the server (SIGTERM: it shuts its kernels down), then every process it started that is
    still there; returns those that had to be killed."""
    try:
        started = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        started = []
    process.terminate()
    try:
        process.wait(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # its own session: the server and what shares its group
        process.wait(timeout=STOP_S)
    _, alive = psutil.wait_procs(started, timeout=STOP_S)
    left = describe(alive)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    return left


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """JupyterLab on 127.0.0.1 and a free port, rooted at notebooks/, with a token; configuration,
    settings, runtime files, workspaces and checkpoints in a temporary folder, so that neither the
    user's setup changes what is tested nor the test leaves anything in ~/.jupyter or beside the
    notebooks (only what the notebooks write themselves, in notebooks/out). Stopped, with every process
    it started, whatever happens."""
    home = tmp_path_factory.mktemp("jupyterlab")
    _settings(home / "settings")
    token = secrets.token_hex(24)
    env = dict(os.environ, JUPYTER_TOKEN=token, JUPYTER_CONFIG_DIR=str(home / "config"),
               JUPYTER_DATA_DIR=str(home / "data"), JUPYTER_RUNTIME_DIR=str(home / "runtime"))
    env.pop("KIT_VIEW", None)  # `make test` and `make check` set it to "text" for nbval; a learner's kernel has widgets
    log = home / "server.log"
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               "--ServerApp.port=0", "--ServerApp.port_retries=0", f"--ServerApp.root_dir={NOTEBOOK_DIR}",
               "--ServerApp.allow_root=True",  # CI runs as root
               "--ServerApp.terminals_enabled=False",
               "--LabApp.expose_app_in_browser=True",  # window.jupyterapp, to read cells and kernel state
               f"--LabApp.user_settings_dir={home / 'settings'}", f"--LabApp.workspaces_dir={home / 'workspaces'}",
               # opening a notebook makes a checkpoint: keep it out of notebooks/ (an absolute path wins)
               f"--FileCheckpoints.checkpoint_dir={home / 'checkpoints'}"]
    libc = ctypes.CDLL(None, use_errno=True)
    with log.open("w") as log_file:
        process = subprocess.Popen(command, env=env, cwd=NOTEBOOK_DIR, stdin=subprocess.DEVNULL,
                                   stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                                   preexec_fn=lambda: _die_with_the_test(libc))
    server = None
    try:
        server = Lab(process, _wait_for_server(process, home / "runtime", token), token, log)
        autosave = server.api("GET", "/lab/api/settings/@jupyterlab/docmanager-extension:plugin")
        assert autosave["settings"].get("autosave") is False, f"autosave is not off: {autosave['settings']}"
        yield server
    except AssertionError as error:
        raise AssertionError(f"{error}\nJupyterLab's log ({log}):\n"
                             f"{server.log_tail() if server else log.read_text(errors='replace')[-3000:]}"
                             ) from error
    finally:
        left = _stop_server(process)
        assert not left, f"processes JupyterLab started outlived it (killed now): {left}"


# ----- the page -----------------------------------------------------------------------------------

#: The open notebook's state from JupyterLab's own model (``window.jupyterapp``), or null while the
#: notebook ``path`` is not the current tab or has no session yet.
STATE_JS = """(path) => {
  const app = window.jupyterapp;
  const panel = app && app.shell.currentWidget;
  if (!panel || !panel.context || panel.context.path !== path || !panel.sessionContext) return null;
  const session = panel.sessionContext.session;
  const kernel = session ? session.kernel : null;
  const cells = Array.from(panel.content.model.cells).filter(c => c.type === 'code');
  const tags = c => c.getMetadata('tags') || [];
  return {
    kernel: kernel ? kernel.status : 'no kernel',
    code_cells: cells.length,
    counted: cells.filter(c => c.executionCount !== null).length,
    running: cells.filter(c => c.executionState === 'running').length,
    errors: cells.filter(c => !tags(c).includes('raises-exception')
                              && c.outputs.toJSON().some(o => o.output_type === 'error')).length,
  };
}"""

#: Done: the kernel is idle, no cell is queued or running, and every code cell has an execution
#: count, or a cell failed (then Run All stops, and waiting longer would only hit the bound).
DONE_JS = f"""(path) => {{
  const s = ({STATE_JS})(path);
  return s !== null && s.kernel === 'idle' && s.running === 0 && (s.counted === s.code_cells || s.errors > 0);
}}"""

#: Every image in the notebook's outputs has finished loading (decoded or failed).
IMAGES_LOADED_JS = """() => Array.from(window.jupyterapp.shell.currentWidget.node
    .querySelectorAll('.jp-OutputArea-output img')).every(img => img.complete)"""

#: What each code cell shows: execution count, tags, errors (model), stderr blocks, images, live
#: views and widgets that did not render (DOM). textContent, not innerText: JupyterLab skips the
#: rendering of cells outside the viewport (content-visibility), and innerText is empty there.
CELLS_JS = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const text = el => el ? (el.textContent || '') : '';
  return panel.content.widgets.map((cell, index) => ({cell, index}))
    .filter(({cell}) => cell.model.type === 'code')
    .map(({cell, index}) => {
      const node = cell.node;
      const outputs = cell.model.outputs.toJSON();
      const children = Array.from(cell.outputArea.node.children)
        .filter(child => child.classList.contains('jp-OutputArea-child'));
      return {
        index,
        count: cell.model.executionCount,
        tags: cell.model.getMetadata('tags') || [],
        source: cell.model.sharedModel.getSource().split('\\n')[0].slice(0, 80),
        errors: outputs.filter(o => o.output_type === 'error').map(o => `${o.ename}: ${o.evalue}`),
        input_hidden: cell.inputHidden,
        stdout: outputs.filter(o => o.output_type === 'stream' && o.name === 'stdout')
          .map(o => Array.isArray(o.text) ? o.text.join('') : o.text).join('').slice(0, 500),
        stderr: Array.from(node.querySelectorAll(
            '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'))
          .map(el => ({text: text(el).slice(0, 3000), in_widget: el.closest('.jupyter-widgets') !== null})),
        images: Array.from(node.querySelectorAll('.jp-OutputArea-output img'))
          .map(img => ({width: img.naturalWidth, height: img.naturalHeight})),
        views: Array.from(node.querySelectorAll('table.kit-view')).map(table => ({
          title: text(table.previousElementSibling).trim(),
          rows: Array.from(table.querySelectorAll('tr[data-kit-task]'))
            .map(row => [row.getAttribute('data-kit-task'), row.getAttribute('data-kit-state')]),
        })),
        unrendered_widgets: outputs.map((output, i) => [output, children[i]])
          .filter(([output, child]) => output.data && output.data['application/vnd.jupyter.widget-view+json']
                                       && !(child && child.querySelector('.jupyter-widgets')))
          .map(([output, child]) => child ? text(child).trim().slice(0, 200) : '(no output element)'),
      };
    });
}"""

#: The exercises' answers as JupyterLab renders the last markdown cells (in view after Run All): closed
#: ``<details>`` whose summary is "Answer", and whether each is open.
ANSWERS_JS = """() => Array.from(document.querySelectorAll('.jp-MarkdownCell .jp-RenderedMarkdown details'))
  .filter(d => (d.querySelector('summary') || {}).textContent === 'Answer').map(d => d.open)"""

#: Hide the side bars (for the screenshot: the notebook alone) and scroll to the notebook's top
#: (Run All leaves it at the last cell).
TO_THE_TOP_JS = """() => {
  window.jupyterapp.shell.collapseLeft();
  window.jupyterapp.shell.collapseRight();
  window.jupyterapp.shell.currentWidget.content.node.querySelector('.jp-WindowedPanel-outer').scrollTop = 0;
}"""

#: The height of the notebook's content (its cells and footer, without the empty space JupyterLab
#: adds below the last cell so that it can scroll to the top) and of the scroller that shows it.
SIZE_JS = """() => {
  const scroller = window.jupyterapp.shell.currentWidget.content.node.querySelector('.jp-WindowedPanel-outer');
  const content = Array.from(scroller.children).reduce((sum, child) => sum + child.offsetHeight, 0);
  return {content, client: scroller.clientHeight};
}"""

#: Resolves after the browser has drawn two more frames (cells that came into view are laid out).
FRAMES_JS = "() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))"


def wait_in_page(page: Any, script: str, what: str, bound_s: float, arg: Any = None,
                 state: str | None = None) -> None:
    """Wait (bounded) until ``script`` is true in the page; the error names ``what`` and, if given,
    the notebook's state (``STATE_JS`` for that path) at the time."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(script, arg=arg, timeout=bound_s * 1000, polling=250)
    except PlaywrightTimeout:
        seen = page.evaluate(STATE_JS, state) if state else None
        raise AssertionError(f"waited {bound_s:.0f} s for {what}" + (f"; notebook state: {seen}" if state else "")
                             ) from None


def open_notebook(page: Any, lab: Lab, name: str) -> None:
    """Open ``name`` as a learner does (a /lab/tree URL with the token) in a workspace of its own, so
    that no tab of an earlier notebook is restored, and wait for its new kernel to be idle."""
    workspace = f"browser-test-{name.removesuffix('.ipynb')}"
    page.goto(f"{lab.url}/lab/workspaces/{workspace}/tree/{name}?reset&token={lab.token}",
              timeout=OPEN_S * 1000)
    wait_in_page(page, f"(path) => {{ const s = ({STATE_JS})(path); return s !== null && s.kernel === 'idle'; }}",
                 f"{name} to open with an idle kernel", OPEN_S, arg=name, state=name)


def run_all_cells(page: Any, name: str) -> float:
    """Run → Run All Cells from the menu bar; wait (bounded) until the run is over. Its seconds."""
    state = page.evaluate(STATE_JS, name)
    assert state["counted"] == 0, f"{name} opened with executed cells (committed outputs?): {state}"
    page.get_by_role("menuitem", name="Run", exact=True).click()
    start = time.monotonic()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    wait_in_page(page, DONE_JS, f"Run All Cells of {name} to finish (kernel idle, every code cell run)",
                 RUN_S, arg=name, state=name)
    return time.monotonic() - start


def problems_in(name: str, cells: list[dict]) -> tuple[list[str], list[str]]:
    """What is wrong in what the page shows (problems), and stderr worth a look that is not wrong (notes)."""
    problems, notes = [], []
    for cell in cells:
        where = f"cell {cell['index']} [{cell['count']}] `{cell['source']}`"
        expected_error = "raises-exception" in cell["tags"]
        if cell["count"] is None:
            problems.append(f"{where}: not executed")
        if cell["errors"] and not expected_error:
            problems.append(f"{where}: error output {cell['errors']}")
        if expected_error and not cell["errors"]:
            problems.append(f"{where}: tagged raises-exception but shows no error")
        for block in cell["stderr"]:
            place = "in a task's log panel" if block["in_widget"] else "in the cell"
            noise = [marker for marker in NOISE if marker in block["text"]]
            if noise:
                problems.append(f"{where}: TensorFlow start-up noise {noise} in a red stderr block {place}")
            elif "Traceback" in block["text"] and not expected_error:
                problems.append(f"{where}: a traceback in a stderr block {place}: {block['text'][-500:]}")
            elif not expected_error:
                notes.append(f"{where}: stderr {place}: {block['text'][:300]}")
        for image in cell["images"]:
            if not (image["width"] > 0 and image["height"] > 0):
                problems.append(f"{where}: an image of size {image['width']}x{image['height']} (not rendered)")
        for text in cell["unrendered_widgets"]:
            problems.append(f"{where}: a widget that did not render; the page shows {text!r}")
    if name in PLOTTING and not any(cell["images"] for cell in cells):
        problems.append("no figure in the page (the notebook plots)")
    # the live view: every task's row ends "done", or "failed" where the notebook fails it on purpose
    rows = [(cell, view["title"], task, state)
            for cell in cells for view in cell["views"] for task, state in view["rows"]]
    if name in LIVE_VIEW and not rows:
        problems.append("no live view (table.kit-view with tr[data-kit-task] rows) in the page")
    for cell, title, task, state in rows:
        on_purpose = {(name, title.split(" on ")[0], task), (name, cell["source"], task)} & FAILS_ON_PURPOSE
        expected = "failed" if on_purpose else "done"
        if state != expected:
            problems.append(f"cell {cell['index']} [{cell['count']}]: live view {title!r}: {task} ended "
                            f"{state!r}, not {expected!r}")
    return problems, notes


def fit_viewport(page: Any, name: str) -> str | None:
    """Make the viewport as tall as the notebook (up to MAX_SHOT_HEIGHT), for a picture of all of it.
    Cells that come into view are laid out anew and may grow, so measure again after each resize,
    until the content fits after two drawn frames. Returns a note if the notebook is taller."""
    height = VIEWPORT["height"]
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        page.evaluate(TO_THE_TOP_JS)
        page.evaluate(FRAMES_JS)
        size = page.evaluate(SIZE_JS)
        if size["content"] <= size["client"]:
            return None
        height += size["content"] - size["client"]
        if height > MAX_SHOT_HEIGHT:
            page.set_viewport_size({"width": VIEWPORT["width"], "height": MAX_SHOT_HEIGHT})
            return f"the picture shows the first {MAX_SHOT_HEIGHT} px of a taller notebook"
        page.set_viewport_size({"width": VIEWPORT["width"], "height": height})
    raise AssertionError(f"waited {SETTLE_S:.0f} s for {name}'s layout to settle in a tall viewport "
                         f"(last: {height} px) for its screenshot")


def photograph(page: Any, name: str) -> dict[str, Any]:
    """``out/browser/<notebook>.png``: the whole notebook in one picture (side bars hidden, the
    viewport as tall as the notebook, up to MAX_SHOT_HEIGHT); for notebook 01 also its live view
    with the most tasks, alone (``live-view-01.png``). Returns what the record says about them."""
    stem = name.removesuffix(".ipynb")
    shot: dict[str, Any] = {"screenshot": str((OUT / f"{stem}.png").relative_to(REPO))}
    if page.evaluate(STATE_JS, name) is None:  # the notebook never opened: the page as it is
        page.screenshot(path=str(OUT / f"{stem}.png"))
        return shot
    note = fit_viewport(page, name)
    if note:
        shot["screenshot_note"] = note
    page.screenshot(path=str(OUT / f"{stem}.png"), full_page=True)
    if name.startswith("01"):
        tables = page.locator("table.kit-view")
        rows = [tables.nth(i).locator("tr[data-kit-task]").count() for i in range(tables.count())]
        if rows:
            view = tables.nth(rows.index(max(rows))).locator("xpath=ancestor::div[contains(@class, 'widget-vbox')][1]")
            view.screenshot(path=str(OUT / "live-view-01.png"))
            shot["live_view_screenshot"] = str((OUT / "live-view-01.png").relative_to(REPO))
    return shot


def kernel_of(lab: Lab, name: str) -> tuple[str, psutil.Process]:
    """The session id of the notebook ``name`` and its kernel's process (a child of the server whose
    command line names the kernel's connection file)."""
    sessions = [s for s in lab.api("GET", "/api/sessions") if s["path"] == name]
    assert len(sessions) == 1, f"expected one session for {name}, the server has {sessions}"
    kernel_id = sessions[0]["kernel"]["id"]
    for proc in psutil.Process(lab.process.pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if any(f"kernel-{kernel_id}.json" in arg for arg in proc.cmdline()):
                return sessions[0]["id"], proc
    raise AssertionError(f"no process of kernel {kernel_id} ({name}) among JupyterLab's children")


def shut_down_kernel(lab: Lab, name: str) -> list[str]:
    """Shut the notebook's kernel down through JupyterLab's REST API (DELETE the session), wait
    (bounded) for it to exit, then for the kit's processes it owned to follow. Returns those still
    alive (killed now, so that they do not burden later tests)."""
    session_id, kernel = kernel_of(lab, name)
    lab.api("DELETE", f"/api/sessions/{session_id}")
    _, alive = psutil.wait_procs([kernel], timeout=STOP_S)
    assert not alive, f"the kernel of {name} (pid {kernel.pid}) still runs {STOP_S:.0f} s after its shutdown"
    _, alive = psutil.wait_procs(kit_processes(kernel.pid), timeout=KIT_GONE_S)
    alive += kit_processes(kernel.pid)  # none can start now, but look once more
    left = describe(alive)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    return left


def check_cell_problems(cells: list[dict]) -> list[str]:
    """The notebook's checks (cells tagged ``check``, tools/reading.py) as a learner meets them: the input
    collapsed, and one printed line of what was confirmed in view."""
    problems = []
    for cell in cells:
        if "check" not in cell["tags"]:
            continue
        if not cell["input_hidden"]:
            problems.append(f"cell {cell['index']} ({cell['source']!r}) is a check whose input is not collapsed")
        if not cell["stdout"].strip():
            problems.append(f"cell {cell['index']} ({cell['source']!r}) is a check that printed nothing")
    return problems


#: The notebook as JupyterLab holds it after the run (its model, as it would save it, outputs included),
#: and for each code cell's outputs the HTML of the widgets the page shows (the live view's table and its
#: events; not the log panels): the notebook keeps no widget state, so that HTML is all a page built from
#: it can show of the live view.
EXECUTED_JS = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const shown = panel.content.widgets.map(cell => cell.model.type !== 'code' ? [] :
    Array.from(cell.outputArea.node.children)
      .filter(child => child.classList.contains('jp-OutputArea-child'))
      .map(child => {
        const html = Array.from(child.querySelectorAll('.widget-html-content')).map(el => el.innerHTML).join('');
        const text = Array.from(child.querySelectorAll('table.kit-view')).map(table =>
          [(table.previousElementSibling ? table.previousElementSibling.textContent : '').trim()]
            .concat(Array.from(table.querySelectorAll('tr[data-kit-task]')).map(row =>
              Array.from(row.children).map(td => td.textContent.trim()).filter(t => t).join('  ')))
            .join('\\n')).join('\\n');
        return html ? {html, text} : null;
      }));
  return {notebook: panel.context.model.toJSON(), shown};
}"""


def save_executed(page: Any, name: str, started: str) -> str:
    """``out/executed/<notebook>``: the notebook JupyterLab ran, with its outputs, each widget output with the
    HTML (and a text table) its page showed beside the widget. Returns the path, for the record."""
    import datetime

    import nbformat

    got = page.evaluate(EXECUTED_JS)
    notebook, failed = got["notebook"], []
    for cell in notebook["cells"]:  # the model says "attachments": null where a saved file has no key
        for key in [key for key, value in cell.items() if value is None and key != "execution_count"]:
            del cell[key]
    code = [(cell, shown) for cell, shown in zip(notebook["cells"], got["shown"]) if cell["cell_type"] == "code"]
    for number, (cell, shown) in enumerate(code):
        tags = cell.get("metadata", {}).get("tags", [])
        if any(o["output_type"] == "error" for o in cell["outputs"]) and "raises-exception" not in tags:
            failed.append(number)
        for output, view in zip(cell["outputs"], shown):
            if view and "application/vnd.jupyter.widget-view+json" in output.get("data", {}):
                output["data"].update({"text/html": view["html"], "text/plain": view["text"] or output["data"]
                                       .get("text/plain", "")})
    notebook["metadata"]["executed"] = {
        "by": "JupyterLab in Chromium (tests/test_browser.py)", "started": started,
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cores": os.cpu_count(), "view": "widget", "failed_cells": failed}
    nbformat.validate(nbformat.from_dict(notebook))
    EXECUTED.mkdir(parents=True, exist_ok=True)
    partial = EXECUTED / f"{name}.part"
    partial.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
    partial.replace(EXECUTED / name)
    return str((EXECUTED / name).relative_to(REPO))


# ----- the test -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NOTEBOOKS, ids=lambda name: name[:2])
def test_browser_runs_notebook_in_jupyterlab(name: str, lab: Lab, browser: Any) -> None:
    """Open the notebook in JupyterLab, Run All Cells from the menu, and check what the page shows:
    every code cell ran, no error or traceback, no TensorFlow noise in red, figures with a size, the
    live view's rows "done" (or "failed" where the notebook fails a task on purpose), and no kit
    process alive once the kernel is shut down."""
    import jupyterlab

    OUT.mkdir(parents=True, exist_ok=True)
    stem = name.removesuffix(".ipynb")
    record: dict[str, Any] = {"notebook": name, "cores": os.cpu_count(), "chromium": browser.version,
                              "jupyterlab": jupyterlab.__version__, "load_average_before": os.getloadavg()}
    problems: list[str] = []
    leftovers: list[str] = []
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    (EXECUTED / name).unlink(missing_ok=True)  # no older run's outputs for `make site` if this one fails early
    started = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    with contextlib.ExitStack() as finally_:
        # run in reverse order, also after a failure: screenshot, stop the kernel, close, record
        finally_.callback(lambda: (OUT / f"{stem}.json").write_text(
            json.dumps(dict(record, kit_processes_left=leftovers), indent=2) + "\n"))
        finally_.callback(context.close)
        finally_.callback(lambda: leftovers.extend(shut_down_kernel(lab, name)))
        finally_.callback(lambda: record.update(photograph(page, name)))
        start = time.monotonic()
        open_notebook(page, lab, name)
        record["open_s"] = round(time.monotonic() - start, 1)
        record["run_s"] = round(run_all_cells(page, name), 1)
        record["load_average_after"] = os.getloadavg()
        print(f"{name}: Run All Cells took {record['run_s']} s in the browser (load average "
              f"{record['load_average_after'][0]:.1f} on {os.cpu_count()} cores)")
        wait_in_page(page, IMAGES_LOADED_JS, f"the images of {name} to load", SETTLE_S)
        cells = page.evaluate(CELLS_JS)
        record["executed"] = save_executed(page, name, started)
        problems, record["stderr_notes"] = problems_in(name, cells)
        problems += check_cell_problems(cells)
        answers, exercises = page.evaluate(ANSWERS_JS), len(exercise_list.written(NOTEBOOK_DIR / name))
        record["answers_open"] = answers
        if answers.count(False) != exercises:
            problems.append(f"{answers.count(False)} collapsed answers rendered for {exercises} exercises ({answers})")
        record["checks_shown"] = [cell["stdout"].strip() for cell in cells if "check" in cell["tags"]]
        record["problems"] = problems
        record["live_view"] = [[cell["index"], view["title"], view["rows"]] for cell in cells for view in cell["views"]]
    assert not leftovers, f"kit processes outlived the kernel of {name} (killed now): {leftovers}"
    assert not problems, f"{name} in JupyterLab (see {OUT / (stem + '.png')}):\n" + "\n".join(problems)
