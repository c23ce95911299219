"""WREN'09's analytical model of incast goodput (Chen et al., Section 6.1), fitted to
our curves, with its parameters kept physical, their uncertainty, and a verdict.

The model, in the paper's symbols (S senders, each sending D bytes in all; r the
minimum RTO; B the link's bandwidth; MSS the average segment):

    goodput(S) = k * S * D / (L(S) + R(S) * r)                      (Eq. 2; k is the
    L(S)       = D / B + (D / MSS) * I(S)    time without RTOs       paper's "empirical
    R(S)       = a * min(S, S0)              RTO events per sender   scaling factor")
    I(S)       = b * min(S, S0)              inter-packet idle time

R and I are the paper's piece-wise linear fits (Eq. 3 and 5: both rise to the same
knee S0 and stay flat beyond). Past the knee R and I stop growing, so goodput grows
with S again: that is how the model makes its recovery (R2). It has no term for the
decline after it (R3), nor for curves of small RTOmin, as the paper says itself.

The fit, on the median of each sender count's runs (the curve the figure draws, each
sender count weighing the same however many runs it has):

1. a and S0 by least squares on the RTO events each sender counted (the kernel's
   timeouts of all senders over the measured blocks, divided by S), every whole knee
   from the fewest senders measured to the most; a >= 0.
2. b and k by least squares on goodput, with k in closed form for each b and b in
   [0, b_max]: b_max is the largest idle time for which L(S), the time the model
   gives the transfer without any RTO, stays within the fastest measured run at every
   S (a run's transfer time is S * D * 8 / goodput, and no run can take less than its
   own time without RTOs). k > 0 is free and reported.
3. The uncertainty by bootstrap over runs: the runs of each sender count resampled
   with replacement (RESAMPLES times, a fixed seed), the whole fit redone, and the
   5th and 95th percentiles of each parameter and of the error kept.
4. The paper's own numbers (Eq. 3 and 5, see PAPER_*) with only k fitted, so a reader
   sees whether the paper's model with the paper's parameters describes our curve.
5. R1, R2 and R3 located on the median curve (`regions`).
6. A verdict: "fits" when the error is at most FIT_RMS_SHARE of the curve's mean and
   no parameter sits at a bound; else "does not fit", with the reasons in numbers.

``python -m incast.pages.wren_table DIR [--record docs/results/wren09-model.csv]``
fits a kept figure result (a directory with sweep.parquet and sweep.json) and prints
the fits, or records them for the documentation's table (incast/pages/doc_tables.py).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd
from scipy.optimize import minimize_scalar

MSS_BYTES = 1448        # a full segment with timestamps (the paper approximates 1500)

# Our thresholds (not the paper's): what "fits" means, and what counts as a turn of
# the curve. A fit within 15% of the curve's mean is close enough to say the model's
# terms describe the curve; a collapse is a fall to half the one-sender goodput or
# less (an incast collapse leaves a fraction of the link; a point where some runs kept
# the link and some collapsed has a median in between and is no collapse yet); a turn
# is a move of more than 10% of the turning point's goodput (less is the runs' noise).
FIT_RMS_SHARE = 0.15
COLLAPSE_SHARE = 0.5
TURN_SHARE = 0.1

RESAMPLES = 200         # bootstrap resamples: intervals steady to a few percent, under a second
SEED = 2009
INTERVAL = (5.0, 95.0)  # percentiles: a 90% interval

# The paper's own parameters (Section 6.1). Eq. 3: R = (35/10) * S RTO events per
# sender up to S0 = 10, then 35, counted over the paper's transfer of 100 blocks; we
# scale R to our number of measured blocks (an RTO rate per block is what carries over
# from 100 blocks to ours). Eq. 5: I = (4.5/10) * S up to S0 = 10, then 4.5, where the
# text gives no unit. We take milliseconds: the text says the 1 ms curve's idle times
# are "comparable and even greater than the RTO timer value" (so Figure 16's axis is on
# the scale of milliseconds), and it calls the model's goodput an underestimate; in
# microseconds the model would give 1.4 Gbit/s at 48 senders on the paper's 100 blocks
# (S * D / (R * r) with R * r = 7 s), more than the link, not less than the measured
# curve. In milliseconds the paper's L from 10 senders on is 79 s (17,476 segments of
# 1500 bytes times 4.5 ms), the time 10 senders' 26 MB each take at 27 Mbit/s: at any
# goodput above that, L alone is longer than the whole run, so the paper's I must count
# idle time that the RTOs cause (which would also make the model underestimate). Our
# bound on b rejects such an I; the fit counts the sender counts where the paper's L
# alone exceeds our fastest run (`paper_l_over`).
PAPER_KNEE = 10
PAPER_RTOS = 35 / 10            # RTO events per sender, per sender, over PAPER_BLOCKS blocks
PAPER_BLOCKS = 100
PAPER_IDLE_S = 4.5e-3 / 10      # inter-packet idle seconds per sender
PAPER_MSS_BYTES = 1500
PAPER_BLOCK_BYTES = 256 * 1024  # the paper's fragment ("256KB"): D = 100 blocks of it


@dataclass
class ModelFit:
    series: str
    rto_min_s: float
    data_bytes: float          # D: bytes each sender sends over the measured blocks
    link_bps: float            # B
    a: float                   # RTO events per sender, per sender, up to the knee
    knee: int                  # S0
    b_s: float                 # inter-packet idle seconds per sender, up to the knee
    k: float                   # the empirical scaling factor
    rms_mbps: float            # goodput fit error over the median curve
    rms_share: float           # ... relative to the median curve's mean
    rto_rms: float             # R(S) fit error, RTO events per sender
    b_max_s: float = 0.0       # b's upper bound: L(S) within the fastest run at every S
    at_bound: list[str] = field(default_factory=list)      # parameters sitting at a bound
    intervals: dict[str, list[float]] = field(default_factory=dict)   # 90%, by bootstrap
    resamples: int = 0
    paper_k: float = float("nan")          # k for the paper's own R and I
    paper_rms_mbps: float = float("nan")
    paper_rms_share: float = float("nan")
    paper_l_over: list[int] = field(default_factory=list)   # S where the paper's L exceeds our fastest run
    regions: dict[str, int | None] = field(default_factory=dict)      # R1, R2, R3: sender counts
    verdict: str = ""
    reasons: list[str] = field(default_factory=list)
    points: dict[str, list[float]] = field(default_factory=dict)      # the median curve fitted

    def goodput_mbps(self, senders) -> np.ndarray:
        s = np.asarray(senders, dtype=float)
        return _goodput(s, self.data_bytes, self.link_bps, self.rto_min_s, self.a, self.knee, self.b_s, self.k)

    def label(self) -> str:
        return (f"model ({self.verdict}): R={self.a:.2f}·min(S,{self.knee}), "
                f"I={1e6 * self.b_s:.2f} µs·min(S,{self.knee}), k={self.k:.2f}; "
                f"RMS {self.rms_mbps:.0f} Mbit/s ({100 * self.rms_share:.0f}%)")

    def as_dict(self) -> dict:
        return _plain(asdict(self))


def _plain(v):
    """JSON's types, floats to 6 significant digits (verdicts.json; b is a fraction of a
    microsecond, so decimal places would round it away)."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, np.ndarray)):
        return [_plain(x) for x in v]
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return None if not np.isfinite(v) else float(f"{float(v):.6g}")
    return v


