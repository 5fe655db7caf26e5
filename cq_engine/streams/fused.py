"""Several streams' works executed together (the interface the stream run model calls).

Stand-in: each request runs alone with :func:`cq_engine.streams.run.run_work`; the fused version
(one read per trigger table and commit range, same-shape aggregations in one Spark job) keeps this
interface."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cq_engine.context import EngineContext, RunResult
from cq_engine.model import Stream
from cq_engine.streams.run import run_work
from cq_engine.streams.timing import StreamWork


@dataclass(frozen=True)
class WorkRequest:
    stream: Stream
    work: StreamWork


def run_works(
    ctx: EngineContext,
    requests: Sequence[WorkRequest],
    *,
    on_outcome: Callable[[WorkRequest, RunResult | Exception], None] | None = None,
) -> list[RunResult | Exception]:
    """Run every request (one per stream); a failing one's exception is returned, not raised."""
    outcomes: list[RunResult | Exception] = []
    for request in requests:
        try:
            outcome: RunResult | Exception = run_work(ctx, request.stream, request.work)
        except Exception as exc:  # one stream's failure must not stop the others
            outcome = exc
        outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(request, outcome)
    return outcomes
