"""The papers' figures: one small file each in figures/, and `incast figure` to run one.

A figure file names the paper, the figure and its caption, the sweep that reproduces it
(a scenario file from scenarios/ with the figure's own settings and grid), the numbers
the paper's text gives, each with the sentence it comes from, and the paper's claims as
checks on our sweep table. ``incast figure NAME`` runs the sweep, then writes

- ``figure.png``: our curves with the paper's numbers overlaid;
- ``comparison.csv``: paper, ours, ratio for every number the paper gives;
- ``verdicts.json``: per claim, holds / does not hold / not testable here, and why;

and prints the table and the verdicts. ``--quick`` runs the figure's small grid and
fewer blocks (minutes instead of an hour): enough to see the shape and to test that the
figure runs, not to judge the claims at the paper's scale.

A claim is one comparison on the median of the faithful repetitions of one grid point (or of every
point from ``from`` on): ``below``/``above`` a fraction of the payload limit (1448/1538
of the link), or ``below_series`` another curve by at least ``margin_mbps``.
"""
from __future__ import annotations

import json
import textwrap
import tomllib
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


from incast.errors import BadInput

from incast.constants import FIGURES_DIR
PAYLOAD_SHARE = 1448 / 1538


class FigureError(BadInput):
    """Bad input (exit 2), as the CLI reports scenario errors."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PaperNumber(_Model):
    series: str
    x: float
    value: float
    metric: str = "goodput_mbps"
    source: str = Field(description="the sentence of the paper the number comes from")


class Claim(_Model):
    text: str
    series: str
    at: float | None = None
    from_: float | None = Field(None, alias="from")
    metric: str = "goodput_mbps"
    below: float | None = Field(None, description="fraction of the payload limit")
    above: float | None = Field(None, description="fraction of the payload limit")
    below_series: str | None = None
    margin_mbps: float = 0.0
    divergence: str | None = Field(
        None, description="the claim does not reproduce here: why, the numbers, what was tried (its test "
                          "is a strict xfail, so the day it holds the suite says so)")

    @model_validator(mode="after")
    def _one_check(self):
        if sum(v is not None for v in (self.below, self.above, self.below_series)) != 1:
            raise ValueError(f"claim {self.text!r}: give exactly one of below, above, below_series")
        if (self.at is None) == (self.from_ is None):
            raise ValueError(f"claim {self.text!r}: give exactly one of at, from")
        return self


class Figure(_Model):
    name: str = ""
    paper: str
    figure: str
    caption: str
    sweep: str = Field(description="scenario (sweep) file, relative to the repository")
    x: str = "senders"
    series: str
    settings: dict[str, Any] = Field(default_factory=dict, description="fields as for --set")
    grid: dict[str, list] = Field(default_factory=dict, description="replaces the sweep file's grid")
    repeat: int = 1
    quick: dict[str, Any] = Field(default_factory=dict, description="grid, repeat and settings for --quick")
    paper_numbers: list[PaperNumber] = Field(default_factory=list)
    claims: list[Claim] = Field(default_factory=list)
    model: Literal["wren09"] | None = Field(
        None, description="an analytical model fitted to the fixed-fragment curves and drawn over them "
                          "(wren09: Chen et al.'s Section 6.1, incast.report.wren_model)")


def known() -> list[str]:
    return sorted(p.stem for p in FIGURES_DIR.glob("*.toml"))


def load(name: str) -> Figure:
    path = FIGURES_DIR / f"{name}.toml"
    if not path.is_file():
        raise FigureError(f"no figure {name!r} (incast figure list: {', '.join(known())})")
    try:
        return Figure.model_validate({**tomllib.loads(path.read_text()), "name": name})
    except (ValidationError, tomllib.TOMLDecodeError) as e:
        raise FigureError(f"figures/{name}.toml: {e}") from None


def scenarios(fig: Figure) -> list:
    """Every scenario the figure's full and quick grids run."""
    from incast.run import sweep
    out = []
    for quick in (False, True):
        data, overrides, grid, _ = plan(fig, quick)
        out += [s for _, s in sweep.expand(data, overrides, sweep.parse_grid([], grid))]
    return out


