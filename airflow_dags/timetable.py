"""``CQTimetable``: a DAG run per firing of a continuous query (RESAMPLE EVERY, BOUNDARY, RANGE) or tick
of a PERIOD stream, at the engine's firing time, its data interval the firing's range; and
``WindowTimetable``: the batched form's run per aligned window of fire times. The times come from
``cq_engine.schedule.ticks`` and ``cq_engine.scheduling.windows``; this module only maps them onto
Airflow's timetable protocol."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import pendulum
from airflow.timetables.base import DagRunInfo, DataInterval, TimeRestriction, Timetable

from cq_engine.durations import format_duration
from cq_engine.errors import ParseError
from cq_engine.model import ContinuousQuery, Definition, PeriodTrigger, Resample, Stream
from cq_engine.schedule.ticks import Ticks, period_ticks_of, resample_ticks
from cq_engine.scheduling.windows import window_of
from cq_engine.times import iso, parse_time

_US = timedelta(microseconds=1)
_DAY = timedelta(days=1)


def _us(value: timedelta) -> int:
    return value // _US


class _SpecTimetable(Timetable):
    """A timetable whose whole state is ``spec``, plain JSON (what the DAG's serialization stores)."""

    spec: dict[str, Any]
    description: str

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> Timetable:
        return cls(data)  # type: ignore[call-arg]

    def serialize(self) -> dict[str, Any]:
        return dict(self.spec)

    @property
    def summary(self) -> str:
        return self.description

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.spec == self.spec  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.spec.items())))


class CQTimetable(_SpecTimetable):
    """The firings of one definition. ``spec`` is plain JSON (what the DAG's serialization stores):
    ``kind`` ``resample`` (``every_us``, ``start_us``, ``end_us``, ``boundary``) or ``period``
    (``period_us``, ``offset_us``), and ``timezone`` (CQ_TIMEZONE). Without ``catchup`` (DISCARD),
    a firing that came due while the run before it was active is skipped: the next run is the first
    firing at or after the moment Airflow asks, which it does once that run has ended."""

    periodic = True
    can_be_scheduled = True
    run_ordering = ("logical_date",)

    def __init__(self, spec: dict[str, Any]):
        self.spec = dict(spec)
        self.ticks, self.lag = _ticks(self.spec)
        self.description = self.ticks.description
        # The batched form (``airflow_dags.batch``): the definition fires in ``cq_firings``'s runs; its
        # own DAG keeps the timetable for backfills and manual runs only (spec ``scheduled`` false).
        self.scheduled = bool(self.spec.get("scheduled", True))
        if not self.scheduled:
            self.description += " (fires in cq_firings; this DAG: backfills and manual runs)"

    @classmethod
    def for_resample(cls, r: Resample, *, timezone: str) -> CQTimetable:
        return cls(
            {
                "kind": "resample",
                "every_us": _us(r.every),
                "start_us": _us(r.start_offset),
                "end_us": _us(r.end_offset),
                "boundary": iso(r.boundary),
                "timezone": timezone,
            }
        )

    @classmethod
    def for_period(cls, trigger: PeriodTrigger, *, timezone: str) -> CQTimetable:
        spec = {"kind": "period", "period_us": _us(trigger.period), "offset_us": _us(trigger.offset)}
        return cls({**spec, "timezone": timezone})

    def unscheduled(self) -> CQTimetable:
        """The same firings for backfills and manual runs only: the scheduler creates no run."""
        return CQTimetable({**self.spec, "scheduled": False})

    # -- Airflow's protocol ------------------------------------------------------------------------
    def fire_time(self, interval: DataInterval) -> datetime:
        """The firing whose range is ``interval``: its end plus the RANGE end offset."""
        return as_utc(interval.end) + self.lag

    def run_info(self, fire: datetime) -> DagRunInfo:
        lo, hi = self.ticks.range_of(fire)
        return DagRunInfo(
            run_after=self._local(fire),
            data_interval=DataInterval(self._local(lo), self._local(hi)),
        )

    def infer_manual_data_interval(self, *, run_after: pendulum.DateTime) -> DataInterval:
        """A manual run computes the latest firing due at ``run_after``."""
        fire = self.ticks.latest(as_utc(run_after))
        if fire is None:
            return DataInterval.exact(run_after)
        return self.run_info(fire).data_interval  # type: ignore[return-value]

    def next_dagrun_info(
        self, *, last_automated_data_interval: DataInterval | None, restriction: TimeRestriction
    ) -> DagRunInfo | None:
        now = datetime.now(UTC)
        earliest = as_utc(restriction.earliest) if restriction.earliest else None
        if not self.scheduled and restriction.latest is None:
            return None  # only a backfill sets the latest bound (the DAGs have no end_date)
        if last_automated_data_interval is None and earliest is not None and restriction.latest is not None:
            # A backfill (or `cq recalculate --via-airflow`): Airflow walks [from, to] with both bounds
            # set (the scheduler never: the DAGs have no end_date); the firings whose range starts in it.
            nxt = self.ticks.next(earliest)
            while nxt is not None and self.ticks.range_of(nxt)[0] < earliest:
                nxt = self.ticks.next(nxt + _US)
        elif last_automated_data_interval is None:
            # IoTDB: the first firing at or after deployment (BOUNDARY if that is later); earlier
            # firings are a backfill's.
            nxt = self.ticks.next(max(now, earliest) if earliest else now)
        else:
            nxt = self.ticks.next(self.fire_time(last_automated_data_interval) + _US)
            if nxt is not None and not restriction.catchup and nxt < now:
                nxt = self.ticks.next(now)
        if nxt is not None and earliest is not None and nxt < earliest:
            nxt = self.ticks.next(earliest)
        # Airflow bounds a run by its logical date, the start of its data interval.
        if nxt is None or (restriction.latest is not None and self.ticks.range_of(nxt)[0] > as_utc(restriction.latest)):
            return None
        return self.run_info(nxt)

    def _local(self, t: datetime) -> pendulum.DateTime:
        return pendulum.instance(as_utc(t)).in_timezone(self.spec["timezone"])


