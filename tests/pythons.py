"""Other Pythons for the smoke tier (tests/test_pythons.py) and the Colab emulation (tests/test_colab.py).

A fresh venv per Python, with the kit installed from the wheel this checkout builds and its lock as pip's
constraints; its notebooks run through papermill with that venv's kernel; everything it starts is checked gone.
"""

from __future__ import annotations

import fcntl
import functools
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"


def interpreter(version: str) -> str:
    """The path of a Python ``version`` ("3.12"): on PATH, else pyenv's; skipped with the reason where missing, and
    a failure in CI (a tier that silently skips is no tier)."""
    found = shutil.which(f"python{version}")
    if found and subprocess.run([found, "-c", ""], capture_output=True).returncode == 0:  # not a pyenv shim that
        return found                                                                       # has no such version
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"))
    if candidates:
        return candidates[-1]
    reason = (f"no Python {version} here (PATH or {root}/versions). Fix: install it (pyenv install {version}, or "
              f"apt-get install python{version}-venv)")
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def run(command: list[str], timeout: float, what: str, **kwargs) -> subprocess.CompletedProcess:
    """Run ``command`` bounded; a failure or a time-out names ``what`` and shows the output's end."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{what} did not finish within {timeout:g} s: {(e.stdout or '')[-2000:]}") from None
    assert done.returncode == 0, f"{what} exited with {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


#: What the wheel is built from (pyproject.toml's packages and package-dir).
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "kit", "notebooks", "docs", "locks", "patches")


def build_wheel(folder: Path) -> Path:
    """The kit's wheel, built from a copy of this checkout in ``folder``: pip builds in the source folder, and its
    build/ and *.egg-info must not land in the checkout, nor collide with another build at the same time."""
    source = folder / "source"
    skip = shutil.ignore_patterns("out", "__pycache__", ".ipynb_checkpoints", "*.egg-info", "build")
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=skip)
        else:
            source.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO / name, source / name)
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w",
         str(folder / "wheels"), str(source)], 300, "pip wheel of the kit")
    (wheel,) = (folder / "wheels").glob("kit-*.whl")
    return wheel


#: Where :func:`wheels` keeps each Python's wheels between runs: beside Horovod's wheel in the kit's cache
#: ($KIT_CACHE_DIR, else ~/.cache/kit, as kit/tools/horovod_wheel.sh has it).
WHEELHOUSE = Path(os.environ.get("KIT_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                  / "kit") / "wheelhouse"


def wheels(python: str, *extra: str) -> dict[str, str]:
    """pip's settings (environment variables) that install with no index from a folder of wheels for ``python``:
    its lock's versions, pip, and ``extra`` requirements with what they need, downloaded on first use and kept
    (``WHEELHOUSE``/py3.X). Every venv of the tests installs from there, so a run downloads TensorFlow once per
    Python instead of once per venv, and no install fails on the network halfway (pip's own cache keeps nothing
    here: the registry's answers carry no caching headers). A lock per folder: two test workers fill it in turn."""
    version = run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], 60, f"{python}'s version")
    lock = REPO / "locks" / f"py{version.stdout.strip()}.txt"
    folder = WHEELHOUSE / f"py{version.stdout.strip()}"
    folder.mkdir(parents=True, exist_ok=True, mode=0o755)  # readable by the ordinary user of tests/test_laptop.py
    done = folder / (".filled-" + hashlib.sha256((lock.read_text() + "\n".join(extra)).encode()).hexdigest()[:16])
    download = [python, "-m", "pip", "download", "--quiet", "--prefer-binary", "--dest", str(folder)]
    with open(folder / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if not done.exists():
            run([*download, "--no-deps", "pip", "-r", str(lock)], 1800, f"pip download of {lock.name}'s wheels")
            if extra:
                run([*download, *extra], 1800, f"pip download of {' '.join(extra)}")
            broken = [wheel for wheel in folder.glob("*.whl") if not zipfile.is_zipfile(wheel)]  # cut short
            for wheel in broken:  # (a full disk): pip would take them as downloaded next time
                wheel.unlink()
            assert not broken, f"removed {len(broken)} incomplete wheels from {folder}: {[w.name for w in broken]}"
            done.touch()
    return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(folder)}


def make_venv(python: str, folder: Path) -> Path:
    """A fresh venv; the path of its python."""
    run([python, "-m", "venv", str(folder)], 120, f"{python} -m venv")
    return folder / "bin" / "python"


def left_behind(venv: Path) -> list[psutil.Process]:
    """Processes that run a Python of ``venv`` (none should outlive a notebook or a demo)."""
    return [process for process in psutil.process_iter(["exe", "cmdline"]) if process.pid != os.getpid()
            and str(venv) in (process.info["exe"] or "") + " ".join(process.info["cmdline"] or [])]


def no_process_left(venv: Path, seconds: float = 15) -> None:
    """Every process of ``venv`` gone within ``seconds`` (an ended kernel's engines take a moment to exit)."""
    _, alive = psutil.wait_procs(left_behind(venv), timeout=seconds)
    assert not alive, f"processes of {venv} left behind:\n" + "\n".join(
        f"{p.pid}: {' '.join(p.info['cmdline'] or [])[:200]}" for p in alive)


@functools.cache
def kernel(python: Path) -> str:
    """The name of ``python``'s own Jupyter kernel, installed into its environment once."""
    name = f"smoke-{python.parent.parent.name}"
    run([str(python), "-m", "ipykernel", "install", "--prefix", str(python.parent.parent), "--name", name],
        120, "ipykernel install")
    return name


def papermill(python: Path, notebook: Path, out: Path, timeout: float, prefix: list[str] = (),
              env: dict[str, str] | None = None) -> dict:
    """Run ``notebook`` through papermill with ``python``'s own kernel (``env`` added to its environment); the
    executed notebook."""
    run([*prefix, str(python), "-m", "papermill", str(notebook), str(out), "-k", kernel(python), "--cwd",
         str(out.parent), "--execution-timeout", str(int(timeout))], timeout + 60,
        f"papermill {notebook.name} with {python}", env={**os.environ, "KIT_VIEW": "text", **(env or {})})
    return json.loads(out.read_text())


def notebook(stem: str) -> Path:
    (path,) = NOTEBOOKS.glob(f"{stem}*.ipynb")
    return path


def outputs(executed: dict) -> str:
    """Every text the executed notebook's cells printed."""
    return "".join("".join(o.get("text", "")) if isinstance(o.get("text", ""), (str, list)) else ""
                   for cell in executed["cells"] if cell["cell_type"] == "code" for o in cell.get("outputs", []))
