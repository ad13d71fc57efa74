"""Notebook 07's lesson taken home: the exported main.py run the way a cluster runs a parameter-server job.

Chief, two workers and one ps (and a sidecar evaluator) as plain ``python main.py`` processes, each with its own
TF_CONFIG and no kit: the script's ``run_task`` picks the role from TF_CONFIG, as the section "If you use the same
binary for all tasks" of TensorFlow's tutorial "Parameter server training with ParameterServerStrategy" does.
Workers and the ps serve (``server.join()``) until they are killed, as the tutorial's servers do; the chief trains
a few steps and prints its result; the evaluator evaluates the chief's checkpoints and ends after the last one.
"""

from __future__ import annotations

import json
import math

import pytest

from take_home import MNIST, Tasks, export, tf_configs

EPOCHS, STEPS_PER_EPOCH, BATCH, EVAL_STEPS = 2, 5, 32, 4


@pytest.mark.slow
def test_chief_workers_ps_and_evaluator_run_the_exported_script_as_plain_processes(tmp_path):
    script = export("07-parameter-server", tmp_path / "take-home")
    source = script.read_text()
    assert "import kit" not in source and "from kit" not in source, "the exported script imports the kit"
    assert "start_server().join()" in source, "the servers do not join() in the exported script"
    configs = tf_configs({"chief": 1, "worker": 2, "ps": 1})
    cluster = configs[0]["cluster"]
    configs.append({"cluster": cluster, "task": {"type": "evaluator", "index": 0}})  # outside the training cluster
    checkpoints = tmp_path / "checkpoints"
    args = ["--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS_PER_EPOCH), "--per-worker-batch", str(BATCH),
            "--examples", "1024", "--eval-steps", str(EVAL_STEPS), "--mnist-path", MNIST,
            "--checkpoint-dir", str(checkpoints)]
    with Tasks(script, configs, args) as tasks:
        names = [tasks.name(i) for i in range(len(configs))]
        chief, evaluator = names.index("chief:0"), names.index("evaluator:0")
        servers = [i for i, name in enumerate(names) if name.split(":")[0] in ("worker", "ps")]
        trained, evaluated = tasks.wait(300, only=[chief, evaluator])
        still_serving = [names[i] for i in servers if tasks.procs[i].poll() is None]
        assert still_serving == [names[i] for i in servers], \
            f"expected every server still serving after the chief's end (join never returns), measured {still_serving}"
    # the servers were killed by Tasks.stop(), as a cluster manager ends them
    assert set(trained) == {"loss", "eval_accuracy"}, f"expected the chief's loss and eval_accuracy, got {trained}"
    assert len(trained["loss"]) == EPOCHS and all(math.isfinite(v) for v in trained["loss"]), \
        f"expected {EPOCHS} finite epoch losses, measured {trained['loss']}"
    assert 0 <= trained["eval_accuracy"] <= 1, f"expected an accuracy in [0, 1], measured {trained['eval_accuracy']}"
    saved = sorted(p.name for p in checkpoints.glob("ckpt-*.index"))
    assert saved == [f"ckpt-{e}.index" for e in range(1, EPOCHS + 1)], f"expected a checkpoint per epoch: {saved}"
    assert set(evaluated) >= {"loss", "accuracy"}, f"expected the evaluator's loss and accuracy, got {evaluated}"
    assert math.isfinite(evaluated["loss"]) and 0 <= evaluated["accuracy"] <= 1, \
        f"expected a finite loss and an accuracy in [0, 1] from the evaluator, measured {evaluated}"
    json.dumps(trained)  # the chief's result is what main.py printed: JSON


def test_the_lesson_is_plain_and_its_export_spec_names_the_dispatcher():
    from pathlib import Path

    from kit.tools.export import check_lesson, lesson_cells, parameters

    path = Path(__file__).resolve().parent.parent / "notebooks" / "07-parameter-server.ipynb"
    notebook = json.loads(path.read_text())
    assert check_lesson(path.name, lesson_cells(notebook)) == [], "the lesson's cells use the kit"
    spec = notebook["metadata"]["kit"]["export"]
    assert spec["call"] == "run_task", f"expected main() to call run_task, which dispatches on TF_CONFIG: {spec}"
    values = parameters(notebook)
    assert all(variable in values for variable in spec["arguments"].values()), \
        f"an export argument is not in the parameters cell: {spec['arguments']}"
