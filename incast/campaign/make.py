"""``incast figure NAME``: run a figure's sweep, add runs where a claim is undecided, and
write

- ``figure.png``: our curves with the paper's numbers overlaid;
- ``comparison.csv``: paper, ours, ratio for every number the paper gives;
- ``verdicts.json``: per claim, holds / does not hold / not testable here, and why;

and print the table and the verdicts. ``--quick`` runs the figure's small grid and
fewer blocks (minutes instead of an hour): enough to see the shape and to test that the
figure runs, not to judge the claims at the paper's scale.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd

from incast import scenario as scn
from incast.campaign import quote
from incast.campaign.figure import Figure, col, load, known, missing, plan
from incast.campaign.judge import (MEDIAN, PAYLOAD_SHARE, POOLED, REPEAT_STEPS, VERDICT, comparison, judge,
                                   link_limit, point_means, point_stats, undecided_points)
from incast.constants import REPO
from incast.errors import BadInput, MissingFeature
from incast.registry import DATAPLANES
from incast.report import wren_model
from incast.run import calibrate, points as run_points, sweep

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)


def model_fits(fig: Figure, table: pd.DataFrame, quick: bool) -> list:
    """The figure's analytical model fitted to each fixed-fragment series (none where
    the figure has no model or too few sender counts)."""
    if fig.model != "wren09":
        return []
    data, overrides, grid, _ = plan(fig, quick)
    kind_col = "kind" if "kind" in table else None
    t = table[table[kind_col] == "fixed-fragment"] if kind_col else table
    first = scn.build(data, {**overrides, **{k: v[0] for k, v in grid.items() if k != "workload.kind"}})
    return wren_model.fit_figure(t, col(fig.series), first.workload.sru)


def plot(fig: Figure, table: pd.DataFrame, out: Path, quick: bool, fits: list = ()) -> Path:
    f, ax = plt.subplots(figsize=(8, 4.8))
    means = point_means(fig, table, "goodput_mbps")
    lo, hi = (point_stats(fig, table, "goodput_mbps", s) for s in ("min", "max"))
    colors = {}
    for series in means.columns:
        points = means[series].dropna()      # a failed run leaves a gap, not a break
        # The median of the faithful runs, and their spread (min to max).
        err = [points - lo[series].reindex(points.index), hi[series].reindex(points.index) - points]
        line = ax.errorbar(points.index, points.values, yerr=err, marker="o", capsize=3,
                           label=f"ours: {col(fig.series)} {series} (median, min-max)")
        colors[series] = line.lines[0].get_color()
    for n in fig.paper_numbers:
        if n.metric == "goodput_mbps":
            ax.plot([n.x], [n.value], marker="*", markersize=14, linestyle="none",
                    color=colors.get(n.series, "black"), markeredgecolor="black")
    if fig.paper_numbers:
        ax.plot([], [], marker="*", markersize=12, linestyle="none", color="white", markeredgecolor="black",
                label="the paper's text")
    for m in fits:
        xs = np.linspace(max(1.0, float(table[col(fig.x)].min())), float(table[col(fig.x)].max()), 200)
        ax.plot(xs, m.goodput_mbps(xs), linestyle="--", linewidth=1.2, color=colors.get(m.series, "black"),
                label=f"{m.series} {m.label()}")
    limit = link_limit(table) * PAYLOAD_SHARE
    ax.axhline(limit, color="gray", linestyle=":", linewidth=1, label="payload limit")
    ax.set_xlabel(fig.x)
    ax.set_ylabel("goodput (Mbit/s)")
    ax.set_ylim(0, limit * 1.08)
    ax.set_title(textwrap.fill(f"{fig.paper}, {fig.figure}{' (quick)' if quick else ''}", 95), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")     # collapsing curves leave the top free, flat ones the bottom
    f.tight_layout()
    f.savefig(out, dpi=110)
    plt.close(f)
    return out


def report(fig: Figure, sweep_dir: Path, quick: bool) -> dict:
    """figure.png, comparison.csv and verdicts.json beside the sweep's table."""
    table = pd.read_parquet(sweep_dir / "sweep.parquet")
    # A quick figure's points have fewer runs than bytes over time decides from: its
    # claims and numbers are judged on the median, and verdicts.json says so.
    statistic = MEDIAN if quick else VERDICT
    comp = comparison(fig, table, statistic)
    comp.to_csv(sweep_dir / "comparison.csv", index=False)
    verdicts = judge(fig, table, statistic)
    fits = model_fits(fig, table, quick)
    unfaithful = int((~table["fidelity_ok"].fillna(False).astype(bool)).sum()) if "fidelity_ok" in table else None
    result = {"figure": fig.name, "paper": fig.paper, "quick": quick, "statistic": statistic,
              "verdicts": verdicts, "runs": int(len(table)), "runs_not_faithful": unfaithful,
              "link_mbps": link_limit(table), "model": [m.as_dict() for m in fits]}
    (sweep_dir / "verdicts.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(fig, table, sweep_dir / "figure.png", quick, fits)
    return result


def provenance() -> dict:
    """What made a figure's result: the command, the checkout's commit (and whether it
    had changes), the date; kept beside the result in its sweep.json."""

    def git(*a):
        try:        # a machine without git (an installed package, a minimal root) has no commit
            r = subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True)
        except OSError:
            return None
        return r.stdout.strip() if r.returncode == 0 else None
    commit = git("rev-parse", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no")) if commit else None
    return {"command": " ".join(["incast", *sys.argv[1:]]), "commit": commit, "uncommitted_changes": dirty,
            "made": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "code": code_versions()}


def code_versions(root=None) -> dict[str, str]:
    """The code version (incast.run.run_points.code_version: what the point store keys a
    run's code by) of each data plane, for the checkout at `root` (default: this one)."""
    if root is None:
        return {plane: run_points.code_version(plane) for plane in DATAPLANES}
    # (not through code_version's cache: another checkout's files, in a scratch folder)
    return {plane: run_points.code_version.__wrapped__(plane, root) for plane in DATAPLANES}


def code_versions_at(commit: str) -> dict[str, str]:
    """code_versions() of an earlier commit's files (git archive into a scratch folder)."""

    tar = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True).stdout
    with tempfile.TemporaryDirectory(prefix="incast-code-") as tmp:
        subprocess.run(["tar", "-x", "-C", tmp], input=tar, check=True)
        return code_versions(Path(tmp))


