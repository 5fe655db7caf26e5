"""Parser fuzz: seeded mutants of every ``.sql`` under ``sql/`` and ``tests/`` (the seeds' worked examples
are in tests/data/seed_examples.sql) either load or fail with a ``ParseError`` naming ``file:line:col``:
no other exception, no hang. A CLI sample checks that no traceback ever reaches the terminal. No Spark."""

from __future__ import annotations

import random
import re
import signal
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from cq_engine.catalog import load_catalog
from cq_engine.cli.main import main
from cq_engine.errors import ParseError

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(ROOT.glob("sql/**/*.sql")) + sorted(ROOT.glob("tests/**/*.sql"))
MUTANTS = 3000
HANG_SECONDS = 20  # per mutant: only a hang gets near it
PLACE = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): \S")

_TOKEN = re.compile(r"""'[^']*'|"[^"]*"|`[^`]*`|\d+[A-Za-z]*|[A-Za-z_%][\w%]*|--[^\n]*|\s+|.""", re.S)
EXTREMES = [
    "2147483648",
    "99999999999999999999",
    "0",
    "-1",
    "1e400",
    "9" * 60,
    "2147483648d",
    "2147483648m",
    "1ns",
    "1zz",
    "0s",
    "99999999999999999999s",
    "1d1h1m1s1ms1us",
    "NaN",
    "-0",
]
NAMES = [
    "a" * 300,
    "a\x00b",
    "x\u202ey",
    '"../escaped"',
    '"/abs/x"',
    '"a\\\\b"',
    "`..`",
    '".."',
    "\u0007",
    "温度",
    '""',
    "é" * 70,
    "_",
]
KEYWORDS = [
    "SELECT",
    "FROM",
    "GROUP",
    "BY",
    "WHERE",
    "INTO",
    "AS",
    "END",
    "BEGIN",
    "(",
    ")",
    ",",
    ";",
    "*",
    "PARTITION",
    "INTERVAL",
    "GROPU",
    "TUMBLINGWINDOW",
    "reflect",
    "java_method",
    "CASE",
    "WHEN",
]


def statements(path: Path) -> tuple[str, list[str]]:
    """A file's CREATE TABLE / stream declarations (kept whole, so columns resolve) and its other
    statements, split on ``;`` outside quotes and parentheses."""
    parts, current, depth = [], [], 0
    for tok in _TOKEN.findall(path.read_text()):
        if tok == ";" and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        depth += {"(": 1, ")": -1}.get(tok, 0)
        current.append(tok)
    parts.append("".join(current))
    parts = [
        p
        for p in parts
        if p.strip() and not all(line.strip().startswith("--") or not line.strip() for line in p.splitlines())
    ]
    tables = [p for p in parts if re.match(r"\s*(--[^\n]*\n\s*)*CREATE\s+(TABLE|STREAM\s+\w+\s*\()", p, re.I)]
    return ";\n".join(tables), [p for p in parts if p not in tables] + tables


def mutate(text: str, rng: random.Random) -> str:
    toks = _TOKEN.findall(text)
    for _ in range(rng.randint(1, 3)):
        solid = [i for i, t in enumerate(toks) if t.strip() and not t.startswith("--")]
        if not solid:
            break
        i = rng.choice(solid)
        op = rng.randrange(9)
        if op == 0:
            del toks[i]
        elif op == 1:
            toks.insert(i, toks[i])
        elif op == 2 and i + 2 < len(toks):
            j = min(len(toks) - 1, i + rng.choice([1, 2]))
            toks[i], toks[j] = toks[j], toks[i]
        elif op == 3:
            toks[i] = rng.choice(EXTREMES)
        elif op == 4:
            toks[i] = rng.choice(NAMES)
        elif op == 5:
            depth = rng.choice([19, 21, 60, 500])
            toks[i] = "(" * depth + toks[i] + ")" * depth
        elif op == 6:
            toks.insert(i, " " + rng.choice(KEYWORDS) + " ")
        elif op == 7 and toks[i][:1].isalpha():
            word = toks[i]
            k = rng.randrange(len(word))
            toks[i] = word[:k] + word[k + 1 :] if len(word) > 2 else word + word  # a misspelling
        else:
            toks[i] = toks[i] + rng.choice(["d", "ns", "\x00", "\u202e", "..", "/", "'"])
    return "".join(toks)


def _corpus() -> list[tuple[Path, str, str]]:
    out = []
    for path in SOURCES:
        tables, stmts = statements(path)
        out += [(path, tables, s) for s in stmts]
    return out


def _on_alarm(signum, frame):
    raise TimeoutError(f"a mutant took over {HANG_SECONDS}s")


