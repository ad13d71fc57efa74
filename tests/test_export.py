"""`kit export`: a lesson's cells as a script that runs without the kit; and what every training notebook's
lesson must be (plain TensorFlow, exportable)."""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kit.tools import export
from kit.train.progress import OnTask, Progress, callback

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"


def notebook(cells: list[tuple[str, list[str]]], spec: dict | None, parameters: str = "EPOCHS = 3\n") -> dict:
    code = [{"cell_type": "code", "metadata": {"tags": ["parameters"]}, "source": parameters, "outputs": []}]
    code += [{"cell_type": "code", "metadata": {"tags": tags}, "source": source, "outputs": []} for source, tags in cells]
    return {"cells": [{"cell_type": "markdown", "metadata": {}, "source": "# A lesson\n\ntext"}, *code],
            "metadata": {"kit": {"export": spec}} if spec else {}}


LESSON = ("import os\n\ndef train(epochs, callbacks=()):\n    return {'epochs': epochs, 'tf_config': "
          "os.environ.get('TF_CONFIG')}\n")


def test_an_exported_lesson_runs_as_a_script_with_the_notebooks_defaults(tmp_path):
    nb = notebook([(LESSON, ["lesson"]), ("import kit\nkit.TFCluster()", []),
                   ("%%writefile hosts.sh\n#!/bin/sh\necho localhost:2\n", ["lesson"])],
                  {"call": "train", "arguments": {"epochs": "EPOCHS"}, "run": "python main.py"})
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    main, hosts = export.export(path, tmp_path / "out")
    assert hosts.name == "hosts.sh" and hosts.read_text().startswith("#!/bin/sh") and hosts.stat().st_mode & 0o100
    assert "kit" not in re.sub(r'""".*?"""', "", main.read_text(), flags=re.S).replace("kit export", "")
    run = lambda *args: subprocess.run([sys.executable, str(main), *args], capture_output=True, text=True,  # noqa: E731
                                       timeout=60, env={"TF_CONFIG": '{"task": 1}', "PATH": "/usr/bin"})
    assert json.loads(run().stdout.splitlines()[-1]) == {"epochs": 3, "tf_config": '{"task": 1}'}
    assert json.loads(run("--epochs", "5").stdout.splitlines()[-1])["epochs"] == 5
    assert "--epochs" in run("--help").stdout


@pytest.mark.parametrize("cells, spec, field", [
    ([(LESSON, ["lesson"])], None, "metadata.kit.export"),
    ([(LESSON, [])], {"call": "train"}, "tagged 'lesson'"),
    ([(LESSON, ["lesson"])], {"call": "fit"}, "export.call is 'fit'"),
    ([(LESSON, ["lesson"])], {"call": "train", "arguments": {"epochs": "STEPS"}}, "export.arguments names ['STEPS']"),
    ([(LESSON + "import kit\n", ["lesson"])], {"call": "train"}, "imports the kit"),
    ([("def train():\n    return kit.train.data.load_mnist()\n", ["lesson"])], {"call": "train"}, "uses the kit"),
    ([("import os\ndef train():\n    return os.environ['KIT_TASK']\n", ["lesson"])], {"call": "train"}, "'KIT_TASK'"),
    ([("def train(model):\n    return model._distribution_strategy\n", ["lesson"])], {"call": "train"},
     "private attribute ._distribution_strategy"),
])
def test_a_lesson_that_cannot_be_a_script_is_refused_naming_the_field_and_the_fix(cells, spec, field):
    with pytest.raises(export.ExportError) as error:
        export.script(notebook(cells, spec), "nb.ipynb")
    assert field in str(error.value) and "Fix:" in str(error.value)


def test_a_callback_made_in_the_kernel_is_built_where_it_is_unpickled():
    assert pickle.loads(pickle.dumps(OnTask(dict, epochs=2))) == {"epochs": 2}
    progress = Progress(128)
    assert progress.factory is callback and progress.args == (128, None)


def test_making_a_progress_callback_in_the_kernel_imports_no_tensorflow():
    code = "import sys, pickle, kit; pickle.dumps(kit.Progress(64)); print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.stdout.strip() == "False", out.stderr


def test_an_option_whose_default_is_none_takes_a_number_or_text(tmp_path):
    lesson = "def train(seed=None, path=None):\n    return {'seed': seed, 'path': path}\n"
    nb = notebook([(lesson, ["lesson"])], {"call": "train", "arguments": {"seed": "SEED", "path": "PATH"}},
                  parameters="SEED = None\nPATH = None\n")
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    main = export.export(path, tmp_path / "out")[0]
    ran = subprocess.run([sys.executable, str(main), "--seed", "1", "--path", "data/mnist.npz"], capture_output=True,
                         text=True, timeout=60)
    assert json.loads(ran.stdout.splitlines()[-1]) == {"seed": 1, "path": "data/mnist.npz"}, ran.stderr


