"""The docs site's generated references (docs/hooks.py puts them into the pages): the CLI reference from
``cq``'s argument parser and the settings table from ``Settings``, so neither is written twice.
``python -m cq_engine.cli.reference cli|settings`` prints one."""

from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING, fields

from cq_engine.config import _ENV, Settings

# What each setting means (the names, keys and defaults come from Settings and its environment map).
SETTING_DOCS: dict[str, str] = {
    "sql_dir": "where the `.sql` definitions live (searched recursively)",
    "warehouse": "Delta tables live at `<warehouse>/<table>`; any deltalake URI (`s3://...`)",
    "spark_remote": "a Spark Connect address `sc://host:port`; unset means the engine's own local server if it "
    "is running, else an in-process `local[*]` session",
    "spark_master": "a classic Spark master URL (`local[4]`, `spark://...`), used when `CQ_SPARK_REMOTE` is "
    "unset; also the master `cq spark start` attaches its Connect server to",
    "timezone": "reads times written without an offset (CLI, BOUNDARY, ingested files); execution timezone of "
    "schedules",
    "min_every": "IoTDB's `continuous_query_min_every_interval`: smaller EVERY is rejected",
    "home": "project-local engine state: the Spark Connect server's pid file, logs, port and token, the "
    "command agent's socket; `cq tick` cursors; trigger state",
    "spark_port": "port of the engine's local Spark Connect server; when unset, the port the running server "
    "recorded in `$CQ_HOME/spark/port` (`cq dev` picks a free one when 15002 is taken)",
    "recalculate_chunk_windows": "windows per Spark job when a recalculation is chunked",
    "trigger_path": "where trigger classes (`AS 'module:Class'`) are imported from, besides installed "
    "packages; `os.pathsep`-separated directories",
    "storage": "`spark`: Delta through Spark's connector (delta-spark), falling back to `deltars` with one "
    "log line when its jars are not in the local Maven repository; `deltars`: the `deltalake` package",
    "spark_write_bytes": "under `spark`: a result computed from less input than this many bytes (and a "
    "stream run's result) is committed by delta-rs from the run's process, a larger one by Spark's "
    "executors; `0`: the executors write every commit",
    "freshness_grace": "how late past its schedule (or its windows' close) a sink may get before its Dagster "
    "freshness policy fails; a definition's `-- cq: freshness_grace` comment overrides it",
    "completeness_horizon": "how far back the `cq_completeness` asset check compares the firings owed with the ledger",
    "completeness_every": "how often batch runs evaluate a continuous query's or PERIOD stream's "
    "`cq_completeness` check, at the run's start: `0s` (the default) every batch run, so each "
    "materialization shows the check's result; longer: its first batch run after this long (up to half of "
    "it earlier, fixed per definition) and every retry of its failed firings, fewer events for a large "
    "location, and the materializations of the runs in between show the check as not evaluated",
    "ledger_retention": "housekeeping (`cq maintain`, the `cq_maintenance` schedule) deletes ledger entries "
    "that finished longer ago than this, never less than `CQ_COMPLETENESS_HORIZON` and keeping each "
    "definition's newest run; at least `1h`",
    "log_retention": "set as each maintained table's `delta.logRetentionDuration`: Delta log files older "
    "than this, before a checkpoint that is too, are deleted; at least `1h`. As long as `CQ_FILE_RETENTION` "
    "by default (Delta's advice: not shorter), since a version older than that may have lost its files to "
    "VACUUM anyway; Delta's own default, 30 days, keeps 86,000 log files of a sink firing every 30 s, "
    "which every open lists",
    "file_retention": "set as each maintained table's `delta.deletedFileRetentionDuration` (Delta's default) "
    "and VACUUM's retention: data files out of the table for longer than this are deleted; at least `1h`",
    "maintenance_cron": "when the `cq_maintenance` Dagster schedule runs housekeeping (5-field cron, in `CQ_TIMEZONE`)",
}
DEFAULT_TEXT = {"trigger_path": "the parent of `CQ_SQL_DIR`"}


def parser() -> argparse.ArgumentParser:
    from cq_engine.cli.main import _parser

    return _parser()


def subcommands(p: argparse.ArgumentParser | None = None) -> dict[str, argparse.ArgumentParser]:
    """Every ``cq`` subcommand's parser, by name, in the order ``cq --help`` lists them."""
    p = p or parser()
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("cq has no subcommands")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _argument(action: argparse.Action) -> str:
    if action.option_strings:
        name = ", ".join(action.option_strings)
        if action.nargs != 0:
            name += f" {action.metavar or action.dest.upper()}"
        return f"`{name}`"
    return f"`{action.metavar or action.dest.upper()}`"


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or action.required:
        return ""
    return f"`{action.default}`"


def cli_reference(p: argparse.ArgumentParser | None = None) -> str:
    """Markdown: one section per subcommand with its usage and a table of its arguments."""
    out: list[str] = []
    for name, sp in subcommands(p).items():
        out += [f"### `cq {name}`", "", _cell(sp.description or ""), "", "```text"]
        out += [" ".join(sp.format_usage().removeprefix("usage: ").split()), "```", ""]  # one line
        actions = [a for a in sp._actions if not isinstance(a, argparse._HelpAction)]
        if actions:
            out += ["| argument | choices | default | meaning |", "| --- | --- | --- | --- |"]
            for a in actions:
                choices = ", ".join(f"`{c}`" for c in a.choices) if a.choices else ""
                help_text = "" if a.help in (None, argparse.SUPPRESS) else str(a.help)
                if a.required and a.option_strings:
                    help_text = "required" + (f"; {help_text}" if help_text else "")
                out.append(f"| {_argument(a)} | {choices} | {_default(a)} | {_cell(help_text)} |")
            out.append("")
    return "\n".join(out)


def settings_reference() -> str:
    """Markdown: the table of every ``Settings`` field with its variable, ``cq.toml`` key and default."""
    out = ["| variable | `cq.toml` key | default | meaning |", "| --- | --- | --- | --- |"]
    for f in fields(Settings):
        default = f.default if f.default is not MISSING else None
        shown = DEFAULT_TEXT.get(f.name) or ("unset" if default is None else f"`{default}`")
        out.append(f"| `{_ENV[f.name]}` | `{f.name}` | {shown} | {_cell(SETTING_DOCS[f.name])} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(cli_reference() if sys.argv[1:] == ["cli"] else settings_reference())
