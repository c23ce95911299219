"""Ethernet flow control on the linux data plane across switches, in virtual time:
PAUSE's head-of-line blocking of an innocent flow (FAST'08 §6), PFC removing it, and a
pause storm caught by the watchdog. The runs are the scenarios users run
(scenarios/two-switch-pfc.toml, leaf-spine-pfc.toml, pause-storm.toml), with the comparisons their comments
name. They skip where the UML kernels are not built (the host kernel has no plug qdisc
to hold a switch queue with)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from conftest import our_netns, our_state, run_json
from test_virtual_time import needs

pytestmark = pytest.mark.network

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def runs_leaving_nothing(root, scenario: str, modes: dict[str, list[str]], common: tuple = ()) -> dict:
    """Run the scenario once per mode (its extra flags); every run must leave no
    namespace or run state behind (the module's runs happen before any test's
    no_leftovers fixture looks)."""
    before = our_netns(), our_state()
    runs = {}
    try:
        for mode, extra in modes.items():
            runs[mode] = run_json(str(SCENARIOS / scenario), *common, *extra, "--out", root / mode)
            runs[mode]["dir"] = root / mode
    finally:
        left = our_netns() - before[0], our_state() - before[1]
    assert not any(left), f"runs left behind: {left}"
    return runs


@pytest.fixture(scope="module")
def two_switch(tmp_path_factory):
    return two_switch_runs(tmp_path_factory.mktemp("pfc"))


def two_switch_runs(root, common: tuple = ()) -> dict:
    """The incast (class 0) and an innocent far1 -> near1 flow (class 1) sharing the
    trunk, with PFC, with 802.3x PAUSE, and with no flow control."""
    return runs_leaving_nothing(root, "two-switch-pfc.toml", {
        "pfc": [], "pause": ["--set", "switch.pause.pfc=false"], "none": ["--set", "switch.pause.enabled=false"]},
        common)


def check_pause_stops_the_innocent_flow(runs) -> None:
    """What 802.3x PAUSE across two switches must show (the linux and bmv2 planes)."""
    pause, none = runs["pause"], runs["none"]
    # Lossless: every switch queue stayed within its buffer (measured: 0 drops; with no
    # flow control 1719 drops and 18 timeouts).
    assert none["drops"] > 100, none["drops"]
    assert pause["drops"] == 0, pause["drops"]
    # Head-of-line blocking: s1 paused the trunk, s2 held it and paused far1 in turn.
    ports = pd.read_parquet(pause["dir"] / "pause_ports.parquet").set_index("port")
    trunk_at_s2 = ports[(ports["switch"] == "s2") & (ports["peer"] == "s1")].iloc[0]
    assert trunk_at_s2["pause_received"] > 0 and trunk_at_s2["held_ms"] > 1.0, trunk_at_s2
    assert ports[ports["peer"] == "far1"]["pause_sent"].iloc[0] > 0
    # The innocent flow loses most of its throughput (measured: 840.8 -> 133.9 Mbit/s).
    (innocent_pause,), (innocent_none,) = pause["background_mbps"], none["background_mbps"]
    assert innocent_pause < 0.5 * innocent_none, (innocent_pause, innocent_none)


def check_pfc_pauses_only_the_congested_class(runs) -> None:
    pfc, pause = runs["pfc"], runs["pause"]
    assert pfc["drops"] == 0, pfc["drops"]
    # The trunk's class-1 queue kept flowing: far1 (class 1 only) was never stopped.
    (innocent_pfc,), (innocent_pause,) = pfc["background_mbps"], pause["background_mbps"]
    assert innocent_pfc > 2 * innocent_pause, (innocent_pfc, innocent_pause)   # measured 470.8 vs 133.9
    # ... and the incast lost nothing by it (measured 940.7 vs 845.9 Mbit/s).
    assert pfc["goodput_mbps"] >= 0.95 * pause["goodput_mbps"], (pfc["goodput_mbps"], pause["goodput_mbps"])


@needs("uml-stock")
def test_pause_stops_the_innocent_flow_across_the_trunk(two_switch, no_leftovers):
    check_pause_stops_the_innocent_flow(two_switch)


@needs("uml-stock")
def test_pfc_pauses_only_the_congested_class(two_switch, no_leftovers):
    check_pfc_pauses_only_the_congested_class(two_switch)


@pytest.fixture(scope="module")
def leaf_spine(tmp_path_factory):
    """The incast climbs through spine s3, the innocent flow through s4: disjoint paths
    between the leaves, with 802.3x PAUSE and with PFC."""
    return runs_leaving_nothing(tmp_path_factory.mktemp("leafspine"), "leaf-spine-pfc.toml", {
        "pfc": [], "pause": ["--set", "switch.pause.pfc=false"]})


@needs("uml-stock")
def test_pause_spreads_through_a_spine_the_incast_never_used(leaf_spine, no_leftovers):
    pause, pfc = leaf_spine["pause"], leaf_spine["pfc"]
    assert pause["drops"] == 0 and pfc["drops"] == 0, (pause["drops"], pfc["drops"])
    ports = pd.read_parquet(pause["dir"] / "pause_ports.parquet")
    at = ports.set_index(["switch", "peer"])
    # s1's client port paused both uplinks; s4 (the innocent flow's spine) filled and
    # paused leaf s2 in turn (measured: held 114.7 ms at s4, 181.2 ms at s2's uplink).
    assert at.loc[("s4", "s1"), "held_ms"] > 1 and at.loc[("s4", "s2"), "pause_received"] > 0, at
    (innocent_pause,), (innocent_pfc,) = pause["background_mbps"], pfc["background_mbps"]
    # measured: 157.7 with PAUSE, 941.6 with PFC (the payload limit: untouched)
    assert innocent_pause < 0.5 * innocent_pfc and innocent_pfc > 0.9 * 941, (innocent_pause, innocent_pfc)


@pytest.fixture(scope="module")
def storm(tmp_path_factory):
    runs = runs_leaving_nothing(tmp_path_factory.mktemp("storm"), "pause-storm.toml", {
        "watchdog": [], "none": ["--set", "switch.pause.watchdog=none"]})
    for run in runs.values():
        run["blocks"] = pd.read_parquet(run["dir"] / "blocks.parquet")
    return runs


@needs("uml-stock")
def test_a_pause_storm_freezes_the_network_without_the_watchdog(storm, no_leftovers):
    s = storm["none"]
    length_ms = (s["storm_end_us"] - s["storm_start_us"]) / 1000
    assert 55 < length_ms < 65, length_ms                       # 60 ms asked for
    assert s["watchdog_fired"] == 0
    # near1's port is held for the whole storm, fills, and the switch pauses every
    # other port: a block spans the storm (measured: 62.5 ms against 4.5).
    assert s["blocks"]["duration_ms"].max() > 0.8 * length_ms, s["blocks"]["duration_ms"].max()


@needs("uml-stock")
def test_the_watchdog_catches_the_storm_and_the_network_recovers(storm, no_leftovers):
    s = storm["watchdog"]
    assert s["watchdog_fired"] >= 1 and s["watchdog_restored"] >= 1, s
    # Held for the detection time only (5 ms), then drained by dropping: the longest
    # block is a few milliseconds longer than the rest (measured: 7.5 ms vs 4.5).
    assert s["switch_held_ms"] < 10, s["switch_held_ms"]
    blocks = s["blocks"]["duration_ms"]
    assert blocks.max() < 15 and blocks.max() < 0.3 * storm["none"]["blocks"]["duration_ms"].max()
    assert s["goodput_mbps"] > storm["none"]["goodput_mbps"]


@pytest.mark.parametrize("senders, reaction_us, holds", [
    (8, 1.0, True),       # two frames each: the default XOFF leaves exactly that (24224 B)
    (16, 1.0, False),     # 48448 B to hold, but XOFF cannot go below an eighth of 32 KiB
    (8, 3300.0, False),   # a 3.3 ms reaction (real time, a busy machine) sends 412 KB each
])
def test_pause_headroom_follows_senders_rate_and_reaction(senders, reaction_us, holds):
    """The buffer above XOFF against what can still arrive once a port passes it; a run
    whose measured reaction needs more than the buffer holds warns (experiment._summary)."""
    from incast.network.flow_control import headroom_bytes, headroom_needed
    from incast.scenario import build
    s = build({"switch": {"pause": {"enabled": True}}, "topology": {"senders": senders},
               "link": {"rate": "1Gbit"}})
    room, needed = headroom_bytes(s), headroom_needed(s, reaction_us)
    assert room == 32 * 1024 - s.switch.port_pause_thresholds(1500, senders)[0]
    assert (needed <= room) is holds, (room, needed)
    assert needed >= senders * 2 * 1514


@pytest.mark.parametrize("gap_us, faithful", [
    (3.1, True),          # the default grid, a quarter of a frame's time at 1 Gbit/s
    (12.3, False),        # a frame's time: with the hosts' 0.3 us, 61 B more a sender (163 drops measured)
    (97.8, False),        # 12 KB more a sender
])
def test_a_switch_that_reads_its_queues_late_is_not_faithful(gap_us, faithful):
    """The linux data plane's switches read their queues on a grid: a read later than the
    buffer above XOFF allows lets in what a switch checking every enqueue would have
    held back, and the run says so as bmv2's does (a fidelity reason)."""
    from incast.clock import VIRTUAL
    from incast.measure import fidelity
    from incast.network.flow_control import headroom_bytes, switch_detection_lag
    from incast.scenario import build
    s = build({"switch": {"pause": {"enabled": True}}, "topology": {"senders": 8}, "link": {"rate": "1Gbit"}})
    summary = {"switch_pause_xoff_lag_us_max": gap_us, "pause_reaction_worst_us": 0.3}
    late = switch_detection_lag(summary, s, headroom_bytes(s))
    assert (late is None) is faithful, late
    if late:
        assert f"up to {gap_us:.1f} us after the read before" in late
        verdict = fidelity.assess([], None, {}, 0, [late], False, measured_ms=1000, clock=VIRTUAL)
        assert verdict["reasons"] == ["PAUSE could not keep this switch lossless"], verdict


