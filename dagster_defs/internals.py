"""Every name the adapter takes from Dagster's private modules, in one place (Dagster 1.13.27, pinned in
pyproject.toml): an upgrade that moves one breaks this module alone. Why no public API serves:

- ``CheckRunHealthResult``, ``WorkerStatus``: what ``CQRunLauncher.check_run_worker_health`` returns to
  run monitoring; Dagster exports ``DefaultRunLauncher`` but not its health check's result types.
- ``GRPC_INFO_TAG``: the run tag holding a run's code server address (the same health check).
- ``DagsterLaunchFailedError``, ``DagsterUserCodeUnreachableError``: ``CQRunLauncher.launch_run`` turns
  a launch refused by a code server that is shutting down into the error the queue retries; Dagster
  exports neither.
- ``IMPLICIT_ASSET_JOB_NAME``: the UI's "Materialize" job; a run of it that selects a sink is a run of
  that definition, which the batch sensor holds while it is in flight. No public constant names it.
- ``InstigatorType``, ``InstigatorStatus``: the switches' running state read from the instance for
  every definition at once; the public sensor context reads one instigator at a time (too slow at 1,000).
- ``SqliteEventLogStorage``, ``SQLITE_BUSY_TIMEOUT_SECONDS``, ``ConfigurableClassData``: ``cq dev``'s
  event log storage subclasses Dagster's SQLite one (kept connections) and is configured from
  ``dagster.yaml`` as Dagster's own storages are.
"""

from dagster._core.definitions.assets.job.asset_job import IMPLICIT_ASSET_JOB_NAME
from dagster._core.definitions.run_request import InstigatorType
from dagster._core.errors import DagsterLaunchFailedError, DagsterUserCodeUnreachableError
from dagster._core.launcher import CheckRunHealthResult, WorkerStatus
from dagster._core.scheduler.instigation import InstigatorStatus
from dagster._core.storage.event_log import SqliteEventLogStorage
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS
from dagster._core.storage.tags import GRPC_INFO_TAG
from dagster._serdes import ConfigurableClassData

__all__ = [
    "GRPC_INFO_TAG",
    "IMPLICIT_ASSET_JOB_NAME",
    "SQLITE_BUSY_TIMEOUT_SECONDS",
    "CheckRunHealthResult",
    "ConfigurableClassData",
    "DagsterLaunchFailedError",
    "DagsterUserCodeUnreachableError",
    "InstigatorStatus",
    "InstigatorType",
    "SqliteEventLogStorage",
    "WorkerStatus",
]
