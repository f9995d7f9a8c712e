"""Errors the library raises: a message saying what went wrong and where, plus a hint saying
what to do. The CLI is the only place that turns them into `error: ...` lines and exit codes."""

from __future__ import annotations


class QcliError(Exception):
    """Base of every error qcli reports to a user. `exit_code` 2 means bad input or usage."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class ModelError(QcliError):
    """The model file is missing, unreadable, corrupt, or not something qcli can handle."""


class DataError(QcliError):
    """A data folder or one of its samples does not fit the model."""


class ConfigError(QcliError):
    """A YAML configuration (or a CLI flag standing in for one) is invalid."""


class CalibrationError(QcliError):
    """A calibration file is unreadable, stale, or lacks what was asked of it."""


class OutputError(QcliError, OSError):
    """An output file cannot be written: its folder cannot be created or takes no files, or the
    path is a folder. Also an OSError, as the failed write it reports (callers may catch either)."""


class GateFailed(QcliError):
    """A quality gate (accuracy drop, speedup, compression, verification floor) failed."""

    exit_code = 1


class WorkerLost(QcliError):
    """A worker process (or Ray worker) died twice running item `index` of `total` (an item
    whose worker dies is run once more first). Callers that know what the items are re-raise
    it naming them (calibration names the shard's samples)."""

    exit_code = 3

    def __init__(self, index: int, total: int, detail: str = ""):
        super().__init__(
            f"a worker died twice running item {index + 1} of {total}" + (f": {detail}" if detail else ""),
            hint="the machine may be out of memory: use fewer --workers or a smaller --batch-size",
        )
        self.index = index
        self.total = total


class InternalError(RuntimeError):
    """A broken invariant inside qcli: a bug, never bad input. Not a QcliError on purpose: the
    CLI reports it as an internal error (exit 3) and asks for the `--debug` traceback."""