def _goodput(s, d, link_bps, r, a, knee, b, k):
    low = np.minimum(s, knee)
    transfer = d * 8 / link_bps + (d / MSS_BYTES) * b * low + a * low * r
    return k * s * d * 8 / transfer / 1e6


def _paper_goodput(s, d, link_bps, r, blocks, k):
    low = np.minimum(s, PAPER_KNEE)
    rtos = PAPER_RTOS * low * blocks / PAPER_BLOCKS
    transfer = _paper_no_rto_time(s, d, link_bps) + rtos * r
    return k * s * d * 8 / transfer / 1e6


def _paper_no_rto_time(s, d, link_bps):
    return d * 8 / link_bps + (d / PAPER_MSS_BYTES) * PAPER_IDLE_S * np.minimum(s, PAPER_KNEE)


# --- the median curve ------------------------------------------------------------------

def _groups(p: pd.DataFrame) -> list[tuple[float, np.ndarray, np.ndarray]]:
    """Per sender count, ascending: (S, the runs' goodput, their RTO events per sender)."""
    return [(float(s), q["goodput_mbps"].to_numpy(float), q["timeouts"].to_numpy(float) / float(s))
            for s, q in p.groupby("senders", sort=True)]


def _curve(groups, d: float, picks=None) -> tuple[np.ndarray, ...]:
    """(S, median goodput, median RTOs per sender, the fastest run's transfer time in
    seconds), each run drawn by `picks` (one index array per sender count) if given."""
    s, g, r, t = [], [], [], []
    for i, (n, good, rtos) in enumerate(groups):
        if picks is not None:
            good, rtos = good[picks[i]], rtos[picks[i]]
        s.append(n)
        g.append(np.median(good))
        r.append(np.median(rtos))
        fastest = good.max()
        t.append(n * d * 8 / (fastest * 1e6) if fastest > 0 else np.inf)
    return np.array(s), np.array(g), np.array(r), np.array(t)


