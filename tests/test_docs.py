"""The documentation (README.md and the docs site's pages) is checked like code, without Spark: every
``sql`` block loads with the engine's own catalog (what ``cq validate`` runs), the generated references
list every ``cq`` subcommand and every setting, every ``CQ_*`` variable the code reads is documented,
and no Markdown file of the project narrates the history of its work.

A ``sql`` block that shows the shape of a statement rather than one carries ``title="Syntax"`` on its
fence; one that shows a statement the engine refuses, ``title="Refused"`` (it must then fail to load)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import textwrap
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_readme import doc_pages

from cq_engine.catalog import load_catalog
from cq_engine.cli import reference
from cq_engine.config import _ENV, Settings

REPO = Path(__file__).resolve().parent.parent
SQL_BLOCK = re.compile(r'^( *)```sql(?: +title="(\w+)")?\s*\n(.*?)^\1```', re.MULTILINE | re.DOTALL)
# Text that narrates sessions or rounds of work instead of stating what holds (the project's hook uses
# the first two alternatives).
DIARY = re.compile(
    r"\b(second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth) session\b"
    r"|\((last|this|next|previous) session\)"
    r"|\b(this|last|previous) session\b"
    r"|\bround \d+\b|\bstop \d+\b",
    re.IGNORECASE,
)
# Read by the test suite only (fault injection, the quick loop), not a user's setting.
TEST_ONLY_VARIABLES = {"CQ_FAILPOINT"}


def sql_blocks() -> list[tuple[str, int, str | None, str]]:
    """(page, line, title, dedented body) of every ``sql`` block of README.md and docs/."""
    out = []
    for page in doc_pages():
        text = page.read_text()
        for m in SQL_BLOCK.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out.append((str(page.relative_to(REPO)), line, m.group(2), textwrap.dedent(m.group(3))))
    return out


def test_the_docs_have_sql_blocks_of_each_kind():
    titles = [title for _, _, title, _ in sql_blocks()]
    assert None in titles and "Syntax" in titles, titles
    assert set(titles) <= {None, "Syntax", "Refused"}, titles


@pytest.mark.parametrize(
    "page,line,title,body",
    [pytest.param(*b, id=f"{b[0]}:{b[1]}") for b in sql_blocks() if b[2] != "Syntax"],
)
def test_every_sql_block_loads_with_the_catalog(tmp_path, page, line, title, body):
    """Each block alone, checked against the tables the sample sql/ directory declares (as ``cq
    validate FILE`` checks one file of a directory)."""
    file = tmp_path / "block.sql"
    file.write_text(body)
    catalog = load_catalog(file, context=REPO / "sql")
    errors = [str(e) for e in catalog.errors]
    if title == "Refused":
        assert errors, f"{page}:{line}: the block is marked Refused but loads"
    else:
        assert not errors, f"{page}:{line}: " + "\n".join(errors)
        assert catalog.definitions or catalog.tables or catalog.triggers, f"{page}:{line}: nothing defined"


def test_the_cli_reference_lists_every_subcommand_and_option():
    text = reference.cli_reference()
    commands = reference.subcommands()
    assert {"validate", "run", "recalculate", "query", "tick", "dev", "maintain"} <= set(commands)
    for name, sp in commands.items():
        assert f"### `cq {name}`" in text, name
        for action in sp._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}" in text, (name, option)
    page = (REPO / "docs" / "cli.md").read_text()
    assert "<!-- cq:cli-reference -->" in page
    for name in commands:  # the hand-written table describes every command too
        assert re.search(rf"^\| `cq [^`]*\b{name}\b", page, re.MULTILINE), name


def test_the_settings_table_lists_every_setting():
    text = reference.settings_reference()
    assert set(reference.SETTING_DOCS) == {f.name for f in fields(Settings)}
    for f in fields(Settings):
        assert f"| `{_ENV[f.name]}` | `{f.name}` |" in text, f.name
    assert "<!-- cq:settings-table -->" in (REPO / "docs" / "operations" / "configuration.md").read_text()


def test_every_cq_variable_the_code_reads_is_documented():
    code = "".join(p.read_text() for d in ("cq_engine", "dagster_defs") for p in (REPO / d).rglob("*.py"))
    read = set(re.findall(r"\"(CQ_[A-Z0-9_]+)\"", code)) - TEST_ONLY_VARIABLES
    documented = (REPO / "docs" / "operations" / "configuration.md").read_text() + reference.settings_reference()
    missing = sorted(v for v in read if f"`{v}`" not in documented)
    assert not missing, f"not in docs/operations/configuration.md: {missing}"


def test_no_markdown_file_narrates_the_history_of_the_work():
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    found = [
        f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
        for name in files
        if (REPO / name).is_file()
        for text in [(REPO / name).read_text()]
        for m in DIARY.finditer(text)
    ]
    assert not found, "\n".join(found)


def test_the_site_hook_fills_every_marker():
    """What docs/hooks.py (mkdocs' hook) makes of each page: no marker left, the generated parts in."""
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "hooks.py")
    assert spec and spec.loader
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    pages = {p.relative_to(REPO / "docs").as_posix(): p.read_text() for p in (REPO / "docs").rglob("*.md")}
    rendered = {
        name: hooks.on_page_markdown(text, SimpleNamespace(file=SimpleNamespace(src_uri=name)), None, None)
        for name, text in pages.items()
    }
    assert not [name for name, text in rendered.items() if "<!-- cq:" in text]
    assert "### `cq validate`" in rendered["cli.md"]
    assert "| `CQ_SQL_DIR` | `sql_dir` |" in rendered["operations/configuration.md"]
    assert rendered["architecture.md"].strip() == (REPO / "ARCHITECTURE.md").read_text().strip()
    tour = rendered["getting-started.md"]  # the README's tour, its links made relative to the page
    assert "## A ten-minute tour" in tour and "](concepts.md#idempotence)" in tour and "](docs/" not in tour
