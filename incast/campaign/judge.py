"""The judge: a claim's verdict on a sweep table, and the statistics it rests on.

A claim is one comparison on a statistic of the faithful repetitions of one grid point
(or of every point from ``from`` on, or, with ``some``, of one of them at least):
``below``/``above`` a fraction of the payload limit (1448/1538 of the link), or
``below_series`` another curve by at least ``margin_mbps``; or the onsets of two curves
compared (``onset_at_least``: the x from which each is below a fraction of the payload
limit). A point decides where the statistic's interval (of the point, or of the gap
between two curves) lies on one side of the bound: the median's, distribution-free, or
bytes over time's, below.

The pooled statistic (pooled_goodput, pooled_interval) is a point's goodput as the
papers measure it, all its runs' bytes over all their time, with a bootstrap-t interval
over runs; a goodput claim of a full figure is judged on it (VERDICT), from
POOLED_MIN_RUNS runs a point, and incast.campaign.statistic sets the median's verdict
beside it.
"""
from __future__ import annotations

from functools import lru_cache
from math import comb

import numpy as np
import pandas as pd

from incast.campaign.figure import Claim, Figure, PaperNumber, col


PAYLOAD_SHARE = 1448 / 1538


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
    return t.groupby([col(fig.series), col(fig.x)])[metric].agg(stat).unstack(0)


