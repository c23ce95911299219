"""The papers' testbeds: each setting quotes its paper, the scenario's own settings win
over the profile's, and a figure runs on its paper's testbed."""
from __future__ import annotations

import pytest

from incast import scenario as scn
from incast import testbed
from incast.campaign import figure


@pytest.mark.parametrize("name", testbed.known())
def test_every_testbed_quotes_its_paper_and_validates(name):
    t = testbed.load(name)
    assert t.paper and t.what and t.settings
    fields = [s.field for s in t.settings]
    assert len(fields) == len(set(fields)), "one value per field"
    for s in t.settings:
        scn.resolve_field(s.field)                  # a real scenario field
        assert len(s.source) >= 20, f"{s.field}: the sentence the setting comes from"
    built = scn.build({"testbed": name})
    assert built.testbed == name and built.link.rate == 10**9     # every paper ran 1 Gbit/s


def test_the_scenario_wins_over_its_testbed():
    s = scn.build({"testbed": "sigcomm09-s50"})
    assert (s.switch.buffer, s.link.delay, s.tcp.era) == (64 * 1024, 50, "linux-2.6.28")
    assert s.tcp.hosts == {"client": "client-without-delayed-ack"}
    assert s.tcp.for_host("client").delayed_ack is False and s.tcp.for_host("server1").delayed_ack is True
    # Today's kernel is one setting away; a buffer in packets replaces the testbed's bytes.
    s = scn.build({"testbed": "sigcomm09-s50", "switch": {"buffer_packets": 40}}, {"tcp.era": "modern"})
    assert s.tcp.era == "modern" and s.switch.buffer is None and s.switch.buffer_packets == 40
    assert s.link.delay == 50                       # the rest stays the paper's
    # Without a testbed nothing changes.
    assert scn.build({}).link.delay == 0 and scn.build({}).tcp.era == "modern"


def test_an_unknown_testbed_is_refused_in_one_line():
    with pytest.raises(scn.ScenarioError, match="unknown testbed 'nope'; one of: .*sigcomm09-s50"):
        scn.build({"testbed": "nope"})


def test_the_resolved_scenario_names_its_testbed_and_rebuilds_the_same():
    import tomllib
    s = scn.build({"testbed": "wren09-nortel5500"}, {"senders": "8"})
    again = scn.build(tomllib.loads(scn.to_toml(s)))
    assert again == s and again.testbed == "wren09-nortel5500"


def test_figure_1_runs_on_its_papers_testbed():
    fig = figure.load("sigcomm09-fig1")
    data, overrides, grid, _ = figure.plan(fig, quick=False)
    from incast.run import sweep
    _, s = sweep.expand(data, overrides, sweep.parse_grid([], grid))[0]
    assert s.testbed == "sigcomm09-s50"
    assert s.link.rate == 10**9 and s.switch.buffer == 64 * 1024 and s.tcp.era == "linux-2.6.28"
