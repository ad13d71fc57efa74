"""kit.core.tfdata_wakeup: fit returns on time because no tf.data autotuner is left to wait for.

The fast tests check the hook without TensorFlow (idempotent, lazy, warns once when TensorFlow lacks the
private method); the slow one trains under MirroredStrategy beside a busy loop and times fit's return.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
import warnings

import pytest

from conftest import REPO
from kit.core import tfdata_wakeup

#: The goal of docs/performance.md, change 13: fit returns within this many seconds of on_train_end.
ON_TIME_SECONDS = 2.0


def run_python(code: str, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def test_install_is_idempotent_and_imports_no_tensorflow():
    result = run_python("""
        import sys
        from kit.core import tfdata_wakeup
        first, second = tfdata_wakeup.install(), tfdata_wakeup.install()
        print(first, second, sys.meta_path.count(tfdata_wakeup._FINDER), tfdata_wakeup.installed(),
              any(name == "tensorflow" or name.startswith("tensorflow.") for name in sys.modules))
    """, timeout=60, env={"KIT_TFDATA_AUTOTUNE": ""})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "1", "False", "False"]


def test_keep_autotune_variable_makes_install_do_nothing():
    result = run_python("""
        import sys
        from kit.core import tfdata_wakeup
        print(tfdata_wakeup.install(), sys.meta_path.count(tfdata_wakeup._FINDER))
    """, timeout=60, env={"KIT_TFDATA_AUTOTUNE": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "0"]


class FakeOptions:
    """Stands for tf.data.Options: ``autotune.enabled`` starts unset (None), as in TensorFlow."""

    def __init__(self, enabled=None):
        self.autotune = types.SimpleNamespace(enabled=enabled)


def fake_dataset_ops(with_method: bool = True) -> types.ModuleType:
    module = types.ModuleType("fake_dataset_ops")

    class DatasetV2:
        def __init__(self, enabled=None):
            self.enabled = enabled

        def options(self):
            return FakeOptions(self.enabled)

        def with_options(self, options):
            return DatasetV2(options.autotune.enabled)

    if with_method:
        DatasetV2._apply_debug_options = lambda self: self
    module.DatasetV2 = DatasetV2
    module.options_lib = types.SimpleNamespace(Options=FakeOptions)
    return module


def test_the_patch_turns_autotune_off_unless_the_dataset_chose_once_wrapped(monkeypatch):
    monkeypatch.setitem(tfdata_wakeup._state, "patched", False)
    module = fake_dataset_ops()
    assert tfdata_wakeup._patch(module) and tfdata_wakeup._patch(module)
    wrapped = module.DatasetV2._apply_debug_options
    assert wrapped.kit_tfdata_wakeup and wrapped.__wrapped__.__name__ == "<lambda>"  # wrapped once, not twice
    assert module.DatasetV2()._apply_debug_options().enabled is False
    assert module.DatasetV2(True)._apply_debug_options().enabled is True
    assert module.DatasetV2(False)._apply_debug_options().enabled is False


def test_a_tensorflow_without_the_private_method_gets_one_warning_and_no_change(monkeypatch):
    monkeypatch.setitem(tfdata_wakeup._state, "warned", False)
    monkeypatch.setitem(tfdata_wakeup._state, "patched", False)
    module = fake_dataset_ops(with_method=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert tfdata_wakeup._patch(module) is False
        assert tfdata_wakeup._patch(module) is False
    assert len(caught) == 1 and issubclass(caught[0].category, tfdata_wakeup.TFDataWakeupWarning)
    message = str(caught[0].message)
    assert "TensorFlow " in message and "_apply_debug_options" in message and "Fix: " in message
    assert not hasattr(module.DatasetV2, "_apply_debug_options") and not tfdata_wakeup.installed()


def test_a_tensorflow_that_brings_no_dataset_ops_gets_one_warning(monkeypatch):
    monkeypatch.setitem(tfdata_wakeup._state, "warned", False)
    monkeypatch.setitem(tfdata_wakeup._state, "patched", False)
    monkeypatch.delitem(sys.modules, tfdata_wakeup.TARGET_MODULE, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tfdata_wakeup._check_tensorflow(types.ModuleType("tensorflow"))
    assert len(caught) == 1 and "did not import tensorflow.python.data.ops.dataset_ops" in str(caught[0].message)


#: One process, one CPU replica under MirroredStrategy (a MultiDeviceIterator, as under
#: MultiWorkerMirroredStrategy), three fits of FIT_SECONDS each; prints fit's delay after on_train_end.
FITS = """
    import json, os, sys, time
    if sys.argv[1] == "on":
        from kit.core import tfdata_wakeup
        tfdata_wakeup.install()
    from kit.train._tf import import_tensorflow
    tf = import_tensorflow()
    from kit.tools.cells import lesson
    from kit.train.data import mnist_path
    build_cnn = lesson("10b-noise-scale-and-links", "links")["build_cnn"]
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    dataset = lesson("01-single-vs-multi-worker")["mnist_dataset"](64, str(mnist_path()))  # the tutorial's
    with strategy.scope():
        model = build_cnn("pooled")

    class Timed(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if time.perf_counter() - self.started > float(sys.argv[2]):
                self.model.stop_training = True
        def on_train_begin(self, logs=None):
            self.started = time.perf_counter()
        def on_train_end(self, logs=None):
            self.ended = time.perf_counter()

    options = dataset._apply_debug_options().options().autotune.enabled
    print("PATCHED " + json.dumps([tfdata_wakeup.installed() if sys.argv[1] == "on" else False, options]))
    delays = []
    for _ in range(3):
        timed = Timed()
        model.fit(dataset, epochs=1, steps_per_epoch=100000, verbose=0, callbacks=[timed])
        delays.append(time.perf_counter() - timed.ended)
    print("DELAYS " + json.dumps(delays), flush=True)
"""


def fit_delays(fix: str, seconds: float) -> tuple[list, list[float]]:
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        result = subprocess.run([sys.executable, "-c", textwrap.dedent(FITS), fix, str(seconds)], cwd=REPO,
                                capture_output=True, text=True, timeout=300,
                                env={**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2",
                                     "TF_USE_LEGACY_KERAS": "1", "KIT_TFDATA_AUTOTUNE": ""})
    finally:
        hog.kill()
        hog.wait()
    found = {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1]) for line in result.stdout.splitlines()
             if line.startswith(("DELAYS ", "PATCHED "))}
    assert result.returncode == 0 and len(found) == 2, result.stderr[-3000:]
    return found["PATCHED"], found["DELAYS"]


@pytest.mark.slow
@pytest.mark.check  # a timing beside a busy loop: the check tier
def test_fit_returns_on_time_beside_a_busy_loop_with_the_fix():
    """With the fix, each of 3 fits returns within 2 s of on_train_end (about 35 s).

    Without it the late return is random (docs/performance.md, change 13: 12 of 24 returns late under one
    busy loop), so the unfixed run is only printed, not asserted: 3 fits can all be on time."""
    patched, fixed = fit_delays("on", seconds=7)
    unpatched, unfixed = fit_delays("off", seconds=1)  # the control: short fits, printed, not asserted
    print(f"fit's seconds after on_train_end beside a busy loop: fix on {fixed}, fix off {unfixed}")
    assert patched == [True, False] and unpatched == [False, None]  # the dataset's autotune.enabled
    assert max(fixed) < ON_TIME_SECONDS, fixed
