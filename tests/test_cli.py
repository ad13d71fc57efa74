"""The `kit` command line: tfconfig output and exit codes, and that `import kit` stays cheap."""

import json
import re
import subprocess
import sys

import pytest

from kit.tools.cli import main


def run_kit(*args):
    return subprocess.run([sys.executable, "-m", "kit.tools.cli", *args], capture_output=True, text=True,
                          timeout=60)


def test_tfconfig_prints_json_for_a_task(capsys):
    assert main(["tfconfig", "--cluster", '{"worker": ["a:1", "b:2"]}', "--task", "worker:1"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}


def test_tfconfig_check_valid_exits_0(tmp_path):
    path = tmp_path / "tf_config.json"
    path.write_text(json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}))
    result = run_kit("tfconfig", "--check", f"@{path}")
    assert result.returncode == 0, result.stderr
    assert "valid" in result.stdout


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}', "task.index"),
    ('{"cluster": {"worker": ["a:0"]}, "task": {"type": "worker", "index": 0}}', "port 0"),
])
def test_tfconfig_check_invalid_exits_2_with_the_reason(text, message):
    result = run_kit("tfconfig", "--check", text)
    assert result.returncode == 2
    assert message in result.stderr and "Fix:" in result.stderr


def test_tfconfig_check_with_strategy(capsys):
    text = '{"cluster": {"worker": ["a:1"], "ps": ["b:1"]}, "task": {"type": "ps", "index": 0}}'
    assert main(["tfconfig", "--check", text]) == 0
    assert main(["tfconfig", "--check", text, "--strategy", "multi_worker_mirrored"]) == 2
    assert "no parameter servers" in capsys.readouterr().err


def test_tfconfig_bad_task_and_missing_file(capsys):
    assert main(["tfconfig", "--cluster", '{"worker": ["a:1"]}', "--task", "worker:5"]) == 2
    assert main(["tfconfig", "--check", "@/nonexistent/tf.json"]) == 2
    err = capsys.readouterr().err
    assert "out of range" in err and "does not exist" in err


def test_cluster_without_task_is_a_usage_error():
    result = run_kit("tfconfig", "--cluster", '{"worker": ["a:1"]}')
    assert result.returncode == 2 and "--task" in result.stderr


def test_import_kit_loads_neither_tensorflow_nor_ipyparallel():
    code = ("import sys, kit, kit.core.tfconfig, kit.tools.cli; "
            "print(sorted(m for m in ('tensorflow', 'ipyparallel', 'papermill') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_tfconfig_export_prints_one_line_per_task_that_a_shell_can_run():
    cluster = {"chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222"]}
    result = run_kit("tfconfig", "--cluster", json.dumps(cluster), "--export")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0::2] == ["# chief:0", "# worker:0", "# worker:1"]
    assert all(line.startswith("export TF_CONFIG='") for line in lines[1::2])
    for name, line in zip(["chief:0", "worker:0", "worker:1"], lines[1::2]):
        shell = subprocess.run(["sh", "-c", f'{line}\nprintf %s "$TF_CONFIG"'], capture_output=True,
                               text=True, timeout=60)
        task_type, index = name.split(":")
        assert json.loads(shell.stdout) == {"cluster": cluster, "task": {"type": task_type, "index": int(index)}}


