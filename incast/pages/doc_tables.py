"""Tables of measured numbers in README.md and docs/, made from result files.

A number in the documentation is only as good as the run behind it, and a number typed
into a page drifts from its run the day either changes. So every table of measured
numbers is written from a CSV in ``docs/results/`` (one row per run: the numbers, the
command that made them and the commit the code was at) and kept in the page between
two comments that hold how it is drawn::

    <!-- results: era-table3.csv
    | run | goodput, Mbit/s | RTOs |
    | `{label}` | {goodput_mbps:.1f} | {rtos} |
    -->
    | run | goodput, Mbit/s | RTOs |
    |---|---|---|
    | `fast-modern` | 213.9 | 24 |
    <!-- end results -->

The comment's first line names the file (and, with ``where COLUMN=VALUE``, the rows
it takes); the next are the table's header and a row
template (Python format fields naming the CSV's columns, or arithmetic on them), or, after ``code``, one line
per row in a ``sh`` block (the rows' commands), or, after ``text``, one line per row in a plain block
(what the rows' runs printed, as a sample of a command's output). Below every table a line links the file,
so each number's command is one line away. ``python -m incast.pages.doc_tables``
rewrites the pages from the files (``--check`` only compares), and ``... record OUT.csv
DIR... --field F --command C`` writes a file from run or sweep directories; tests/test_docs.py fails
when a page and its files disagree, or when a table of numbers is typed by hand.

A row's ``commit`` is the commit its run's code was at; rows recorded before these
files existed carry the commit that first reported them.
"""
from __future__ import annotations

import argparse
import csv
import json
import re
import string
import subprocess
import sys
from pathlib import Path

import pandas as pd

from incast.constants import DOC_RESULTS_DIR as RESULTS_DIR
from incast.constants import DOCS_DIR, REPO
from incast.errors import BadInput
from incast.measure.results import complete_run, flat_summary
from incast.pages.scoreboard import PAGE as SCOREBOARD_PAGE
from incast.report.explain import explain
from incast.run.points import CODE_GLOBS, plane_globs, run_files

# The scoreboard page is written whole from the kept results by incast.pages.scoreboard
# (tests/test_docs.py checks that it is current), so its tables are drawn, not typed.
PAGES = [REPO / "README.md", *sorted(p for p in DOCS_DIR.rglob("*.md") if p != SCOREBOARD_PAGE)]

BLOCK = re.compile(r"<!-- results: (?P<file>[\w.+-]+\.csv)(?: where (?P<col>\w+)=(?P<val>\S+))?(?: (?P<code>code|text))?\n"
                   r"(?P<spec>.*?)\n-->\n"
                   r"(?P<body>.*?)<!-- end results -->", re.S)


def _value(text: str):
    """A CSV cell as the number it is, or its text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def rows(name: str, where: tuple[str, str] | None = None) -> list[dict]:
    """The file's rows (those whose column `where[0]` reads `where[1]`)."""
    path = RESULTS_DIR / name
    if not path.is_file():
        raise BadInput(f"docs/results/{name}: no such result file")
    with open(path, newline="") as f:
        out = [{k: _value(v) for k, v in r.items()} for r in csv.DictReader(f)]
    for i, r in enumerate(out, 2):
        if not r.get("command") or not r.get("commit"):
            raise BadInput(f"docs/results/{name}:{i}: every row names its command and commit")
    if where is not None:
        out = [r for r in out if str(r.get(where[0])) == where[1]]
        if not out:
            raise BadInput(f"docs/results/{name}: no row where {where[0]} = {where[1]}")
    return out


class _RowFormatter(string.Formatter):
    """str.format over a row whose fields may also be arithmetic on its columns
    (``{100 * explain_full_window / explain_timeouts:.0f}``): a share or a rate per block
    is drawn from the numbers it comes from, not kept beside them."""

    def get_field(self, field_name, args, kwargs):
        if field_name.isidentifier():
            return super().get_field(field_name, args, kwargs)
        return eval(field_name, {"__builtins__": {}}, dict(kwargs)), field_name


_FORMAT = _RowFormatter()


def render(name: str, spec: str, code: str | None, link_prefix: str, where: tuple[str, str] | None = None) -> str:
    """The text between a block's comments: the table (or code block) and the link."""
    lines = spec.splitlines()
    try:
        if code:
            # code: the rows' commands, to run; text: what the rows' runs printed
            body = ["```" + ("sh" if code == "code" else "text"),
                    *(_FORMAT.format(ln, **r) for r in rows(name, where) for ln in lines), "```"]
        else:
            header, template = lines
            cols = header.count("|") - 1
            body = [header, "|" + "---|" * cols, *(_FORMAT.format(template, **r) for r in rows(name, where))]
    except (KeyError, ValueError, NameError, SyntaxError, ZeroDivisionError) as e:
        raise BadInput(f"docs/results/{name}: the template does not fit the file: {e!r}") from None
    link = f"{link_prefix}results/{name}"
    what = {"code": "commands", "text": "command and commit of each line"}.get(code, "command and commit of each row")
    return "\n".join(body) + f"\n\n*The {what}: [docs/results/{name}]({link}).*\n"


