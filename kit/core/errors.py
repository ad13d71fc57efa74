"""The kit's small family of errors: each message says what went wrong and how to fix it."""

from __future__ import annotations


_FIX = "Fix: "


class KitError(Exception):
    """Base class of every error the kit raises on purpose; ``fix`` says what to do about it.

    ``KitError("what went wrong", fix="what to do")`` ends the message with "Fix: what to do". A message
    that already ends with "Fix: ..." gives ``fix`` from its text. Otherwise ``fix`` is the class's general
    advice (every subclass sets one), and the message is left as written.
    """

    #: What to do about this kind of error when the message gives nothing more precise.
    fix = "read the message: it says what went wrong"

    def __init__(self, message: str = "", fix: str | None = None):
        message = str(message)
        if fix:
            message = f"{message}. {_FIX}{fix}"
            self.fix = fix
        elif _FIX in message:
            self.fix = message.rsplit(_FIX, 1)[1].strip()
        super().__init__(message)


class TFConfigError(KitError, ValueError):
    """A TF_CONFIG (or a cluster spec) is malformed; ``field`` names the offending part."""

    fix = "build TF_CONFIG with kit.core.tfconfig.build, or check it with kit tfconfig"

    def __init__(self, field: str, problem: str, fix: str):
        self.field = field
        self.problem = problem
        super().__init__(f"TF_CONFIG field {field!r}: {problem}", fix)


class ClusterError(KitError, RuntimeError):
    """A TFCluster could not be started, or is not in a state to do what was asked.

    ``tasks`` names the TF tasks concerned (e.g. the ones that never came up).
    """

    fix = "read the engine log lines the message quotes, then cluster.restart() or start a new TFCluster"

    def __init__(self, message: str, tasks: list[str] | None = None, fix: str | None = None):
        self.tasks = list(tasks or [])
        super().__init__(message, fix)


class OptionError(KitError, ValueError):
    """An option or argument given to the kit has a bad value; ``field`` names it."""

    fix = "give the option a value its documentation lists"

    def __init__(self, field: str, problem: str, fix: str):
        self.field = field
        super().__init__(f"option {field!r}: {problem}", fix)


class WorkerError(KitError, RuntimeError):
    """A function run on the cluster failed on one or more TF tasks.

    ``task`` is the first task that failed, ``remote_traceback`` its traceback as text, and
    ``failures`` maps every failed task to its one-line error. The message ends with the remote traceback,
    so ``fix`` stays the class's advice.
    """

    fix = ("read the remote traceback of the first task that failed and fix the function; for a transient "
           "failure, supervise the run (cluster.with_options(max_failures=...))")

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
        self.fix = type(self).fix  # the task's own error may contain "Fix: "; it is not this error's fix


class FailuresExhaustedError(KitError, RuntimeError):
    """A supervised run failed more often than ``max_failures`` allowed; ``failures`` lists each."""

    fix = "look at the first failure; raise max_failures if the failures are transient"

    def __init__(self, function: str, failures: list, logs: str = ""):
        self.failures = list(failures)
        lines = "\n".join(f"  {f.attempt}. {f.task}: {f.error}" for f in self.failures)
        super().__init__(f"{function} failed {len(self.failures)} time(s), more than max_failures="
                         f"{len(self.failures) - 1} allows:\n{lines}{logs}\n{_FIX}{self.fix}")


class GridError(KitError, ValueError):
    """A sweep's grid does not fit its notebook; ``parameter`` names the offending grid entry."""

    fix = "give the grid only parameters the notebook's parameters cell defines, with values of their type"

    def __init__(self, parameter: str | None, problem: str, fix: str):
        self.parameter = parameter
        where = f"grid parameter {parameter!r}" if parameter else "grid"
        super().__init__(f"{where}: {problem}", fix)


def first_line(error: BaseException | str, limit: int | None = None) -> str:
    """``"Type: first line of the message"`` of ``error`` (a string: its first line), cut to ``limit``.

    Drops TensorFlow's "{{function_node ...}}" prefix of an op's error; an error raised while tracing a
    ``tf.function`` starts with "in user code:" and the frames, and its real first line is the last
    "SomeError: ..." line of the message.
    """
    import re

    if isinstance(error, BaseException):
        message = getattr(error, "message", None) or str(error)
        lines = [line.strip() for line in str(message).strip().splitlines() if line.strip()]
        head = lines[0] if lines else ""
        if head.startswith("{{") and "}}" in head:
            head = head.split("}}", 1)[1].strip()
        text = f"{type(error).__name__}: {head}".rstrip(": ")
        if head == "in user code:":
            inner = [line for line in lines[1:] if re.match(r"[A-Za-z_.]*(Error|Exception)\b.*:", line)]
            text = inner[-1] if inner else text
    else:
        text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return text if limit is None or len(text) <= limit else text[:limit - 1] + "…"


class ExposedPortsWarning(UserWarning):
    """A cluster's TensorFlow servers can be reached from other hosts (they accept any op from anyone
    who connects). Its text is one line, the same for every cluster of a kind, so a notebook shows it once
    per kernel (:mod:`kit.core.cluster` files it under Python's "once" action); ``detail`` names every
    address of every task and what to do (also in ``cluster.describe()``: ``listens_on``, ``reachable_at``)."""

    detail = ""

    @classmethod
    def about(cls, tasks: list, because: str, fix: str) -> "ExposedPortsWarning":
        """The warning for ``tasks`` (``cluster.tasks``); its ``detail``: each server's address in TF_CONFIG and
        every address it can be reached at (``reachable_at``: it binds every interface of its host)."""
        servers = [f"{t.name} at {t.address}" + (f" (reachable at {', '.join(t.reachable_at)})" if t.reachable_at
                                                 else "") for t in tasks if t.address]
        warning = cls(f"other hosts can reach this cluster's TensorFlow servers, which have no authentication "
                      f"({because}): cluster.describe() lists their addresses, docs/security.md what to do.")
        warning.detail = (f"The TensorFlow servers of this cluster can be reached from other hosts: "
                          f"{'; '.join(servers)}, listening on every interface ({because}). They have no "
                          "authentication: anyone who can connect can read and write files as this user while "
                          f"the cluster runs. {_FIX}{fix} (docs/security.md).")
        return warning


class MemoryLimitWarning(UserWarning):
    """A cluster about to start will probably not fit in this machine's (or container's) memory limit;
    the message gives the numbers and the fix (:mod:`kit.core.limits`)."""
