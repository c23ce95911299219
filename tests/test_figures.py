"""The figure catalog: every file is valid and runs what it compares; claims are
judged on the sweep table; a figure's quick mode runs where its parts exist."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from conftest import incast_cmd, needs_root
from incast.report import figures
from incast import scenario
from incast.run import sweep


@pytest.mark.parametrize("name", figures.known())
def test_every_figure_names_what_its_sweep_runs(name):
    fig = figures.load(name)
    assert fig.caption and fig.claims, "a figure says what the paper claims"
    for quick in (False, True):
        data, overrides, grid, repeat = figures.plan(fig, quick)
        points = sweep.expand(data, overrides, sweep.parse_grid([], grid))   # every point validates
        assert points
        series = {str(v) for v in grid[fig.series]}
        for c in fig.claims:
            assert c.series in series and (c.below_series is None or c.below_series in series), c.text
        for n in fig.paper_numbers:
            assert n.series in series
            if not quick:
                assert str(int(n.x)) in grid[fig.x], f"{n.x} is not on the full grid"
    for n in fig.paper_numbers:
        assert len(n.source) > 40, "the sentence the number comes from"


def table(rows):
    return pd.DataFrame([{"rto_min": s, "senders": x, "goodput_mbps": g, "link_mbps": 1000.0}
                         for s, x, g in rows])


def test_claims_are_judged_on_the_mean_of_repetitions():
    fig = figures.Figure(paper="P", figure="F", caption="c", sweep="s.toml", series="rto_min", claims=[
        {"text": "collapse", "series": "200ms", "from": 8, "below": 0.25},
        {"text": "recovery", "series": "200us", "from": 1, "above": 0.85},
        {"text": "gap", "series": "200ms", "at": 16, "below_series": "200us", "margin_mbps": 500},
        {"text": "wider gap", "series": "200ms", "at": 16, "below_series": "200us", "margin_mbps": 501},
        {"text": "absent", "series": "1ms", "at": 16, "below": 0.5}])
    t = table([("200ms", 1, 940), ("200ms", 8, 150), ("200ms", 16, 100), ("200ms", 16, 300),
               ("200us", 1, 941), ("200us", 8, 900), ("200us", 16, 700)])
    v = {r["claim"]: r for r in figures.judge(fig, t)}
    # 8: 150 and 16: the mean of 100 and 300, both below 25% of the payload limit (235.4)
    assert v["collapse"]["verdict"] == "holds" and "16: 200.0" in v["collapse"]["detail"]
    assert v["recovery"]["verdict"] == "does not hold" and "16: 700.0" in v["recovery"]["detail"]
    assert v["gap"]["verdict"] == "holds"               # 200 <= 700 - 500
    assert v["wider gap"]["verdict"] == "does not hold"
    assert v["absent"]["verdict"] == "not testable"


def test_an_unknown_figure_is_refused():
    r = incast_cmd("figure", "no-such-figure")
    assert r.returncode == 2 and "incast figure list" in r.stderr
    r = incast_cmd("figure", "list")
    assert r.returncode == 0 and all(n in r.stdout for n in figures.known())


@needs_root
@pytest.mark.network
def test_a_figure_runs_quick_and_is_judged(tmp_path, no_leftovers):
    """FAST'08 Figure 3 on the linux data plane in real time: its quick grid runs and
    gives a picture, the paper-vs-ours table and a verdict for every claim."""
    r = incast_cmd("figure", "fast08-fig3", "--quick", "--json", "--out", tmp_path / "f")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["quick"] and out["runs"] == 3
    assert all(v["verdict"] in ("holds", "does not hold", "not testable") for v in out["verdicts"])
    assert len(out["verdicts"]) == len(figures.load("fast08-fig3").claims)
    for f in ("figure.png", "comparison.csv", "verdicts.json", "sweep.parquet"):
        assert (tmp_path / "f" / f).is_file(), f
    comp = pd.read_csv(tmp_path / "f" / "comparison.csv")
    assert list(comp["paper"]) == [500]


@needs_root
@pytest.mark.network
@pytest.mark.figure
@pytest.mark.parametrize("name", [n for n in figures.known() if n != "fast08-fig3"])
def test_every_figure_runs_quick(name, tmp_path, no_leftovers):
    """Every figure's quick mode, where its parts exist: it runs, draws, and gives the
    paper-vs-ours table and a verdict for every claim (which quick grids may not test)."""
    fig = figures.load(name)
    why = figures.missing(fig)
    if why:
        pytest.skip("; ".join(why))
    r = incast_cmd("figure", name, "--quick", "--json", "--out", tmp_path / "f")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["quick"] and out["runs"] > 0
    assert len(out["verdicts"]) == len(fig.claims)
    assert all(v["verdict"] in ("holds", "does not hold", "not testable") for v in out["verdicts"])
    assert (tmp_path / "f" / "figure.png").stat().st_size > 10_000
    table = pd.read_parquet(tmp_path / "f" / "sweep.parquet")
    assert len(table) == out["runs"] and (table["goodput_mbps"] > 0).all()
