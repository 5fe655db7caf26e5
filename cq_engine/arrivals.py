"""Rows that reached a source after a firing read it: what the completeness check needs to tell a
firing that wrote no row because its range was empty from one that ran before its rows arrived."""

from __future__ import annotations

from datetime import datetime

from cq_engine.errors import CQError
from cq_engine.storage.ledger import LedgerEntry


def arrived_later(ctx, source: str, entries: list[LedgerEntry], *, cache: dict | None = None) -> set[datetime]:
    """The fire times of ``entries`` (firings that wrote no row) whose ``source`` received rows for
    their range after the version they read: a commit since then added a file whose time statistics
    reach into the range (a file without statistics may hold any time). ``ctx``: an ``EngineContext``
    (its storage and time columns); reads the Delta log only, no Spark. ``cache`` (one per check
    evaluation): the commits read per source, shared by the definitions reading it."""
    read = [e for e in entries if source in e.source_versions and e.fire_time is not None]
    if not read:
        return set()
    after = min(e.source_versions[source] for e in read)
    known = (cache or {}).get(source)
    if known is not None and known[0] <= after:
        commits = known[1]
    else:
        try:
            latest = ctx.storage.latest_version(source)
            commits = (
                []
                if latest is None
                else ctx.storage.read_commits(source, after=after, until=latest, time_column=ctx.time_column(source))
            )
        except CQError:  # the source is gone: nothing arrives
            return set()
        if cache is not None:
            cache[source] = (after, commits)
    late: set[datetime] = set()
    for e in read:
        since = [c for c in commits if c.version > e.source_versions[source]]
        if (
            any(
                f.min_time is None or f.max_time is None or (f.min_time < e.range_end and f.max_time >= e.range_start)
                for c in since
                for f in c.added
            )
            and e.fire_time is not None
        ):
            late.add(e.fire_time)
    return late
