"""incast catalog: the kept figures made again, where something dates them.

    incast catalog                  # those a changed setting or the check dates
    incast catalog --all            # every figure
    incast catalog NAME [NAME ...]  # these
    incast catalog --dry-run        # say which, and why, and make nothing

A figure is dated where its kept result is missing, made with settings the figure no
longer has (incast.campaign.kept.stale), leaves a claim or a paper number undecided
(incast.campaign.judge.undecided_points: a claim rendered anew can need runs the kept
result lacks), or where fresh runs of today's code disagree with it at its claims'
deciding points (incast.campaign.check). Each one dated
is made as `incast figure NAME --repeat 6` makes it (the full grid, six runs a point,
more where a claim is undecided) into results/catalog-COMMIT/NAME, then kept: its
sweep.parquet, sweep.json and figure.png copied into docs/figure-results/NAME, the
sweep.json recording the commit, the command, the date, the runs' host time and the
machine. The scoreboard and the documentation's tables are drawn again at the end.

A kept result is made from a clean tree whose commit is on main (anything else is
refused with one line: no commit would name the code that made it). It is resumable:
finished runs are the point store's, and a figure already made under
results/catalog-COMMIT is kept without running again.
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from incast.constants import REPO
from incast.errors import BadInput
from incast.measure import calibration
from incast.campaign import check, figure, judge, kept, make
from incast.pages import doc_tables, scoreboard, wren_table
from incast.run import points

KEPT_FILES = ("sweep.parquet", "sweep.json", "figure.png")
KEPT_REPEAT = 6             # runs a point of a kept result (judge.runs_to_decide())
WREN_FIGURE = "wren09-rto"  # the kept result WREN'09's model is fitted to, and the fit's record
WREN_RECORD = doc_tables.RESULTS_DIR / "wren09-model.csv"


class CatalogError(BadInput):
    """Bad input (exit 2), as the CLI reports scenario errors."""


def made_here(path: str) -> bool:
    """What a catalog writes (kept results, the pages drawn from them): a catalog that
    was stopped finds them changed, and resumes."""
    return path.startswith("docs/") or path == "README.md"


def clean_commit_on_main(repo: Path = REPO, branch: str = "main") -> str:
    """HEAD's commit where the tree is clean and HEAD is on `branch`; else CatalogError."""
    def _git(*args: str) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
        except OSError:         # no git on this machine
            return subprocess.CompletedProcess(args, 127, "", "")
    head = _git("rev-parse", "HEAD")
    if head.returncode:
        raise CatalogError("not a git checkout: a kept result names the commit that made it")
    changed = [line[3:] for line in _git("status", "--porcelain", "--untracked-files=no").stdout.splitlines()]
    if [f for f in changed if not made_here(f)]:
        raise CatalogError("the tree has uncommitted changes: a kept result is made from a clean commit on main")
    if _git("merge-base", "--is-ancestor", "HEAD", branch).returncode:
        raise CatalogError(f"HEAD ({head.stdout.strip()[:10]}) is not on {branch}: "
                           "a kept result is made from a commit on main")
    return head.stdout.strip()


def machine() -> dict:
    """What the runs ran on (the calibration's description of the machine, and its name)."""
    return {"host": platform.node(), **calibration.machine(), "python": platform.python_version()}


def dated(names: list[str], run=None, say=lambda m: None) -> list[tuple[str, str]]:
    """(name, why) of each figure of `names` that is to be made again."""
    out = []
    for name in names:
        fig = figure.load(name)
        result = kept.full(name)
        if result is None:
            out.append((name, "no full kept result"))
            continue
        why = kept.stale(fig, result[1])
        if why:
            out.append((name, why))
            continue
        # a claim (or paper number) the kept runs leave undecided, as a claim rendered
        # anew can: incast figure gives those points their runs
        todo = judge.undecided_points(fig, result[0], numbers=True)
        if todo:
            out.append((name, "undecided on the kept result at " + ", ".join(f"{s} {x:g}" for s, x in todo)))
            continue
        if figure.missing(fig):
            say(f"{name}: not checked here ({'; '.join(figure.missing(fig))})")
            continue
        r = check.check_figure(name, run, log=say)
        if r.disagrees:
            out.append((name, "today's code disagrees at " + ", ".join(f"{p.series} {p.x:g}" for p in r.disagrees)))
    return out


