"""The project's files agree with each other (pins, Binder copy, notebooks without outputs), and the
package: its license, its package data, and a wheel that works installed elsewhere."""

import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version


REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]*-*.ipynb"))


def requirements():
    """Every requirement of pyproject.toml: the dependencies and each extra's."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(spec) for spec in
            project["dependencies"] + [d for extra in project["optional-dependencies"].values() for d in extra]]


def lock_pins(path):
    """``{name: version}`` of a lock (uv pip compile's ``name==version`` lines) or of a conda environment's pip list."""
    pins = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^(?:\s+- )?([A-Za-z0-9][A-Za-z0-9_.-]*)==([^\s#;]+)", line)
        if match:
            pins[canonicalize_name(match[1])] = match[2]
    return pins


LOCKS = sorted((REPO / "locks").glob("py3.*.txt"))


def test_dependencies_are_ranges_with_a_floor_and_each_lock_pins_them_inside():
    """A library declares ranges (it installs beside a course image's or Colab's pins); the tested set is a lock
    per supported Python, each pin inside pyproject's range, and requires-python admits exactly those Pythons."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for requirement in requirements():
        assert not any(spec.operator in ("==", "===") for spec in requirement.specifier), \
            f"pyproject.toml pins {requirement} exactly: give a range (>= the oldest that works); the lock pins"
        assert any(spec.operator == ">=" for spec in requirement.specifier), f"{requirement} has no floor (>=)"
    assert [lock.name for lock in LOCKS] == ["py3.11.txt", "py3.12.txt", "py3.13.txt"], LOCKS
    supported = SpecifierSet(project["requires-python"])
    for lock in LOCKS:
        python = lock.name[2:-4]
        assert f"{python}.0" in supported, f"{lock.name}: requires-python {supported} does not admit {python}"
        pins = lock_pins(lock)
        for requirement in requirements():
            name = canonicalize_name(requirement.name)
            assert name in pins, f"{lock.name} has no pin for {requirement}: run make lock"
            assert requirement.specifier.contains(pins[name], prereleases=True), \
                f"{lock.name} pins {name}=={pins[name]} outside pyproject's {requirement}: run make lock"
    assert "3.10.0" not in supported and "3.14.0" in supported, "no ceiling on Python where no break is known"


def test_jax_is_the_newest_each_python_takes():
    """JAX 0.11 and later need Python 3.12: 3.11's lock keeps 0.10.2, 3.12's and 3.13's have 0.12 or later."""
    versions = {lock.name: Version(lock_pins(lock)["jax"]) for lock in LOCKS}
    assert versions["py3.11.txt"] < Version("0.11") and versions["py3.12.txt"] >= Version("0.12"), versions
    assert versions["py3.13.txt"] >= Version("0.12"), versions


def test_environment_yml_lists_the_pins_of_the_python_3_11_lock():
    """Binder's environment is Python 3.11 with the lock of 3.11, written by tools/environment_yml.py."""
    text = (REPO / "environment.yml").read_text()
    assert "  - python=3.11\n" in text
    assert lock_pins(REPO / "environment.yml") == lock_pins(REPO / "locks" / "py3.11.txt"), \
        "environment.yml differs from locks/py3.11.txt: run python tools/environment_yml.py"


def test_binder_environment_is_the_root_one():
    assert (REPO / "binder" / "environment.yml").read_text() == (REPO / "environment.yml").read_text()


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 2


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_clean_with_a_parameters_cell(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert not [c for c in code if c.get("outputs") or c.get("execution_count")], "outputs committed"
    tagged = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters'"
    first = "".join(nb["cells"][0]["source"])
    assert first.startswith(f"# {path.name[:2]}"), "the title carries the notebook's number"
    assert "What you will learn" in first
    assert "## What you saw" in "".join(nb["cells"][-1]["source"])


@pytest.mark.slow  # a pytest run that must time out: 4.3 s
def test_a_hung_test_fails_within_its_time_bound(tmp_path):
    """pytest-timeout bounds every test (pyproject: timeout); a hang is a failure that names the test."""
    assert tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["timeout"] > 0
    (tmp_path / "test_hang.py").write_text("import threading\n\ndef test_hangs():\n    threading.Event().wait()\n")
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
                             str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path), "-o", "timeout=2",
                             str(tmp_path / "test_hang.py")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "Timeout" in result.stdout and "test_hangs" in result.stdout, result.stdout


@pytest.mark.slow  # a pytest run in two xdist workers: ~5 s
def test_make_unit_runs_each_module_on_one_xdist_worker():
    """make unit's ``-n 2 --dist loadgroup`` keeps a module together (tests/conftest.py gives the groups): its
    module-scoped cluster starts once and its tests keep their order; the emulated-cluster modules share one."""
    unit = re.search(r"^unit:.*\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), re.M).group(1)
    assert "-n 2 --dist loadgroup" in unit, unit
    modules = ["tests/test_firewall.py", "tests/test_outcomes.py", "tests/test_sim_lifeline.py"]
    result = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "2", "--dist",
                             "loadgroup", "-m", "not slow", *modules], capture_output=True, text=True, timeout=300,
                            cwd=REPO, env={**os.environ, "COLUMNS": "1000"})
    ran = re.findall(r"^\[(gw\d)\] .*?(?:PASSED|SKIPPED) (tests/(\w+)\.py::.*?)\s*$", result.stdout, re.M)
    assert result.returncode == 0 and len(ran) > 10, result.stdout[-3000:]
    groups = {"test_sim_lifeline": "sim"}
    for worker, nodeid, module in ran:
        assert nodeid.endswith(f"@{groups.get(module, module)}"), f"{nodeid}: no xdist group"
    workers = {module: {w for w, _, m in ran if m == module} for _, _, module in ran}
    assert all(len(w) == 1 for w in workers.values()), f"a module ran on both workers: {workers}"