# Repetitions a point gets, step by step, while a claim it tests is undecided: REPEAT_STEPS.
MAX_REPEAT = 80
# A full figure's runs decide each claim on both statistics: the papers' own, all the
# runs' bytes over their time (judge.POOLED, deciding from 10 runs), on which the
# verdicts rest, and the median of runs, shown beside it (docs/figures.md, "Median or
# bytes over time"). A quick figure decides on the median.
DECIDE_ON = (MEDIAN, POOLED)


def failed_runs(fig: Figure, table: pd.DataFrame, points) -> int:
    """How many runs at `points` ((series, x) pairs) failed and have not run since."""
    if "error" not in table:
        return 0
    bad = table[table["error"].notna()]
    if "point_key" in table:
        bad = bad[~bad["point_key"].isin(table.loc[table["error"].isna(), "point_key"])]
        bad = bad.drop_duplicates("point_key")
    at = {(str(s), float(x)) for s, x in points}
    return sum((str(s), float(x)) in at for s, x in zip(bad[col(fig.series)], bad[col(fig.x)]))


def joined(table: pd.DataFrame, extra: pd.DataFrame) -> pd.DataFrame:
    """A round's runs added to the figure's table: a run the table has (its point key)
    is not added again; a failed attempt is kept beside the run that later finished."""
    t = pd.concat([table, extra], ignore_index=True)
    if "point_key" not in t:
        return t
    ok = t["error"].isna() if "error" in t else pd.Series(True, index=t.index)
    return t[~(ok & t["point_key"].where(ok).duplicated())].reset_index(drop=True)


def failures_told(say):
    """A sweep's log (incast.run.sweep.run_sweep's `log`) cut to its failed runs, each
    with the whole of what it wrote: the table keeps one line of a failed run's error,
    often not the line that says why."""
    failed: set[str] = set()

    def log(msg: str) -> None:
        m = re.match(r"run (\d+)( failed)?: ", msg)
        if m and m.group(2):
            failed.add(m.group(1))
            say(msg)
        elif m and m.group(1) in failed:
            say(msg)
    return log


