"""A figure file's texts name the kept result's numbers instead of copying them
(incast.campaign.quote), so a kept result made again leaves no text quoting the old one."""
from __future__ import annotations

import pandas as pd
import pytest

from incast.campaign import figure, kept, quote

FIG = figure.Figure(name="toy", paper="P", figure="F", caption="c", sweep="s.toml", series="rto_min")


def runs(series: str, x: int, goodputs: list[float], timeouts: list[int], faithful: bool = True) -> list[dict]:
    return [{"rto_min": series, "senders": x, "goodput_mbps": g, "timeouts": t, "blocks": 10,
             "link_mbps": 1000.0, "fidelity_ok": faithful} for g, t in zip(goodputs, timeouts)]


TABLE = pd.DataFrame(runs("200ms", 3, [100.0, 150.0, 120.0, 130.0], [4, 8, 5, 6])
                     + runs("200ms", 3, [900.0], [0], faithful=False)
                     + runs("200us", 3, [930.0, 931.0], [0, 0]))


def test_names_are_filled_from_the_points_faithful_runs():
    text = ("ours {kept 200ms@3} Mbit/s ({range 200ms@3 timeouts} timeouts a run, {runs 200ms@3} runs, "
            "median {median 200ms@3}; R {kept 200ms@3 rto_events_per_sender_per_100_blocks}), "
            "{kept 200us@3} without, at {commit}")
    # the unfaithful 900 counts nowhere; R is 100 * timeouts / (senders * blocks)
    assert quote.fill(FIG, text, TABLE, {"commit": "413ee66e0a"}) == (
        "ours 125.0 [100.0-150.0] Mbit/s (4-8 timeouts a run, 4 runs, median 125.0; R 18.3 [13.3-26.7]), "
        "930.5 [930.0-931.0] without, at 413ee66")


@pytest.mark.parametrize("text, why", [
    ("{kept 1ms@3}", "no faithful run there"),
    ("{kept 200ms@4}", "no faithful run there"),
    ("{kept 200ms@3 drops}", "has no 'drops'"),
    ("{kept 200ms@three}", "is not a number"),
    ("{runs}", "name a point"),
    ("{commit}", "records no commit"),
])
def test_a_name_the_kept_result_cannot_fill_is_refused(text, why):
    with pytest.raises(quote.QuoteError, match=why):
        quote.fill(FIG, text, TABLE, {})


def test_a_run_without_the_point_leaves_its_name_as_written():
    """incast figure --quick prints the declared divergence with this run's numbers where
    it has the point, and the name where it has not."""
    assert quote.fill(FIG, "{kept 200ms@3} and {kept 200ms@47}", TABLE, strict=False) == \
        "125.0 [100.0-150.0] and {kept 200ms@47}"
    assert quote.fill(FIG, "{kept 200ms@47}", None) == "{kept 200ms@47}"     # no table: as written


def test_a_written_out_kept_number_is_found():
    assert quote.copied(FIG, "ours 125.0 [100.0-150.0] Mbit/s", TABLE) == ["200ms@3 goodput_mbps: 125.0 [100.0-150.0]"]
    # an ablation's row for the unchanged testbed is its own record
    assert quote.copied(FIG, "one setting changed: the testbed 125.0 [100.0-150.0]; 64 KiB 300.0", TABLE) == []
    assert quote.copied(FIG, "ours {kept 200ms@3}", TABLE) == []


@pytest.mark.parametrize("name", figure.known())
def test_every_figure_text_names_what_its_kept_result_gives(name):
    """Every name in a figure's divergences is one its kept result fills, and no
    divergence writes out a number of the kept result's points it could name."""
    fig = figure.load(name)
    result = kept.result(name)
    texts = [t for c in [*fig.claims, *fig.paper_numbers] for t in (c.divergence, c.undecided)]
    texts = [t for t in texts if t]
    if result is None:
        pytest.skip(f"{name} has no kept result")
    for text in texts:
        quote.fill(fig, text, *result)
        copies = quote.copied(fig, text, result[0])
        assert not copies, f"{name}: a divergence writes out its kept result's {copies}: name them (incast.campaign.quote)"


def test_bytes_over_time_is_named_with_its_interval():
    """{pooled S@X}: the point's goodput as the verdict takes it, all its faithful runs'
    bytes over their time (the unfaithful 900 left out), with the bootstrap-t interval."""
    from incast.campaign import judge
    value, lo, hi, _ = judge.point_value(FIG, TABLE, "200ms", 3, "goodput_mbps", judge.POOLED)
    assert abs(value - 4 / (1 / 100 + 1 / 150 + 1 / 120 + 1 / 130)) < 0.01     # 122.35
    assert quote.fill(FIG, "{pooled 200ms@3}", TABLE) == f"{value:.1f} [{lo:.1f}-{hi:.1f}]"
    with pytest.raises(quote.QuoteError, match="a goodput's"):
        quote.fill(FIG, "{pooled 200ms@3 timeouts}", TABLE)
