"""WREN'09's model fitted to a kept figure result, and its record for the documentation
(docs/results/wren09-model.csv): ``python -m incast.pages.wren_table DIR [--record CSV]``.
The model itself is incast.report.wren_model."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from incast.campaign import figure, make
from incast.constants import REPO
from incast.pages.doc_tables import code_commit
from incast.report.wren_model import SEED, ModelFit


def fit_kept(sweep_dir: Path) -> list[ModelFit]:
    """The fits of a kept figure result (sweep.parquet and sweep.json, as
    docs/figure-results/NAME/ keeps them), as `incast figure` makes them."""
    meta = json.loads((sweep_dir / "sweep.json").read_text())
    fig = figure.load(meta["figure"])
    return make.model_fits(fig, pd.read_parquet(sweep_dir / "sweep.parquet"), bool(meta.get("quick")))


def _repo_path(path: Path) -> Path:
    path = path.resolve()
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def _none(v):
    return "—" if v is None else v


def record_rows(sweep_dir: Path, fits: list[ModelFit], out: Path | None = None) -> list[dict]:
    """One row per series for docs/results/: the fit rounded as the page shows it, the
    command that made the runs and the fit, and the runs' commit (the fit is a
    function of the kept runs and of this file, which the test on the kept result
    holds to the row)."""
    meta = json.loads((sweep_dir / "sweep.json").read_text())
    where = _repo_path(sweep_dir)
    record = f" --record {_repo_path(out)}" if out is not None else ""
    command = (f"{meta['command']} && python -m incast.pages.wren_table {where}{record}"
               f"  # {where} keeps that figure's sweep.parquet and sweep.json")
    if meta.get("commit") and not meta.get("uncommitted_changes"):
        commit = str(meta["commit"])[:7]
    else:
        commit = code_commit()
    rows = []
    for m in fits:
        iv = m.intervals
        rows.append({
            "figure": meta["figure"], "series": m.series, "verdict": m.verdict,
            "a": round(m.a, 4), "a_lo": round(iv["a"][0], 4), "a_hi": round(iv["a"][1], 4),
            "knee": m.knee, "knee_lo": int(iv["knee"][0]), "knee_hi": int(iv["knee"][1]),
            "b_us": round(1e6 * m.b_s, 4), "b_lo_us": round(1e6 * iv["b_s"][0], 4),
            "b_hi_us": round(1e6 * iv["b_s"][1], 4), "b_max_us": round(1e6 * m.b_max_s, 4),
            "k": round(m.k, 4), "k_lo": round(iv["k"][0], 4), "k_hi": round(iv["k"][1], 4),
            "rms_mbps": round(m.rms_mbps, 1), "rms_pct": round(100 * m.rms_share, 1),
            "rms_pct_lo": round(100 * iv["rms_share"][0], 1), "rms_pct_hi": round(100 * iv["rms_share"][1], 1),
            "at_bound": ", ".join(m.at_bound) or "none",
            "paper_k": round(m.paper_k, 4), "paper_rms_mbps": round(m.paper_rms_mbps, 1),
            "paper_rms_pct": round(100 * m.paper_rms_share, 1),
            "paper_l_over": len(m.paper_l_over), "sender_counts": len(m.points["senders"]),
            "r1": _none(m.regions["R1"]), "r2": _none(m.regions["R2"]), "r3": _none(m.regions["R3"]),
            "reasons": "; ".join(m.reasons) or "—", "resamples": m.resamples, "seed": SEED,
            "command": command, "commit": commit})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m incast.pages.wren_table",
                                description="Fit WREN'09's goodput model to a kept figure result.")
    p.add_argument("dir", type=Path, help="a kept result: sweep.parquet and sweep.json")
    p.add_argument("--record", type=Path, metavar="CSV", help="write the fits for the docs (docs/results/...)")
    args = p.parse_args(argv)
    fits = fit_kept(args.dir)
    if not fits:
        print(f"{args.dir}: no series to fit", file=sys.stderr)
        return 2
    for m in fits:
        print(f"{m.series}: {m.verdict}; {m.label()}")
        print(f"  90% intervals ({m.resamples} resamples): "
              + ", ".join(f"{k} {lo:.4g}-{hi:.4g}" for k, (lo, hi) in m.intervals.items()))
        print(f"  b <= {1e6 * m.b_max_s:.3g} µs; at a bound: {', '.join(m.at_bound) or 'none'}; "
              f"regions {m.regions}")
        print(f"  the paper's R and I, k fitted: k={m.paper_k:.3g}, RMS {m.paper_rms_mbps:.0f} Mbit/s "
              f"({100 * m.paper_rms_share:.0f}%); its L exceeds our fastest run at {m.paper_l_over}")
        for why in m.reasons:
            print(f"  - {why}")
    if args.record:
        rows = record_rows(args.dir, fits, args.record)
        pd.DataFrame(rows).to_csv(args.record, index=False)   # as doc_tables.record writes its files
        print(f"{args.record}: {len(rows)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