def test_tfconfig_export_of_one_task_and_quoting(capsys):
    cluster = {"worker": ["it's:1", "b:2"]}  # a quote in a host name: the line must still set it exactly
    assert main(["tfconfig", "--cluster", json.dumps(cluster), "--task", "worker:1", "--export"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "# worker:1" and len(lines) == 2
    shell = subprocess.run(["sh", "-c", f'{lines[1]}\nprintf %s "$TF_CONFIG"'], capture_output=True,
                           text=True, timeout=60)
    assert json.loads(shell.stdout)["task"] == {"type": "worker", "index": 1}


@pytest.mark.parametrize("cluster, message", [
    ('{"worker": ["a:1"], "ps": ["b:1"]}', "no parameter servers"),  # with --strategy below
    ('{}', "is empty"),
    ('["a:1"]', "not an object"),
    ('{"workers": ["a:1"]}', "unknown task type"),
])
def test_tfconfig_export_rejects_a_bad_cluster_with_the_reason(cluster, message, capsys):
    assert main(["tfconfig", "--cluster", cluster, "--export", "--strategy", "multi_worker_mirrored"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and message in captured.err and "Fix:" in captured.err


def test_export_needs_a_cluster():
    result = run_kit("tfconfig", "--check", '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}',
                     "--export")
    assert result.returncode == 2 and "--export needs --cluster" in result.stderr


def test_help_lists_every_command():
    result = run_kit("--help")
    assert result.returncode == 0, result.stderr
    for name in ("tfconfig", "demo", "notebooks", "sweep", "plot", "bench", "faults", "compat"):
        assert name in result.stdout, name


def test_compat_help_and_a_bad_value_refused_before_any_cluster_starts(capsys):
    shown = run_kit("compat", "--help")
    assert shown.returncode == 0, shown.stderr
    for option in ("--out", "--steps", "--keras", "--strategies", "--modes", "--timeout"):
        assert option in shown.stdout, option
    assert "Keras compatibility table" in shown.stdout
    assert run_kit("compat", "--keras", "keras2").returncode == 2  # argparse's choices
    assert main(["compat", "--steps", "0", "--keras", "keras3", "--strategies", "default"]) == 2
    assert main(["compat", "--timeout", "-1"]) == 2
    err = capsys.readouterr().err
    assert "kit compat: --steps 0" in err and "kit compat: --timeout -1" in err and err.count("Fix:") == 2


def test_notebooks_copies_the_lessons_with_their_figures_and_keeps_edits_unless_forced(tmp_path, capsys):
    from kit.tools import cli

    source = cli.notebooks_dir()
    target = tmp_path / "lessons"
    assert main(["notebooks", str(target)]) == 0
    lessons = sorted(p.name for p in source.glob("[0-9][0-9]*-*.ipynb"))
    assert len(lessons) >= 10 and sorted(p.name for p in target.glob("*.ipynb")) == lessons
    for name in ("README.md", "figures/01-data-parallel.svg", "trials/scaling-trial.ipynb"):
        assert (target / name).read_bytes() == (source / name).read_bytes(), name
    assert not (target / "out").exists()  # the notebooks' own results stay behind
    assert f"copied {len(lessons)} lessons" in capsys.readouterr().out

    edited = target / lessons[0]
    edited.write_text("my edits")
    assert main(["notebooks", str(target)]) == 2
    assert "already has" in capsys.readouterr().err and edited.read_text() == "my edits"
    assert main(["notebooks", str(target), "--force"]) == 0
    assert edited.read_bytes() == (source / lessons[0]).read_bytes()
    assert main(["notebooks", str(source), "--force"]) == 2  # never onto the lessons themselves
    assert "is where the lessons come from" in capsys.readouterr().err


def test_kit_demo_prints_one_line_per_section_of_the_lesson(tmp_path, capsys):
    """`kit demo` writes papermill's cell log to a file; the terminal gets each ``##`` heading once."""
    import logging

    import nbformat

    from kit.tools.demo import SectionEcho

    notebook = tmp_path / "lesson.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Title"), nbformat.v4.new_code_cell("setup = 1"),
        nbformat.v4.new_markdown_cell("Intro\n## Step 1: one worker"), nbformat.v4.new_code_cell("a = 1"),
        nbformat.v4.new_code_cell("b = 2"), nbformat.v4.new_markdown_cell("## Step 2: two workers"),
        nbformat.v4.new_code_cell("c = 3")]), notebook)
    echo = SectionEcho(notebook, prefix="kit demo: ")
    for number in range(1, 8):
        for message in (f"Executing Cell {number:-<40}", "some output line", f"Ending Cell {number:-<43}"):
            echo.emit(logging.LogRecord("papermill", logging.INFO, __file__, 0, message, None, None))
    lines = capsys.readouterr().out.splitlines()
    assert [re.sub(r"^kit demo: +[\d.]+s +", "", line) for line in lines] == ["Step 1: one worker",
                                                                            "Step 2: two workers"]


