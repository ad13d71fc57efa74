"""Write environment.yml and binder/environment.yml (conda, Binder) from the lock of Binder's Python.

    python tools/environment_yml.py        # make lock runs it after the locks

Binder's repo2docker copies binder/environment.yml into the image before the repository, so the file cannot point
at locks/ with `-r`: it lists the lock's pins itself (tests/test_packaging.py checks that they agree).
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = "3.11"  # Binder's, and the full suite's (README, Set-up)
HEADER = f"""\
# Conda environment for Binder and conda users: Python {PYTHON} and the tested set of locks/py{PYTHON}.txt
# (written by `make lock` with tools/environment_yml.py; tests/test_packaging.py checks that they agree).
name: kit
channels:
  - conda-forge
dependencies:
  - python={PYTHON}
  - pip
  - cmake      # cmake and g++ build Horovod (kit/tools/horovod_wheel.sh); not pip packages
  - gxx
  - pip:
"""


def main() -> None:
    from kit.tools.install import pins  # the kit's reader of a lock (make lock runs this with .venv's Python)

    text = HEADER + "".join(f"      - {name}=={version}\n"
                            for name, version in pins((REPO / "locks" / f"py{PYTHON}.txt").read_text()).items())
    for path in (REPO / "environment.yml", REPO / "binder" / "environment.yml"):
        path.write_text(text)


if __name__ == "__main__":
    main()