def decide(fig: Figure, final: Path, data: dict, overrides: dict, grid: dict, repeat: int,
           max_repeat: int, run_more, log=lambda m: None, numbers: bool = False,
           stats: tuple[str, ...] = (MEDIAN,)) -> int:
    """More runs where a claim is undecided on any of `stats` (with numbers, a paper
    number too: a full figure's): the points that leave one undecided get 6,
    then 10, then 20 runs (up to max_repeat), each its own seed, until every claim is
    decided; their runs join the figure's table (final/sweep.parquet). run_more(points,
    grid, repeat, out) runs a sweep (incast.run.sweep.run_sweep); the runs a point
    already has come from the point store. Returns the repetitions the last round
    reached."""
    table = pd.read_parquet(final / "sweep.parquet")
    current = repeat
    # No look past the last designed one: the judge's 90% is stated for REPEAT_STEPS.
    max_repeat = min(max_repeat, REPEAT_STEPS[-1])
    retried: set[int] = set()
    while current < max_repeat:
        todo = undecided_points(fig, table, numbers, stats)
        if not todo:
            break
        failed = failed_runs(fig, table, todo)
        where = ', '.join(f'{s} at {x:g}' for s, x in todo)
        if failed and current not in retried:
            # A run that failed measured nothing (the store keeps only finished runs), so
            # the same seeds run again once, at this look, before the look moves on: a
            # point short of its runs by a failure is not a reason for twice the runs at
            # every point. The failed rows stay in the table (the report counts them).
            retried.add(current)
            log(f"undecided: {where}; {failed} failed run(s) there run again ({current} runs each)")
            name = f"retry{current}"
        else:
            current = min(next((r for r in REPEAT_STEPS if r > current), max_repeat), max_repeat)
            log(f"undecided: {where}; {current} runs each")
            name = f"repeat{current}"
        points = []
        for series, x in todo:
            g = {**grid, fig.series: [str(series)], fig.x: [f"{x:g}"]}
            points += sweep.expand(data, overrides, sweep.parse_grid([], g))
        more = run_more(points, {fig.series: sorted({str(s) for s, _ in todo}),
                                 fig.x: sorted({f"{x:g}" for _, x in todo})},
                        current, final / "more" / name)
        table = joined(table, pd.read_parquet(more.final / "sweep.parquet"))
        tmp = final / ".sweep.parquet.tmp"
        table.to_parquet(tmp, index=False)
        tmp.replace(final / "sweep.parquet")
    return current


def cmd_figure(args) -> int:
    if args.name == "list" or args.name is None:
        for name in known():
            fig = load(name)
            why = missing(fig)
            state = "runs here" if not why else "needs: " + "; ".join(why)
            print(f"{name:22} {fig.paper}, {fig.figure} ({state})")
        return 0
    fig = load(args.name)
    if args.max_repeat > REPEAT_STEPS[-1]:
        raise BadInput(f"--max-repeat: at most {REPEAT_STEPS[-1]}: the judge's 90% is stated for its looks "
                       f"at {', '.join(map(str, REPEAT_STEPS))} runs, not for one more")
    why = missing(fig)
    if why:
        raise MissingFeature(f"figure {fig.name}: " + "; ".join(why))

    data, overrides, grid, repeat = plan(fig, args.quick)
    if getattr(args, "repeat", None) is not None:
        repeat = args.repeat        # a campaign's kept result: at least runs_to_decide() a point
    points = sweep.expand(data, overrides, sweep.parse_grid([], grid))
    out = Path(args.out) if args.out else Path("results") / f"figure-{fig.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    print(f"{fig.paper}, {fig.figure}: {fig.caption}", file=sys.stderr)
    calibrate.ensure(points[0][1], lambda m: print(m, file=sys.stderr))
    told = failures_told(lambda m: print(m, file=sys.stderr))
    result = sweep.run_sweep(points, grid, repeat, out, unique=not args.out,
                             meta={"figure": fig.name, "quick": args.quick, "base": data, "overrides": overrides,
                                   **provenance()},
                             log=told, progress=sweep.runs_bar,
                             jobs=args.jobs, executor=args.executor, force_jobs=args.force_jobs,
                             batch=getattr(args, "batch", None),
                             fresh=args.fresh)
    if result.reused:
        print(f"{result.reused} of {result.runs} runs from earlier measurements (--fresh measures them again)",
              file=sys.stderr)
    decide(fig, result.final, data, overrides, grid, repeat, args.max_repeat,
           lambda pts, g, r, out: sweep.run_sweep(
               pts, g, r, out, unique=True, meta={"figure": fig.name, "more_runs_for": "undecided claims"},
               log=told, progress=sweep.runs_bar,
               jobs=args.jobs, executor=args.executor, force_jobs=args.force_jobs,
               batch=getattr(args, "batch", None), fresh=args.fresh),
           log=lambda m: print(m, file=sys.stderr), numbers=not args.quick,
           stats=(MEDIAN,) if args.quick else DECIDE_ON)
    r = report(fig, result.final, args.quick)
    comp = pd.read_csv(result.final / "comparison.csv")
    if args.json:
        print(json.dumps(r))
        return 0
    if len(comp):
        print(comp.drop(columns=["source", "divergence"]).to_string(index=False))
    table = pd.read_parquet(result.final / "sweep.parquet")
    meta = json.loads((result.final / "sweep.json").read_text())
    for v in r["verdicts"]:
        print(f"[{v['verdict']}] {v['claim']}\n    {v['detail']}")
        if v.get("divergence"):
            # Its numbers named in the text are this run's, where this run has the point.
            print(f"    declared divergence: {quote.fill(fig, v['divergence'], table, meta, strict=False)}")
    if r["runs_not_faithful"]:
        print(f"note: {r['runs_not_faithful']} of {r['runs']} runs were not faithful (see sweep.parquet)")
    if args.quick:
        print("(quick: a small grid and few blocks; run without --quick to judge the claims)")
    print(f"-> {result.final}/figure.png, comparison.csv, verdicts.json")
    return 0