TOLD_BLOCKS = 3


@pytest.fixture(scope="module")
def fast08_pause(tmp_path_factory):
    """FAST'08's 32 KB port with PAUSE at 8 servers, as runs have it by default."""
    return runs_leaving_nothing(tmp_path_factory.mktemp("fast08"), "fast08-collapse.toml", {"pause": []}, (
        "--testbed", "fast08-procurve", "--clock", "virtual", "--kernel", "stock", "--link-rate", "1Gbit",
        "--set", "switch.pause.enabled=true", "--set", "workload.server_process=shared", "--senders", "8",
        "--blocks", str(TOLD_BLOCKS)))["pause"]


@needs("uml-stock")
def test_the_switch_is_told_each_crossing_and_reads_nothing_between(fast08_pause, no_leftovers):
    """In the UML kernels the plug qdisc tells each XOFF and XON crossing
    (kernels/patches-um/0004), so hosts/switch_pause.py reads the queues once, at its
    start, and is woken by the kernel for the rest. FAST'08's 32 KB port with PAUSE at 8
    servers: every block's burst crosses XOFF (an XOFF and an XON told at least per
    block), and the queues' telemetry never shows a port past XOFF by more than the
    headroom the thresholds leave (a switch seeing every enqueue drops nothing)."""
    blocks, s = TOLD_BLOCKS, fast08_pause
    assert s["switch_pause_watch"] == "told", s["switch_pause_watch"]
    assert s["switch_pause_polls"] == 1, s["switch_pause_polls"]         # the read at its start
    assert s["switch_pause_crossings_told"] >= 2 * blocks, s["switch_pause_crossings_told"]
    assert s["pause_frames"] >= blocks, s["pause_frames"]
    assert s["switch_pause_xoff_lag_us_max"] == 0, s["switch_pause_xoff_lag_us_max"]
    # Each decision (the client's port crossing XOFF or XON, a refresh) tells the 8
    # servers' ports at once, in one system call (Frames: sendmmsg), not one a frame.
    sent = s["pause_frames_sent"] + s["xon_frames_sent"]
    assert 0 < s["switch_pause_send_calls"] <= sent / 8, (s["switch_pause_send_calls"], sent)
    assert s["fidelity"]["ok"], s["fidelity"]["reasons"]


