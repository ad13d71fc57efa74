"""How a local cluster's controller and engines start: join the private network, take a lifeline, run.

    python -m kit.core._boot kit.core._controller [args...]
    python -m kit.core._boot ipyparallel.engine [args...]

(:class:`kit.core.engines.LocalEngines` starts them so, and :class:`kit.core.plain.PlainProcesses` its plain
processes: ``python -m kit.core._boot MODULE``.) A process whose environment has ``KIT_NETNS``
first joins its cluster's private network namespace (:mod:`kit.core._netns`), while this process still
has one thread, as joining a user namespace needs; then the lifeline (:mod:`kit.core._lifeline`) ends
this process when the kernel or the controller is gone; an engine gets :mod:`kit.core.tfdata_wakeup`
(no ``tf.data`` autotuner for ``fit`` to wait for); an engine with ``KIT_PRELOAD=tensorflow`` starts
importing TensorFlow in the background (:func:`kit.core._remote.preload_tensorflow`); then the module
runs as ``__main__``.

Kept apart from both, so that imports point one way: ``_boot`` → ``_netns`` → ``_lifeline``.
"""

from __future__ import annotations

import os
import runpy
import sys

from . import _lifeline, _netns, _remote, nojax, tfdata_wakeup


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python -m kit.core._boot MODULE [ARGS...]")
    netns = os.environ.get(_netns.NETNS_VAR)
    if netns:  # an engine of a local cluster: into the cluster's private network first
        _netns.enter(netns)
    _lifeline.start()
    nojax.install()  # TensorFlow's import without JAX (kit.core.nojax says why)
    if argv[0] == "ipyparallel.engine":  # fit returns on time on the kit's engines (kit.core.tfdata_wakeup)
        tfdata_wakeup.install()
    if os.environ.get(_remote.PRELOAD_VAR) == "tensorflow":  # ClusterOptions.preload: overlaps the roles
        _remote.preload_tensorflow()
    _run(argv)


def run_forked(argv: list[str]) -> None:
    """The same in an engine forked by its cluster's zygote (:mod:`kit.core._zygote`), which is in the cluster's
    network already and imported TensorFlow before the fork (the engine counts as preloaded)."""
    _lifeline.start()
    if argv[0] == "ipyparallel.engine":
        tfdata_wakeup.install()
    _remote.mark_preloaded()
    _run(argv)


def _run(argv: list[str]) -> None:
    # ipykernel's streams capture file descriptors 1 and 2 (TensorFlow's C++ lines, and the Python log lines of a
    # TensorFlow imported before those streams existed, as the zygote's is) unless PYTEST_CURRENT_TEST is set: an
    # engine inherits it from a kernel that nbval or a test started, and cluster.output then missed those lines
    os.environ.pop("PYTEST_CURRENT_TEST", None)
    sys.argv = [argv[0], *argv[1:]]
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