def test_an_options_help_sentence_shows_in_help_with_its_default(tmp_path):
    """``metadata.kit.export.help`` gives an option the sentence ``--help`` shows (a path that every worker must
    share says so there); help for an option the script does not have is refused."""
    lesson = "def train(run_dir='out'):\n    return {'run_dir': run_dir}\n"
    spec = {"call": "train", "arguments": {"run_dir": "OUT_DIR"},
            "help": {"run_dir": "storage every worker shares: 100% of them"}}
    nb = notebook([(lesson, ["lesson"])], spec, parameters="OUT_DIR = 'out/03'\n")
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    main = export.export(path, tmp_path / "out")[0]
    shown = subprocess.run([sys.executable, str(main), "--help"], capture_output=True, text=True, timeout=60)
    assert "storage every worker shares: 100% of them (default: out/03)" in " ".join(shown.stdout.split()), shown
    ran = subprocess.run([sys.executable, str(main)], capture_output=True, text=True, timeout=60)
    assert json.loads(ran.stdout.splitlines()[-1]) == {"run_dir": "out/03"}, ran.stderr
    with pytest.raises(export.ExportError, match=r"export.help names \['epochs'\].*Fix:"):
        export.script(notebook([(lesson, ["lesson"])], {**spec, "help": {"epochs": "x"}},
                               parameters="OUT_DIR = 'out/03'\n"), "nb.ipynb")


def test_what_main_cannot_reach_is_left_out_with_its_comment_and_an_emptied_cell_goes():
    cells = ["import os\n\nLIMIT = helper_for_the_constant()",
             "def helper_for_the_constant():\n    return 3",
             "# the pitfall the notebook shows\ndef only_the_chief_saves():\n    return os.getpid()",
             "@decorated\ndef train():\n    return step()\n\n\n# shown in the notebook only\ndef probe():\n    pass",
             "def step():\n    return LIMIT"]
    assert export.unreachable(cells, "train") == ["only_the_chief_saves", "probe"]
    kept = export.reachable(cells, "train")
    assert kept == [cells[0], cells[1], "@decorated\ndef train():\n    return step()", cells[4]], kept


@pytest.mark.parametrize("name", export.exportable(export.notebooks_dir()))
def test_an_exported_script_holds_only_what_main_reaches(name):
    """The pitfalls and probes of a lesson stay in its notebook: its main.py has no function main() cannot reach."""
    notebook = json.loads((export.notebooks_dir() / name).read_text())
    text, _ = export.script(notebook, name)
    assert export.unreachable([text], "main") == [], f"{name}'s main.py holds what main() never reaches"


#: What each take-home script's options must cover: the notebook's parameters that change its training.
TRAINING_OPTIONS = {
    "04-dataset-sharding.ipynb": ["--policy", "--num-files", "--examples", "--global-batch", "--epochs", "--seed"],
    "08-scaling-experiments.ipynb": ["--per-worker-batch", "--lr-rule", "--warmup", "--base-lr", "--preset", "--seed"],
    "11-your-own-cluster.ipynb": ["--resolver", "--per-worker-batch-size", "--epochs", "--steps-per-epoch", "--seed"],
}
#: The path options whose help must say that every worker shares the storage (or, for Horovod, who writes there).
SHARED_PATHS = {"03-multi-worker-mirrored.ipynb": "--run-dir", "03b-checkpoints-and-tensorboard.ipynb": "--run-dir",
                "05-fault-tolerance.ipynb": "--backup-dir", "07-parameter-server.ipynb": "--checkpoint-dir"}


def _help(name: str, tmp_path: Path) -> str:
    main = export.export(NOTEBOOKS / name, tmp_path / "take-home")[0]
    shown = subprocess.run([sys.executable, str(main), "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    return " ".join(shown.stdout.split())


@pytest.mark.parametrize("name", sorted(TRAINING_OPTIONS))
def test_a_take_home_scripts_options_cover_what_changes_its_training(name, tmp_path):
    shown = _help(name, tmp_path)
    missing = [flag for flag in TRAINING_OPTIONS[name] if f"{flag} " not in shown]
    assert not missing, f"{name}: main.py --help lacks {missing}:\n{shown}"


@pytest.mark.parametrize("name", sorted(SHARED_PATHS))
def test_a_path_every_worker_reads_says_so_in_its_help(name, tmp_path):
    shown = _help(name, tmp_path)
    flag = SHARED_PATHS[name]
    options = shown[shown.index("options:"):]
    said = options[options.index(f"{flag} {flag.lstrip('-').replace('-', '_').upper()}"):]
    assert "every" in said.split("(default:")[0] and "shares" in said.split("(default:")[0], \
        f"{name}: the help of {flag} should say that every worker (or task) shares its storage:\n{said[:400]}"