@needs("uml-stock")
def test_the_hosts_kernel_obeys_pause_and_no_agent_runs(fast08_pause, no_leftovers):
    """In the UML kernels each host's NIC plug obeys PAUSE itself
    (kernels/patches-um/0005): no host starts hosts/pause_agent.py, every frame the
    switch sent a host was obeyed by that host's kernel, its queue was held, and the
    port stayed lossless (as with the agents: 0 drops at 8 servers)."""
    s = fast08_pause
    assert s["host_pause_obeyed_by"] == "kernel" and s["host_pause_agents"] == 0, s["host_pause_obeyed_by"]
    sent = s["pause_frames_sent"] + s["xon_frames_sent"]
    assert sent >= TOLD_BLOCKS and s["pause_frames_received"] == sent, (s["pause_frames_received"], sent)
    assert s["paused_ms"] > 0, s["paused_ms"]
    # The kernel stops the queue as the frame arrives: no reaction measured, and the
    # headroom needed is the frames on their way and the one on the wire.
    assert s["pause_reaction_us_p50"] is None and s["pause_reaction_worst_us"] == 0
    assert s["pause_headroom_needed_bytes"] <= s["pause_headroom_bytes"], s
    assert s["drops"] == 0, s["drops"]
    assert s["fidelity"]["ok"], s["fidelity"]["reasons"]


