"""kit.tools.bench's bookkeeping: goals judged from a report, the printed table, the Slurm section's skip and
record (no timing here but in the one slow test, a round of the Slurm section)."""

import pytest

from kit.tools.bench import check_goals, format_report


def report():
    return {"throughput": {64: {"examples_per_second": {"single": 6000.0, "2 workers": 1800.0, "2 workers tuned": 2400.0},
                                "efficiency": 0.3, "efficiency_tuned": 0.4},
                           512: {"examples_per_second": {"single": 7000.0, "2 workers": 7600.0}, "efficiency": 0.95}},
            "ready_s": 7.0, "recovery_s": 31.0,
            "memory": {"uss_worker_mb": 450.0, "pss_total_mb": 2100.0},
            "notebooks_s": {"00-a": 30.0, "01-b": 119.0}}


def test_goals_are_judged_against_their_targets():
    goals = check_goals(report())
    assert goals["efficiency_512"]["met"] and not goals["efficiency_64"]["met"]
    assert goals["ready_s"]["met"] and not goals["recovery_s"]["met"]
    assert goals["uss_worker_mb"]["met"] and not goals["pss_total_mb"]["met"]
    assert goals["notebook_max_s"] == {"value": 119.0, "target": "<= 120", "met": True}


def test_tuned_variant_is_judged_beside_the_default():
    goals = check_goals(report())
    assert goals["efficiency_64_tuned"] == {"value": 0.4, "target": ">= 0.6", "met": False}
    assert "efficiency_512_tuned" not in goals  # not measured at 512 in this report: not invented
    text = format_report({**report(), "goals": goals})
    assert "2400" in text and "allreduce=float16" in text and "2 workers tuned: 08-scaling-experiments" in text


def test_every_variant_trains_with_a_lesson_and_an_unknown_one_names_the_choices():
    from kit.core.errors import OptionError
    from kit.tools import bench, cells

    for variant, name in bench.LESSONS.items():
        code = cells.lesson(name, "training" if variant == "2 workers tuned" else "lesson")
        assert callable(code["train"]), (variant, name)
    assert set(bench.LESSONS) == set(bench.VARIANTS)
    cluster, call, global_batch = bench.variant_call("2 workers tuned", 64, 2, 30, "mnist.npz")  # 08's plan
    trial = call[4]
    assert not cluster.started and global_batch == 128 == trial["global_batch"]
    assert (trial["steps_per_epoch"], trial["epochs"], trial["steps_per_execution"]) == (30, 2, 10), trial
    with pytest.raises(OptionError, match="2 workers tuned") as refused:
        bench.variant_call("2 Horovod tuned", 64, 2, 30, "mnist.npz")
    assert refused.value.field == "variant"
    with pytest.raises(OptionError, match="use at most 468") as refused:  # 12 and 08 do not repeat MNIST
        bench.variant_call("2 jax", 64, 2, 500, "mnist.npz")
    assert refused.value.field == "steps"


def test_goals_read_json_keys_too():
    loaded = report()
    loaded["throughput"] = {str(k): v for k, v in loaded["throughput"].items()}  # as read back from JSON
    assert check_goals(loaded)["efficiency_64"]["value"] == 0.3


def test_the_private_network_may_cost_at_most_a_second_of_start_up():
    goals = check_goals({"ready_s": 5.2, "ready_host_network_s": 4.9})
    assert goals["isolation_cost_s"]["target"] == "<= 1" and goals["isolation_cost_s"]["met"]
    assert not check_goals({"ready_s": 6.5, "ready_host_network_s": 4.9})["isolation_cost_s"]["met"]


def test_missing_figures_are_left_out_not_invented():
    assert check_goals({"ready_s": 12.0}) == {"ready_s": {"value": 12.0, "target": "<= 10", "met": False}}


def test_table_lists_each_batch_and_goal():
    text = format_report({**report(), "goals": check_goals(report())})
    assert "6000" in text and "0.95" in text and "NOT met" in text and "notebook 01-b" in text


def test_the_fastest_two_worker_variant_is_judged_and_horovod_has_its_columns():
    loaded = report()
    loaded["throughput"][64]["examples_per_second"]["2 Horovod"] = 3000.0
    loaded["throughput"][64]["efficiency_horovod"] = 0.5
    goals = check_goals(loaded)
    assert goals["efficiency_64_fastest"] == {"value": 0.5, "target": ">= 0.4", "met": True}
    text = format_report({**loaded, "goals": goals})
    assert "2 Horovod" in text and "3000" in text and "0.50" in text
    assert "2 Horovod fp16" not in text  # not measured: no column


def test_the_launch_goal_is_the_first_step_within_a_second_of_the_plain_launch():
    behind = {"launch": {"first_step_behind_plain_s": 0.4}}
    assert check_goals(behind)["first_step_behind_plain_s"] == {"value": 0.4, "target": "<= 1", "met": True}
    assert not check_goals({"launch": {"first_step_behind_plain_s": 2.5}})["first_step_behind_plain_s"]["met"]


