"""A figure file's texts quoting its kept result by name, not by copy.

A declared divergence says what ours is beside the paper's ("ours: 143.7 [103.1-185.8]
Mbit/s at 3 servers, 4-8 timeouts a run"). Copied into the figure file, such numbers
are right only until the kept result is made again (incast catalog); named, they are
drawn from whichever kept result the page shows:

    {kept 200ms@3}                  goodput, median [min-max] of the point's faithful runs
    {kept 200ms@3 METRIC}           the same for another column or judge.RUN_METRICS metric
    {median 200ms@3 METRIC}         the median alone
    {range 200ms@3 METRIC}          min-max
    {runs 200ms@3}                  how many faithful runs the point has
    {pooled 200ms@3}                goodput as bytes over time [its interval] (judge.point_value)
    {commit}                        the commit the kept result was made at (7 digits)

SERIES@X names a point of the figure: its series value and its x (as in paper_numbers).
Numbers that are not in the sweep table (an ablation's, a traced run's) stay written out,
with the commit or command that made them. tests/test_figures.py holds that every name
resolves and that no text copies a kept point's median [min-max] (an ablation's row for
the unchanged testbed is the ablation's record, and stays written out).
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from incast.campaign import judge
from incast.campaign.figure import Figure

NAME = re.compile(r"\{(kept|median|range|runs|pooled|commit)(?: ([^\s{}@]+)@([^\s{}]+))?(?: ([a-z0-9_]+))?\}")


class QuoteError(ValueError):
    """A name in a figure's text that its kept result cannot fill."""


def _number(v: float) -> str:
    return f"{v:.1f}"


def _count(v: float) -> str:
    return f"{v:g}" if float(v).is_integer() else f"{v:.1f}"


def values(fig: Figure, table: pd.DataFrame, series: str, x: float, metric: str) -> list[float]:
    """A metric over the faithful runs of one point of the kept result."""
    return judge.faithful_values(fig, table, series, x, metric)


def fill(fig: Figure, text: str | None, table: pd.DataFrame | None, meta: dict | None = None,
         strict: bool = True) -> str | None:
    """text with every name replaced by what the kept result (table, its sweep.json
    meta) gives; QuoteError names one it cannot fill (strict=False: that name stays as
    written, as for a quick run's table that lacks the point). No table: the names stay."""
    if text is None or table is None:
        return text
    meta = meta or {}

    def one(m: re.Match) -> str:
        try:
            return _one(m)
        except QuoteError:
            if strict:
                raise
            return m.group(0)

    def _one(m: re.Match) -> str:
        what, series, x, metric = m.group(1), m.group(2), m.group(3), m.group(4)
        if what == "commit":
            if not meta.get("commit"):
                raise QuoteError(f"{fig.name}: {m.group(0)}: the kept result records no commit")
            return str(meta["commit"])[:7]
        if series is None:
            raise QuoteError(f"{fig.name}: {m.group(0)}: name a point, as {{{what} SERIES@X}}")
        try:
            xv = float(x)
        except ValueError:
            raise QuoteError(f"{fig.name}: {m.group(0)}: {x!r} is not a number") from None
        metric = metric or "goodput_mbps"
        if metric not in judge.RUN_METRICS and metric not in table:
            raise QuoteError(f"{fig.name}: {m.group(0)}: the kept result has no {metric!r}")
        v = values(fig, table, series, xv, metric)
        if not v:
            raise QuoteError(f"{fig.name}: {m.group(0)}: the kept result has no faithful run there")
        if what == "runs":
            return str(len(v))
        if what == "pooled":
            if not judge.pooled_applies(metric):
                raise QuoteError(f"{fig.name}: {m.group(0)}: bytes over time is a goodput's, not {metric!r}'s")
            value, p_lo, p_hi, _ = judge.point_value(fig, table, series, xv, metric, judge.POOLED)
            return f"{_number(value)} [{_number(p_lo)}-{_number(p_hi)}]"
        lo, hi, med = min(v), max(v), float(np.median(v))
        if what == "median":
            return _number(med)
        if what == "range":
            return f"{_count(lo)}-{_count(hi)}"
        return f"{_number(med)} [{_number(lo)}-{_number(hi)}]"

    return NAME.sub(one, text)


def names(text: str | None) -> list[str]:
    """The names a text uses."""
    return [m.group(0) for m in NAME.finditer(text or "")]


# An ablation's row for the unchanged testbed is that ablation's record, made with the
# code it names, beside the rows it is compared with: written out, after these words.
ABLATION_BASELINE = ("the testbed ", "(the testbed) ")


def copied(fig: Figure, text: str | None, table: pd.DataFrame, metrics=("goodput_mbps",)) -> list[str]:
    """Each kept point's 'median [min-max]' that text writes out instead of naming it
    (an ablation's baseline row excepted: ABLATION_BASELINE)."""
    if not text or table is None or not len(table):
        return []
    found = []
    t = judge.faithful_rows(table)
    for series in t[fig.series.split(".")[-1]].astype(str).unique():
        for x in t[fig.x.split(".")[-1]].unique():
            for metric in metrics:
                v = values(fig, table, series, float(x), metric)
                if v:
                    quoted = f"{_number(float(np.median(v)))} [{_number(min(v))}-{_number(max(v))}"
                    if max(v) - min(v) <= 0.01 * abs(float(np.median(v))):
                        continue        # runs at one level (the link's limit): other runs give it too
                    for at in (i.start() for i in re.finditer(re.escape(quoted), text)):
                        if not text[:at].endswith(ABLATION_BASELINE):
                            found.append(f"{series}@{float(x):g} {metric}: {quoted}]")
    return found
