"""kit.train.multiworker: error first lines, and (slow) the training function on two workers."""

import os
import time

import pytest

from kit.core.errors import OptionError, first_line
from kit.train import multiworker, strategies


def test_first_line_drops_tensorflows_function_prefix():
    class FakeOpError(Exception):
        message = "{{function_node __wrapped__X_device_/job:worker}} Could not apply FILE based sharding\nmore"

    assert first_line(FakeOpError()) == "FakeOpError: Could not apply FILE based sharding"


def test_unknown_communication_is_refused():
    with pytest.raises(OptionError, match="AUTO, RING, NCCL") as refused:
        strategies.build_strategy("multi_worker_mirrored", communication="GLOO")
    assert refused.value.field == "communication" and "AUTO" in refused.value.fix


@pytest.mark.slow
def test_chief_writes_for_real_and_the_other_worker_in_a_temporary_directory(make_cluster, tmp_path):
    cluster = make_cluster(workers=2)
    results = cluster.with_options(stream=False).run(multiworker.train_with_callbacks, str(tmp_path),
        epochs=1, steps_per_epoch=2, tensorboard=False, verbose=0)
    chief, other = results
    assert chief["chief"] and not other["chief"]
    assert chief["modelcheckpoint_wrote_to"] == "ckpt/ckpt_1"
    assert other["modelcheckpoint_wrote_to"] == "ckpt/workertemp_1/ckpt_1"
    assert chief["saved"]["kept"] and not other["saved"]["kept"]
    assert chief["restored_vs_trained"] == other["restored_vs_trained"] == 0.0
    assert chief["loss"] == pytest.approx(other["loss"], rel=1e-6)
    assert not [f for _, dirs, _ in os.walk(tmp_path) for f in dirs if f.startswith("workertemp")]

    # the next run on the same engines gets the same strategy, also when the chief comes to it last:
    # a second MultiWorkerMirroredStrategy made by the chief after the other worker's first broadcast
    # reached it aborts that broadcast ("Delete called on non-empty BufRendezvous")
    def late_chief_builds_a_variable(delay):
        import json
        import os
        import time

        from kit.train._tf import import_tensorflow
        from kit.train.strategies import build_strategy

        tf = import_tensorflow()
        if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0:
            time.sleep(delay)
        strategy = build_strategy("multi_worker_mirrored")
        with strategy.scope():
            variable = tf.Variable(tf.ones([1000]))
        return {"same": strategy is build_strategy("multi_worker_mirrored"), "sum": float(tf.reduce_sum(variable))}

    assert cluster.with_options(stream=False).run(late_chief_builds_a_variable, 2.0) == [{"same": True, "sum": 1000.0}] * 2
