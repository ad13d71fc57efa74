"""A notebook's first cell on Colab (or any Python without the kit): the kit's dependencies at the tested versions.

    %pip install --quiet --no-deps "kit @ git+https://github.com/OWNER/REPO@main"   # where the kit is missing
    import kit.tools.install; kit.tools.install.dependencies()
    kit.tools.install.lessons()                                                     # every time

(tools/colab.py writes that cell into every notebook.)

The kit's wheel carries the locks (locks/py3.X.txt, the tested set per Python). :func:`dependencies` installs the
kit's requirements with the lock of this Python as pip's constraints, except for what this kernel has loaded already
(Colab's kernel, its widget manager, pyzmq, tornado...): those stay as they are where they fit the kit's ranges, so the
running kernel is not pulled from under itself. Afterwards it says whether the runtime must restart, and why: only
when a package this kernel had loaded was replaced.

A notebook opened alone on Colab has none of the files beside it that a checkout has (its figures' sources, the
stored results notebooks 10 and 10b read, notebook 11's profiles in ../docs): :func:`lessons` copies the installed
kit's lessons folder and docs to /content/kit-lessons and works in its notebooks folder, as in a checkout.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ..core.files import shipped

#: Distributions kept where installed even if not loaded yet: Colab's widget manager serves these versions.
FRONT_END = ("ipywidgets", "widgetsnbextension", "jupyterlab-widgets")


def lock_path(version: tuple[int, int] | None = None) -> Path | None:
    """The lock this Python installs with (None: not a tested Python): ``kit/locks`` in an installed wheel, else the
    repository's ``locks/`` (a checkout)."""
    name = "py{}.{}.txt".format(*(version or sys.version_info[:2]))
    folder = shipped("locks", name)
    return folder / name if folder else None


def pins(text: str) -> dict[str, str]:
    """``{canonical name: version}`` of a lock's ``name==version`` lines."""
    return {canonicalize_name(m[1]): m[2] for m in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", text, re.M)}


def loaded() -> dict[str, str]:
    """``{canonical name: version}`` of the installed distributions whose modules this process has imported."""
    owners = metadata.packages_distributions()
    names = {canonicalize_name(dist) for module in list(sys.modules) if "." not in module
             for dist in owners.get(module, ())}
    return {name: version for name in names if (version := installed(name))}


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def kept(requirements: list[Requirement], before: dict[str, str]) -> dict[str, str]:
    """What stays as installed: the loaded distributions and the front end's, where the kit's own range admits them."""
    ranges = {canonicalize_name(r.name): r.specifier for r in requirements}
    candidates = {**{name: v for name in FRONT_END if (v := installed(name))}, **before}
    return {name: version for name, version in candidates.items()
            if ranges.get(name) is None or ranges[name].contains(version, prereleases=True)}


def constraints(lock: dict[str, str], keep: dict[str, str]) -> str:
    """pip's constraints: the lock's pins, and the kept distributions at their installed versions instead."""
    return "".join(f"{name}=={version}\n" for name, version in sorted({**lock, **keep}.items()))


def dependencies() -> None:
    """Install the kit's dependencies (see the module's text), and say what it did in a line or two."""
    requirements = [Requirement(r) for r in metadata.requires("kit") or [] if "extra ==" not in r]
    lock = lock_path()
    before = loaded()
    keep = kept(requirements, before)
    tested = pins(lock.read_text()) if lock else {}
    command = [sys.executable, "-m", "pip", "install", "--quiet", *map(str, requirements)]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kit-install-") as folder:
        if lock is not None:
            (Path(folder) / "constraints.txt").write_text(constraints(tested, keep))
            command += ["--constraint", str(Path(folder) / "constraints.txt")]
        else:
            print(f"Python {sys.version_info[0]}.{sys.version_info[1]} has no tested set (the kit is tested on 3.11, "
                  "3.12 and 3.13): installing the newest versions pyproject's ranges allow")
        subprocess.run(command, check=True)
    now = {name: installed(name) for name in before}
    changed = {name: (version, now[name]) for name, version in before.items() if now[name] != version}
    seconds = time.monotonic() - started
    other = {name: version for name, version in keep.items() if tested.get(name, version) != version}
    lines = [f"Installed the kit's dependencies in {seconds:.0f} s"
             + (f" (the tested set of {lock.name}" if lock else "")
             + (", but for what this runtime's kernel uses, kept as it was: "
                + ", ".join(f"{n} {v} (tested: {tested[n]})" for n, v in sorted(other.items())) if other else "")
             + (")" if lock else "")]
    if changed:
        lines.append("Restart the runtime now (Colab: Runtime > Restart session), then run the notebook from the top: "
                     "this kernel had loaded " + ", ".join(f"{n} {a}, now {b}" for n, (a, b) in sorted(changed.items())))
    else:
        lines.append("No restart needed: nothing this kernel had loaded was changed.")
    print("\n".join(lines))


def in_colab() -> bool:
    """Whether this is a Colab runtime (its ``google.colab`` package is there)."""
    try:
        from importlib.util import find_spec

        return find_spec("google.colab") is not None
    except ModuleNotFoundError:  # no google package at all
        return False


def lessons(folder: str = "kit-lessons") -> None:
    """On Colab, where the notebook has no folder of its own: copy the installed kit's lessons folder and docs to
    ``folder`` (under the working directory, /content on Colab; once) and work in its notebooks folder, as in a
    checkout. Elsewhere (a checkout, a copy made by ``kit notebooks``, not Colab) nothing."""
    if Path("figures").is_dir() or not in_colab():
        return
    from .cli import docs_dir
    from .export import notebooks_dir

    target = Path(folder).resolve()
    if not (target / "notebooks").is_dir():
        shutil.copytree(notebooks_dir(), target / "notebooks", ignore=shutil.ignore_patterns("__pycache__", "*.py"))
        shutil.copytree(docs_dir(), target / "docs", ignore=shutil.ignore_patterns("__pycache__", "__init__.py"))
    os.chdir(target / "notebooks")
    print(f"Working in {target / 'notebooks'}: a copy of the lessons' folder (figures, stored results, ../docs)")