#: make test's and make check's python, standing in for .venv/bin/python
FAKE_PYTHON = r"""#!/bin/sh
# stands in for .venv/bin/python: the unit tests wait (bounded) for the notebooks' run to have started
case "$*" in
  *tools/binder_cgroup.py*|*--nbval-lax*) touch "$FAKE/notebooks-started"; echo "NOTEBOOKS RAN"; exit "${NOTEBOOKS_EXIT:-0}";;
  *"-m pytest tests "*)
    i=0; while [ ! -e "$FAKE/notebooks-started" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
    if [ -e "$FAKE/notebooks-started" ]; then echo "UNIT RAN beside the notebooks"; else echo "UNIT RAN alone"; fi
    exit "${UNIT_EXIT:-0}";;
esac
"""


def make_test(folder: Path, target: str = "test", **exits: str) -> subprocess.CompletedProcess:
    """`make test` (or ``target``) with the project's Makefile in ``folder``, its python (and the tools its targets
    look for) a stand-in: the recipes' own shell runs, the tests and notebooks do not."""
    (folder / "patches").mkdir(exist_ok=True)
    (folder / "kit" / "tools").mkdir(parents=True, exist_ok=True)
    for name in ("pyproject.toml", "kit/tools/horovod_wheel.sh", "patches/horovod-0.28.1-tf2.21.patch"):
        (folder / name).touch()
    (folder / "Makefile").write_text((REPO / "Makefile").read_text())
    bin_ = folder / "venv" / "bin"
    bin_.mkdir(parents=True, exist_ok=True)
    tools = {"python": FAKE_PYTHON, **{name: "#!/bin/sh\n" for name in ("tc", "slurmd", "nft")}}  # found: no apt
    for name, text in tools.items():
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    for stamp in (".installed", ".installed-horovod"):  # newer than the prerequisites above: no install
        (folder / "venv" / stamp).touch()
    (folder / "notebooks-started").unlink(missing_ok=True)
    env = {**os.environ, "FAKE": str(folder), "PATH": f"{bin_}:{os.environ['PATH']}", **exits}
    env.pop("MAKEFLAGS", None)
    return subprocess.run(["make", "--no-print-directory", "-C", str(folder), f"VENV={folder / 'venv'}",
                           "CHROMIUM=/bin/sh", target], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("target, said", [("test", "tests: exit {}; notebooks: exit {}"),
                                          ("check", "make unit: exit {}; make notebooks: exit {}")])
def test_both_tiers_run_the_notebooks_beside_the_tests_and_fail_if_either_fails(tmp_path, target, said):
    done = make_test(tmp_path, target)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "UNIT RAN beside the notebooks" in done.stdout
    unit_at = done.stdout.index("UNIT RAN")
    assert done.stdout.index("NOTEBOOKS RAN") > unit_at, "the notebooks' log comes after the unit tests' output"
    assert said.format(0, 0) in done.stdout
    failed_exit = "1" if target == "test" else "2"  # make check's halves are make targets: make says 2
    for exits, codes in [({"NOTEBOOKS_EXIT": "1"}, (0, failed_exit)), ({"UNIT_EXIT": "1"}, (failed_exit, 0))]:
        failed = make_test(tmp_path, target, **exits)
        assert failed.returncode != 0 and said.format(*codes) in failed.stdout, (exits, failed.stdout + failed.stderr)
        assert "NOTEBOOKS RAN" in failed.stdout  # the notebooks' log is shown either way


def test_make_test_needs_no_root_and_leaves_the_check_tier_to_make_check():
    """make test installs nothing outside .venv (no apt-get target among its prerequisites) and runs the tests not
    marked ``check``; make check (what .ci/run runs) has the apt-get targets and every test."""
    makefile = (REPO / "Makefile").read_text()
    rule = {name: re.search(rf"^{name}:([^#\n]*).*\n((?:\t.*\n)+)", makefile, re.M) for name in ("test", "check")}
    assert rule["test"][1].split() == ["$(HOROVOD_STAMP)"], rule["test"][1]
    assert '-m "not check"' in rule["test"][2] and "$(MAKE) --no-print-directory unit" in rule["check"][2]
    assert {"chromium", "netns-tools", "cluster-tools"} <= set(rule["check"][1].split()), rule["check"][1]
    assert "\nmake check " in (REPO / ".ci" / "run").read_text()


# --- the package: license, package data, and a non-editable install used from another directory ---

def build_config():
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_license_is_an_spdx_string_with_the_apache_text_beside_it():
    config = build_config()
    assert config["project"]["license"] == "Apache-2.0 AND CC-BY-SA-3.0"  # the code, and the bundled MNIST
    assert config["project"]["license-files"] == ["LICENSE", "kit/train/datasets/README.md"]
    assert "Creative Commons Attribution-Share Alike 3.0" in (REPO / "kit/train/datasets/README.md").read_text()
    text = (REPO / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"] and "END OF TERMS AND CONDITIONS" in text
    # setuptools 77 is the first to read `license` as an SPDX string; the upper bound is the tested one
    (spec,) = config["build-system"]["requires"]
    assert re.fullmatch(r"setuptools>=77,<\d+", spec), spec


def package_data_files(package: str, folder: Path) -> set[Path]:
    """The files of ``folder`` that pyproject's package-data globs put into the wheel for ``package``."""
    globs = build_config()["tool"]["setuptools"]["package-data"].get(package, [])
    return {p for pattern in globs for p in folder.glob(pattern)}


def test_package_data_carries_mnist_and_every_lesson_file_kit_notebooks_copies():
    from kit.tools import cli
    from kit.train import data

    setuptools = build_config()["tool"]["setuptools"]
    assert setuptools["package-dir"]["kit.notebooks"] == "notebooks"
    assert data.BUNDLED_MNIST in package_data_files("kit.train.datasets", REPO / "kit" / "train" / "datasets")
    shipped = set()
    for package in ("kit.notebooks", "kit.notebooks.figures", "kit.notebooks.trials", "kit.notebooks.results"):
        assert package in setuptools["packages"]
        folder = REPO / "notebooks" / Path(*package.split(".")[2:])
        shipped |= {p.relative_to(REPO / "notebooks") for p in package_data_files(package, folder)}
    copied = set(cli.notebook_files(REPO / "notebooks"))
    assert shipped == copied
    assert {Path(p.name) for p in NOTEBOOKS} <= copied and len([p for p in copied if p.suffix == ".svg"]) >= 10
    # every figure a lesson shows, and every notebook a lesson runs from trials/, is in the wheel
    figures = {p.relative_to(REPO / "notebooks") for p in (REPO / "notebooks" / "figures").iterdir() if p.is_file()}
    trials = {p.relative_to(REPO / "notebooks") for p in (REPO / "notebooks" / "trials").glob("*.ipynb")}
    shown = {Path("figures", m) for p in NOTEBOOKS for m in re.findall(r"\]\(attachment:([^)\s]+)\)", p.read_text())}
    results = {p.relative_to(REPO / "notebooks") for p in (REPO / "notebooks" / "results").iterdir() if p.is_file()}
    needed = figures | trials | shown | results
    assert len(shown) >= 10 and len(results) >= 2 and needed <= shipped, sorted(map(str, needed - shipped))


INSTALLED_CHECK = r"""
import json, os, subprocess, sys
from pathlib import Path

import kit
from kit.tools import cli
from kit.train import data

(x_train, y_train), _ = data.load_mnist()
copy = subprocess.run([sys.executable, "-m", "kit.tools.cli", "notebooks", "lessons"], capture_output=True,
                      text=True, timeout=120)
print(json.dumps({
    "kit": kit.__file__, "mnist": str(data.BUNDLED_MNIST), "train_images": len(x_train),
    "notebooks": str(cli.notebooks_dir()), "copy": [copy.returncode, copy.stdout + copy.stderr],
    "copied": sorted(str(p.relative_to("lessons")) for p in Path("lessons").rglob("*") if p.is_file()),
}))
"""


@pytest.mark.slow  # builds and installs a wheel, runs a copied lesson: about 30 s, more when pip fetches setuptools
def test_a_wheel_installed_elsewhere_finds_mnist_the_notebooks_and_its_commands(tmp_path, kit_wheel):
    wheel = kit_wheel  # from a copy of the checkout
    target, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    # MNIST (11.5 MB, already compressed) is most of it; notebooks/out, tests and docs stay out
    assert wheel.stat().st_size < 14e6, f"{wheel.name} is {wheel.stat().st_size / 1e6:.1f} MB"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "kit/train/datasets/mnist.npz" in names and "kit/notebooks/figures/01-data-parallel.svg" in names
    assert {"kit/locks/py3.13.txt", "kit/patches/horovod-0.28.1-tf2.21.patch", "kit/tools/horovod_wheel.sh",
            "kit/core/nojax_site/sitecustomize.py"} <= set(names), "the wheel lacks what kit.tools.install, " \
        "kit horovod or kit.core.nojax read"
    assert not [n for n in names if n.startswith(("kit/notebooks/out/", "tests/", "docs/"))]
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert any(n.endswith(".dist-info/licenses/kit/train/datasets/README.md") for n in names)
    assert "License-Expression: Apache-2.0 AND CC-BY-SA-3.0" in metadata

    installed = subprocess.run(pip + ["install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    env = {**os.environ, "PYTHONPATH": str(target), "KIT_VIEW": "text"}
    env.pop("KIT_DATA_DIR", None)

    def run(*command):
        return subprocess.run(command, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)

    checked = run(sys.executable, "-c", INSTALLED_CHECK)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    found = json.loads(checked.stdout.splitlines()[-1])
    assert found["kit"] == str(target / "kit" / "__init__.py")
    assert found["mnist"] == str(target / "kit" / "train" / "datasets" / "mnist.npz")
    assert found["train_images"] == 60000
    assert found["notebooks"] == str(target / "kit" / "notebooks")
    assert found["copy"][0] == 0, found["copy"][1]
    assert {p.name for p in NOTEBOOKS} | {"README.md", "figures/01-data-parallel.svg",
                                          "trials/scaling-trial.ipynb"} <= set(found["copied"])
    # the copy carries what its lessons link to (notebook 11's profiles), and what `kit notebooks` printed runs
    lessons = elsewhere / "lessons"
    linked = {m for p in lessons.glob("*.ipynb") for m in re.findall(r"\]\(((?:\.\./)?docs/[^)\s#]+)\)", p.read_text())}
    assert not [p.name for p in lessons.glob("*.ipynb") if "../docs/" in p.read_text()]
    assert all((lessons / link).exists() for link in linked), sorted(linked)
    assert (lessons / "docs" / "profiles" / "slurm" / "ipcluster_config.py").is_file()
    command = found["copy"][1].strip().splitlines()[-1].removeprefix("open them with: ").split()
    assert command[:2] == ["jupyter", "lab"] and Path(sys.executable).with_name("jupyter-lab").exists(), command
    # a copied lesson runs from there, with the installed kit, as a learner would run it (papermill)
    ran = run(sys.executable, "-m", "papermill", "--cwd", str(lessons), "-k", "python3", "--no-progress-bar",
              str(lessons / "00-tf-config-and-clusters.ipynb"), str(elsewhere / "00-run.ipynb"))
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    for command in ([str(target / "bin" / "kit"), "--help"], [sys.executable, "-m", "kit.tools.cli", "--help"]):
        shown = run(*command)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        for name in ("tfconfig", "demo", "notebooks", "sweep", "plot", "bench", "faults", "compat"):
            assert name in shown.stdout, (command, name, shown.stdout)


def test_the_environment_can_build_the_kit_without_build_isolation():
    """`pip wheel --no-build-isolation .` builds with this environment's setuptools: make installs the
    build-system's requirement (the SPDX `license` string needs setuptools 77 or later)."""
    from importlib.metadata import version

    from packaging.requirements import Requirement

    (requirement,) = [Requirement(r) for r in tomllib.loads((REPO / "pyproject.toml").read_text())
                      ["build-system"]["requires"] if r.startswith("setuptools")]
    assert requirement.specifier.contains(version("setuptools")), (
        f"setuptools {version('setuptools')} here; pyproject.toml's build-system requires {requirement}. "
        "Fix: make (it installs it), or pip install 'setuptools>=77,<85'")


def test_kit_notebooks_prints_the_install_that_adds_jupyterlab_where_it_is_missing(tmp_path, monkeypatch, capsys):
    from kit.tools import cli

    real = cli.importlib.util.find_spec
    monkeypatch.setattr(cli.importlib.util, "find_spec", lambda name: None if name == "jupyterlab" else real(name))
    assert cli.main(["notebooks", str(tmp_path / "lessons")]) == 0
    printed = capsys.readouterr().out
    assert "pip install 'jupyterlab==4.6.6'" in printed and printed.rstrip().endswith(f"jupyter lab {tmp_path / 'lessons'}")
    assert not [p.name for p in (tmp_path / "lessons").glob("*.ipynb") if "../docs/" in p.read_text()]


@pytest.mark.slow  # hashes every installed file (TensorFlow's 1.5 GB): ~10 s
def test_no_installed_file_differs_from_its_wheels_record():
    """Nothing of ours edits an installed package: every file under site-packages that a wheel's RECORD lists with a
    hash still has that hash (`make`'s install, Horovod's wheel and kit.core.nojax change no file of TensorFlow's)."""
    import base64
    import hashlib
    import importlib.metadata
    import sysconfig

    site = Path(sysconfig.get_paths()["purelib"])
    changed, checked = [], 0
    for dist in importlib.metadata.distributions(path=[str(site)]):
        for file in dist.files or []:
            if file.hash is None or file.hash.mode != "sha256":
                continue
            path = Path(file.locate())
            if not path.is_file():
                changed.append(f"{dist.metadata['Name']}: {file} is missing")
                continue
            digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
            checked += 1
            if digest != file.hash.value:
                changed.append(f"{dist.metadata['Name']}: {file} differs from its RECORD")
    assert checked > 1000, f"only {checked} files checked under {site}"
    assert not changed, "installed files changed after install (reinstall them; never edit an installed package):\n" + \
        "\n".join(changed[:20])
