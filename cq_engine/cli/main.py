"""``cq``: every command is a thin call into the library (the same functions Dagster calls).

Start-up is part of every command's cost (docs/cli.md): modules a command does not need are
imported inside its handler, and the ``cq`` executable (``console``) ends without the interpreter's
teardown when no in-process JVM needs an orderly stop."""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

from cq_engine.cli.common import name_arg, open_engine, open_ledger
from cq_engine.cli.streams import register
from cq_engine.config import Settings, load_settings
from cq_engine.durations import format_duration
from cq_engine.errors import CQError, summary
from cq_engine.model import ContinuousQuery, PeriodTrigger, Stream
from cq_engine.resample import timing
from cq_engine.times import UTC, iso, parse_time


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # usage errors (argparse printed them) and --help, also when called in-process
        return exc.code if isinstance(exc.code, int) else 2
    try:
        settings = load_settings()
        return args.handler(args, settings) or 0
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # one line, never a traceback (CQ_DEBUG=1 prints it after the line)
        print(f"cq: error: {exc if isinstance(exc, CQError) else 'internal error: ' + summary(exc)}", file=sys.stderr)
        if os.environ.get("CQ_DEBUG"):
            traceback.print_exception(exc, file=sys.stderr)
        return 1


def console() -> None:
    """The ``cq`` executable: ``main()``, then exit. Tearing the interpreter down (pandas, pyarrow,
    gRPC, a Connect client) costs a few tenths of a second and does nothing a finished command needs
    (its files are closed, its commits done, a Connect server keeps no state of ours), so the process
    ends at once after flushing; only a classic session's JVM gets pyspark's orderly stop."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    context = sys.modules.get("pyspark.core.context")
    if context is not None and context.SparkContext._gateway is not None:
        sys.exit(code)
    os._exit(code)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cq", description="cq-engine: continuous queries on Spark and Delta Lake")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def cmd(name: str, handler, help: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=help)
        sp.set_defaults(handler=handler)
        return sp

    sp = cmd("validate", _validate, "parse the definitions and list them; errors as file:line:col")
    sp.add_argument("path", nargs="?", help="file or directory (default: CQ_SQL_DIR)")
    sp.add_argument(
        "--check-triggers",
        action="store_true",
        help="also import each trigger's class and call its validate() (runs the trigger's code)",
    )
    sp = cmd("plan", _plan, "print the next firings at or after a time")
    sp.add_argument("name", type=name_arg)
    sp.add_argument("--from", dest="start", required=True, metavar="T")
    sp.add_argument("--count", type=int, default=5)
    sp.add_argument("--json", action="store_true")
    sp = cmd("run", _run, "execute the firing scheduled at T")
    sp.add_argument("name", type=name_arg)
    sp.add_argument("--at", required=True, metavar="T")
    sp = cmd("recalculate", _recalculate, "recompute every window in [T1, T2) in one run")
    sp.add_argument("name", type=name_arg)
    sp.add_argument("--from", dest="start", required=True, metavar="T1")
    sp.add_argument("--to", dest="end", metavar="T2", help="default: the end of the latest firing's range")
    sp.add_argument(
        "--via-dagster",
        nargs="?",
        const="localhost:3000",
        metavar="HOST:PORT",
        help="launch the definition's recalculate job on a Dagster webserver instead",
    )
    sp.add_argument(
        "--via-airflow",
        nargs="?",
        const="http://localhost:8080",
        metavar="URL",
        help="create a backfill of the definition's DAG on an Airflow API server instead (credentials: "
        "CQ_AIRFLOW_TOKEN, or CQ_AIRFLOW_USER and CQ_AIRFLOW_PASSWORD)",
    )
    cmd("show", _show, "list definitions with their last firing")
    sp = cmd(
        "maintain",
        _maintain,
        "housekeeping: drop ledger entries past CQ_LEDGER_RETENTION; compact, checkpoint, clean the log "
        "of and VACUUM the engine state tables and the sinks",
    )
    sp.add_argument("--sources", action="store_true", help="also the declared tables (CREATE TABLE in sql/)")
    sp = cmd("ingest", _ingest, "append a CSV, JSON-lines or Parquet file to a table (one commit)")
    sp.add_argument("table", type=name_arg)
    sp.add_argument("file")
    sp = cmd("query", _query, "run Spark SQL over the warehouse tables")
    sp.add_argument("sql")
    sp.add_argument("--limit", type=int, default=1000)
    sp.add_argument(
        "--format",
        choices=list(FORMATS),
        default="table",
        help="table (default), csv (a header, then RFC 4180 rows), or json (one JSON object per line)",
    )
    sp.add_argument(
        "--allow-writes",
        action="store_true",
        help="run any statement (INSERT, CREATE, ADD JAR, file reads...); default: one SELECT only",
    )
    sp = cmd("spark", _spark, "manage the local Spark Connect server")
    sp.add_argument("action", choices=["start", "stop", "status"])
    sp = cmd("dev", _dev, "Spark Connect server + Dagster UI/daemon + a simulated sensor feed; Ctrl-C stops all")
    sp.add_argument("--port", type=int, default=3000)
    sp.add_argument("--feed-every", type=float, default=5.0, metavar="SECONDS")
    sp.add_argument("--no-spark-server", action="store_true", help="use in-process Spark in each run")
    sp.add_argument(
        "--verbose", action="store_true", help="echo all of Dagster's output, not only its warnings and errors"
    )
    sp.add_argument(
        "--stop-wait",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="on Ctrl-C, how long runs in flight other than batches may take to finish (then canceled and "
        "queued again; batch runs are canceled at once, their sensors request them again)",
    )
    register(cmd)
    # `cq drop NAME` also drops a trigger whose statement was removed (calling its on_drop()).
    drop = sub.choices["drop"]
    drop.set_defaults(handler=_drop_trigger_or(drop.get_default("handler")))
    cmd("triggers", _triggers, "list the triggers (IoTDB's SHOW TRIGGERS): event, type, state, pattern, class")
    sp = cmd("demo", _demo, "scripted demo: ingest the sample feed, run the sample queries, print the sinks")
    sp.add_argument("--firings", type=int, default=3)
    return p


def _time(text: str, settings: Settings, what: str) -> datetime:
    return parse_time(text, tz=settings.tz, what=what)


def _validate(args, settings: Settings) -> int:
    from cq_engine.catalog import load_catalog, parse_options, undeclared_reads
    from cq_engine.lastgood import LastGood
    from cq_engine.triggers.runtime import check_trigger, find_module

    # One file is checked against the tables the sql directory's other files declare. A file that fails
    # is reported with what a running stack does meanwhile (its last good version, read, never recorded).
    catalog = load_catalog(
        args.path or settings.sql_dir,
        options=parse_options(settings),
        context=settings.sql_dir if args.path else None,
        last_good=LastGood(settings.home, record=False),
    )
    for t in catalog.tables:
        print(f"table  {t.name:<24} time={t.time_column:<10} {t.location}")
    for d in catalog.definitions:
        print(f"{_kind(d):<6} {d.name:<24} {d.source} -> {d.sink}  {_trigger(d)}  {_policy(d)}  {d.location}")
    errors = [f"{e} ({e.consequence()})" if e.kept else str(e) for e in catalog.errors]
    for trig in catalog.triggers:
        print(
            f"trigger {trig.name:<23} {trig.event.upper()} INSERT ON {trig.pattern} AS {trig.target}  "
            f"{'STATEFUL' if trig.stateful else 'STATELESS'}  {trig.location}"
        )
        try:  # only --check-triggers runs user code (imports the class, calls its validate())
            if args.check_triggers:
                check_trigger(trig, settings=settings)
            else:
                find_module(trig, settings=settings)
        except CQError as exc:
            errors.append(str(exc))
    for d, table in undeclared_reads(catalog):
        if not _in_warehouse(settings, table):
            windowed = isinstance(d, Stream) and not isinstance(d.trigger, PeriodTrigger)
            effect = "its windows wait" if windowed else "its firings fail"
            print(
                f"warning: {d.location}: {d.name!r} reads table {table!r}, which is neither declared (CREATE TABLE) "
                f"nor in the warehouse {settings.warehouse}; {effect} until it exists",
                file=sys.stderr,
            )
    for err in errors:
        print(err, file=sys.stderr)
    return 1 if errors else 0


def _in_warehouse(settings: Settings, table: str) -> bool:
    """Whether ``table`` is a Delta table of the warehouse: its log directory, locally (no pyarrow: validate
    stays light); on object storage its latest version."""
    if "://" not in settings.warehouse or settings.warehouse.startswith("file://"):
        root = settings.warehouse.removeprefix("file://")
        return (Path(root) / table / "_delta_log").is_dir()
    from cq_engine.storage.log import latest_version

    try:
        return latest_version(settings.table_uri(table)) is not None
    except Exception:  # unreachable store: say nothing rather than a false warning
        return True


def _kind(d) -> str:
    if isinstance(d, ContinuousQuery):
        return "cq"
    return "rule" if d.form == "ekuiper" else "stream"


def _trigger(d) -> str:
    """One line describing when a definition runs."""
    if isinstance(d, ContinuousQuery):
        r = d.resample
        return f"every={format_duration(r.every)} range=[-{format_duration(r.start_offset)}, -{format_duration(r.end_offset)})"
    t = d.trigger
    if d.form == "ekuiper" and t.kind == "sliding":  # eKuiper's TUMBLINGWINDOW / HOPPINGWINDOW
        label = "tumbling" if t.sliding == t.interval else "hopping"
        return (
            f"{label}(size={format_duration(t.interval)}"
            + (f", hop={format_duration(t.sliding)}" if label == "hopping" else "")
            + f") from {d.trigger_table or '-'}"
        )
    args = {
        k: (format_duration(v) if hasattr(v, "total_seconds") else v)
        for k, v in vars(t).items()
        if k not in ("kind", "ts_column") and v not in (None, (), "", timedelta(0))
    }
    return f"{t.kind}({', '.join(f'{k}={v}' for k, v in args.items())}) from {d.trigger_table or '-'}"


def _policy(d) -> str:
    """How a definition treats what arrives late or overlaps, in its own system's words: IoTDB's and
    TDengine's TIMEOUT POLICY; an eKuiper rule's ``lateTolerance`` option (without it, late rows are
    recomputed: README, eKuiper rules)."""
    if isinstance(d, Stream) and d.form == "ekuiper":
        if d.options.ignore_disorder:
            return f"lateTolerance={format_duration(d.options.watermark)}"
        return "lateTolerance=none (late rows recomputed)"
    return d.timeout_policy


def _definition(name: str, settings: Settings):
    from cq_engine.catalog import require_definition, settings_catalog

    catalog = settings_catalog(settings)
    return require_definition(catalog, name, sql_dir=settings.sql_dir)


def _plan(args, settings: Settings) -> int:
    from cq_engine.schedule.ticks import ticks_of

    d = _definition(args.name, settings)
    if args.count < 1:
        raise CQError("--count must be at least 1")
    if not isinstance(d, ContinuousQuery) and not isinstance(d.trigger, PeriodTrigger):
        raise CQError(
            f"{d.name!r} is a window-triggered stream: its runs follow its trigger table's data, "
            f"not a clock (see `cq tick {d.name}`)"
        )
    start = _time(args.start, settings, "--from")
    ticks = ticks_of(d, timezone=settings.timezone, created=start)
    fires: list[datetime] = []
    while len(fires) < args.count:
        more = ticks.between(
            fires[-1] + timedelta(microseconds=1) if fires else start,
            (fires[-1] if fires else start) + max(ticks.every, timedelta(days=1)) * 2,
        )
        if not more:
            break
        fires += more[: args.count - len(fires)]
    firings = [timing.Firing(d.name, f, ticks.range_of(f)).as_dict() for f in fires]
    if args.json:
        print(json.dumps(firings, indent=2))
    else:
        _print_rows(["fire_time", "range_start", "range_end"], [list(f.values()) for f in firings])
    return 0


def _run(args, settings: Settings) -> int:
    engine = open_engine(settings)
    at = _time(args.at, settings, "--at")
    d = engine.definition(args.name)
    # Delta's idempotent write skips a firing already committed from the same source version: the
    # sink's version then stays where it was, which the line says instead of claiming rows.
    before = engine.storage.version(d.sink) if d.sink and engine.storage.exists(d.sink) else None
    r = engine.run_period(args.name, at) if not isinstance(d, ContinuousQuery) else engine.run_firing(args.name, at)
    fired = iso(r.fire_time) if r.fire_time else iso(at)
    head = f"{r.definition}: fired {fired} over [{iso(r.time_range[0])}, {iso(r.time_range[1])}): "
    tail = f"(read {r.files_read}/{r.files_total} files, {r.seconds:.2f}s)"
    if before is not None and r.sink_version == before:
        versions = ", ".join(f"{t} v{v}" for t, v in sorted(r.source_versions.items()))
        print(
            f"{head}nothing written: this firing was already committed from {versions}, so {d.sink} stays at "
            f"v{r.sink_version} ({r.rows_written} rows computed; new source data or a changed definition "
            f"writes again) {tail}"
        )
    else:
        print(f"{head}{r.rows_written} rows -> {d.sink} v{r.sink_version} {tail}")
    return 0


def _recalculate(args, settings: Settings) -> int:
    if args.via_dagster and args.via_airflow:
        raise CQError("--via-dagster and --via-airflow: choose one")
    if args.via_dagster:
        return _recalculate_via_dagster(args, settings)
    if args.via_airflow:
        return _recalculate_via_airflow(args, settings)
    engine = open_engine(settings)
    start = _time(args.start, settings, "--from")
    end = _time(args.end, settings, "--to") if args.end else None
    r = engine.recalculate(args.name, start=start, end=end, now=datetime.now(UTC), progress=_progress_bar)
    print(
        f"{r.definition}: recalculated [{iso(r.time_range[0])}, {iso(r.time_range[1])}) in {r.chunks} "
        f"chunk(s): {r.rows_written} rows -> v{r.sink_version} ({r.seconds:.2f}s)"
    )
    return 0


def _recalculate_via_dagster(args, settings: Settings) -> int:
    from dagster_defs.client import launch_recalculate
    from dagster_defs.translator import configured_translator

    d = _definition(args.name, settings)
    _time(args.start, settings, "--from")  # reject bad times before anything is launched
    if args.end:
        _time(args.end, settings, "--to")
    address = args.via_dagster if ":" in args.via_dagster else f"{args.via_dagster}:3000"
    try:
        kind, ident = launch_recalculate(
            d, address=address, translator=configured_translator(), start=args.start, end=args.end
        )
    except CQError as exc:
        raise CQError(f"--via-dagster {args.via_dagster}: {exc}") from None
    page = f"runs/b/{ident}" if kind == "backfill" else f"runs/{ident}"
    print(f"{args.name}: recalculate {kind} {ident} launched on http://{address}/{page}")
    return 0


def _recalculate_via_airflow(args, settings: Settings) -> int:
    from cq_engine.cli.viaairflow import backfill

    start = _time(args.start, settings, "--from")
    # Airflow takes the runs whose data interval starts in [from, to] and has ended: [T1, T2) is to = T2 - 1 µs.
    end = _time(args.end, settings, "--to") - timedelta(microseconds=1) if args.end else datetime.now(UTC)
    if end < start:
        raise CQError(f"--from {args.start} is not before --to {args.end}")
    b = backfill(args.via_airflow, args.name, start=start, end=end)
    print(
        f"{args.name}: backfill {b.get('id')} created on {args.via_airflow} over the runs whose range starts in "
        f"[{b.get('from_date')}, {b.get('to_date')}] (reprocess {b.get('reprocess_behavior')}, "
        f"{b.get('max_active_runs')} at a time)"
    )
    return 0


def _progress_bar(done: int, total: int) -> None:
    width = 30
    filled = width * done // total
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} chunks")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def _show(args, settings: Settings) -> int:
    from cq_engine.catalog import settings_catalog

    catalog = settings_catalog(settings)
    last = open_ledger(settings).last_by_definition()
    rows = []
    for d in catalog.definitions:
        e = last.get(d.name)
        # A firing is known by its fire time; a recalculation or stream run by its half-open range.
        when = (iso(e.fire_time) if e.fire_time else f"[{iso(e.range_start)}, {iso(e.range_end)})") if e else "-"
        rows.append(
            [
                d.name,
                f"{d.source} -> {d.sink}",
                _trigger(d),
                _policy(d),
                e.kind if e else "-",
                when,
                e.status if e else "never",
                str(e.rows_written) if e else "-",
            ]
        )
    _print_rows(["name", "tables", "trigger", "policy", "last run", "time", "status", "rows"], rows)
    for err in catalog.errors:
        print(err, file=sys.stderr)
    return 1 if catalog.errors else 0


def _maintain(args, settings: Settings) -> int:
    reports = open_engine(settings).maintain(sources=args.sources)
    for report in reports:
        print(report.line(), file=sys.stderr if report.error else sys.stdout)
    return 1 if any(r.error for r in reports) else 0


def _ingest(args, settings: Settings) -> int:
    from cq_engine.ingest import ingest

    result = ingest(table=args.table, data=args.file, engine=open_engine(settings))
    for failure in result.trigger_failures:
        print(f"cq: warning: {failure} (OPTIMISTIC: the rows were written)", file=sys.stderr)
    print(f"{args.table}: appended {result.rows} rows from {args.file} (version {result.version})")
    return 0


def _triggers(args, settings: Settings) -> int:
    from cq_engine.triggers.after import show

    engine = open_engine(settings)
    rows = show(engine.catalog, ctx=engine.ctx)
    header = ["name", "event", "type", "state", "pattern", "class", "runs in", "tables"]
    _print_rows(header, [[r[h] for h in header] for r in rows])
    for err in engine.catalog.errors:
        print(err, file=sys.stderr)
    return 1 if engine.catalog.errors else 0


def _drop_trigger_or(fallback):
    def handler(args, settings: Settings) -> int:
        from cq_engine.catalog import settings_catalog
        from cq_engine.triggers.runtime import drop

        catalog = settings_catalog(settings)
        dropped = drop(args.name, catalog=catalog, settings=settings)
        if dropped is None:
            return fallback(args, settings)
        print(json.dumps(dropped))
        return 0

    return handler


def _query(args, settings: Settings) -> int:
    from cq_engine.parse.safety import check_read_only

    if not args.allow_writes:
        check_read_only(args.sql)  # before Spark starts
    engine = open_engine(settings)
    table = engine.query(args.sql, limit=args.limit, allow_writes=args.allow_writes)
    FORMATS[args.format](table.column_names, table.to_pylist())
    return 0


def _cell(v) -> str:
    if isinstance(v, datetime):
        return iso(v)
    return "NULL" if v is None else str(v)


def _print_table(columns: list[str], rows: list[dict]) -> None:
    _print_rows(columns, [[_cell(v) for v in row.values()] for row in rows])


def _print_csv(columns: list[str], rows: list[dict]) -> None:
    """A header line, then one line per row: timestamps ISO-8601, NULL as an empty field."""
    import csv

    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if v is None else iso(v) if isinstance(v, datetime) else v for v in row.values()])


def _print_json_lines(columns: list[str], rows: list[dict]) -> None:
    """One JSON object per row, keys in column order: timestamps and dates as ISO-8601 strings,
    decimals and bytes as strings, NaN and infinities as the strings "NaN", "Infinity", "-Infinity"
    (JSON has no such numbers), NULL as null."""
    for row in rows:
        print(json.dumps({k: _json_value(v) for k, v in row.items()}, default=_json_default, allow_nan=False))


def _json_value(v):
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
    if isinstance(v, list):
        return [_json_value(x) for x in v]
    if isinstance(v, dict):
        return {k: _json_value(x) for k, x in v.items()}
    return v


def _json_default(v) -> str:
    if isinstance(v, datetime):
        return iso(v)
    if hasattr(v, "isoformat"):  # date, time
        return v.isoformat()
    if isinstance(v, bytes):
        return v.hex()
    return str(v)  # Decimal and anything else: its exact text


FORMATS = {"table": _print_table, "csv": _print_csv, "json": _print_json_lines}


def _spark(args, settings: Settings) -> int:
    from cq_engine import spark
    from cq_engine.cli import agent

    if args.action == "start":
        print(spark.start_server(settings).describe())
        agent.start(settings.home)  # warm commands (docs/cli.md); ready a second or two later
    elif args.action == "stop":
        agent.stop(settings.home)
        print("stopped" if spark.stop_server(settings) else "not running")
    else:
        status = spark.server_status(settings)
        print(status.describe())
        return 0 if status.running else 3
    return 0


def _dev(args, settings: Settings) -> int:
    from cq_engine.cli.dev import run_dev

    return run_dev(
        settings,
        port=args.port,
        feed_every=args.feed_every,
        spark_server=not args.no_spark_server,
        drain_timeout=args.stop_wait,
        verbose=args.verbose,
    )


def _demo(args, settings: Settings) -> int:
    from cq_engine.cli.demo import run_demo

    return run_demo(settings, firings=args.firings)


def _print_rows(header: list[str], rows: list[list[str]]) -> None:
    widths = [max([len(h)] + [len(str(r[i])) for r in rows]) for i, h in enumerate(header)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    print(line)
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    print(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")


if __name__ == "__main__":
    console()