def make_figure(name: str, out: Path, args) -> dict:
    """The figure at full scale into `out` (incast figure's own path); its verdicts."""
    if (out / "verdicts.json").is_file():
        return json.loads((out / "verdicts.json").read_text())
    # A make that was stopped: its runs are in the point store, so its directories go
    # (the work directory only where no live process holds it).
    incomplete = out.parent / f".{out.name}.incomplete"
    if incomplete.exists() and points.abandoned(incomplete):
        shutil.rmtree(incomplete)
    if out.exists():                # the sweep finished, the decisions or the report did not
        shutil.rmtree(out)
    ns = argparse.Namespace(name=name, quick=False, out=str(out), json=True, repeat=KEPT_REPEAT,
                            max_repeat=make.MAX_REPEAT, jobs=args.jobs, executor=args.executor,
                            force_jobs=False, fresh=False)
    make.cmd_figure(ns)
    return json.loads((out / "verdicts.json").read_text())


def keep(name: str, out: Path, commit: str, command: str, took_s: float) -> Path:
    """The made figure into docs/figure-results/NAME, its sweep.json completed."""
    dest = kept.KEPT_FIGURES_DIR / name
    dest.mkdir(parents=True, exist_ok=True)
    table = pd.read_parquet(out / "sweep.parquet")
    meta = json.loads((out / "sweep.json").read_text())
    meta.update({"commit": commit, "uncommitted_changes": False, "command": command,
                 "kept": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine(),
                 "runs": int(len(table)),
                 "host_seconds": round(float(table["host_seconds"].sum()), 1) if "host_seconds" in table else None,
                 "wall_seconds": round(took_s, 1)})
    for f in KEPT_FILES:
        if f != "sweep.json":
            shutil.copyfile(out / f, dest / f)
    (dest / "sweep.json").write_text(json.dumps(meta, indent=2) + "\n")
    return dest


def cmd_catalog(args) -> int:
    known = figure.known()
    unknown = [n for n in args.names if n not in known]
    if unknown:
        raise CatalogError(f"no figure {', '.join(unknown)} (incast figure list)")
    if args.all and args.names:
        raise CatalogError("give figures or --all, not both")
    commit = clean_commit_on_main() if not args.dry_run else ""

    def say(m):
        print(m, file=sys.stderr)
    names = args.names or known
    todo = [(n, "asked for") for n in names] if (args.all or args.names) else \
        dated(names, check.sweep_runner(args.jobs, log=lambda m: None), say)
    for name, why in todo:
        print(f"{name}: {why}")
    if args.dry_run or not todo:
        print("nothing to make" if not todo else f"{len(todo)} figures to make (--dry-run: none made)")
        return 0
    root = Path(args.out or f"results/catalog-{commit[:10]}")
    root.mkdir(parents=True, exist_ok=True)
    command = " ".join(["incast", *sys.argv[1:]])
    for i, (name, why) in enumerate(todo, 1):
        missing = figure.missing(figure.load(name))
        if missing:
            print(f"[{i}/{len(todo)}] {name}: not made here: {'; '.join(missing)}")
            continue
        print(f"[{i}/{len(todo)}] {name}: making ({why})", file=sys.stderr)
        start = time.monotonic()
        result = make_figure(name, root / name, args)
        dest = keep(name, root / name, commit, command, time.monotonic() - start)
        verdicts = ", ".join(v["verdict"] for v in result["verdicts"])
        print(f"[{i}/{len(todo)}] {name}: kept in {dest} ({result['runs']} runs; {verdicts})")
        fig = figure.load(name)
        declared = sum(1 for c in [*fig.claims, *fig.paper_numbers] if c.divergence)
        if declared:
            # The numbers they name are the new result's (incast.campaign.quote); the
            # words around them were written for the old one.
            print(f"[{i}/{len(todo)}] {name}: read its {declared} declared divergences again against the new result")
    if any(name == WREN_FIGURE for name, _ in todo):
        # The model's record is a fit of this figure's kept result (tests/test_wren_model.py).
        wren_table.main([str(kept.KEPT_FIGURES_DIR / WREN_FIGURE), "--record", str(WREN_RECORD)])
    scoreboard.main([])
    doc_tables.main([])
    return 0