# --- the fit -----------------------------------------------------------------------------

def _fit_knee(s: np.ndarray, r: np.ndarray) -> tuple[float, int, float]:
    """R(S) = a * min(S, S0), a >= 0: every whole knee from the fewest senders measured
    to the most, the slope by least squares for each, the best by RMS (the fewest
    senders where knees tie, as where no RTO was counted)."""
    best = None
    for knee in range(int(s.min()), int(s.max()) + 1):
        x = np.minimum(s, knee)
        a = max(0.0, float(x @ r / (x @ x)))
        rms = float(np.sqrt(np.mean((a * x - r) ** 2)))
        if best is None or rms < best[2] - 1e-12:
            best = (a, knee, rms)
    return best


def _idle_bound(s, t_fast, d, link_bps, knee) -> tuple[float, int]:
    """(b_max, the sender count that sets it): the largest b with L(S) <= the fastest
    run's transfer time at every measured S. L's baseline is D over the link's rate, as
    the paper has it, so at one sender the room left for idle time is the share of the
    link that headers take (1538 bytes on the wire for 1448 of payload)."""
    room = (t_fast - d * 8 / link_bps) / ((d / MSS_BYTES) * np.minimum(s, knee))
    i = int(np.argmin(room))
    return max(0.0, float(room[i])), int(s[i])


def _fit_idle(s, g, d, link_bps, r, a, knee, b_max) -> tuple[float, float, float]:
    """(b, k, RMS) with b in [0, b_max] and k by least squares for each b: a grid
    dense near zero and across the range, then Brent's method around its best."""
    def k_rms(b):
        shape = _goodput(s, d, link_bps, r, a, knee, b, 1.0)
        k = float(shape @ g / (shape @ shape))
        return k, float(np.sqrt(np.mean((k * shape - g) ** 2)))

    if b_max <= 0:
        return (0.0, *k_rms(0.0))
    grid = np.unique(np.concatenate([[0.0], np.geomspace(b_max * 1e-6, b_max, 100), np.linspace(0, b_max, 41)]))
    shapes = _goodput(s[None, :], d, link_bps, r, a, knee, grid[:, None], 1.0)
    ks = (shapes @ g) / np.einsum("ij,ij->i", shapes, shapes)
    rms = np.sqrt(np.mean((ks[:, None] * shapes - g) ** 2, axis=1))
    i = int(np.argmin(rms))
    b = float(grid[i])
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    if hi > lo:
        refined = minimize_scalar(lambda x: k_rms(x)[1], bounds=(lo, hi), method="bounded",
                                  options={"xatol": b_max * 1e-9})
        if refined.fun < rms[i]:
            b = float(refined.x)
    return (b, *k_rms(b))


def _fit_curve(s, g, r, t_fast, d, link_bps, rto) -> dict:
    a, knee, rto_rms = _fit_knee(s, r)
    b_max, b_max_at = _idle_bound(s, t_fast, d, link_bps, knee)
    b, k, rms = _fit_idle(s, g, d, link_bps, rto, a, knee, b_max)
    mean = float(np.mean(g))
    return {"a": a, "knee": knee, "rto_rms": rto_rms, "b_s": b, "b_max_s": b_max, "b_max_at": b_max_at,
            "k": k, "rms_mbps": rms, "rms_share": rms / mean if mean > 0 else float("nan")}


def _at_bound(f: dict, s: np.ndarray) -> list[str]:
    out = []
    if f["a"] <= 0:
        out.append("a")
    if f["knee"] in (int(s.min()), int(s.max())):
        out.append("knee")
    tol = 1e-3 * f["b_max_s"]
    if f["b_s"] <= tol or f["b_s"] >= f["b_max_s"] - tol:
        out.append("b")
    return out