def _link_prefix(page: Path) -> str:
    """How a page reaches docs/results/."""
    rel = page.parent.relative_to(REPO)
    if rel == Path("."):
        return "docs/"
    depth = len(rel.parts) - 1          # docs/ itself is depth 0
    return "../" * depth


def refresh(page: Path) -> str:
    """The page with every results block drawn anew from its file."""
    text = page.read_text()

    def draw(m: re.Match) -> str:
        where = (m["col"], m["val"]) if m["col"] else None
        body = render(m["file"], m["spec"], m["code"], _link_prefix(page), where)
        return m.group(0)[:m.start("body") - m.start()] + body + "<!-- end results -->"
    return BLOCK.sub(draw, text)


def typed_tables(page: Path) -> list[str]:
    """Tables of numbers outside a results block: the header line of each. A table is one
    of numbers when, in some column, every body cell starts with a digit (a column of
    release numbers mixed with words, as in a table of kernel knobs, is not)."""
    text = BLOCK.sub("", page.read_text())
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    found, table = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            table.append(line)
            continue
        body = [[c.strip() for c in row.strip().strip("|").split("|")] for row in table[2:]]
        if body and any(all(i < len(r) and re.match(r"\d", r[i]) for r in body) for i in range(len(body[0]))):
            found.append(table[0])
        table = []
    return found


def code_commit() -> str:
    """HEAD's short hash; refused while a file a run executes differs from it (then no
    commit names the code that ran). Other changes (documentation, tests) do not matter."""
    git = ["git", "-C", str(REPO)]
    changed = subprocess.run([*git, "diff", "--name-only", "HEAD"], capture_output=True,
                             text=True).stdout.split()
    executed = {str(f.relative_to(REPO)) for f in run_files(CODE_GLOBS + plane_globs())}
    code = [f for f in changed if f in executed]
    if code:
        raise BadInput(f"{', '.join(code)}: changed since the last commit; commit, then record "
                       "(a row names the commit its code was at)")
    return subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()


def record(out: Path, dirs: list[Path], fields: list[str], command: str, append: bool = False) -> int:
    """Rows for docs/results/ from run or sweep directories: `fields` of each run's
    summary (a sweep: each row of its sweep.parquet; a run made with --capture: also
    ``explain_*``, the fields of ``incast explain --json``), its name as `label`, and the
    command (``{label}`` stands for the run's name) and HEAD's commit: record right after
    the runs, at the commit they ran at. Returns the rows written."""
    commit = code_commit()
    rows = []
    for d in dirs:
        if (d / "sweep.parquet").is_file():
            table = pd.read_parquet(d / "sweep.parquet")
            found = [{**r, "label": Path(str(r.get("run_dir", d))).name} for r in table.to_dict("records")]
        else:
            run = complete_run(d)
            found = [{**flat_summary(json.loads((run / "summary.json").read_text())), "label": run.name}]
            if any(f.startswith("explain_") for f in fields):     # FAST'08 Table 3's classes
                found[0].update({f"explain_{k}": v for k, v in explain(run).table3().items()})
        for r in found:
            missing = [f for f in fields if f not in r]
            if missing:
                raise BadInput(f"{d}: no field {', '.join(missing)} in its results")
            rows.append({"label": r["label"], **{f: r[f] for f in fields},
                         "command": command.format(label=r["label"]), "commit": commit})
    table = pd.DataFrame(rows)
    if append and out.is_file():
        table = pd.concat([pd.read_csv(out, dtype=str, keep_default_na=False), table.astype(str)])
    table.to_csv(out, index=False)
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m incast.pages.doc_tables",
                                description="Draw the documentation's tables of numbers from docs/results/.")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 where a page differs")
    sub = p.add_subparsers(dest="verb")
    r = sub.add_parser("record", help="write a result file from run or sweep directories")
    r.add_argument("out", type=Path, help="e.g. docs/results/NAME.csv")
    r.add_argument("dirs", type=Path, nargs="+", help="run or sweep directories")
    r.add_argument("--field", action="append", required=True, help="a summary field (repeatable)")
    r.add_argument("--command", required=True, help="what made the runs; {label} is a run's name")
    r.add_argument("--append", action="store_true", help="add the rows to the file's (same columns)")
    args = p.parse_args(argv)
    if args.verb == "record":
        try:
            n = record(args.out, args.dirs, args.field, args.command, args.append)
        except BadInput as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"{args.out}: {n} rows")
        return 0
    stale = []
    for page in PAGES:
        new = refresh(page)
        if new != page.read_text():
            stale.append(str(page.relative_to(REPO)))
            if not args.check:
                page.write_text(new)
    verb = "differ from their results" if args.check else "redrawn"
    for s in stale:
        print(f"{s}: {verb}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
