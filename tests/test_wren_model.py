"""WREN'09's goodput model (incast.report.wren_model): the fit recovers the parameters
of a curve the model made, inside its bootstrap intervals, keeps them physical, says
why it does not fit a curve it cannot make, locates R1/R2/R3, lands in a WREN figure's
verdicts and picture, and holds what docs/results/wren09-model.csv records for the
kept result."""
import json

import numpy as np
import pandas as pd
import pytest

from incast.constants import REPO
from incast.campaign import figure, judge, make
from incast.pages import doc_tables, wren_table
from incast.report import wren_model

D, LINK, R200 = 256 * 1024 * 20, 1e9, 0.2
SENDERS = [1, 2, 4, 8, 12, 16, 24, 32, 48]
KEPT = REPO / "docs" / "figure-results" / "wren09-rto"
RECORD = "wren09-model.csv"


def curve(a=3.5 / 20, knee=10, b=4.5e-5, k=0.02, senders=SENDERS):
    s = np.array(senders, float)
    g = wren_model._goodput(s, D, LINK, R200, a, knee, b, k)
    return pd.DataFrame({"senders": s, "goodput_mbps": g, "timeouts": a * np.minimum(s, knee) * s})


def noisy_runs(a=3.5 / 20, knee=10, b=4.5e-5, k=0.02, runs=6, noise=0.03, seed=0):
    """Six runs a sender count, goodput and RTO counts each off by a few percent."""
    rng = np.random.default_rng(seed)
    t = pd.concat([curve(a, knee, b, k)] * runs, ignore_index=True)
    t["goodput_mbps"] *= 1 + noise * rng.standard_normal(len(t))
    t["timeouts"] *= 1 + noise * rng.standard_normal(len(t))
    return t


def test_the_fit_recovers_the_parameters_of_a_curve_the_model_made():
    m = wren_model.fit(curve(), "200ms", R200, D, LINK)
    assert m.knee == 10 and m.a == pytest.approx(3.5 / 20, rel=1e-6)
    assert m.rms_share < 0.01, m
    assert m.b_s == pytest.approx(4.5e-5, rel=0.1) and m.k == pytest.approx(0.02, rel=0.1)


def test_a_curve_with_a_clear_knee_is_recovered_inside_its_intervals_and_fits():
    truth = {"a": 3.5 / 20, "knee": 10, "b_s": 4.5e-5, "k": 0.02}
    m = wren_model.fit(noisy_runs(), "200ms", R200, D, LINK)
    for name, value in truth.items():
        lo, hi = m.intervals[name]
        assert lo <= value <= hi, (name, value, m.intervals)
        assert lo <= getattr(m, name) <= hi, (name, m.intervals)
    assert m.verdict == "fits" and m.at_bound == [] and m.reasons == [], m
    assert m.rms_share <= wren_model.FIT_RMS_SHARE and m.intervals["rms_share"][1] <= wren_model.FIT_RMS_SHARE
    assert 0 < m.b_s < m.b_max_s


def test_a_curve_without_a_knee_does_not_fit_and_says_why():
    """RTOs per sender rising to the last sender count: the knee sits at the bound."""
    m = wren_model.fit(noisy_runs(knee=48), "200ms", R200, D, LINK)
    assert m.knee == 48 and "knee" in m.at_bound
    assert m.verdict == "does not fit"
    assert any(r.startswith("R(S) has no knee in 1-48 senders") and "at 48" in r for r in m.reasons), m.reasons


def test_the_fit_says_how_far_it_is_from_a_curve_it_cannot_make():
    t = curve()
    t["goodput_mbps"] = np.where(t["senders"] > 20, 900.0, 50.0)      # a step the model has no term for
    m = wren_model.fit(t, "200ms", R200, D, LINK)
    assert m.rms_share > 0.3, m
    assert "RMS" in m.label()
    assert m.verdict == "does not fit" and any("above our 15%" in r for r in m.reasons), m.reasons


def test_the_idle_time_never_makes_the_transfer_longer_than_a_run_took():
    """Goodput near the link at every count leaves almost no room for idle time: b
    stops at its bound and the model's time without RTOs stays within every run."""
    t = curve()
    t["goodput_mbps"] = 900.0
    m = wren_model.fit(t, "200ms", R200, D, LINK)
    s = t["senders"].to_numpy(float)
    no_rto = D * 8 / LINK + (D / wren_model.MSS_BYTES) * m.b_s * np.minimum(s, m.knee)
    assert np.all(no_rto <= s * D * 8 / 900e6 * (1 + 1e-9))
    assert 0 <= m.b_s <= m.b_max_s


