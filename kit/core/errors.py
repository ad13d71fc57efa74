"""The kit's small family of errors: each message says what went wrong and how to fix it."""

from __future__ import annotations


class KitError(Exception):
    """Base class of every error the kit raises on purpose."""


class TFConfigError(KitError, ValueError):
    """A TF_CONFIG (or a cluster spec) is malformed; ``field`` names the offending part."""

    def __init__(self, field: str, problem: str, fix: str):
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"TF_CONFIG field {field!r}: {problem}. Fix: {fix}")


class ClusterError(KitError, RuntimeError):
    """A TFCluster could not be started, or is not in a state to do what was asked.

    ``tasks`` names the TF tasks concerned (e.g. the ones that never came up).
    """

    def __init__(self, message: str, tasks: list[str] | None = None):
        self.tasks = list(tasks or [])
        super().__init__(message)


class OptionError(KitError, ValueError):
    """An option given to the kit has a bad value; ``field`` names the option."""

    def __init__(self, field: str, problem: str, fix: str):
        self.field = field
        super().__init__(f"option {field!r}: {problem}. Fix: {fix}")


class WorkerError(KitError, RuntimeError):
    """A function run on the cluster failed on one or more TF tasks.

    ``task`` is the first task that failed, ``remote_traceback`` its traceback as text, and
    ``failures`` maps every failed task to its one-line error.
    """

    def __init__(self, task: str, error: str, remote_traceback: str = "",
                 failures: dict[str, str] | None = None):
        self.task = task
        self.error = error
        self.remote_traceback = remote_traceback
        self.failures = dict(failures or {task: error})
        others = [t for t in self.failures if t != task]
        also = f" (also failed: {', '.join(others)})" if others else ""
        message = f"task {task} failed: {error}{also}"
        if remote_traceback:
            message += f"\n\nRemote traceback from {task}:\n{remote_traceback}"
        super().__init__(message)


class FailuresExhaustedError(KitError, RuntimeError):
    """A supervised run failed more often than ``max_failures`` allowed; ``failures`` lists each."""

    def __init__(self, function: str, failures: list):
        self.failures = list(failures)
        lines = "\n".join(f"  {f.attempt}. {f.task}: {f.error}" for f in self.failures)
        super().__init__(f"{function} failed {len(self.failures)} time(s), more than max_failures="
                         f"{len(self.failures) - 1} allows:\n{lines}\nFix: look at the first failure; "
                         "raise max_failures if the failures are transient")


class GridError(KitError, ValueError):
    """A sweep's grid does not fit its notebook; ``parameter`` names the offending grid entry."""

    def __init__(self, parameter: str | None, problem: str, fix: str):
        self.parameter = parameter
        where = f"grid parameter {parameter!r}" if parameter else "grid"
        super().__init__(f"{where}: {problem}. Fix: {fix}")


class ExposedPortsWarning(UserWarning):
    """A cluster's TensorFlow servers can be reached from other hosts (they accept any op from anyone
    who connects); the message names the ports and what to do (README, Security)."""


class MemoryLimitWarning(UserWarning):
    """A cluster about to start will probably not fit in this machine's (or container's) memory limit;
    the message gives the numbers and the fix (:mod:`kit.core.limits`)."""