def as_utc(t: datetime) -> datetime:
    """A plain ``datetime`` in UTC: Airflow hands pendulum's, whose arithmetic with the engine's
    standard-library datetimes fails."""
    t = t.astimezone(UTC)
    return datetime(t.year, t.month, t.day, t.hour, t.minute, t.second, t.microsecond, tzinfo=UTC)


def _ticks(spec: dict[str, Any]) -> tuple[Ticks, timedelta]:
    """The engine's ticks for ``spec`` and how long after its range's end a firing runs."""
    tz = spec["timezone"]
    if spec["kind"] == "resample":
        r = Resample(
            every=spec["every_us"] * _US,
            start_offset=spec["start_us"] * _US,
            end_offset=spec["end_us"] * _US,
            boundary=parse_time(spec["boundary"], tz=UTC, bounded=False),
        )
        return resample_ticks(r, timezone=tz), r.end_offset
    trigger = PeriodTrigger(period=spec["period_us"] * _US, offset=spec["offset_us"] * _US)
    return period_ticks_of(trigger, timezone=tz), timedelta(0)


class WindowTimetable(_SpecTimetable):
    """The batched form's DAG ``cq_firings`` (``airflow_dags.batch``): one run per aligned window of
    fire times ``[W, W + cadence)`` (multiples of the cadence since the Unix epoch, UTC), created
    ``lead`` before ``W`` so that its worker has started, parsed and opened Spark by the time the
    window's first firings are due (the task waits for each). Airflow schedules a run's tasks only
    once its logical date (its data interval's start) has passed, so the data interval is the window
    moved ``lead`` earlier: ``[W - lead, W + cadence - lead)``; the task adds the lead back. ``spec``:
    ``cadence_us``, ``lead_us``, ``timezone``.

    No catch-up: after a run that ended past its window the next is the window holding the moment
    Airflow asks (the task plans from the engine's ledger, so BLOCKED catches up whatever came due
    meanwhile and DISCARD skips it). Not periodic: there is no backfill of ``cq_firings`` (a
    definition's own DAG has them)."""

    periodic = False
    can_be_scheduled = True
    run_ordering = ("logical_date",)

    def __init__(self, spec: dict[str, Any]):
        self.spec = dict(spec)
        self.cadence = self.spec["cadence_us"] * _US
        self.lead = self.spec["lead_us"] * _US
        self.description = f"every {format_duration(self.cadence)}, {format_duration(self.lead)} early"

    @classmethod
    def of(cls, *, cadence: timedelta, lead: timedelta, timezone: str) -> WindowTimetable:
        return cls({"cadence_us": _us(cadence), "lead_us": _us(lead), "timezone": timezone})

    def window(self, interval: DataInterval) -> tuple[datetime, datetime]:
        """The fire times ``[start, end)`` a run of data interval ``interval`` owns."""
        return as_utc(interval.start) + self.lead, as_utc(interval.end) + self.lead

    def run_info(self, start: datetime) -> DagRunInfo:
        """The run of the window starting at ``start``."""
        lo = self._local(start - self.lead)
        return DagRunInfo(run_after=lo, data_interval=DataInterval(lo, self._local(start + self.cadence - self.lead)))

    def infer_manual_data_interval(self, *, run_after: pendulum.DateTime) -> DataInterval:
        """A manual run (Trigger) owns the window holding ``run_after``."""
        return self.run_info(window_of(as_utc(run_after), self.cadence)[0]).data_interval  # type: ignore[return-value]

    def next_dagrun_info(
        self, *, last_automated_data_interval: DataInterval | None, restriction: TimeRestriction
    ) -> DagRunInfo | None:
        now = datetime.now(UTC)
        if last_automated_data_interval is None:
            start = window_of(now, self.cadence)[0]
        else:
            start = self.window(last_automated_data_interval)[1]
            if not restriction.catchup and start + self.cadence <= now:
                start = window_of(now, self.cadence)[0]
        if restriction.latest is not None and start - self.lead > as_utc(restriction.latest):
            return None
        return self.run_info(start)

    def _local(self, t: datetime) -> pendulum.DateTime:
        return pendulum.instance(as_utc(t)).in_timezone(self.spec["timezone"])


def ticked_definitions(definitions: Iterable[Definition]) -> list[Definition]:
    """The continuous queries and PERIOD streams: the definitions that fire on a timetable (one DAG
    each, or together in ``cq_firings``); the others run on their trigger table (``stream_dags``)."""
    return [d for d in definitions if isinstance(d, ContinuousQuery) or isinstance(d.trigger, PeriodTrigger)]


def timetable_of(definition: Definition, *, timezone: str) -> CQTimetable | None:
    if isinstance(definition, ContinuousQuery):
        return CQTimetable.for_resample(definition.resample, timezone=timezone)
    assert isinstance(definition, Stream)
    trigger = definition.trigger
    if not isinstance(trigger, PeriodTrigger):
        return None
    if trigger.period >= _DAY:
        raise ParseError(
            "a PERIOD of a day or more is anchored at the stream's creation, which only the engine's "
            "state records: not scheduled under Airflow",
            file=definition.location.file,
            line=definition.location.line,
            col=definition.location.col,
        )
    return CQTimetable.for_period(trigger, timezone=timezone)
