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
