"""Every claim judged on its kept result on the median of its runs and on the bytes over
time of all of them (judge.pooled_goodput, the verdict).

    python -m incast.campaign.statistic [NAME ...] [--results DIR] [--points] [--differ]

prints one row a claim: its verdict on the median, on the pooled statistic as designed
(deciding from judge.POOLED_MIN_RUNS = 10 runs: the verdict, judge.VERDICT), and on the
pooled statistic deciding
from 6 runs as the median does (judge.POOLED_FROM_6: not sure enough where runs are
bimodal, shown to tell what the estimator changes from what the runs it needs change);
and, at the point that shows the difference (one whose state differs between the
statistics, else the one nearest the claim's bound), each statistic's value with its
interval at the look's confidence. The median's interval is the distribution-free one
(judge.median_interval), the pooled one the bootstrap-t over runs
(judge.pooled_interval); a gap between two curves is the shift's (Hodges-Lehmann, with
judge.shift_interval) and the pooled goodputs' difference (judge.pooled_gap_interval).
It changes no verdict: it sets the median's beside the judge's.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from incast.campaign import figure, judge
from incast.campaign.figure import col


STATS = (judge.MEDIAN, judge.POOLED, judge.POOLED_FROM_6)


@dataclass
class PointPair:
    """One point of a claim on both statistics."""
    where: str
    median: tuple[float, float, float]       # value, interval low, high
    pooled: tuple[float, float, float]
    runs: int
    states: tuple[str, ...]                  # holds / fails / split on each of STATS
    margin: float                            # how far the median lies from the bound

    def cell(self, which: int) -> str:
        v, lo, hi = (self.median, self.pooled)[which]
        if np.isnan(v):
            return "-"
        return f"{v:.1f} [{lo:.1f}-{hi:.1f}]"


@dataclass
class ClaimPair:
    figure: str
    index: int
    text: str
    verdicts: tuple[str, ...]                # on each of STATS
    point: PointPair | None
    note: str = ""
    divergence: bool = False

    @property
    def differs(self) -> bool:
        """The verdict on the pooled statistic as designed is not the median's."""
        return self.verdicts[0] != self.verdicts[1]

    @property
    def estimator_differs(self) -> bool:
        """The verdict on the pooled statistic from 6 runs is not the median's."""
        return self.verdicts[0] != self.verdicts[2]


def _bound(c: figure.Claim, limit: float):
    if c.onset:
        v = c.onset_below * limit
        return (lambda g: g < v), v
    if c.below is not None:
        v = c.below * limit
        return (lambda g: g < v), v
    v = c.above * limit
    return (lambda g: g > v), v


def _hodges_lehmann(a: list[float], b: list[float]) -> float:
    return float(np.median([x - y for x in a for y in b])) if a and b else float("nan")


def _gap_point(fig, table, c, x) -> PointPair:
    runs, others = (judge.faithful_values(fig, table, s, x, c.metric) for s in (c.series, c.below_series))
    blocks, oblocks = (judge.faithful_blocks(fig, table, s, x, c.metric) for s in (c.series, c.below_series))
    out, states = [], []
    for stat in STATS:
        lo, hi, fewer = judge.gap_interval(fig, table, c.series, c.below_series, x, c.metric, stat)
        v = (judge.pooled_goodput(others, oblocks) - judge.pooled_goodput(runs, blocks)
             if judge.pooled_applies(c.metric, stat) else _hodges_lehmann(others, runs))
        out.append((v, lo, hi))
        if pd.isna(lo) or fewer < judge._few(stat, c.metric):
            states.append("split")
        else:
            states.append("holds" if lo >= c.margin_mbps else "fails" if hi < c.margin_mbps else "split")
    return PointPair(f"{c.below_series} - {c.series} at {x:g} (margin {c.margin_mbps:g})", out[0], out[1],
                     min(len(runs), len(others)), tuple(states), abs(out[0][0] - c.margin_mbps))


def _bound_point(fig, table, c, series, x, limit) -> PointPair:
    bound, v_bound = _bound(c, limit)
    vals, states = [], []
    for stat in STATS:
        v, lo, hi, n = judge.point_value(fig, table, series, x, c.metric, stat)
        vals.append((v, lo, hi))
        states.append(judge._state(fig, table, series, x, c.metric, bound, stat)[0] if n else "split")
    op = "<" if c.onset or c.below is not None else ">"
    return PointPair(f"{series} at {x:g} ({op} {v_bound:.1f})", vals[0], vals[1], n, tuple(states),
                     abs(vals[0][0] - v_bound))


def claim_points(fig: figure.Figure, table: pd.DataFrame, c: figure.Claim, limit: float) -> list[PointPair]:
    """Every point the claim is judged on, on both statistics."""
    xs_all = sorted({x for x in table[col(fig.x)].dropna()}) if col(fig.x) in table else []
    present = {str(s) for s in table.get(col(fig.series), pd.Series(dtype=str)).unique()}
    if c.onset:
        return [_bound_point(fig, table, c, s, x, limit) for s in (c.series, c.onset_of) if s in present
                for x in xs_all if judge.faithful_values(fig, table, s, x, c.metric)]
    xs = [x for x in xs_all if (x == c.at if c.at is not None else x >= c.from_)]
    if c.below_series is not None:
        return [_gap_point(fig, table, c, x) for x in xs
                if all(judge.faithful_values(fig, table, s, x, c.metric) for s in (c.series, c.below_series))]
    return [_bound_point(fig, table, c, c.series, x, limit) for x in xs
            if judge.faithful_values(fig, table, c.series, x, c.metric)]