# ----- kit bench --only slurm (kit.tools.slurm_bench) ---------------------------------------------
def test_the_slurm_section_is_skipped_with_the_reason_where_no_emulated_cluster_can_be_made(monkeypatch):
    from kit.tools import bench, sim_cluster

    monkeypatch.setattr(sim_cluster, "missing", lambda: ["root: network namespaces need it"])
    lines = []
    report = bench.run(repeats=1, sections=("slurm",), log=lines.append)
    assert report["slurm_skipped"] == "an emulated cluster needs root: network namespaces need it"
    assert "slurm" not in report and lines == [f"slurm: skipped, {report['slurm_skipped']}"]
    assert "slurm start-up: skipped, an emulated cluster needs root" in bench.format_report(report)


def test_the_slurm_record_holds_each_run_and_the_medians():
    from kit.tools import bench, slurm_bench

    runs = {"local": [{"started": 3.0, "imported": 3.1, "strategy": 4.0},
                      {"started": 3.4, "imported": 3.5, "strategy": 4.6},
                      {"started": 2.8, "imported": 2.9, "strategy": 3.9}],
            "slurm": [{"started": 6.0, "imported": 8.5, "strategy": 9.0},
                      {"started": 7.0, "imported": 9.1, "strategy": 9.8},
                      {"started": 6.5, "imported": 8.8, "strategy": 9.4}]}
    record = slurm_bench.summarize(runs)
    assert record["runs"] is runs
    assert record["median"] == {"local": {"started": 3.0, "imported": 3.1, "strategy": 4.0},
                                "slurm": {"started": 6.5, "imported": 8.8, "strategy": 9.4}}
    assert record["slurm_behind_local_s"] == 5.4
    text = bench.format_report({"slurm": record})
    assert "slurm start-up, local  started 3.0s, imported 3.1s, strategy 4.0s" in text
    assert "slurm start-up, slurm  started 6.5s, imported 8.8s, strategy 9.4s" in text


def test_the_slurm_profile_is_installed_with_the_login_nodes_address(tmp_path):
    from kit.tools import sim_cluster

    folder = sim_cluster.install_profile("slurm", "10.70.1.1", tmp_path / "profile_kit-slurm")
    text = (folder / "ipcluster_config.py").read_text()
    assert 'c.Cluster.controller_location = "10.70.1.1"' in text and "login1" not in text
    assert 'engine_launcher_class = "slurm"' in text


@pytest.mark.slow
@pytest.mark.check
def test_the_slurm_section_times_both_kinds_and_leaves_nothing_running():
    """One round (23 s here: the emulated cluster up and down, one local and one Slurm start)."""
    import os

    from conftest import describe, kit_processes
    from kit.tools import slurm_bench

    why = slurm_bench.why_not()
    if why:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(why)
    from kit.tools.sim_state import emulated_namespaces

    namespaces = emulated_namespaces()  # other tests' come and go meanwhile (make unit: xdist)
    conf, lines, report = os.environ.get("SLURM_CONF"), [], {}
    slurm_bench.section(report, lines.append, repeats=1)
    record = report["slurm"]
    for kind in slurm_bench.KINDS:
        (run,) = record["runs"][kind]
        assert 0 < run["started"] <= run["imported"] <= run["strategy"] < slurm_bench.START_TIMEOUT_S, (kind, run)
    assert record["median"]["slurm"]["strategy"] - record["median"]["local"]["strategy"] == pytest.approx(
        record["slurm_behind_local_s"], abs=0.002)
    assert lines[0].startswith("slurm rep 1: local started") and "strategy built" in lines[-1]
    assert os.environ.get("SLURM_CONF") == conf  # the Slurm runs' environment is this process's again
    assert emulated_namespaces() == namespaces
    assert not kit_processes(os.getpid()), describe(kit_processes(os.getpid()))


def test_the_ceiling_row_reports_each_two_worker_variant_as_a_share_of_two_processes_alone():
    shown = report()
    shown["throughput"][64]["examples_per_second"]["2 alone"] = 7200.0
    shown["throughput"][64]["of_ceiling"] = {"2 workers": 0.25, "2 workers tuned": 2400.0 / 7200.0}
    text = format_report(shown)
    assert "2 alone" in text.splitlines()[0]
    assert "64/worker, share of the ceiling (2 alone: two processes, no all-reduce): 2 workers 0.25, " \
           "2 workers tuned 0.33" in text


@pytest.mark.slow  # a two-task cluster, two Keras 3 + JAX processes and two plain processes: ~60 s
@pytest.mark.check  # a benchmark sample of each kind
def test_the_ceiling_sums_two_processes_and_the_plain_launch_keeps_tensorflows_lines_out_of_the_output(capfd):
    from kit.tools import bench, launch_bench

    row = bench.measure_variant(bench.CEILING, 32, epochs=2, steps=5)
    assert row["examples_per_second"] > 0 and row["lesson"] == "01-single-vs-multi-worker", row
    jax = bench.measure_variant("2 jax", 32, epochs=2, steps=5)
    assert jax["examples_per_second"] > 0 and jax["lesson"] == "12-keras3-jax", jax
    marks = launch_bench.plain_launch(workers=2, epochs=1, steps_per_epoch=3)
    assert len(marks) == 2 and all(m["first_step"] > 0 for m in marks)
    out, err = capfd.readouterr()
    noise = [line for line in (out + err).splitlines() if "cuInit" in line or "oneDNN" in line or "cpu_feature" in line]
    assert not noise, noise