class _Host:
    def __init__(self, name):
        self.name = name


def test_hosts_whose_plug_refuses_to_obey_fall_back_to_their_agent(monkeypatch):
    """A kernel whose plug lacks TCQ_PLUG_OBEY (the host's, the QEMU kernels, UML
    kernels before kernels/patches-um/0005) refuses it with EINVAL: that host is left
    to its agent, and any other error fails the run. switch.pause.hosts=agent asks for
    agents everywhere."""
    import errno
    from types import SimpleNamespace
    from incast.errors import RunFailed
    from incast.network import flow_control, hostconfig
    from incast.scenario import build
    s = build({"switch": {"pause": {"enabled": True}}, "link": {"rate": "1Gbit"}})
    features = SimpleNamespace(qdiscs={"plug": True})
    hosts = [_Host("h1"), _Host("h2")]
    told = []

    class Everyone:     # each host's function, here in this namespace
        def __init__(self, hosts, fn, errors=(OSError,)):
            self.results = {}
            for h in hosts:
                try:
                    self.results[h.name] = (None, fn(h))
                except errors as e:
                    self.results[h.name] = (str(e), None)

        def join(self):
            return self.results

    def plug_action(index, *, handle, parent, action, limit):
        told.append((index, action, limit))
        if index == 2:
            raise OSError(refusal, "refused")
    monkeypatch.setattr(hostconfig, "InEachNamespace", Everyone)
    monkeypatch.setattr(flow_control.socket, "if_nametoindex", lambda name: int(name[-1]))
    monkeypatch.setattr(flow_control.netdev, "plug_action", plug_action)
    for h in hosts:
        h.defaultIntf = (lambda n: lambda: SimpleNamespace(name=f"eth{n}"))(h.name[-1])
    classes = {"h1": {0, 2}, "h2": {0}}
    refusal = errno.EINVAL
    assert [h.name for h in flow_control.obey_in_kernel(hosts, s, features, classes)] == ["h1"]
    # h1: its classes (0b101), then the rate in kbit/s
    assert told[:2] == [(1, 7, 0b101), (1, 6, 1_000_000)], told
    refusal = errno.EPERM
    with pytest.raises(RunFailed, match="obey PAUSE"):
        flow_control.obey_in_kernel(hosts, s, features, classes)
    agents = build({"switch": {"pause": {"enabled": True, "hosts": "agent"}}, "link": {"rate": "1Gbit"}})
    told.clear()
    assert flow_control.obey_in_kernel(hosts, agents, features, classes) == [] and not told
    assert flow_control.obey_in_kernel(hosts, s, SimpleNamespace(qdiscs={}), classes) == []


def test_the_summary_says_how_the_hosts_obeyed(monkeypatch):
    """The kernels' counts join the agents' (frames obeyed, time paused); the hosts that
    obeyed in the kernel add no reaction, so the headroom needed is that of a reaction of
    0 (the frame on the wire)."""
    from types import SimpleNamespace
    from incast.network import flow_control, hostconfig
    from incast.scenario import build

    class Everyone:
        def __init__(self, hosts, fn, errors=(OSError,)):
            self.results = {h.name: (None, fn(h)) for h in hosts}

        def join(self):
            return self.results
    monkeypatch.setattr(hostconfig, "InEachNamespace", Everyone)
    monkeypatch.setattr(flow_control.socket, "if_nametoindex", lambda name: 1)
    monkeypatch.setattr(flow_control.netdev, "plug_xstats", lambda index, handle: {
        "pause_frames": 10, "resume_frames": 4, "pfc_ignored": 1, "paused_ns": 2_500_000})
    hosts = [_Host("h1"), _Host("h2")]
    for h in hosts:
        h.defaultIntf = lambda: SimpleNamespace(name="eth0")
    pause = {"paused_ms": 1.0, "pause_frames_received": 3, "pause_token_frames": 0, "reaction_us": [],
             "pause_frames_sent": 20, "xon_frames_sent": 8}
    pause.update(flow_control.obeyed_in_kernel(hosts, pause, agents=0, where=("1:1", "10:")))
    assert pause["host_pause_obeyed_by"] == "kernel" and pause["host_pause_pfc_ignored"] == 2
    assert pause["pause_frames_received"] == 3 + 28 and pause["paused_ms"] == 6.0
    assert flow_control.obeyed_in_kernel([], pause, agents=2)["host_pause_obeyed_by"] == "agent"
    assert flow_control.obeyed_in_kernel(hosts, pause, 1, ("1:1", "10:"))["host_pause_obeyed_by"] == "kernel and agent"
    s = build({"switch": {"pause": {"enabled": True}}, "topology": {"senders": 8}, "link": {"rate": "1Gbit"}})
    summary = flow_control.pause_summary(s, pause)
    assert summary["pause_reaction_worst_us"] == 0.0 and summary["pause_reaction_us_p50"] is None
    assert summary["pause_headroom_needed_bytes"] == flow_control.headroom_needed(s, 0.0)