def test_corpus_covers_every_dialect():
    text = " ".join(" ".join(s.split()).upper() for _, _, s in _corpus())
    assert len(SOURCES) >= 7
    for head in ("CREATE CONTINUOUS QUERY", "CREATE STREAM", "CREATE RULE", "TRIGGER", "CREATE TABLE"):
        assert head in text


def test_mutants_load_or_fail_with_file_line_col(tmp_path):
    rng = random.Random(13)
    corpus = _corpus()
    failures: list[str] = []
    counts = {"loaded": 0, "errors": 0}
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        for n in range(MUTANTS):
            path, tables, stmt = rng.choice(corpus)
            mutant = (tables + ";\n" if tables and stmt not in tables else "") + mutate(stmt, rng)
            file = tmp_path / f"m{n}.sql"
            file.write_text(mutant, encoding="utf-8", errors="surrogatepass")
            signal.alarm(HANG_SECONDS)
            try:
                catalog = load_catalog(file)
            except BaseException as exc:  # any escape is the finding
                failures.append(
                    f"{file} (from {path.name}): {type(exc).__name__}: {exc}\n{mutant[:400]!r}\n"
                    + "".join(traceback.format_exception(exc)[-3:])
                )
                continue
            finally:
                signal.alarm(0)
            lines = mutant.count("\n") + 1
            for error in catalog.errors:
                match = PLACE.match(str(error))
                if not (
                    isinstance(error, ParseError)
                    and match
                    and match["file"] == str(file)
                    and 1 <= error.line <= lines
                    and error.col >= 1
                ):
                    failures.append(f"{file}: not a file:line:col error: {error!r}\n{mutant[:400]!r}")
            counts["errors" if catalog.errors else "loaded"] += 1
            if not catalog.errors:
                file.unlink()
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert not failures, f"{len(failures)} of {MUTANTS} mutants escaped:\n\n" + "\n\n".join(failures[:5])
    assert counts["errors"] > MUTANTS // 2 and counts["loaded"] > 0, counts


def _cli_mutants(tmp_path: Path, count: int, seed: int) -> list[Path]:
    rng = random.Random(seed)
    corpus = _corpus()
    files = []
    for n in range(count):
        _, tables, stmt = rng.choice(corpus)
        d = tmp_path / f"c{n}"
        d.mkdir()
        (d / "m.sql").write_text(
            (tables + ";\n" if tables and stmt not in tables else "") + mutate(stmt, rng),
            encoding="utf-8",
            errors="surrogatepass",
        )
        files.append(d / "m.sql")
    return files


def test_cli_validate_never_prints_a_traceback(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CQ_HOME", str(tmp_path / ".cq"))
    monkeypatch.setenv("CQ_CONFIG", str(tmp_path / "none.toml"))
    for file in _cli_mutants(tmp_path, 40, seed=15):
        monkeypatch.setenv("CQ_SQL_DIR", str(file.parent))
        code = main(["validate", str(file)])
        out, err = capsys.readouterr()
        assert "Traceback" not in out + err
        assert code in (0, 1), (file, code, err)
        if code:
            assert err.strip(), file
            for line in err.strip().splitlines():
                assert PLACE.match(line) or line.startswith("cq: error: "), (file, line)


def test_cli_subprocess_sample_exits_non_zero_without_traceback(tmp_path):
    cq = Path(sys.executable).with_name("cq")
    if not cq.exists():
        pytest.skip("the cq script is not installed next to this Python")
    env = {
        "PATH": str(cq.parent),
        "CQ_HOME": str(tmp_path / ".cq"),
        "CQ_CONFIG": str(tmp_path / "none.toml"),
        "PYTHONPATH": ":".join(sys.path[1:]),
    }
    for file in [*_cli_mutants(tmp_path, 6, seed=16), tmp_path / "deep.sql"]:
        if file.name == "deep.sql":
            file.write_text(
                "CREATE CQ c BEGIN SELECT max(" + "(" * 500 + "x" + ")" * 500 + ") AS m INTO o FROM t GROUP BY (1m) END"
            )
        proc = subprocess.run(
            [str(cq), "validate", str(file)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**env, "CQ_SQL_DIR": str(file.parent)},
            cwd=tmp_path,
        )
        assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
        assert proc.returncode in (0, 1)
        if proc.returncode:
            assert all(
                PLACE.match(line) or line.startswith("cq: error: ") for line in proc.stderr.strip().splitlines()
            ), proc.stderr
    assert proc.returncode == 1 and "nested deeper than 20 levels" in proc.stderr