def needs(fig: Figure) -> list[str]:
    """What the figure's runs need beyond the set-up, read from its scenarios: virtual
    time (the UML kernels) and the data planes that need tools of their own."""
    from incast import clock as clocks
    from incast.registry import DATAPLANES
    found = []
    for s in scenarios(fig):
        for need, yes in (("virtual-time", clocks.named(s.clock).simulated),
                          (s.dataplane, bool(DATAPLANES[s.dataplane].tools))):
            if yes and need not in found:
                found.append(need)
    return found


def missing(fig: Figure) -> list[str]:
    """What this machine lacks for the figure, as reasons (empty: it can run here),
    asked of each of its scenarios (incast.run.preflight.host_missing)."""
    from incast.run import preflight
    why: list[str] = []
    asked = set()
    for s in scenarios(fig):
        # one of each kind: finding a guest kernel hashes its inputs (tens of ms)
        kind = (s.clock, s.kernel, s.dataplane, s.topology.senders if s.dataplane != "linux" else 0)
        if kind not in asked:
            asked.add(kind)
            why += [w for w in preflight.host_missing(s) if w not in why]
    return why


def plan(fig: Figure, quick: bool) -> tuple[dict, dict, dict, int]:
    """(scenario data, overrides, grid, repeat) of the figure's sweep."""
    from incast.scenario import load_file
    path = FIGURES_DIR.parent / fig.sweep
    data = load_file(path)
    grid = dict(tomllib.loads(path.read_text()).get("sweep", {}))
    grid.update(fig.grid)
    overrides = {k: _cli(v) for k, v in fig.settings.items()}
    if "testbed" in fig.settings:
        # The figure runs on its paper's testbed: the testbed's settings win over the
        # sweep file's (a first look at whatever rate this machine holds), the
        # figure's own win over both.
        from incast import testbed
        overrides = {**{k: _cli(v) for k, v in testbed.settings(str(fig.settings["testbed"])).items()},
                     **overrides}
    repeat = fig.repeat
    if quick:
        grid.update(fig.quick.get("grid", {}))
        overrides.update({k: _cli(v) for k, v in fig.quick.get("settings", {}).items()})
        repeat = fig.quick.get("repeat", 1)
    return data, overrides, {k: [str(v) for v in vals] for k, vals in grid.items()}, repeat