@needs("uml-stock")
def test_the_switch_sleeps_through_quiet_time_and_wakes_for_each_burst(tmp_path, no_leftovers):
    """Reading on a grid (switch.pause.interval given, or a kernel whose plug cannot
    tell crossings), hosts/switch_pause.py stops reading the queues once they are empty
    and sleeps until a frame enters a switch port. FAST'08's 32 KB port with PAUSE at 16
    servers (more than its headroom holds: drops, 200 ms timeouts): the timeouts are
    slept through, and every block's burst, arriving at a sleeping switch, is still seen
    crossing XOFF."""
    blocks = 3
    s = run_json("scenarios/fast08-collapse.toml", "--testbed", "fast08-procurve", "--clock", "virtual",
                 "--kernel", "stock", "--link-rate", "1Gbit", "--set", "switch.pause.enabled=true",
                 "--set", "switch.pause.interval=3us",
                 "--set", "workload.server_process=shared", "--senders", "16", "--blocks", str(blocks),
                 "--out", tmp_path / "r")
    assert s["switch_pause_watch"] == "grid", s["switch_pause_watch"]
    assert s["timeouts"] >= 1, s["timeouts"]
    # A timeout's 200 ms, at least, asleep; on the grid that were 64500 reads.
    assert s["switch_pause_slept_ms"] >= 200, s["switch_pause_slept_ms"]
    # Each block (the warm-up's too) starts at a sleeping switch, and so does each
    # retransmission after a timeout; their bursts cross XOFF and the doorbell woke the
    # switch for them (measured: 19 such wakes in 3 blocks and the warm-up, 1540 ms
    # asleep; with 5 blocks 77522 reads and 78 host seconds, where reading on the grid
    # throughout took 836192 and 568).
    assert s["switch_pause_woke_to_xoff"] >= blocks, s["switch_pause_woke_to_xoff"]


def test_a_host_with_a_link_delay_obeys_in_a_plug_under_netem():
    """A link delay puts netem under the NIC's token bucket, where the plug would be:
    the plug the kernel obeys in goes under netem (frames that served their delay wait
    in it, as they wait in the token bucket the agent stops). With agents asked for, the
    NIC is as before: the agent slows the token bucket."""
    from types import SimpleNamespace
    from incast.network import hostconfig
    from incast.scenario import build
    features = SimpleNamespace(qdiscs={"plug": True}, clock=SimpleNamespace(exact_timers=True))
    delayed = {"switch": {"pause": {"enabled": True}}, "link": {"rate": "1Gbit", "delay": "50us"}}
    s = build(delayed)
    assert hostconfig.obeying_plug(s, features) == ("10:1", "20:")
    lines = hostconfig.nic_tc_commands("h0", s, features)
    assert lines.index(next(ln for ln in lines if " netem " in ln)) < lines.index(
        next(ln for ln in lines if "parent 10:1 handle 20: plug limit" in ln)), lines
    assert lines[-1] == "tc qdisc change dev h0 parent 10:1 handle 20: plug release_indefinite", lines
    agents = build({**delayed, "switch": {"pause": {"enabled": True, "hosts": "agent"}}})
    assert hostconfig.obeying_plug(agents, features) is None
    assert not any(" plug " in ln for ln in hostconfig.nic_tc_commands("h0", agents, features))
    assert hostconfig.obeying_plug(build({"link": {"rate": "1Gbit"}}), features) is None
    assert hostconfig.obeying_plug(build({"switch": {"pause": {"enabled": True}}}), features) == ("1:1", "10:")
