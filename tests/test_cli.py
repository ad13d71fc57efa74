"""The `kit` command line: tfconfig output and exit codes, and that `import kit` stays cheap."""

import json
import subprocess
import sys

import pytest

from kit.cli import main


def run_kit(*args):
    return subprocess.run([sys.executable, "-m", "kit.cli", *args], capture_output=True, text=True,
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
    code = ("import sys, kit, kit.tfconfig, kit.cli; "
            "print(sorted(m for m in ('tensorflow', 'ipyparallel', 'papermill') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