def _cli(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _col(field: str) -> str:
    """The sweep table's column for a grid field (its last part)."""
    return field.split(".")[-1]


def faithful_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The runs a verdict may rest on: a run its own fidelity flagged never counts."""
    if "fidelity_ok" not in table:
        return table
    return table[table["fidelity_ok"].fillna(False).astype(bool)]


def point_stats(fig: Figure, table: pd.DataFrame, metric: str, stat: str = "median") -> pd.DataFrame:
    """metric over the faithful repetitions of each point (stat: median, min, max,
    count), one row per x, one column per series."""
    t = faithful_rows(table)
    t = t.dropna(subset=[metric]) if metric in t else t.iloc[0:0]
    if not len(t):
        return pd.DataFrame()
    return t.groupby([_col(fig.series), _col(fig.x)])[metric].agg(stat).unstack(0)


def point_means(fig: Figure, table: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The value a claim is judged on at each point: the median of its faithful runs
    (one run at a tipping point says little; an outlier moves a mean, not a median)."""
    return point_stats(fig, table, metric, "median")


def _unfaithful(fig: Figure, table: pd.DataFrame, series: str, x) -> tuple[int, int]:
    """(runs not faithful, runs) at one point."""
    rows = table[(table[_col(fig.series)].astype(str) == str(series)) & (table[_col(fig.x)] == x)]
    bad = int((~rows["fidelity_ok"].fillna(False).astype(bool)).sum()) if "fidelity_ok" in rows else 0
    return bad, len(rows)


def judge(fig: Figure, table: pd.DataFrame) -> list[dict]:
    """A verdict for each claim, on the median of each point's faithful runs: holds, does
    not hold, undecided (the runs disagree), or not testable (and why). Each point's spread (min-max, n) is in the
    detail; runs that were not faithful are left out and counted there."""
    out = []
    limit = _limit(table) * PAYLOAD_SHARE
    for c in fig.claims:
        verdict, detail, _, why = _judge_claim(fig, table, c, limit)
        out.append({"claim": c.text, "verdict": verdict, "detail": detail, "why": why,
                    "divergence": c.divergence})
    return out


# Why a claim is not testable, for whoever acts on it (the suite defers an unreached
# claim to the full kept result, skips one whose runs were not faithful on this machine,
# and fails one whose runs did not finish).
UNREACHED = "unreached"          # the sweep has none of the claim's points
NOT_FAITHFUL = "not faithful"    # its runs were left out as not faithful
UNFINISHED = "unfinished"        # no run of the point finished


# A point decides a claim when the confidence interval of its median lies on one side
# of the claim's bound: runs on both sides of it leave the point undecided, however the
# median falls, until there are enough runs for the interval to clear the bound.
# A verdict is to be 90% sure. incast figure looks at an undecided point up to three
# times, after 6, 10 and 20 runs (REPEAT_STEPS), and stops at the first look that
# decides: three looks at 90% each decide a tipping point wrongly more often than one
# time in ten (a 10-run look once "held" a gap whose 20-run interval is 45.6 to 114.1
# Mbit/s against a margin of 100). So each look is made at 1 - 0.1 / 3 (Bonferroni).
CONFIDENCE = 0.9
REPEAT_STEPS = (6, 10, 20)
LOOK_CONFIDENCE = 1 - (1 - CONFIDENCE) / len(REPEAT_STEPS)


def median_interval(values: list[float], confidence: float = LOOK_CONFIDENCE) -> tuple[float, float]:
    """The distribution-free interval for the median of the runs' distribution: order
    statistics k in from each end, k the largest with P(Binomial(n, 1/2) < k) <=
    (1 - confidence) / 2. Too few runs for the confidence give min to max (3 runs: 75%,
    6 runs: 97%); at LOOK_CONFIDENCE 10 runs give the 2nd to the 9th (97.9%), 20 runs
    the 5th to the 16th (98.8%)."""
    from math import comb
    v = sorted(values)
    n = len(v)
    if not n:
        return float("nan"), float("nan")
    k, tail = 1, 0.0
    while k < (n + 1) // 2:
        tail += comb(n, k) / 2 ** n      # P(B = k) added: P(B <= k)
        if tail + 1 / 2 ** n > (1 - confidence) / 2:
            break
        k += 1
    return v[k - 1], v[n - k]


def runs_to_decide(confidence: float = LOOK_CONFIDENCE) -> int:
    """The fewest runs whose min-max interval of the median reaches the confidence (6 for
    a look's 96.7%: 1 - 2/2^6 = 96.9%; five runs give 93.8%, three 75%)."""
    n = 1
    while 1 - 2 / 2 ** n < confidence:
        n += 1
    return n


def point_verdict(runs: list[float], bound) -> str:
    """holds / fails / split: where the interval of the median of one point's runs lies
    against the claim's bound (a predicate on one value). Fewer runs than the confidence
    needs decide nothing: three runs on one side of a bound happen one time in four at a
    tipping point, so the point stays split (and incast figure adds runs) until its
    interval is as sure as a look must be (LOOK_CONFIDENCE)."""
    if len(runs) < runs_to_decide():
        return "split"
    lo, hi = median_interval(runs)
    at_lo, at_hi = bool(bound(lo)), bool(bound(hi))
    if at_lo and at_hi:
        return "holds"
    if not at_lo and not at_hi:
        return "fails"
    return "split"


def _judge_claim(fig: Figure, table: pd.DataFrame, c: Claim, limit: float) -> tuple[str, str, list, str]:
    """Each of the claim's points holds, fails or is split (incast.report.figures.
    point_verdict); the claim does not hold where any point fails, is undecided where
    none fails but some is split (the next repetitions could land on either side), and
    holds where every point holds. Returns (verdict, detail, the split points' x, why a
    claim is not testable: UNREACHED, NOT_FAITHFUL, UNFINISHED, or "")."""
    med = point_means(fig, table, c.metric)
    lo, hi = point_stats(fig, table, c.metric, "min"), point_stats(fig, table, c.metric, "max")
    n = point_stats(fig, table, c.metric, "count")
    every = {x for x in table[_col(fig.x)].dropna()} if _col(fig.x) in table else set()
    xs = sorted(x for x in every if (x == c.at if c.at is not None else x >= c.from_))
    if str(c.series) not in {str(s) for s in table.get(_col(fig.series), pd.Series(dtype=str)).unique()}:
        return "not testable", f"no {fig.series} = {c.series} in the sweep", [], UNREACHED
    if not xs:
        return ("not testable", f"no {fig.x} {'= ' + str(c.at) if c.at is not None else '>= ' + str(c.from_)} "
                "in the sweep", [], UNREACHED)
    parts, failed, split, split_xs = [], [], [], []
    for x in xs:
        for s in filter(None, (c.series, c.below_series)):
            bad, runs = _unfaithful(fig, table, s, x)
            if bad and (s not in med.columns or x not in med.index or pd.isna(med.at[x, s])):
                return "not testable", f"{x:g} ({s}): {bad} of {runs} runs not faithful", [], NOT_FAITHFUL
        if c.series not in med.columns or x not in med.index or pd.isna(med.at[x, c.series]):
            return "not testable", f"{x:g}: no run of {c.series} finished", [], UNFINISHED
        v = med.at[x, c.series]
        spread = f" [{lo.at[x, c.series]:.1f}-{hi.at[x, c.series]:.1f}, n={int(n.at[x, c.series])}]"
        bad, runs = _unfaithful(fig, table, c.series, x)
        left_out = f" ({bad} of {runs} not faithful, left out)" if bad else ""
        runs = _faithful_values(fig, table, c.series, x, c.metric)
        if c.below_series is None:
            if c.below is not None:
                bound, text = (lambda g: g < c.below * limit), f"< {c.below * limit:.1f}"
            else:
                bound, text = (lambda g: g > c.above * limit), f"> {c.above * limit:.1f}"
            state = point_verdict(runs, bound)
            if state == "split":
                held = sum(bool(bound(g)) for g in runs)
                m_lo, m_hi = median_interval(runs)
                split.append(f"{x:g}: {held} of {len(runs)} runs hold, " + (
                    f"too few to decide ({runs_to_decide()} needed)"
                    if len(runs) < runs_to_decide() else f"the median's interval {m_lo:.1f}-{m_hi:.1f}"))
        else:
            other = med.at[x, c.below_series] if c.below_series in med.columns and x in med.index else float("nan")
            text = f"{c.below_series} {other:.1f}"
            # Both series are measured, so the gap's uncertainty is both series' spread:
            # the claim is decided only where the gap's interval is on one side of the
            # margin, and, as for one series, not before each has the runs a look needs.
            others = _faithful_values(fig, table, c.below_series, x, c.metric)
            lo_gap, hi_gap = shift_interval(others, runs)
            few = min(len(runs), len(others)) < runs_to_decide()
            if few and not pd.isna(lo_gap):
                state = "split"
                split.append(f"{x:g}: {len(runs)} and {len(others)} runs, too few to decide "
                             f"({runs_to_decide()} needed)")
            elif pd.isna(lo_gap) or hi_gap < c.margin_mbps:
                state = "fails"
            elif lo_gap >= c.margin_mbps:
                state = "holds"
            else:
                state = "split"
                split.append(f"{x:g}: the gap's {LOOK_CONFIDENCE:.1%} interval {lo_gap:.1f} to {hi_gap:.1f} Mbit/s "
                             f"straddles {c.margin_mbps:g}")
        if state == "fails":
            failed.append(f"{x:g}")
        elif state == "split":
            split_xs.append(x)
        parts.append(f"{x:g}: {v:.1f}{spread}{left_out} vs {text}")
    detail = "; ".join(parts)
    if failed:
        more = f" (undecided elsewhere: {'; '.join(split)})" if split else ""
        return "does not hold", f"{detail}{more}", split_xs, ""
    if split:
        return "undecided", f"{detail} (the runs disagree: {'; '.join(split)})", split_xs, ""
    return "holds", detail, [], ""


def undecided_points(fig: Figure, table: pd.DataFrame) -> list[tuple[str, float]]:
    """(series, x) of every point that leaves a claim undecided: where more repetitions
    decide it (for a gap between two series, both series' runs at that x)."""
    limit = _limit(table) * PAYLOAD_SHARE
    points = []
    for c in fig.claims:
        verdict, _, xs, _ = _judge_claim(fig, table, c, limit)
        if verdict != "undecided":
            continue
        for x in xs:
            for s in filter(None, (c.series, c.below_series)):
                if (s, x) not in points:
                    points.append((s, x))
    return points


def shift_interval(a: list[float], b: list[float], confidence: float = LOOK_CONFIDENCE) -> tuple[float, float]:
    """The distribution-free interval for how much `a` exceeds `b` (Hodges-Lehmann /
    Mann-Whitney): order statistics of the pairwise differences, k in from each end,
    with k from the exact null distribution of the U statistic. Too few runs for the
    confidence give the whole range of differences (with 3 and 3 that is 90%)."""
    diffs = sorted(x - y for x in a for y in b)
    if not diffs:
        return float("nan"), float("nan")
    n, m = len(a), len(b)
    # counts[u] = number of orderings of the n + m runs with U = u (recurrence on the
    # largest value: it is one of a's, adding m to U, or one of b's)
    from functools import lru_cache

    @lru_cache(None)
    def ways(i: int, j: int, u: int) -> int:
        if u < 0:
            return 0
        if i == 0 or j == 0:
            return 1 if u == 0 else 0
        return ways(i - 1, j, u - j) + ways(i, j - 1, u)
    total, tail, k = sum(ways(n, m, u) for u in range(n * m + 1)), 0, 0
    while k < n * m // 2 and tail + ways(n, m, k) <= (1 - confidence) / 2 * total:
        tail += ways(n, m, k)
        k += 1
    k = max(k - 1, 0)
    return diffs[k], diffs[-1 - k]


def _faithful_values(fig: Figure, table: pd.DataFrame, series: str, x, metric: str) -> list[float]:
    t = faithful_rows(table)
    t = t[(t[_col(fig.series)].astype(str) == str(series)) & (t[_col(fig.x)] == x)]
    return [float(g) for g in t[metric].dropna()] if metric in t else []


def _limit(table: pd.DataFrame) -> float:
    return float(table["link_mbps"].dropna().iloc[0]) if "link_mbps" in table and table["link_mbps"].notna().any() else 1000.0


def comparison(fig: Figure, table: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for n in fig.paper_numbers:
        means = point_means(fig, table, n.metric)
        ours = means.at[n.x, n.series] if n.series in means.columns and n.x in means.index else None
        rows.append({"series": n.series, fig.x: n.x, "metric": n.metric, "paper": n.value,
                     "ours": None if ours is None or pd.isna(ours) else round(float(ours), 1),
                     "ratio": None if ours is None or pd.isna(ours) else round(float(ours) / n.value, 2),
                     "source": n.source})
    return pd.DataFrame(rows, columns=["series", fig.x, "metric", "paper", "ours", "ratio", "source"])


def model_fits(fig: Figure, table: pd.DataFrame, quick: bool) -> list:
    """The figure's analytical model fitted to each fixed-fragment series (none where
    the figure has no model or too few sender counts)."""
    if fig.model != "wren09":
        return []
    from incast import scenario as scn
    from incast.report import wren_model
    data, overrides, grid, _ = plan(fig, quick)
    kind_col = "kind" if "kind" in table else None
    t = table[table[kind_col] == "fixed-fragment"] if kind_col else table
    first = scn.build(data, {**overrides, **{k: v[0] for k, v in grid.items() if k != "workload.kind"}})
    return wren_model.fit_figure(t, _col(fig.series), first.workload.sru)


def plot(fig: Figure, table: pd.DataFrame, out: Path, quick: bool, fits: list = ()) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    f, ax = plt.subplots(figsize=(8, 4.8))
    means = point_means(fig, table, "goodput_mbps")
    lo, hi = (point_stats(fig, table, "goodput_mbps", s) for s in ("min", "max"))
    colors = {}
    for series in means.columns:
        points = means[series].dropna()      # a failed run leaves a gap, not a break
        # The median of the faithful runs, and their spread (min to max).
        err = [points - lo[series].reindex(points.index), hi[series].reindex(points.index) - points]
        line = ax.errorbar(points.index, points.values, yerr=err, marker="o", capsize=3,
                           label=f"ours: {_col(fig.series)} {series} (median, min-max)")
        colors[series] = line.lines[0].get_color()
    for n in fig.paper_numbers:
        if n.metric == "goodput_mbps":
            ax.plot([n.x], [n.value], marker="*", markersize=14, linestyle="none",
                    color=colors.get(n.series, "black"), markeredgecolor="black")
    if fig.paper_numbers:
        ax.plot([], [], marker="*", markersize=12, linestyle="none", color="white", markeredgecolor="black",
                label="the paper's text")
    import numpy as np
    for m in fits:
        xs = np.linspace(max(1.0, float(table[_col(fig.x)].min())), float(table[_col(fig.x)].max()), 200)
        ax.plot(xs, m.goodput_mbps(xs), linestyle="--", linewidth=1.2, color=colors.get(m.series, "black"),
                label=f"{m.series} {m.label()}")
    limit = _limit(table) * PAYLOAD_SHARE
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
    comp = comparison(fig, table)
    comp.to_csv(sweep_dir / "comparison.csv", index=False)
    verdicts = judge(fig, table)
    fits = model_fits(fig, table, quick)
    unfaithful = int((~table["fidelity_ok"].fillna(False).astype(bool)).sum()) if "fidelity_ok" in table else None
    result = {"figure": fig.name, "paper": fig.paper, "quick": quick, "verdicts": verdicts,
              "runs": int(len(table)), "runs_not_faithful": unfaithful,
              "link_mbps": _limit(table), "model": [m.as_dict() for m in fits]}
    (sweep_dir / "verdicts.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(fig, table, sweep_dir / "figure.png", quick, fits)
    return result


def provenance() -> dict:
    """What made a figure's result: the command, the checkout's commit (and whether it
    had changes), the date; kept beside the result in its sweep.json."""
    import subprocess
    import sys
    import time

    from incast.constants import REPO
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
    """The code version (incast.run.points.code_version: what the point store keys a
    run's code by) of each data plane, for the checkout at `root` (default: this one)."""
    from incast.registry import DATAPLANES
    from incast.run import points
    if root is None:
        return {plane: points.code_version(plane) for plane in DATAPLANES}
    # (not through code_version's cache: another checkout's files, in a scratch folder)
    return {plane: points.code_version.__wrapped__(plane, root) for plane in DATAPLANES}


def code_versions_at(commit: str) -> dict[str, str]:
    """code_versions() of an earlier commit's files (git archive into a scratch folder)."""
    import subprocess
    import tempfile

    from incast.constants import REPO
    tar = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True).stdout
    with tempfile.TemporaryDirectory(prefix="incast-code-") as tmp:
        subprocess.run(["tar", "-x", "-C", tmp], input=tar, check=True)
        return code_versions(Path(tmp))


# Repetitions a point gets, step by step, while a claim it tests is undecided: REPEAT_STEPS.
MAX_REPEAT = 20


def decide(fig: Figure, final: Path, data: dict, overrides: dict, grid: dict, repeat: int,
           max_repeat: int, run_more, log=lambda m: None) -> int:
    """More runs where a claim is undecided: the points that leave one undecided get 6,
    then 10, then 20 runs (up to max_repeat), each its own seed, until every claim is
    decided; their runs join the figure's table (final/sweep.parquet). run_more(points,
    grid, repeat, out) runs a sweep (incast.run.sweep.run_sweep); the runs a point
    already has come from the point store. Returns the repetitions the last round
    reached."""
    from incast.run import sweep
    table = pd.read_parquet(final / "sweep.parquet")
    current = repeat
    while current < max_repeat:
        todo = undecided_points(fig, table)
        if not todo:
            break
        current = next((r for r in REPEAT_STEPS if r > current), max_repeat)
        current = min(current, max_repeat)
        log(f"undecided: {', '.join(f'{s} at {x:g}' for s, x in todo)}; {current} runs each")
        points = []
        for series, x in todo:
            g = {**grid, fig.series: [str(series)], fig.x: [f"{x:g}"]}
            points += sweep.expand(data, overrides, sweep.parse_grid([], g))
        more = run_more(points, {fig.series: sorted({str(s) for s, _ in todo}),
                                 fig.x: sorted({f"{x:g}" for _, x in todo})},
                        current, final / "more" / f"repeat{current}")
        extra = pd.read_parquet(more.final / "sweep.parquet")
        table = pd.concat([table, extra], ignore_index=True)
        if "point_key" in table:
            table = table.drop_duplicates("point_key", keep="first")
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
    why = missing(fig)
    if why:
        from incast.errors import MissingFeature
        raise MissingFeature(f"figure {fig.name}: " + "; ".join(why))
    import sys
    import time

    from incast.run import calibrate, sweep
    data, overrides, grid, repeat = plan(fig, args.quick)
    if getattr(args, "repeat", None) is not None:
        repeat = args.repeat        # a campaign's kept result: at least runs_to_decide() a point
    points = sweep.expand(data, overrides, sweep.parse_grid([], grid))
    out = Path(args.out) if args.out else Path("results") / f"figure-{fig.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    print(f"{fig.paper}, {fig.figure}: {fig.caption}", file=sys.stderr)
    calibrate.ensure(points[0][1], lambda m: print(m, file=sys.stderr))
    result = sweep.run_sweep(points, grid, repeat, out, unique=not args.out,
                             meta={"figure": fig.name, "quick": args.quick, "base": data, "overrides": overrides,
                                   **provenance()},
                             progress=sweep.runs_bar,
                             jobs=args.jobs, executor=args.executor, force_jobs=args.force_jobs,
                             fresh=args.fresh)
    if result.reused:
        print(f"{result.reused} of {result.runs} runs from earlier measurements (--fresh measures them again)",
              file=sys.stderr)
    decide(fig, result.final, data, overrides, grid, repeat, args.max_repeat,
           lambda pts, g, r, out: sweep.run_sweep(
               pts, g, r, out, unique=True, meta={"figure": fig.name, "more_runs_for": "undecided claims"},
               progress=sweep.runs_bar,
               jobs=args.jobs, executor=args.executor, force_jobs=args.force_jobs, fresh=args.fresh),
           log=lambda m: print(m, file=sys.stderr))
    r = report(fig, result.final, args.quick)
    comp = pd.read_csv(result.final / "comparison.csv")
    if args.json:
        print(json.dumps(r))
        return 0
    if len(comp):
        print(comp.drop(columns=["source"]).to_string(index=False))
    for v in r["verdicts"]:
        print(f"[{v['verdict']}] {v['claim']}\n    {v['detail']}")
        if v.get("divergence"):
            print(f"    declared divergence: {v['divergence']}")
    if r["runs_not_faithful"]:
        print(f"note: {r['runs_not_faithful']} of {r['runs']} runs were not faithful (see sweep.parquet)")
    if args.quick:
        print("(quick: a small grid and few blocks; run without --quick to judge the claims)")
    print(f"-> {result.final}/figure.png, comparison.csv, verdicts.json")
    return 0
