"""WREN'09's analytical model of incast goodput (Chen et al., Section 6.1), fitted to
our curves.

The model, in the paper's symbols (S senders, each sending D bytes in all; r the
minimum RTO; B the link's bandwidth; MSS the average segment):

    goodput(S) = k * S * D / (L(S) + R(S) * r)                     (Eq. 2, k: the
    L(S)       = D / B + (D / MSS) * I(S)                           paper's "empirical
    R(S)       = a * min(S, S0)            RTO events per sender    scaling factor")
    I(S)       = b * min(S, S0)            inter-packet idle time

R and I are the paper's piece-wise linear fits (Eq. 3 and 5: both rise to the same
knee S0 and stay flat beyond; the paper found 3.5 RTOs and 0.45 ms per sender up to
S0 = 10). Here a and S0 are fitted to the RTO events each sender counted (the
kernel's timeouts per sender over the measured blocks), then b and k to the goodput,
each by least squares. The fit reports its parameters and its error (RMS, in Mbit/s
and relative to the curve's mean), so a reader sees how much of the curve the model
explains; the paper itself says it does not explain the decline at many senders
(its R3) nor curves of small RTOmin.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

MSS_BYTES = 1448        # a full segment with timestamps (the paper approximates 1500)


@dataclass
class ModelFit:
    series: str
    rto_min_s: float
    data_bytes: float          # D: bytes each sender sends over the measured blocks
    link_bps: float            # B
    a: float                   # RTO events per sender per sender, up to the knee
    knee: float                # S0
    b_s: float                 # inter-packet idle seconds per sender, up to the knee
    k: float                   # the empirical scaling factor
    rms_mbps: float            # goodput fit error
    rms_share: float           # ... relative to the measured curve's mean
    rto_rms: float             # R(S) fit error, RTO events per sender

    def goodput_mbps(self, senders) -> np.ndarray:
        s = np.asarray(senders, dtype=float)
        return _goodput(s, self.data_bytes, self.link_bps, self.rto_min_s, self.a, self.knee, self.b_s, self.k)

    def label(self) -> str:
        return (f"model: R={self.a:.2f}·min(S,{self.knee:g}), I={1e6 * self.b_s:.1f} µs·min(S,{self.knee:g}), "
                f"k={self.k:.2f}; RMS {self.rms_mbps:.0f} Mbit/s ({100 * self.rms_share:.0f}%)")

    def as_dict(self) -> dict:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def _goodput(s, d, link_bps, r, a, knee, b, k):
    low = np.minimum(s, knee)
    transfer = d * 8 / link_bps + (d / MSS_BYTES) * b * low + a * low * r
    return k * s * d * 8 / transfer / 1e6


def fit(points: pd.DataFrame, series: str, rto_min_s: float, data_bytes: float, link_bps: float) -> ModelFit:
    """points: one row per run with senders, goodput_mbps and timeouts (all senders'
    RTO events over the measured blocks)."""
    p = points.dropna(subset=["goodput_mbps", "timeouts"])
    if p["senders"].nunique() < 3:
        raise ValueError(f"{series}: the model needs at least three sender counts")
    s = p["senders"].to_numpy(float)
    g = p["goodput_mbps"].to_numpy(float)
    rto_per_sender = p["timeouts"].to_numpy(float) / s
    a, knee, rto_rms = _fit_knee(s, rto_per_sender)
    best = None
    for b in np.concatenate([[0.0], np.logspace(-8, -2, 121)]):
        shape = _goodput(s, data_bytes, link_bps, rto_min_s, a, knee, b, 1.0)
        k = float(shape @ g / (shape @ shape)) if shape @ shape > 0 else 0.0      # least squares in k
        rms = float(np.sqrt(np.mean((k * shape - g) ** 2)))
        if best is None or rms < best[2]:
            best = (b, k, rms)
    b, k, rms = best
    return ModelFit(series, rto_min_s, data_bytes, link_bps, a, knee, b, k, rms,
                    rms / float(np.mean(g)) if np.mean(g) > 0 else float("nan"), rto_rms)


def _fit_knee(s: np.ndarray, r: np.ndarray) -> tuple[float, float, float]:
    """R(S) = a * min(S, S0): every whole knee from the fewest senders measured to the
    most, the slope by least squares for each, the best by RMS."""
    best = None
    for knee in range(int(s.min()), int(s.max()) + 1):
        x = np.minimum(s, knee)
        a = float(x @ r / (x @ x))
        rms = float(np.sqrt(np.mean((a * x - r) ** 2)))
        if best is None or rms < best[2] - 1e-12:
            best = (a, float(knee), rms)
    return best


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
            fits.append(fit(t, str(series), rto, sru_bytes * blocks, float(t["link_mbps"].iloc[0]) * 1e6))
        except ValueError:
            continue
    return fits