def _bootstrap(groups, d, link_bps, rto, resamples: int, seed: int) -> dict[str, list[float]]:
    rng = np.random.default_rng(seed)
    kept = {name: [] for name in ("a", "knee", "b_s", "k", "rms_share")}
    for _ in range(resamples):
        picks = [rng.integers(0, len(good), len(good)) for _, good, _ in groups]
        f = _fit_curve(*_curve(groups, d, picks), d, link_bps, rto)
        for name, values in kept.items():
            values.append(f[name])
    return {name: [float(np.percentile(v, INTERVAL[0], method="inverted_cdf")),
                   float(np.percentile(v, INTERVAL[1], method="inverted_cdf"))] for name, v in kept.items()}


def regions(senders, goodput) -> dict[str, int | None]:
    """R1, R2, R3 of a median curve, as sender counts (None where absent). R1: the
    lowest point of the initial collapse (the first local minimum at COLLAPSE_SHARE of
    the one-sender goodput or less), before goodput rises again; R2: the local maximum
    after it; R3: the lowest point of the decline after R2. A turn counts when the curve
    moves more than TURN_SHARE of the turning point's goodput away from it, so a dip
    of noise does not make one."""
    s, g = np.asarray(senders, float), np.asarray(goodput, float)
    turns = _turns(g)
    r1 = next((i for i, kind in turns if kind == "min" and g[i] <= COLLAPSE_SHARE * g[0]), None)
    r2 = None if r1 is None else next((i for i, kind in turns if kind == "max" and i > r1), None)
    r3 = None if r2 is None else next((i for i, kind in turns if kind == "min" and i > r2), None)
    return {name: None if i is None else int(s[i]) for name, i in (("R1", r1), ("R2", r2), ("R3", r3))}


def _turns(g: np.ndarray) -> list[tuple[int, str]]:
    """The curve's alternating extremes (index, "min" or "max"), each more than
    TURN_SHARE away from the next; the last is where the curve ends up after its last
    confirmed turn."""
    turns, trend, hi, lo, cand = [], 0, 0, 0, 0
    for j in range(1, len(g)):
        if trend == 0:          # no turn yet: watch both ways from the start
            hi = j if g[j] > g[hi] else hi
            lo = j if g[j] < g[lo] else lo
            if g[j] < g[hi] * (1 - TURN_SHARE):
                turns.append((hi, "max"))
                trend, cand = -1, hi + int(np.argmin(g[hi:j + 1]))
            elif g[j] > g[lo] * (1 + TURN_SHARE):
                turns.append((lo, "min"))
                trend, cand = 1, lo + int(np.argmax(g[lo:j + 1]))
        elif trend < 0:
            if g[j] < g[cand]:
                cand = j
            elif g[j] > g[cand] * (1 + TURN_SHARE):
                turns.append((cand, "min"))
                trend, cand = 1, j
        else:
            if g[j] > g[cand]:
                cand = j
            elif g[j] < g[cand] * (1 - TURN_SHARE):
                turns.append((cand, "max"))
                trend, cand = -1, j
    if trend:
        turns.append((cand, "min" if trend < 0 else "max"))
    return turns


def _reasons(f: dict, at_bound: list[str], s, g, r, t_fast, d, link_bps, rto) -> list[str]:
    """Why the model does not fit, in the curve's own numbers."""
    span = f"{s.min():g}-{s.max():g} senders"
    per_sender = ", ".join(f"{x:.2g} at {n:g}" for n, x in zip(s, r))
    out = []
    if "a" in at_bound:
        out.append(f"no RTO events in {span}: R(S) = 0, the model is its time without RTOs alone")
    elif "knee" in at_bound and f["knee"] == int(s.max()):
        out.append(f"R(S) has no knee in {span}: RTOs per sender {per_sender}; the model's recovery (R2) "
                   "comes from R and I flattening past S0, so without a knee its curve only levels off")
    elif "knee" in at_bound:
        out.append(f"R(S) is flat from the fewest senders on (RTOs per sender {per_sender}): "
                   "a knee at the first sender count leaves the model goodput proportional to S")
    if "b" in at_bound and f["b_s"] > 0:
        at = f["b_max_at"]
        i = int(np.flatnonzero(s == at)[0])
        out.append(f"the idle time b sits at its bound {1e6 * f['b_max_s']:.3g} µs a segment per sender, "
                   f"where the model's time without RTOs reaches the fastest run at {_senders(at)} "
                   f"({1e3 * t_fast[i]:.1f} ms): the fit wants more time without RTOs than the runs took")
    elif "b" in at_bound:
        out.append("the idle time b sits at 0: the fit wants a time without RTOs shorter than D / B, "
                   "which no idle time gives")
    if not f["rms_share"] <= FIT_RMS_SHARE:
        model = _goodput(s, d, link_bps, rto, f["a"], f["knee"], f["b_s"], f["k"])
        i = int(np.argmax(np.abs(model - g)))
        out.append(f"the error is {f['rms_mbps']:.0f} Mbit/s RMS, {100 * f['rms_share']:.0f}% of the curve's "
                   f"mean ({np.mean(g):.0f} Mbit/s), above our {100 * FIT_RMS_SHARE:.0f}%; the widest miss "
                   f"is at {_senders(s[i])}: model {model[i]:.0f}, measured {g[i]:.0f} Mbit/s")
    return out