@pytest.mark.parametrize("option, value", [("--workers", "0"), ("--epochs", "0"), ("--steps-per-epoch", "-1"),
                                           ("--per-worker-batch", "0"), ("--epochs", "one")])
def test_demo_refuses_a_value_that_cannot_run_before_it_starts_anything(option, value, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["demo", option, value, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert info.value.code == 2, f"expected exit 2 (a usage error), got {info.value.code}: {err}"
    assert f"argument {option}: must be a whole number of at least 1, got {value!r}. Fix: e.g. {option} " in err, err
    assert not list(tmp_path.iterdir()), "expected nothing written before the values are checked"


@pytest.mark.slow  # papermill runs notebook 01: three clusters, each 5 steps (~1-2 min on 2 cores)
@pytest.mark.parametrize("workers", [2, pytest.param(1, marks=pytest.mark.check)])  # make test: 2 workers
def test_kit_demo_runs_one_epoch_of_five_steps_and_says_what_it_could_check(workers, tmp_path, capsys, no_leaks):
    """`kit demo --epochs 1 --steps-per-epoch 5` (and with `--workers 1`) runs to its table: the notebook's checks
    that need two epochs say what one epoch of 5 steps can show; one worker is not compared with itself."""
    code = main(["demo", "--workers", str(workers), "--epochs", "1", "--steps-per-epoch", "5",
                 "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 0, f"expected kit demo to exit 0, it exited {code}:\n{captured.out}\n{captured.err}"
    lines = captured.out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("run ") and "final loss" in line)
    rows = [line.split() for line in lines[header + 2:header + 3 + workers]]
    assert [row[0] for row in rows] == ["single"] + [str(workers)] * workers, f"expected 1 + {workers} rows:\n" + \
        "\n".join(lines[header:])
    assert all(float(row[-4]) > 0 for row in rows), f"expected a finite loss in every row: {rows}"
    agree = "nothing to compare" if workers == 1 else "workers' losses agree: True"
    assert agree in captured.out, f"expected {agree!r} in the demo's output:\n{captured.out}"
    executed = json.loads((tmp_path / f"01-single-vs-multi-worker_workers-{workers}.ipynb").read_text())
    checks = ["".join(o.get("text", "")) for c in executed["cells"] if "check" in c["metadata"].get("tags", [])
              for o in c.get("outputs", []) if o.get("name") == "stdout"]
    assert any("one epoch of 5 steps is too few to see it fall" in text for text in checks), checks
    assert (tmp_path / "loss-curves.png").is_file() and (tmp_path / "take-home" / "main.py").is_file()


def test_kit_demo_counts_the_cell_papermill_injects_after_the_parameters(tmp_path, capsys):
    """papermill numbers its injected-parameters cell too: each heading shows when its own section starts."""
    import logging

    import nbformat

    from kit.tools.demo import SectionEcho

    notebook = tmp_path / "lesson.ipynb"
    parameters = nbformat.v4.new_code_cell("N = 1")
    parameters.metadata["tags"] = ["parameters"]
    nbformat.write(nbformat.v4.new_notebook(cells=[
        parameters, nbformat.v4.new_markdown_cell("## Setup"), nbformat.v4.new_code_cell("a = 1"),
        nbformat.v4.new_markdown_cell("## Step 1: one worker"), nbformat.v4.new_code_cell("b = 2")]), notebook)
    echo = SectionEcho(notebook, prefix="kit demo: ")

    def executing(number):
        echo.emit(logging.LogRecord("papermill", logging.INFO, __file__, 0, f"Executing Cell {number:-<40}", (), None))

    for number in (1, 2, 3, 4):  # parameters, injected parameters, "## Setup", its code: Step 1 not yet
        executing(number)
    assert [re.sub(r"^kit demo: +[\d.]+s +", "", line) for line in capsys.readouterr().out.splitlines()] == ["Setup"]
    executing(5)
    assert capsys.readouterr().out.endswith("Step 1: one worker\n")
