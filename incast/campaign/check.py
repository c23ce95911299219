"""A kept result checked by what today's code does, not by the bytes it was made with.

A figure's kept result (docs/figure-results/NAME) stays current while fresh runs of
today's code agree with it where its claims are decided. For each claim, its deciding
point is the one of its points, among those that give the claim its kept verdict, whose
median lies nearest the claim's bound (for a gap between two curves: both curves there;
for an onset claim, one on each of its curves: of the two points that fix the curve's
onset, the last decided not below the onset's bound and the first from which every
point is decided below it, the one nearest that bound): the point a change in behaviour
moves across the bound first. At every deciding point:

1. six fresh runs (seeds of their own, SEED_OFFSET past any kept run's), compared with
   the kept runs there by the exact two-sided Mann-Whitney rank-sum test, and judged by
   the figure's own judge on the claim at that point;
2. where the first look is in doubt (the test's p below SCREEN_ALPHA, or the fresh runs
   decide the point the other way from the kept runs), runs up to SECOND_RUNS, and the
   point disagrees when the test's p is below ALPHA or the fresh runs still decide the
   point the other way. A point whose kept runs leave it undecided (declared at its
   bound) is only compared by the test.

The false alarm (the point disagrees though today's code runs as the kept result's did):
the test's p-value is exact for continuous results and conservative with ties (ties are
counted half and the null distribution is that without ties), so the test alone raises
it at most ALPHA (2e-4) a point; the fresh runs decide the point the other way at most
P(Binomial(20, 1/2) <= 4) = 0.6 % of the time, and only where the point's true median
sits exactly on the bound, the kept runs having decided it; more where the kept runs
decided it wrongly (a look is 96.7% sure), since the fresh runs then decide it right.
tests/test_check.py shows both by simulation.

The check judges on the median (judge.MEDIAN), its deciding points and its states: bytes
over time, the verdict of a full figure's goodput claims (judge.VERDICT), decides
nothing from six runs; the rank-sum test compares the runs themselves.

Cost: six runs a deciding point, from the point store where today's code has run them
(it keys points by the code's bytes: a cache never serves another code's runs).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from incast.campaign import figure, judge, kept
from incast.run import sweep

FIRST_RUNS = 6          # judge.runs_to_decide(): the fewest runs that can decide a point
SECOND_RUNS = 20        # the judge's third look (judge.REPEAT_STEPS[2])
SCREEN_ALPHA = 0.05     # below it the first look runs more
ALPHA = 2e-4            # a point disagrees below it: at ~60 deciding points, <= 1.2 % a suite
SEED_OFFSET = 1000      # fresh runs' seeds: base + SEED_OFFSET + r, apart from the kept runs'

REMAKE = ("incast catalog {name} --jobs 2 (from a clean tree at a commit on main: it writes "
          "docs/figure-results/{name}/, the scoreboard and the doc tables)")


@dataclass(frozen=True)
class Deciding:
    """One (series, x) point where claims of a figure are decided."""
    series: str
    x: float
    claims: tuple[int, ...]


@dataclass
class PointCheck:
    series: str
    x: float
    claims: tuple[int, ...]
    kept: list[float]
    fresh: list[float]
    p: float
    states: dict[int, tuple[str, str]] = field(default_factory=dict)   # claim: (kept, fresh) at x
    outcome: str = "agrees"        # agrees | more | disagrees | not testable
    why: str = ""

    def line(self) -> str:
        k, f = np.median(self.kept) if self.kept else float("nan"), np.median(self.fresh) if self.fresh else float("nan")
        states = "; ".join(f"claim {i}: kept {a}, fresh {b}" for i, (a, b) in self.states.items())
        return (f"{self.series} at {self.x:g}: kept {k:.1f} (n={len(self.kept)}), fresh {f:.1f} "
                f"(n={len(self.fresh)}), rank-sum p={self.p:.2g}; {states}: {self.outcome}"
                + (f" ({self.why})" if self.why else ""))


@dataclass
class FigureCheck:
    figure: str
    points: list[PointCheck]
    skipped: str = ""        # why no fresh run was made (the figure has no full kept result, ...)

    @property
    def disagrees(self) -> list[PointCheck]:
        return [p for p in self.points if p.outcome != "agrees"]

    def message(self) -> str:
        if self.skipped:
            return f"{self.figure}: not checked: {self.skipped}"
        if not self.disagrees:
            return f"{self.figure}: today's code agrees with the kept result at {len(self.points)} deciding points"
        return (f"{self.figure}: today's code does not give the kept result "
                f"({len(self.disagrees)} of {len(self.points)} deciding points):\n  "
                + "\n  ".join(p.line() for p in self.disagrees)
                + f"\nmake it again: {REMAKE.format(name=self.figure)}")


def at_point(c: figure.Claim, x: float, series: str | None = None) -> figure.Claim:
    """The claim as judged at one of its points (an onset claim: `series` against the
    onset's bound there)."""
    return c.point(x, series)


def _margin(fig: figure.Figure, table: pd.DataFrame, c: figure.Claim, x: float, limit: float,
            series: str | None = None) -> float:
    """How far the point's median is from the claim's bound, in Mbit/s (the gap's median
    from the margin for a gap between two curves)."""
    med = judge.point_means(fig, table, c.metric)
    v = med.at[x, series or c.series]
    if c.below_series is not None:
        return abs(float(med.at[x, c.below_series] - v) - c.margin_mbps)
    bound = c.onset_below if c.onset else c.below if c.below is not None else c.above
    return abs(float(v) - bound * limit)


def onset_points(fig: figure.Figure, table: pd.DataFrame, c: figure.Claim, series: str, xs: list[float],
                 limit: float) -> list[float]:
    """The points that fix a curve's onset in the kept table: its last point decided not
    below the onset's bound and the first from which every point is decided below it
    (one of them where the curve is below from its first point, or never below)."""
    states = [(x, judge.judge_claim(fig, table, c.point(x, series), limit, judge.MEDIAN)[0]) for x in xs]
    above = [x for x, st in states if st == "does not hold"]
    below = [x for i, (x, _) in enumerate(states) if all(st == "holds" for _, st in states[i:])]
    return [x for x in (above[-1] if above else None, below[0] if below else None) if x is not None]


def deciding_points(fig: figure.Figure, table: pd.DataFrame) -> list[Deciding]:
    """Each claim's deciding point in the kept table (module docstring), merged where
    claims share one; a claim the kept table cannot test has none. An onset claim has
    one on each of its two curves: of the points that fix the curve's onset
    (onset_points), the one nearest the onset's bound."""
    limit = judge.link_limit(table) * judge.PAYLOAD_SHARE
    xs_all = sorted({float(x) for x in table[figure.col(fig.x)].dropna()})
    found: dict[tuple[str, float], list[int]] = {}
    for i, c in enumerate(fig.claims):
        verdict = judge.judge_claim(fig, table, c, limit, judge.MEDIAN)[0]
        if verdict == "not testable":
            continue
        if c.onset:
            for s in (c.series, c.onset_of):
                mine = onset_points(fig, table, c, s, xs_all, limit)
                if mine:
                    x = min(mine, key=lambda x: (_margin(fig, table, c, x, limit, s), x))
                    found.setdefault((str(s), x), []).append(i)
            continue
        xs = [x for x in xs_all if (x == c.at if c.at is not None else x >= c.from_)]
        states = {x: judge.judge_claim(fig, table, at_point(c, x), limit, judge.MEDIAN)[0] for x in xs}
        mine = [x for x in xs if states[x] == verdict]
        if not mine:
            continue
        # nearest its bound; of equals, the fewest senders (the cheapest runs)
        x = min(mine, key=lambda x: (_margin(fig, table, c, x, limit), x))
        for s in filter(None, (c.series, c.below_series)):
            found.setdefault((str(s), x), []).append(i)
    return [Deciding(s, x, tuple(v)) for (s, x), v in found.items()]


def opposite(was: str, now: str) -> bool:
    decided = ("holds", "does not hold")
    return was in decided and now in decided and was != now


def failures(table: pd.DataFrame) -> list[str]:
    """The errors of a sweep table's failed runs, one line each."""
    if "error" not in table:
        return []
    return [str(e).strip().splitlines()[-1] if str(e).strip() else "failed"
            for e in table["error"].dropna()]


def judge_point(fig: figure.Figure, kept_table: pd.DataFrame, fresh: pd.DataFrame, d: Deciding,
                final: bool) -> PointCheck:
    """A deciding point's comparison after one look (final: the last look)."""
    def runs(t):
        return judge.faithful_values(fig, t, d.series, d.x, fig.claims[d.claims[0]].metric)
    k, f = runs(kept_table), runs(fresh)
    pc = PointCheck(d.series, d.x, d.claims, k, f, judge.rank_sum_p(f, k))
    if not f:
        errors = failures(judge.point_rows(fig, fresh, d.series, d.x)) if len(fresh) else []
        pc.outcome, pc.why = "not testable", (f"every fresh run failed: {errors[0]}" if errors
                                              else "no fresh run was faithful")
        return pc
    limit = judge.link_limit(kept_table) * judge.PAYLOAD_SHARE
    for i in d.claims:
        c = at_point(fig.claims[i], d.x, d.series)
        pc.states[i] = tuple(judge.judge_claim(fig, t, c, limit, judge.MEDIAN)[0] for t in (kept_table, fresh))
    turned = [i for i, (a, b) in pc.states.items() if opposite(a, b)]
    pc.outcome, pc.why = decide(pc.p, turned, final)
    return pc


def decide(p: float, turned: list[int], final: bool) -> tuple[str, str]:
    """(outcome, why) of a look at a point: its rank-sum p and the claims its fresh runs
    decide the other way from the kept runs."""
    if not final:
        return ("more" if p < SCREEN_ALPHA or turned else "agrees"), ""
    if p < ALPHA:
        return "disagrees", f"the fresh runs differ from the kept ones (p < {ALPHA:g})"
    if turned:
        return "disagrees", "the fresh runs decide " + ", ".join(f"claim {i}" for i in turned) + " the other way"
    return "agrees", ""


Runner = Callable[[list, dict, int, Path], pd.DataFrame]


def fresh_points(fig: figure.Figure, points: list[Deciding],
                 alter: Callable | None = None) -> tuple[list, dict]:
    """The scenarios of the deciding points on the figure's full setting, their seeds
    moved past the kept runs' (alter: a further change to each, for the tests that show
    what a change in behaviour does)."""
    data, overrides, grid, _ = figure.plan(fig, False)
    out = []
    for d in points:
        g = {**grid, fig.series: [d.series], fig.x: [f"{d.x:g}"]}
        for values, s in sweep.expand(data, overrides, sweep.parse_grid([], g)):
            s = s.model_copy(update={"workload": s.workload.model_copy(
                update={"seed": s.workload.seed + SEED_OFFSET})})
            out.append((values, alter(s) if alter else s))
    narrowed = {**grid, fig.series: sorted({d.series for d in points}),
                fig.x: sorted({f"{d.x:g}" for d in points})}
    return out, narrowed


def sweep_runner(jobs: int | None = None, log=lambda m: None, progress=lambda runs: runs, store=None) -> Runner:
    """Runs points through incast.run.sweep (through the point store: a rerun of today's
    code measures nothing again) into a scratch sweep directory; returns its table."""
    def run(points, grid, repeat, out):
        result = sweep.run_sweep(points, grid, repeat, out, unique=False, meta={"check": True},
                                 jobs=jobs, log=log, progress=progress, store=store)
        return pd.read_parquet(result.final / "sweep.parquet")
    return run


def check_figure(name: str, run: Runner | None = None, alter: Callable | None = None,
                 log=lambda m: None) -> FigureCheck:
    """Fresh runs of today's code at each deciding point of the figure's kept result,
    compared with the kept runs there (module docstring)."""
    fig = figure.load(name)
    result = kept.full(name)
    if result is None:
        return FigureCheck(name, [], skipped="no full kept result")
    table, meta = result
    if "repeat" in table and table["repeat"].max() >= SEED_OFFSET:
        raise ValueError(f"{name}: kept runs reach repeat {table['repeat'].max()}, past SEED_OFFSET")
    why = kept.stale(fig, meta)
    if why:
        return FigureCheck(name, [], skipped=f"the kept result is stale: {why}")
    return FigureCheck(name, looks(fig, table, run or sweep_runner(log=log), alter, log))


def looks(fig: figure.Figure, table: pd.DataFrame, run: Runner, alter: Callable | None = None,
          log=lambda m: None) -> list[PointCheck]:
    """The check's looks at every deciding point of a kept table (module docstring). A
    gap between two curves is judged on both: where one of its points gets the second
    look, so does the other."""
    points = deciding_points(fig, table)
    checks: dict[Deciding, PointCheck] = {}
    with tempfile.TemporaryDirectory(prefix=f"incast-check-{fig.name}-") as tmp:
        todo, repeat = points, FIRST_RUNS
        while todo:
            final = repeat >= SECOND_RUNS
            scen, grid = fresh_points(fig, todo, alter)
            log(f"{fig.name}: {repeat} fresh runs at " + ", ".join(f"{d.series} {d.x:g}" for d in todo))
            fresh = run(scen, grid, repeat, Path(tmp) / f"look{repeat}")
            failed = failures(fresh)
            if failed:      # a failed run measured nothing: run it once more (the store serves the rest)
                log(f"{fig.name}: {len(failed)} fresh runs failed, run again: {failed[0]}")
                fresh = run(scen, grid, repeat, Path(tmp) / f"look{repeat}-again")
            for d in todo:
                checks[d] = judge_point(fig, table, fresh, d, final)
            more = [d for d in todo if checks[d].outcome == "more"]
            gaps = {(i, d.x) for d in more for i in d.claims if fig.claims[i].below_series is not None}
            todo = [d for d in todo if d in more or any((i, d.x) in gaps for i in d.claims)]
            repeat = SECOND_RUNS
    return [checks[d] for d in points]


def main(argv=None) -> int:
    """python -m incast.campaign.check [NAME ...]: check kept results (all by default);
    exits 1 where one disagrees."""
    ap = argparse.ArgumentParser(prog="python -m incast.campaign.check", description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help="figures (default: every one with a full kept result)")
    ap.add_argument("--jobs", type=int, default=None, help="runs at once (default: one per core)")
    ap.add_argument("--json", action="store_true", help="one JSON line per figure")
    a = ap.parse_args(argv)
    names = a.names or [n for n in figure.known() if kept.full(n) is not None]
    bad = 0
    for name in names:
        why = figure.missing(figure.load(name))
        if why:
            print(f"{name}: not checked here: {'; '.join(why)}")
            continue

        def say(m):    # the runs' own lines are in their run directories; failures and warnings here
            if " failed: " in m or m.startswith("warning:") or m.startswith(f"{name}:"):
                print(m, file=sys.stderr)
        r = check_figure(name, sweep_runner(a.jobs, log=say, progress=sweep.runs_bar), log=say)
        bad += bool(r.disagrees)
        if a.json:
            print(json.dumps({"figure": name, "skipped": r.skipped,
                              "points": [{**{k: v for k, v in p.__dict__.items() if k not in ("kept", "fresh", "p")},
                                          "p": None if np.isnan(p.p) else p.p,
                                          "kept_n": len(p.kept), "fresh_n": len(p.fresh),
                                          "states": {str(i): list(s) for i, s in p.states.items()}}
                                         for p in r.points]}))
        else:
            print(r.message())
            for p in r.points:
                print("  " + p.line())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
