"""WREN'09's goodput model (incast.report.wren_model): the fit recovers the parameters
of a curve the model made, says how far it is from a curve it cannot make, and lands in
a WREN figure's verdicts and picture."""
import numpy as np
import pandas as pd
import pytest

from incast.report import figures, wren_model

D, LINK, R200 = 256 * 1024 * 20, 1e9, 0.2
SENDERS = [1, 2, 4, 8, 12, 16, 24, 32, 48]


def curve(a=3.5 / 20, knee=10, b=4.5e-5, k=0.02, senders=SENDERS):
    s = np.array(senders, float)
    g = wren_model._goodput(s, D, LINK, R200, a, knee, b, k)
    return pd.DataFrame({"senders": s, "goodput_mbps": g, "timeouts": a * np.minimum(s, knee) * s})


def test_the_fit_recovers_the_parameters_of_a_curve_the_model_made():
    m = wren_model.fit(curve(), "200ms", R200, D, LINK)
    assert m.knee == 10 and m.a == pytest.approx(3.5 / 20, rel=1e-6)
    assert m.rms_share < 0.01, m
    assert m.b_s == pytest.approx(4.5e-5, rel=0.1) and m.k == pytest.approx(0.02, rel=0.1)


def test_the_fit_says_how_far_it_is_from_a_curve_it_cannot_make():
    t = curve()
    t["goodput_mbps"] = np.where(t["senders"] > 20, 900.0, 50.0)      # a step the model has no term for
    m = wren_model.fit(t, "200ms", R200, D, LINK)
    assert m.rms_share > 0.3, m
    assert "RMS" in m.label()


def test_too_few_sender_counts_are_refused():
    with pytest.raises(ValueError, match="three sender counts"):
        wren_model.fit(curve(senders=[16, 48]), "200ms", R200, D, LINK)


def test_a_wren_figure_fits_and_draws_the_model(tmp_path):
    fig = figures.load("wren09-rto")
    rows = []
    for series, a in (("200ms", 0.3), ("1ms", 0.5)):
        t = curve(a=a)
        for _, r in t.iterrows():
            rows.append({"rto_min": series, "senders": int(r["senders"]), "goodput_mbps": r["goodput_mbps"],
                         "timeouts": r["timeouts"], "blocks": 20, "rto_min_us": 200_000 if series == "200ms" else 1000,
                         "link_mbps": 1000.0, "fidelity_ok": True})
    table = pd.DataFrame(rows)
    fits = figures.model_fits(fig, table, quick=False)
    assert {m.series for m in fits} == {"200ms", "1ms"}
    out = figures.plot(fig, table, tmp_path / "f.png", quick=False, fits=fits)
    assert out.stat().st_size > 10_000