def _senders(n) -> str:
    return f"{n:g} sender{'' if n == 1 else 's'}"


def fit(points: pd.DataFrame, series: str, rto_min_s: float, data_bytes: float, link_bps: float,
        blocks: float | None = None, resamples: int = RESAMPLES, seed: int = SEED) -> ModelFit:
    """points: one row per run with senders, goodput_mbps and timeouts (all senders'
    RTO events over the measured blocks). blocks: how many blocks data_bytes is (to
    scale the paper's RTO count to ours); by default D over the paper's 256 KB block."""
    p = points.dropna(subset=["goodput_mbps", "timeouts"])
    if p["senders"].nunique() < 3:
        raise ValueError(f"{series}: the model needs at least three sender counts")
    d = data_bytes
    groups = _groups(p)
    s, g, r, t_fast = _curve(groups, d)
    f = _fit_curve(s, g, r, t_fast, d, link_bps, rto_min_s)
    at_bound = _at_bound(f, s)
    fits = f["rms_share"] <= FIT_RMS_SHARE and not at_bound

    blocks = d / PAPER_BLOCK_BYTES if blocks is None else blocks
    shape = _paper_goodput(s, d, link_bps, rto_min_s, blocks, 1.0)
    paper_k = float(shape @ g / (shape @ shape))
    paper_rms = float(np.sqrt(np.mean((paper_k * shape - g) ** 2)))
    paper_l_over = [int(n) for n, t in zip(s, t_fast) if _paper_no_rto_time(n, d, link_bps) > t]

    return ModelFit(
        series=series, rto_min_s=rto_min_s, data_bytes=d, link_bps=link_bps,
        a=f["a"], knee=f["knee"], b_s=f["b_s"], k=f["k"], rms_mbps=f["rms_mbps"], rms_share=f["rms_share"],
        rto_rms=f["rto_rms"], b_max_s=f["b_max_s"], at_bound=at_bound,
        intervals=_bootstrap(groups, d, link_bps, rto_min_s, resamples, seed), resamples=resamples,
        paper_k=paper_k, paper_rms_mbps=paper_rms, paper_rms_share=paper_rms / float(np.mean(g)),
        paper_l_over=paper_l_over, regions=regions(s, g),
        verdict="fits" if fits else "does not fit",
        reasons=[] if fits else _reasons(f, at_bound, s, g, r, t_fast, d, link_bps, rto_min_s),
        points={"senders": s.tolist(), "goodput_mbps": g.tolist(), "rtos_per_sender": r.tolist(),
                "fastest_transfer_s": t_fast.tolist()})


def fit_figure(table: pd.DataFrame, series_col: str, sru_bytes: float | None) -> list[ModelFit]:
    """A fit per series of a fixed-fragment sweep table (each sender sends sru_bytes
    per block); series without enough points are left out."""
    if sru_bytes is None or "timeouts" not in table:
        return []
    fits = []
    for series, t in table.groupby(series_col):
        if "fidelity_ok" in t:
            t = t[t["fidelity_ok"].fillna(False).astype(bool)]
        if t["senders"].nunique() < 3:
            continue
        blocks = float(t["blocks"].iloc[0])      # every measured block of the run, all repetitions
        rto = float(t["rto_min_us"].iloc[0]) / 1e6
        try:
            fits.append(fit(t, str(series), rto, sru_bytes * blocks, float(t["link_mbps"].iloc[0]) * 1e6,
                            blocks=blocks))
        except ValueError:
            continue
    return fits
