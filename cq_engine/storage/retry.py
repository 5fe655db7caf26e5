"""Bounded, jittered retries of Delta commits that lost a race to a concurrent writer.

Every engine write is a range (or predicate) replace carrying an application transaction, or an
append of rows nobody else writes: writing it again after a conflict gives the same table as a
write that had not raced, so a ``CommitFailedError`` is retried rather than recorded as a failure.
A firing streams its output once (``RecordBatchReader``); ``Replayable`` spills what the first
attempt streamed to a local Arrow IPC file so later attempts can write it again.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pyarrow as pa
import pyarrow.ipc as ipc
from deltalake.exceptions import CommitFailedError

from cq_engine.errors import CQError

T = TypeVar("T")
MAX_ATTEMPTS = 8  # whole-write attempts; with the backoff below at most ~13 s of waiting in all
BASE_DELAY = 0.05  # seconds; attempt n waits a uniform random time up to BASE_DELAY * 2**n


def retry_conflicts(write: Callable[[int], T], *, attempts: int = MAX_ATTEMPTS) -> T:
    """``write(attempt)`` until it commits; a ``CommitFailedError`` is retried after a random wait
    (writers that collided should not collide again in lockstep), the last one is raised."""
    for attempt in range(attempts):
        try:
            return write(attempt)
        except CommitFailedError:
            if attempt == attempts - 1:
                raise
            time.sleep(random.uniform(0, BASE_DELAY * 2**attempt))
    raise AssertionError("unreachable")


class Replayable:
    """A batch stream that can be read more than once: the first read spills each batch to a
    temporary Arrow IPC file as it passes, later reads come from that file. Use as a context
    manager; the file is removed on exit."""

    def __init__(self, schema: pa.Schema, batches: Iterator[pa.RecordBatch]):
        self.schema, self._batches = schema, batches
        fd, self._path = tempfile.mkstemp(prefix="cq-replay-", suffix=".arrow")
        os.close(fd)
        self._complete, self._reads = False, 0

    def reader(self) -> pa.RecordBatchReader:
        self._reads += 1
        if self._reads == 1:
            return pa.RecordBatchReader.from_batches(self.schema, self._tee())
        if not self._complete:
            raise CQError("cannot write again: the first attempt did not read all of its data")
        return ipc.open_stream(pa.memory_map(self._path))

    def _tee(self) -> Iterator[pa.RecordBatch]:
        with ipc.new_stream(self._path, self.schema) as sink:
            for batch in self._batches:
                sink.write_batch(batch)
                yield batch
        self._complete = True

    def __enter__(self) -> Replayable:
        return self

    def __exit__(self, *exc: object) -> None:
        os.unlink(self._path)
