"""kit.launch: plain processes from a lesson's cell, each waited for with a bound, none left behind."""

import os
import signal
import socket

import psutil
import pytest

import kit


def test_each_command_runs_with_its_log_and_a_late_one_is_killed_with_its_group(tmp_path):
    port = kit.free_ports(1)[0]
    commands = ["echo ready; echo done; exit 3",
                "echo ready; sleep 30 & wait",  # a child in its group: killed with it
                "env | grep -c '^TF_CONFIG=' || true"]
    jobs = kit.launch(commands, str(tmp_path), wait_seconds=1.5, ready="ready", env={"TF_CONFIG": "{}"},
                      hold_port=port)
    first, late, environment = jobs
    assert first["returncode"] == 3 and not first["killed"] and first["log"] == "ready\ndone\n"
    assert first["ended"] == "exited (3)"
    assert late["killed"] and late["returncode"] == -9 and late["ended"] == "killed at the bound (1.5 s)"
    assert late["network"] == os.readlink("/proc/self/ns/net")  # started here: this process's network
    assert environment["log"].strip() == "0"  # TF_CONFIG is the command's to set
    assert (tmp_path / "job_1.log").read_text() == "ready\n"
    sleepers = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "30"]
                and p.status() != psutil.STATUS_ZOMBIE]
    assert not sleepers, "a child of a killed command outlived it"
    with socket.create_server(("127.0.0.1", port)):  # the held port was released
        pass


def test_a_ready_line_that_never_comes_is_bounded(tmp_path):
    with pytest.raises(TimeoutError, match="start_seconds"):
        kit.launch(["sleep 30"], str(tmp_path), wait_seconds=1, ready="never", start_seconds=0.5)


def test_free_ports_are_different_and_free():
    ports = kit.free_ports(3)
    assert len(set(ports)) == 3 and all(1024 < p < 65536 for p in ports)


def test_a_process_killed_by_a_signal_says_so(tmp_path):
    [job] = kit.launch(["kill -ABRT $$"], str(tmp_path), wait_seconds=10)
    assert job["returncode"] == -signal.SIGABRT and not job["killed"] and job["ended"] == "died of signal 6"