def test_the_papers_parameters_describe_a_curve_they_made():
    """Eq. 3 and 5 with the paper's numbers (R scaled to our 20 blocks), only k fitted."""
    s = np.array(SENDERS, float)
    t = curve()
    t["goodput_mbps"] = wren_model._paper_goodput(s, D, LINK, R200, 20, 3.0)
    t["timeouts"] = wren_model.PAPER_RTOS * np.minimum(s, 10) * 20 / 100 * s
    m = wren_model.fit(t, "200ms", R200, D, LINK, blocks=20)
    assert m.paper_k == pytest.approx(3.0) and m.paper_rms_share < 1e-9
    assert m.knee == 10 and m.a == pytest.approx(wren_model.PAPER_RTOS * 20 / 100)


def test_the_regions_are_found_on_the_median_curve():
    s = [1, 2, 4, 6, 8, 12, 16, 24, 32, 48]
    # A dip at 4 that comes back is no collapse (not below half); the collapse bottoms
    # out at 16, recovers to 32 and declines at 48.
    g = [940, 940, 620, 940, 360, 200, 150, 190, 230, 180]
    assert wren_model.regions(s, g) == {"R1": 16, "R2": 32, "R3": 48}
    assert wren_model.regions(s, [940, 940, 940, 940, 939, 939, 938, 935, 925, 860]) == \
        {"R1": None, "R2": None, "R3": None}
    assert wren_model.regions(s, [940, 900, 600, 300, 200, 150, 140, 130, 120, 110]) == \
        {"R1": 48, "R2": None, "R3": None}


def test_too_few_sender_counts_are_refused():
    with pytest.raises(ValueError, match="three sender counts"):
        wren_model.fit(curve(senders=[16, 48]), "200ms", R200, D, LINK)


def test_a_wren_figure_fits_and_draws_the_model(tmp_path):
    fig = figure.load("wren09-rto")
    rows = []
    for series, a in (("200ms", 0.3), ("1ms", 0.5)):
        t = curve(a=a)
        for _, r in t.iterrows():
            rows.append({"rto_min": series, "senders": int(r["senders"]), "goodput_mbps": r["goodput_mbps"],
                         "timeouts": r["timeouts"], "blocks": 20, "rto_min_us": 200_000 if series == "200ms" else 1000,
                         "link_mbps": 1000.0, "fidelity_ok": True})
    table = pd.DataFrame(rows)
    fits = make.model_fits(fig, table, quick=False)
    assert {m.series for m in fits} == {"200ms", "1ms"}
    json.dumps([m.as_dict() for m in fits])         # verdicts.json takes them
    out = make.plot(fig, table, tmp_path / "f.png", quick=False, fits=fits)
    assert out.stat().st_size > 10_000


def test_the_kept_result_holds_what_the_page_says():
    """docs/figures.md draws the model's table from docs/results/wren09-model.csv: a fit
    of the kept wren09-rto result made now has every parameter inside its bounds and
    the verdict, the bounds hit, the regions and the numbers the file recorded."""
    fits = {m.series: m for m in wren_table.fit_kept(KEPT)}
    recorded = {str(r["series"]): r for r in doc_tables.rows(RECORD)}
    assert set(fits) == set(recorded)
    table = judge.faithful_rows(pd.read_parquet(KEPT / "sweep.parquet"))
    for series, m in fits.items():
        runs = table[table["rto_min"] == series]
        s = np.sort(runs["senders"].unique()).astype(float)
        assert a_whole_number_within(m.knee, s) and m.a >= 0 and m.k > 0 and 0 <= m.b_s <= m.b_max_s
        # b's bound, checked against the runs themselves: the model's time without RTOs
        # is never longer than the fastest run at any sender count.
        fastest = runs.groupby("senders")["goodput_mbps"].max().reindex(s).to_numpy()
        no_rto = m.data_bytes * 8 / m.link_bps + (m.data_bytes / wren_model.MSS_BYTES) * m.b_s * np.minimum(s, m.knee)
        assert np.all(no_rto <= s * m.data_bytes * 8 / (fastest * 1e6) * (1 + 1e-9)), series

        row = recorded[series]
        assert m.verdict == row["verdict"], series
        assert (", ".join(m.at_bound) or "none") == row["at_bound"], series
        for region, col in (("R1", "r1"), ("R2", "r2"), ("R3", "r3")):
            assert (m.regions[region] if m.regions[region] is not None else "—") == row[col], (series, region)
        assert ("; ".join(m.reasons) or "—") == row["reasons"], series
        fresh = wren_table.record_rows(KEPT, [m])[0]
        assert set(fresh) == set(row), series
        for col, value in fresh.items():
            if isinstance(value, float):      # to the digit recorded (one step of rounding either way)
                assert abs(value - row[col]) <= 1.01 * last_digit(row[col]), (series, col, value, row[col])
            elif col not in ("command", "commit"):
                assert value == row[col], (series, col, value, row[col])


def a_whole_number_within(knee, senders) -> bool:
    return float(knee).is_integer() and senders.min() <= knee <= senders.max()


def last_digit(recorded) -> float:
    text = repr(recorded)
    return 10.0 ** -len(text.split(".")[1]) if "." in text else 1.0