def point_means(fig: Figure, table: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The value a claim is judged on at each point: the median of its faithful runs
    (one run at a tipping point says little; an outlier moves a mean, not a median)."""
    return point_stats(fig, table, metric, "median")


def point_rows(fig: Figure, table: pd.DataFrame, series: str, x) -> pd.DataFrame:
    """The table's runs at one point (series, x), faithful or not, failed or not."""
    return table[(table[col(fig.series)].astype(str) == str(series)) & (table[col(fig.x)] == x)]


def _unfaithful(fig: Figure, table: pd.DataFrame, series: str, x) -> tuple[int, int]:
    """(runs not faithful, runs) at one point."""
    rows = point_rows(fig, table, series, x)
    bad = int((~rows["fidelity_ok"].fillna(False).astype(bool)).sum()) if "fidelity_ok" in rows else 0
    return bad, len(rows)


def judge(fig: Figure, table: pd.DataFrame, stat: str | None = None) -> list[dict]:
    """A verdict for each claim, on the statistic (VERDICT: a goodput's bytes over time,
    from POOLED_MIN_RUNS runs a point; MEDIAN: the median of each point's faithful runs):
    holds, does not hold, undecided (the runs disagree), or not testable (and why). Each
    point's value (bytes over time [interval, n], or median [min-max, n]) is in the
    detail; runs that were not faithful are left out and counted there."""
    out = []
    limit = link_limit(table) * PAYLOAD_SHARE
    for c in fig.claims:
        verdict, detail, _, why = judge_claim(fig, table, c, limit, stat or VERDICT)
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
# A verdict is to be 90% sure. incast figure looks at an undecided point up to five
# times, after 6, 10, 20, 40 and 80 runs (REPEAT_STEPS), and stops at the first look that
# decides: looks at 90% each decide a tipping point wrongly more often than one time in
# ten (a 10-run look once "held" a gap whose 20-run interval is 45.6 to 114.1 Mbit/s
# against a margin of 100). So the 10% is spent over the looks (Bonferroni): the first
# three at 1 - 0.1 / 3 each (LOOK_CONFIDENCE); their intervals, order statistics, are
# surer than that (6 runs: 96.9%, 10: 97.9%, 20: 98.8% for a median), and the later looks
# share what they leave (LATE_LOOK_CONFIDENCE for a median's interval, _GAP for a gap's):
# the sum of the looks' exact error rates is at most 10%, whichever looks a point takes.
# A point near its bound needs the late looks (a gap of 33 Mbit/s against 47 was still
# split at 40 runs).
CONFIDENCE = 0.9


REPEAT_STEPS = (6, 10, 20, 40, 80)


LOOK_CONFIDENCE = 1 - (1 - CONFIDENCE) / 3


def _median_k(n: int, confidence: float) -> int:
    """The order statistic (k in from each end) of the median's interval: the largest k
    with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2, at least 1."""
    k, tail = 1, 0.0
    while k < (n + 1) // 2:
        tail += comb(n, k) / 2 ** n      # P(B = k) added: P(B <= k)
        if tail + 1 / 2 ** n > (1 - confidence) / 2:
            break
        k += 1
    return k


def median_error(n: int, confidence: float) -> float:
    """How often the interval of n runs misses the median: 2 P(B <= k - 1)."""
    k = _median_k(n, confidence)
    return 2 * sum(comb(n, j) for j in range(k)) / 2 ** n


def _shift_k(n: int, m: int, confidence: float) -> int:
    counts = u_counts(n, m)
    total, tail, k = sum(counts), 0, 0
    while k < n * m // 2 and tail + counts[k] <= (1 - confidence) / 2 * total:
        tail += counts[k]
        k += 1
    return max(k - 1, 0)


def shift_error(n: int, m: int, confidence: float) -> float:
    """How often the gap's interval of n and m runs misses the shift: 2 P(U <= k)."""
    counts = u_counts(n, m)
    return min(1.0, 2 * sum(counts[:_shift_k(n, m, confidence) + 1]) / sum(counts))


def _late_look_confidence(error) -> float:
    """What the first three looks' exact error rates (error(n): a median's or a gap's
    interval of n runs) leave of the 10%, shared equally by the later looks, as each
    later look's confidence."""
    left = (1 - CONFIDENCE) - sum(error(n) for n in REPEAT_STEPS[:3])
    return 1 - left / len(REPEAT_STEPS[3:])


def look_confidence(n: int, gap: bool = False) -> float:
    """The confidence of the look that n runs at a point make: the first three looks'
    (up to 20 runs) or a later one's, for a median's interval or a gap's (each claim
    takes one kind, so each kind spends its own 10%)."""
    if n <= REPEAT_STEPS[2]:
        return LOOK_CONFIDENCE
    return LATE_LOOK_CONFIDENCE_GAP if gap else LATE_LOOK_CONFIDENCE


def median_interval(values: list[float], confidence: float | None = None) -> tuple[float, float]:
    """The distribution-free interval for the median of the runs' distribution: order
    statistics k in from each end, k the largest with P(Binomial(n, 1/2) < k) <=
    (1 - confidence) / 2 (default: the confidence of the look the runs make). Too few
    runs for the confidence give min to max (3 runs: 75%, 6 runs: 97%); at
    LOOK_CONFIDENCE 10 runs give the 2nd to the 9th (97.9%), 20 runs the 5th to the
    16th (98.8%)."""
    v = sorted(values)
    n = len(v)
    if not n:
        return float("nan"), float("nan")
    k = _median_k(n, look_confidence(n) if confidence is None else confidence)
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
    return interval_verdict(*median_interval(runs), bound)


def interval_verdict(lo: float, hi: float, bound) -> str:
    """holds / fails / split: both ends of an interval on the bound's side, both off it,
    or one each."""
    at_lo, at_hi = bool(bound(lo)), bool(bound(hi))
    if at_lo and at_hi:
        return "holds"
    if not at_lo and not at_hi:
        return "fails"
    return "split"


# The pooled statistic: a point's goodput as the papers measure it, all its
# runs' bytes over all their measured time. A run's goodput_mbps is its bytes x 8 over
# its measured seconds (incast.measure.results.summarize: the first measured block's
# start to the last one's end), and its bytes are its `blocks` x the block's bytes
# (SRU x senders, or the fixed block), which a point fixes for every run of it: so a
# run's time is blocks / goodput_mbps times one constant, and the point's bytes over
# its time is sum(blocks) / sum(blocks / goodput_mbps), the runs' harmonic mean weighted
# by their blocks (the plain harmonic mean where every run measured the same blocks).
#
# Its interval is over runs (the unit that repeats independently; a run's blocks share
# its timeouts): a studentized bootstrap (bootstrap-t) of the point's time per byte,
# theta = sum(time) / sum(bytes), inverted (goodput = 1 / theta). Chosen, before any
# kept result was read with it, by simulating the candidates at the look's confidence
# (tests/test_figures.py): the percentile bootstrap over runs covers 83-94% where the
# look needs 96.7% (its spread is the plug-in one, without the t's allowance for few
# runs); the Student t on the runs' time per byte covers the unimodal runs but only
# 90-94% of bimodal ones (a sample with few slow runs has a small spread: a right-skewed
# time is the t's known weak side); the bootstrap-t's quantiles come from the runs'
# own skew and cover both from 10 runs on. No interval can from 6: where a third of the
# runs fall in a slow mode, (2/3)^6 = 8.8% of six-run samples have none of them, and
# nothing in such a sample tells it from a point whose runs are all fast. So the pooled
# statistic decides a point from POOLED_MIN_RUNS runs, and a mean of any kind cannot be
# sure of a slow mode rarer than its runs can see: one that a run in four falls in goes
# unseen in 10 runs 5.6% of the time, one of a run in ten in 20 runs 12% (the median is
# distribution-free: median_interval holds for every distribution of the runs).
#
# Its looks spend the 10% as the median's do: the looks at 10 and 20 runs at
# LOOK_CONFIDENCE each (the look at 6 decides nothing and spends nothing), the looks at
# 40 and 80 share what those two leave (POOLED_LATE_LOOK_CONFIDENCE, 98.3%), so that the
# stated errors of the looks a point takes add up to 10% at most. The bootstrap's error
# is not exact as an order statistic's is: the tests show by simulation that each look
# covers at least its stated confidence, and that four looks at a point on its bound
# decide it at most 10% of the time.
POOLED_MIN_RUNS = 10

POOLED_LATE_LOOK_CONFIDENCE = 1 - ((1 - CONFIDENCE) - 2 * (1 - LOOK_CONFIDENCE)) / len(REPEAT_STEPS[3:])

POOLED_RESAMPLES = 999      # the bootstrap's resamples: its 1.67% quantile is its 16th of 999

POOLED_SEED = 49            # the resamples are drawn the same way every time: a verdict is reproducible


def pooled_look_confidence(n: int) -> float:
    """The confidence of the pooled statistic's look that n runs make (the block above)."""
    return LOOK_CONFIDENCE if n <= REPEAT_STEPS[2] else POOLED_LATE_LOOK_CONFIDENCE


def pooled_goodput(goodputs, blocks=None) -> float:
    """All the runs' bytes over all their measured time (the block above): the runs'
    goodputs' harmonic mean weighted by their blocks (by none: the same for each)."""
    g = np.asarray(goodputs, float)
    w = np.ones_like(g) if blocks is None else np.asarray(blocks, float)
    if not len(g):
        return float("nan")
    return float(w.sum() / (w / g).sum())


# A run's goodput_mbps is rounded to 0.001 Mbit/s (incast.measure.results.summarize): runs
# that differ by less are equal as far as the table knows, so no spread is taken as
# smaller than half that step. Without this floor a resample that draws one run
# repeatedly has no spread at all, and its t (a difference of rounding over zero) is
# infinite: six runs at 907.48 and 907.49 Mbit/s would leave the interval open.
GOODPUT_RESOLUTION_MBPS = 0.001


def _theta(t: np.ndarray, w: np.ndarray, resolution: float = GOODPUT_RESOLUTION_MBPS
           ) -> tuple[np.ndarray, np.ndarray]:
    """Time per byte theta = sum t / sum w over the last axis (t = w / goodput: 1 /
    theta is the pooled goodput), and its standard error by the ratio's linearization,
    sqrt(sum((t - theta w)^2) / (n (n - 1))) / mean(w) (for runs of equal bytes the
    sample standard deviation of their time per byte over sqrt(n)), never below what
    half the goodput's rounding step makes of theta (theta^2 x resolution / 2)."""
    n = t.shape[-1]
    theta = t.sum(-1) / w.sum(-1)
    e = t - theta[..., None] * w
    se = np.sqrt((e ** 2).sum(-1) / (n * (n - 1))) / w.mean(-1)
    return theta, np.maximum(se, theta ** 2 * resolution / 2)


def _z_bounds(z: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """The bootstrap-t's quantiles of z over the last axis, as order statistics taken
    outward: the k-th from each end, k = floor((1 - confidence) / 2 * (B + 1))."""
    b = z.shape[-1]
    k = max(int(np.floor((1 - confidence) / 2 * (b + 1))), 1)
    z = np.sort(z, axis=-1)
    return z[..., k - 1], z[..., b - k]


def pooled_intervals(goodputs: np.ndarray, blocks: np.ndarray | None = None, confidence: float | None = None,
                     resamples: int = POOLED_RESAMPLES, rng: np.random.Generator | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """pooled_interval for many samples at once: goodputs (and blocks) of shape
    (samples, runs); returns the lower and upper ends, one of each per sample."""
    g = np.atleast_2d(np.asarray(goodputs, float))
    w = np.ones_like(g) if blocks is None else np.atleast_2d(np.asarray(blocks, float))
    rng = rng if rng is not None else np.random.default_rng(POOLED_SEED)
    confidence = pooled_look_confidence(g.shape[1]) if confidence is None else confidence
    t = w / g
    theta, se = _theta(t, w)
    idx = rng.integers(0, g.shape[1], size=(g.shape[0], resamples, g.shape[1]))
    rows = np.arange(g.shape[0])[:, None, None]
    b_theta, b_se = _theta(t[rows, idx], w[rows, idx])
    z_lo, z_hi = _z_bounds((b_theta - theta[:, None]) / b_se, confidence)
    t_hi, t_lo = theta - z_lo * se, theta - z_hi * se     # the slowest time per byte gives the lowest goodput
    with np.errstate(divide="ignore"):
        return 1 / t_hi, np.where(t_lo > 0, 1 / t_lo, np.inf)


def pooled_interval(goodputs, blocks=None, confidence: float | None = None) -> tuple[float, float]:
    """The interval of a point's pooled goodput (pooled_goodput) over its runs: the
    studentized bootstrap of its time per byte (the block above), POOLED_RESAMPLES
    resamples of the runs drawn from POOLED_SEED, inverted, at the confidence of the
    look the runs make (pooled_look_confidence) unless given. An interval whose fast end
    reaches no time at all is open (inf)."""
    g = np.asarray(goodputs, float)
    if len(g) < 2:
        v = pooled_goodput(g, blocks)
        return v, v
    lo, hi = pooled_intervals(g[None, :], None if blocks is None else np.asarray(blocks, float)[None, :], confidence)
    return float(lo[0]), float(hi[0])


def pooled_gap_intervals(a: np.ndarray, b: np.ndarray, wa: np.ndarray | None = None, wb: np.ndarray | None = None,
                         confidence: float | None = None, resamples: int = POOLED_RESAMPLES,
                         rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
    """pooled_gap_interval for many pairs of samples at once (shapes (samples, runs))."""
    a, b = np.atleast_2d(np.asarray(a, float)), np.atleast_2d(np.asarray(b, float))
    confidence = pooled_look_confidence(min(a.shape[1], b.shape[1])) if confidence is None else confidence
    wa = np.ones_like(a) if wa is None else np.atleast_2d(np.asarray(wa, float))
    wb = np.ones_like(b) if wb is None else np.atleast_2d(np.asarray(wb, float))
    rng = rng if rng is not None else np.random.default_rng(POOLED_SEED)

    def pooled(t, w):         # goodput and its standard error (delta method: se(1/theta) = se / theta^2)
        theta, se = _theta(t, w)
        return 1 / theta, se / theta ** 2
    ta, tb = wa / a, wb / b
    pa, sa = pooled(ta, wa)
    pb, sb = pooled(tb, wb)
    d, se = pa - pb, np.hypot(sa, sb)
    rows = np.arange(a.shape[0])[:, None, None]
    ia = rng.integers(0, a.shape[1], size=(a.shape[0], resamples, a.shape[1]))
    ib = rng.integers(0, b.shape[1], size=(b.shape[0], resamples, b.shape[1]))
    bpa, bsa = pooled(ta[rows, ia], wa[rows, ia])
    bpb, bsb = pooled(tb[rows, ib], wb[rows, ib])
    z_lo, z_hi = _z_bounds((bpa - bpb - d[:, None]) / np.hypot(bsa, bsb), confidence)
    return d - z_hi * se, d - z_lo * se


def pooled_gap_interval(a, b, wa=None, wb=None, confidence: float | None = None) -> tuple[float, float]:
    """The interval for how much `a`'s pooled goodput exceeds `b`'s (as shift_interval
    for the median): the studentized bootstrap of the difference, each curve's runs
    resampled on their own, its spread by the delta method from each one's time per
    byte, at the confidence of the look the fewer runs make."""
    if min(len(a), len(b)) < 2:
        v = pooled_goodput(a, wa) - pooled_goodput(b, wb)
        return v, v
    lo, hi = pooled_gap_intervals(np.asarray(a, float)[None, :], np.asarray(b, float)[None, :],
                                  None if wa is None else np.asarray(wa, float)[None, :],
                                  None if wb is None else np.asarray(wb, float)[None, :], confidence)
    return float(lo[0]), float(hi[0])


def pooled_verdict(runs: list[float], bound, blocks=None, min_runs: int = POOLED_MIN_RUNS) -> str:
    """point_verdict on the pooled statistic: holds / fails / split where its interval
    (pooled_interval) lies against the bound; fewer than POOLED_MIN_RUNS runs decide nothing."""
    if len(runs) < min_runs:
        return "split"
    return interval_verdict(*pooled_interval(runs, blocks), bound)


MEDIAN, POOLED = "median", "pooled"
# The statistic a full figure's claims are judged on: the papers' own, all the runs'
# bytes over their time (docs/figures.md, "Median or bytes over time"). Every kept
# result has the runs it decides from (make.DECIDE_ON). A quick figure, with fewer runs
# a point than it decides from, is judged on the median (make.report), and the check of
# a kept result compares runs, its states on the median (incast.campaign.check).
VERDICT = POOLED
# The pooled statistic deciding from the first look's 6 runs, as the median does: not
# sure enough where runs are bimodal (90%: POOLED_MIN_RUNS), so never a verdict; it shows
# what the estimator alone changes on kept results that have 6 runs a point.
POOLED_FROM_6 = "pooled from 6 runs"


def pooled_applies(metric: str, stat: str = POOLED) -> bool:
    """Whether the statistic is bytes over time here: it is a goodput's; another metric
    (timeouts a block, ...) is judged on its median."""
    return stat in (POOLED, POOLED_FROM_6) and metric.endswith("_mbps")


def _state(fig: Figure, table: pd.DataFrame, series: str, x, metric: str, bound, stat: str
           ) -> tuple[str, str]:
    """(holds / fails / split, why a split point is split) of one point on the statistic."""
    runs = faithful_values(fig, table, series, x, metric)
    if pooled_applies(metric, stat):
        state = pooled_verdict(runs, bound, faithful_blocks(fig, table, series, x, metric), _few(stat, metric))
        if state != "split":
            return state, ""
        if len(runs) < _few(stat, metric):
            return state, f"too few to decide ({_few(stat, metric)} needed)"
        lo, hi = pooled_interval(runs, faithful_blocks(fig, table, series, x, metric))
        return state, f"the bytes over time's interval {lo:.1f}-{hi:.1f}"
    state = point_verdict(runs, bound)
    if state != "split":
        return state, ""
    if len(runs) < runs_to_decide():
        return state, f"too few to decide ({runs_to_decide()} needed)"
    m_lo, m_hi = median_interval(runs)
    return state, f"the median's interval {m_lo:.1f}-{m_hi:.1f}"


def point_value(fig: Figure, table: pd.DataFrame, series: str, x, metric: str, stat: str = MEDIAN
                ) -> tuple[float, float, float, int]:
    """(value, interval low, interval high, runs) of one point on the statistic: the
    median and median_interval, or the pooled goodput and pooled_interval."""
    runs = faithful_values(fig, table, series, x, metric)
    if not runs:
        return float("nan"), float("nan"), float("nan"), 0
    if pooled_applies(metric, stat):
        blocks = faithful_blocks(fig, table, series, x, metric)
        return (pooled_goodput(runs, blocks), *pooled_interval(runs, blocks), len(runs))
    return (float(np.median(runs)), *median_interval(runs), len(runs))


def gap_interval(fig: Figure, table: pd.DataFrame, series: str, other: str, x, metric: str, stat: str = MEDIAN
                 ) -> tuple[float, float, int]:
    """The interval of how much `other` exceeds `series` at x (shift_interval, or
    pooled_gap_interval), and the fewer runs of the two."""
    runs, others = (faithful_values(fig, table, s, x, metric) for s in (series, other))
    if pooled_applies(metric, stat):
        lo, hi = pooled_gap_interval(others, runs, faithful_blocks(fig, table, other, x, metric),
                                     faithful_blocks(fig, table, series, x, metric))
    else:
        lo, hi = shift_interval(others, runs)
    return lo, hi, min(len(runs), len(others))


def _few(stat: str, metric: str) -> int:
    """The runs a point needs before the statistic decides it."""
    return POOLED_MIN_RUNS if stat == POOLED and pooled_applies(metric, stat) else runs_to_decide()


def _spread(fig: Figure, table: pd.DataFrame, series: str, x, metric: str, stat: str = MEDIAN) -> str:
    """One point's median [min-max, n] (pooled: bytes over time [its interval, n]) and
    how many of its runs were left out."""
    runs = faithful_values(fig, table, series, x, metric)
    bad, total = _unfaithful(fig, table, series, x)
    left_out = f" ({bad} of {total} not faithful, left out)" if bad else ""
    if pooled_applies(metric, stat):
        v, lo, hi, n = point_value(fig, table, series, x, metric, stat)
        return f"{v:.1f} bytes over time [{lo:.1f}-{hi:.1f}, n={n}]{left_out}"
    return f"{np.median(runs):.1f} [{min(runs):.1f}-{max(runs):.1f}, n={len(runs)}]{left_out}"


def _untestable(fig: Figure, table: pd.DataFrame, med: pd.DataFrame, series: str, x) -> tuple | None:
    """(verdict, detail, points, why) where the point has no faithful finished run."""
    bad, runs = _unfaithful(fig, table, series, x)
    missing = series not in med.columns or x not in med.index or pd.isna(med.at[x, series])
    if bad and missing:
        return "not testable", f"{x:g} ({series}): {bad} of {runs} runs not faithful", [], NOT_FAITHFUL
    if missing:
        return "not testable", f"{x:g}: no run of {series} finished", [], UNFINISHED
    return None


def judge_claim(fig: Figure, table: pd.DataFrame, c: Claim, limit: float, stat: str = MEDIAN
                ) -> tuple[str, str, list, str]:
    """Each of the claim's points holds, fails or is split (point_verdict); the claim
    does not hold where any point fails, is undecided where none fails but some is split
    (the next repetitions could land on either side), and holds where every point holds
    (with `some`: holds where any point holds, does not hold where every point fails,
    and is undecided otherwise). An onset claim is judge_onset's. Returns (verdict,
    detail, the (series, x) points whose runs would decide an undecided claim, why a
    claim is not testable: UNREACHED, NOT_FAITHFUL, UNFINISHED, or ""). stat: the
    median (the verdicts), or POOLED, the bytes over time (pooled_verdict,
    pooled_gap_interval) for setting beside it."""
    med = point_means(fig, table, c.metric)
    every = {x for x in table[col(fig.x)].dropna()} if col(fig.x) in table else set()
    present = {str(s) for s in table.get(col(fig.series), pd.Series(dtype=str)).unique()}
    for s in ((c.series, c.onset_of) if c.onset else (c.series,)):
        if str(s) not in present:
            return "not testable", f"no {fig.series} = {s} in the sweep", [], UNREACHED
    if c.onset:
        return judge_onset(fig, table, c, limit, sorted(every), med, stat)
    xs = sorted(x for x in every if (x == c.at if c.at is not None else x >= c.from_))
    if not xs:
        return ("not testable", f"no {fig.x} {'= ' + str(c.at) if c.at is not None else '>= ' + str(c.from_)} "
                "in the sweep", [], UNREACHED)
    parts, failed, held, split, split_xs = [], [], [], [], []
    for x in xs:
        for s in filter(None, (c.series, c.below_series)):
            bad, runs = _unfaithful(fig, table, s, x)
            if bad and (s not in med.columns or x not in med.index or pd.isna(med.at[x, s])):
                return "not testable", f"{x:g} ({s}): {bad} of {runs} runs not faithful", [], NOT_FAITHFUL
        gone = _untestable(fig, table, med, c.series, x)
        if gone:
            return gone
        runs = faithful_values(fig, table, c.series, x, c.metric)
        if c.below_series is None:
            if c.below is not None:
                bound, text = (lambda g: g < c.below * limit), f"< {c.below * limit:.1f}"
            else:
                bound, text = (lambda g: g > c.above * limit), f"> {c.above * limit:.1f}"
            state, why_split = _state(fig, table, c.series, x, c.metric, bound, stat)
            if state == "split":
                n_held = sum(bool(bound(g)) for g in runs)
                split.append(f"{x:g}: {n_held} of {len(runs)} runs hold, {why_split}")
        else:
            other = point_value(fig, table, c.below_series, x, c.metric, stat)[0]   # on the same statistic
            text = f"{c.below_series} {other:.1f}"
            # Both series are measured, so the gap's uncertainty is both series' spread:
            # the claim is decided only where the gap's interval is on one side of the
            # margin, and, as for one series, not before each has the runs a look needs.
            others = faithful_values(fig, table, c.below_series, x, c.metric)
            lo_gap, hi_gap, fewer = gap_interval(fig, table, c.series, c.below_series, x, c.metric, stat)
            few = fewer < _few(stat, c.metric)
            if few and not pd.isna(lo_gap):
                state = "split"
                split.append(f"{x:g}: {len(runs)} and {len(others)} runs, too few to decide "
                             f"({_few(stat, c.metric)} needed)")
            elif pd.isna(lo_gap) or hi_gap < c.margin_mbps:
                state = "fails"
            elif lo_gap >= c.margin_mbps:
                state = "holds"
            else:
                state = "split"
                split.append(f"{x:g}: the gap's {look_confidence(min(len(runs), len(others)), gap=True):.1%} interval "
                             f"{lo_gap:.1f} to {hi_gap:.1f} Mbit/s "
                             f"straddles {c.margin_mbps:g}")
        if state == "fails":
            failed.append(f"{x:g}")
        elif state == "split":
            split_xs.append(x)
        else:
            held.append(f"{x:g}")
        parts.append(f"{x:g}: {_spread(fig, table, c.series, x, c.metric, stat)} vs {text}")
    detail = "; ".join(parts)
    points = [(s, x) for x in split_xs for s in filter(None, (c.series, c.below_series))]
    if c.some:
        if held:
            return "holds", f"{detail} (holds at {', '.join(held)})", [], ""
        if split:
            return "undecided", f"{detail} (no point holds yet, the runs disagree: {'; '.join(split)})", points, ""
        return "does not hold", f"{detail} (no point holds)", [], ""
    if failed:
        more = f" (undecided elsewhere: {'; '.join(split)})" if split else ""
        return "does not hold", f"{detail}{more}", points, ""
    if split:
        return "undecided", f"{detail} (the runs disagree: {'; '.join(split)})", points, ""
    return "holds", detail, [], ""


def onsets(states: list[tuple[float, str]]) -> list[float]:
    """The onsets a curve's points allow, given each point's state against the onset's
    bound in order of x (holds: below it, fails: not below it, split: undecided): every
    x from which no point is decided not below, the point before it not decided below;
    inf where the last point may be not below (no onset up to the grid's last x)."""
    out = []
    for i, (x, _) in enumerate(states):
        if all(st != "fails" for _, st in states[i:]) and (i == 0 or states[i - 1][1] != "holds"):
            out.append(x)
    if not states or states[-1][1] != "holds":
        out.append(float("inf"))
    return out


def onset_at_least(a: float, b: float, factor: float, last: float) -> bool | None:
    """Whether onset a is at least factor times onset b (onsets as onsets() gives them;
    inf: past the grid's last x), or None where the grid does not reach far enough to say."""
    inf = float("inf")
    if a != inf and b != inf:
        return a >= factor * b
    if a == inf and b != inf:
        return True if last >= factor * b else None
    if a != inf:
        return False if a <= factor * last else None
    return None


def judge_onset(fig: Figure, table: pd.DataFrame, c: Claim, limit: float, xs: list, med: pd.DataFrame,
                stat: str = MEDIAN) -> tuple[str, str, list, str]:
    """An onset claim: the onset of a curve is the smallest x from which every point is
    below onset_below of the payload limit, each point counted below or not below only
    where the interval of its median decides it (point_verdict), so that an onset can be
    undecided (onsets()); onsets are counts of the grid, as fine as the grid. The claim
    holds where every onset its points allow for the series is at least onset_at_least
    times every one they allow for onset_of, does not hold where none is, and is
    undecided otherwise: the undecided points from each curve's last point decided not
    below are the ones whose runs would decide it."""
    if not xs:
        return "not testable", f"no {fig.x} in the sweep", [], UNREACHED
    bound_v = c.onset_below * limit

    def bound(g):
        return g < bound_v
    allowed, parts, split, points = {}, [], [], []
    for s in (c.series, c.onset_of):
        states, texts = [], []
        for x in xs:
            gone = _untestable(fig, table, med, s, x)
            if gone:
                return gone
            state, why_split = _state(fig, table, s, x, c.metric, bound, stat)
            states.append((x, state))
            texts.append(f"{x:g}: {_spread(fig, table, s, x, c.metric, stat)}"
                         + (" (undecided)" if state == "split" else ""))
            if state == "split":
                split.append(f"{s} at {x:g}: {why_split.replace('too few to decide', 'too few runs to decide')}")
        above = [x for x, st in states if st == "fails"]
        points += [(s, x) for x, st in states if st == "split" and (not above or x > above[-1])]
        allowed[s] = onsets(states)
        parts.append(f"{s}: " + "; ".join(texts))
    last = xs[-1]

    def say(found):
        return " or ".join(f"{x:g}" if x != float("inf") else f"none up to {last:g}" for x in found)
    a, b = allowed[c.series], allowed[c.onset_of]
    results = {onset_at_least(x, y, c.onset_at_least, last) for x in a for y in b}
    detail = (f"onset (every point from it on below {bound_v:.1f}) of {c.series} {say(a)}, of {c.onset_of} {say(b)}, "
              f"vs at least {c.onset_at_least:g} x; " + "; ".join(parts))
    if results == {True}:
        return "holds", detail, [], ""
    if results == {False}:
        return "does not hold", detail, [], ""
    if (True in results and False in results) or points:
        return "undecided", f"{detail} (the runs disagree: {'; '.join(split)})", points, ""
    return "not testable", f"{detail} (the grid ends at {last:g}, short of telling the onsets apart)", [], UNREACHED


def undecided_points(fig: Figure, table: pd.DataFrame, numbers: bool = False,
                     stats: tuple[str, ...] = (MEDIAN,)) -> list[tuple[str, float]]:
    """(series, x) of every point that leaves a claim undecided on any of `stats`: where
    more repetitions decide it (for a gap between two series, both series' runs at that
    x; for an onset claim, each curve's undecided points past its last point decided not
    below); with numbers, also every point whose paper number is undecided on any of
    `stats` (number_verdict) after at least the runs one look takes (a point the sweep has fewer
    runs of, as a quick sweep's, is not what the number is judged on)."""
    limit = link_limit(table) * PAYLOAD_SHARE
    points = []
    for c in fig.claims:
        for stat in stats:
            verdict, _, found, _ = judge_claim(fig, table, c, limit, stat)
            if verdict != "undecided":
                continue
            for s, x in found:
                if (s, x) not in points:
                    points.append((s, x))
    for n in fig.paper_numbers if numbers else ():
        for stat in stats:
            v = number_verdict(fig, table, n, stat)
            if v["verdict"] == "undecided" and v["runs"] >= runs_to_decide() and (n.series, n.x) not in points:
                points.append((n.series, float(n.x)))
    return points


def undecided_at_last_look(fig: Figure, table: pd.DataFrame, c: Claim, stat: str | None = None) -> bool:
    """Whether claim c is undecided (on the statistic, default VERDICT) with every point
    that leaves it so at the judge's last look (REPEAT_STEPS[-1] faithful runs): no more
    runs are designed for it."""
    verdict, _, found, _ = judge_claim(fig, table, c, link_limit(table) * PAYLOAD_SHARE, stat or VERDICT)
    return verdict == "undecided" and all(
        len(faithful_values(fig, table, s, x, c.metric)) >= REPEAT_STEPS[-1] for s, x in found)


def shift_interval(a: list[float], b: list[float], confidence: float | None = None) -> tuple[float, float]:
    """The distribution-free interval for how much `a` exceeds `b` (Hodges-Lehmann /
    Mann-Whitney): order statistics of the pairwise differences, k in from each end,
    with k from the exact null distribution of the U statistic (default confidence: the
    look's that the fewer runs make). Too few runs for the confidence give the whole
    range of differences (with 3 and 3 that is 90%)."""
    diffs = sorted(x - y for x in a for y in b)
    if not diffs:
        return float("nan"), float("nan")
    n, m = len(a), len(b)
    k = _shift_k(n, m, look_confidence(min(n, m), gap=True) if confidence is None else confidence)
    return diffs[k], diffs[-1 - k]


# Per-run quantities a paper states that a sweep's table holds in parts: each a function
# of the runs' rows. A paper number's (or a claim's) metric is a table column or one of these.
RUN_METRICS = {
    # WREN'09's R: "the number of RTO events during the transfer" of 100 blocks, per
    # sender (its Equations 1-3); the runs count every server's timeouts over their blocks.
    "rto_events_per_sender_per_100_blocks": lambda t: 100 * t["timeouts"] / (t["senders"] * t["blocks"]),
    # FAST'08's Table 3 counts timeouts and data blocks over a 20 s run: their ratio.
    "timeouts_per_block": lambda t: t["timeouts"] / t["blocks"],
}


def run_metric(table: pd.DataFrame, metric: str) -> pd.Series | None:
    """A metric's value for each run (row) of the table, or None where it has none."""
    if metric in RUN_METRICS:
        return RUN_METRICS[metric](table)
    return table[metric] if metric in table else None


def faithful_values(fig: Figure, table: pd.DataFrame, series: str, x, metric: str) -> list[float]:
    t = faithful_rows(table)
    t = point_rows(fig, t, series, x)
    values = run_metric(t, metric)
    return [float(g) for g in values.dropna()] if values is not None else []


def faithful_blocks(fig: Figure, table: pd.DataFrame, series: str, x, metric: str) -> list[float]:
    """The measured blocks of the runs faithful_values gives, in its order (each 1 where
    the table has no `blocks`): what weighs each run's goodput in pooled_goodput."""
    t = faithful_rows(table)
    t = point_rows(fig, t, series, x)
    values = run_metric(t, metric)
    if values is None:
        return []
    rows = t[values.notna().to_numpy()]
    return [float(b) for b in rows["blocks"]] if "blocks" in rows else [1.0] * len(rows)


def link_limit(table: pd.DataFrame) -> float:
    return float(table["link_mbps"].dropna().iloc[0]) if "link_mbps" in table and table["link_mbps"].notna().any() else 1000.0


# A number of ours agrees with a number the paper states where the interval of our
# statistic (a goodput's bytes over time, else the median) lies within a tenth of the
# link rate of it, or within a factor of 1.5 of it, whichever band is wider; it
# differs where the interval lies wholly outside that band.
# Chosen before any number was compared: the papers state numbers they read off their
# own curves (a tenth of the axis is as fine as such a reading goes) from one testbed
# each, and a collapsed curve's level, a few percent of the link, moves by its timeouts
# per block (a factor of 1.5 is one timeout more or less in two or three). Counts that
# are not rates (timeouts, servers) take the factor alone.
NUMBER_LINK_SHARE = 0.1
NUMBER_FACTOR = 1.5


def number_band(n: PaperNumber, link_mbps: float) -> tuple[float, float]:
    """Where ours agrees with the paper's number n."""
    lo, hi = n.value / NUMBER_FACTOR, n.value * NUMBER_FACTOR
    if n.metric.endswith("_mbps"):
        lo, hi = min(lo, n.value - NUMBER_LINK_SHARE * link_mbps), max(hi, n.value + NUMBER_LINK_SHARE * link_mbps)
    return lo, hi


def number_verdict(fig: Figure, table: pd.DataFrame, n: PaperNumber, stat: str | None = None) -> dict:
    """Ours beside the paper's number on the statistic (default VERDICT): a goodput's
    bytes over time with its interval (pooled_interval, from POOLED_MIN_RUNS runs), or
    the median of the point's faithful runs with median_interval (a count that is not a
    rate, or stat MEDIAN); agrees / differs / undecided (number_band), or not testable
    where the point has no faithful run."""
    stat = stat or VERDICT
    runs = faithful_values(fig, table, n.series, n.x, n.metric) if len(table) else []
    row = {"series": n.series, fig.x: n.x, "metric": n.metric, "paper": n.value, "ours": None, "lo": None,
           "hi": None, "runs": len(runs), "ratio": None, "verdict": "not testable", "source": n.source,
           "divergence": n.divergence, "statistic": POOLED if pooled_applies(n.metric, stat) else MEDIAN}
    if not runs:
        return row
    value, lo, hi, _ = point_value(fig, table, n.series, n.x, n.metric, stat)
    band = number_band(n, link_limit(table))
    if len(runs) < _few(stat, n.metric) or (lo < band[0] <= hi) or (lo <= band[1] < hi):
        verdict = "undecided"
    else:
        verdict = "agrees" if band[0] <= lo and hi <= band[1] else "differs"
    return {**row, "ours": round(value, 1), "lo": round(lo, 1), "hi": round(hi, 1),
            "ratio": round(value / n.value, 2) if n.value else None, "verdict": verdict}


def comparison(fig: Figure, table: pd.DataFrame, stat: str | None = None) -> pd.DataFrame:
    """Every number the paper states beside ours (number_verdict, on the statistic)."""
    return pd.DataFrame([number_verdict(fig, table, n, stat) for n in fig.paper_numbers],
                        columns=["series", fig.x, "metric", "paper", "ours", "lo", "hi", "runs", "ratio", "verdict",
                                 "source", "divergence", "statistic"])


@lru_cache(maxsize=64)
def u_counts(n: int, m: int) -> tuple[int, ...]:
    """How many orderings of n runs against m (no ties) give the Mann-Whitney U = u, for
    u = 0..n*m, exactly: ways(i, j, u) = ways(i-1, j, u-j) + ways(i, j-1, u) (the largest
    run is one of the i, beating all j, or one of the j)."""
    size = n * m + 1
    rows = [np.zeros(size, dtype=object) for _ in range(m + 1)]     # rows[j]: ways(i, j, .)
    for r in rows:
        r[0] = 1                                                    # i = 0
    for i in range(1, n + 1):
        new = [np.zeros(size, dtype=object) for _ in range(m + 1)]
        new[0][0] = 1
        for j in range(1, m + 1):
            shifted = np.zeros(size, dtype=object)
            shifted[j:] = rows[j][:size - j]
            new[j] = shifted + new[j - 1]
        rows = new
    return tuple(int(c) for c in rows[m])


def _u_null(n: int, m: int) -> np.ndarray:
    """P(U = u), u = 0..n*m (u_counts over their sum)."""
    counts = u_counts(n, m)
    total = sum(counts)
    return np.array([c / total for c in counts])


def rank_sum_p(a: list[float], b: list[float]) -> float:
    """The exact two-sided p-value of the Mann-Whitney rank-sum test of a against b: ties
    count half in U and the null is that without ties (conservative where runs tie)."""
    n, m = len(a), len(b)
    if not n or not m:
        return float("nan")
    x, y = np.asarray(a, float)[:, None], np.asarray(b, float)[None, :]
    u = float((x > y).sum() + 0.5 * (x == y).sum())
    d = abs(u - n * m / 2)
    cut = int(np.ceil(n * m / 2 - d))       # P(U <= cut) = P(U >= n*m - cut): symmetric
    pmf = _u_null(n, m)
    return float(min(1.0, 2 * pmf[:cut + 1].sum())) if d > 0 else 1.0


# (here: they need u_counts)
LATE_LOOK_CONFIDENCE = _late_look_confidence(lambda n: median_error(n, LOOK_CONFIDENCE))
LATE_LOOK_CONFIDENCE_GAP = _late_look_confidence(lambda n: shift_error(n, n, LOOK_CONFIDENCE))