def _onset_note(fig, table, c, limit) -> str:
    """Each curve's onsets on each statistic."""
    bound, _ = _bound(c, limit)
    xs = sorted({x for x in table[col(fig.x)].dropna()})
    parts = []
    for stat in STATS:
        found = []
        for s in (c.series, c.onset_of):
            states = [(x, judge._state(fig, table, s, x, c.metric, bound, stat)[0]) for x in xs
                      if judge.faithful_values(fig, table, s, x, c.metric)]
            onsets = judge.onsets(states)
            found.append(f"{s} " + "/".join("none" if o == float("inf") else f"{o:g}" for o in onsets))
        parts.append(f"{stat}: onset " + ", ".join(found))
    return "; ".join(parts)


def compare(fig: figure.Figure, table: pd.DataFrame) -> list[ClaimPair]:
    """Each claim of the figure on both statistics (module docstring)."""
    limit = judge.link_limit(table) * judge.PAYLOAD_SHARE
    out = []
    for i, c in enumerate(fig.claims):
        verdicts = tuple(judge.judge_claim(fig, table, c, limit, stat)[0] for stat in STATS)
        points = claim_points(fig, table, c, limit)
        differing = ([p for p in points if p.states[0] != p.states[2]]
                     or [p for p in points if p.states[0] != p.states[1]])
        point = (differing[0] if differing else min(points, key=lambda p: p.margin)) if points else None
        note = _onset_note(fig, table, c, limit) if c.onset and verdicts[0] != "not testable" else ""
        if not judge.pooled_applies(c.metric):
            note = f"{c.metric} is not a goodput: judged on its median both times"
        out.append(ClaimPair(fig.name, i, c.text, verdicts, point, note, bool(c.divergence)))
    return out


def kept_commit(results: Path, name: str) -> str:
    try:
        return str(json.loads((results / name / "sweep.json").read_text()).get("commit", ""))[:7]
    except (OSError, ValueError):
        return ""


def table_lines(pairs: list[ClaimPair], commits: dict[str, str]) -> list[str]:
    lines = ["| figure (kept at) | claim | median | pooled (from 10 runs) | pooled from 6 runs | point | "
             "median [interval] | bytes over time [interval] | runs |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in pairs:
        p = r.point
        text = r.text if len(r.text) <= 70 else r.text[:67] + "..."
        lines.append(f"| {r.figure} ({commits.get(r.figure, '')}) | {r.index}: {text}"
                     f"{' (divergence)' if r.divergence else ''} | {r.verdicts[0]} "
                     f"| {r.verdicts[1]}{' **differs**' if r.differs else ''} "
                     f"| {r.verdicts[2]}{' **differs**' if r.estimator_differs else ''} | {p.where if p else '-'} "
                     f"| {p.cell(0) if p else '-'} | {p.cell(1) if p else '-'} | {p.runs if p else '-'} |"
                     + (f"\n|  | {r.note} |  |  |  |  |  |  |  |" if r.note else ""))
    return lines


def summary(pairs: list[ClaimPair], figures: int) -> str:
    """How many verdicts differ, and which."""
    lines = [f"{len(pairs)} claims in {figures} figures."]
    for label, key, which in (("pooled (from 10 runs)", "differs", 1), ("pooled from 6 runs", "estimator_differs", 2)):
        differ = [r for r in pairs if getattr(r, key)]
        counts = pd.Series([f"{r.verdicts[0]} / {r.verdicts[which]}" for r in pairs]).value_counts()
        lines.append(f"median vs {label}: {len(differ)} differ"
                     + (" (" + ", ".join(f"{r.figure}:{r.index}" for r in differ) + ")" if differ else "")
                     + "; " + "; ".join(f"{k} {v}" for k, v in counts.items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m incast.campaign.statistic", description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help="figures (default: every one with a kept result in --results)")
    ap.add_argument("--results", type=Path, default=Path("docs/figure-results"),
                    help="where the kept results are (default docs/figure-results)")
    ap.add_argument("--differ", action="store_true", help="only the claims whose two verdicts differ")
    ap.add_argument("--points", action="store_true", help="also every point of every claim on both statistics")
    a = ap.parse_args(argv)
    names = a.names or [n for n in figure.known() if (a.results / n / "sweep.parquet").is_file()]
    pairs, commits, points = [], {}, []
    for name in names:
        fig = figure.load(name)
        table = pd.read_parquet(a.results / name / "sweep.parquet")
        commits[name] = kept_commit(a.results, name)
        mine = compare(fig, table)
        pairs += mine
        if a.points:
            limit = judge.link_limit(table) * judge.PAYLOAD_SHARE
            for r, c in zip(mine, fig.claims):
                points += [(name, r.index, p) for p in claim_points(fig, table, c, limit)]
    shown = [r for r in pairs if r.differs] if a.differ else pairs
    print("\n".join(table_lines(shown, commits)))
    print()
    print(summary(pairs, len(names)))
    if points:
        print("\n| figure | claim | point | median | pooled | pooled from 6 | median [interval] | "
              "bytes over time [interval] | runs |\n|---|---|---|---|---|---|---|---|---|")
        for name, i, p in points:
            print(f"| {name} | {i} | {p.where} | {' | '.join(p.states)} | {p.cell(0)} | {p.cell(1)} | {p.runs} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
