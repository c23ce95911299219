"""The papers' claims on the bmv2 data plane (p4src/incast.p4). Skipped, saying why,
where bmv2 or p4c is missing.

The link rate is one bmv2 keeps up with when every server sends at once: 8 servers
at 10 Mbit/s offer at most ~7 kpps of data, well below what simple_switch forwards.
The 32 KiB buffer leaves room above XOFF for two frames from each of them, so PAUSE
can make the switch lossless.
In real time at 100 Mbit/s bmv2's ingress falls behind the burst here, so packets wait
in its input queue where no PAUSE can hold them back; virtual time runs 100 Mbit/s and
1 Gbit/s (the tests at the end).
"""
import pandas as pd
import pytest

from conftest import NotFaithful, measurer, needs_root

pytestmark = [needs_root, pytest.mark.network, pytest.mark.p4, pytest.mark.scenario]

bmv2 = pytest.importorskip("incast.dataplane.bmv2")
from incast.machine.probe import MissingFeature  # noqa: E402

BUFFER = 32 * 1024
BASE = {"--switch": "bmv2", "--link-rate": "10Mbit", "--buffer": "32KiB", "--sru": "8KiB",
        "--cc": "reno", "--rto-min": "200ms", "--blocks": "20", "--warmup": "2"}
SENDERS = 8
# The collapse claims are judged on 100 blocks. At 10 Mbit/s a block takes ~60 ms and a
# 200 ms RTO costs four blocks' time, and how many blocks wait one out varies from run
# to run (1-11 of 20 in 16 runs): 20 blocks put a run's goodput across the claim's
# threshold in some runs (measured 2.7-5.8 Mbit/s against 0.65 x 8.8 = 5.7).
JUDGED = {"blocks": 100}


@pytest.fixture(scope="module", autouse=True)
def _bmv2_present():
    try:
        bmv2.bmv2_version()
        bmv2.compile_program()
    except MissingFeature as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def measure(tmp_path_factory):
    """Claims rest on faithful runs only. In real time bmv2 is a process that shares the
    machine's two cores with the hosts: on a busy machine its ingress falls behind (once
    615 of 8523 packets waited over 1 ms, against 1-3 % on an idle one), and the run says
    so itself. Such a run is made again once; if neither was faithful the test skips with
    the runs' reasons, since what it would judge is the machine's load, not the switch."""
    m = measurer(BASE, tmp_path_factory.mktemp("bmv2"), faithful_attempts=2)

    def faithful(**flags):
        try:
            return m(**flags)
        except NotFaithful as e:
            pytest.skip(f"this machine cannot run bmv2 faithfully in real time now: {e}")
    return faithful


def test_bmv2_collapse_with_200ms_rto(measure):
    one, many = measure(senders=1, **JUDGED), measure(senders=SENDERS, **JUDGED)
    # Measured: one server 8.9 Mbit/s; eight servers 2.7-5.8 Mbit/s over 20 blocks.
    assert one["goodput_mbps"] > 0.8 * one["link_mbps"], one
    assert many["goodput_mbps"] < 0.65 * one["goodput_mbps"], (one, many)
    # Some block waited out the 200 ms RTOmin. The kernel counts that wait as a timeout
    # or, where a fragment's last segment was lost, as a tail loss probe armed no earlier
    # than the RTO (see test_bmv2_collapse_is_explained): TCPTimeouts alone may be 0.
    assert many["block_ms_max"] >= many["rto_min_us"] / 1000 and many["bottleneck_drops"] > 0, many
    # The program's buffer is the only place packets are lost: no second queue (a
    # qdisc on the switch's ports, the kernel's input backlog) drops what TCP resends.
    # Retransmits exceed drops only by tail-loss probes (measured: equal).
    assert many["backlog_drops"] == 0, many
    assert many["retransmits"] <= 1.2 * many["drops"] + 10, many
    # bmv2 kept up: few packets waited over 1 ms before its ingress (measured: ~1-3 %,
    # scheduling hiccups; 43 % at 12 servers x 100 Mbit/s with PAUSE). A faithful run
    # implies it (bmv2.LATE_SHARE); asserted here on the run's own tables.
    queues = pd.read_parquet(f"{many['run_dir']}/queues.parquet")
    assert many["switch_ingress_late_packets"] < 0.05 * queues["sent_packets"].sum(), many
    # Once the run is over, the program's occupancy registers are back to zero: no
    # update between ingress and egress was lost (a lost one leaks buffer for good).
    # (When the last block is in, retransmissions the client did not need may still
    # be queued: queues.parquet's backlog_bytes, measured then, need not be 0.)
    assert many["switch_buffer_end_bytes"] == 0, many


def test_bmv2_recovery_with_lowest_rto_min(measure):
    """The lowest RTOmin recovers goodput, though less here than in the papers: at 10
    Mbit/s a full 32 KiB queue is 26 ms, so the RTO (SRTT + 4 RTTVAR) is far above the
    4 ms floor. Over 100 blocks the 200 ms runs got 4.1 and 5.0 Mbit/s, the lowest
    RTOmin 6.5 and 6.1: a ratio of 1.57 in one run and 1.22 in another, where the 200 ms
    run waited out few timeouts. A ratio of 1.3 or more (1.48 the smallest seen over 20
    blocks earlier) does not hold in every run, so the ratio is printed and what holds
    in every run is asserted: the lowest RTOmin is faster, and no block of it waits as
    long as a 200 ms timeout (longest block: 145.1 ms against 323.4 in the 1.22 run)."""
    slow = measure(senders=SENDERS, **JUDGED)
    fast = measure(senders=SENDERS, rto_min="min", **JUDGED)
    print(f"lowest RTOmin / 200 ms: {fast['goodput_mbps']:.2f} / {slow['goodput_mbps']:.2f} Mbit/s = "
          f"{fast['goodput_mbps'] / slow['goodput_mbps']:.2f}")
    assert fast["goodput_mbps"] > slow["goodput_mbps"], (slow, fast)
    assert fast["goodput_mbps"] > 0.5 * fast["link_mbps"], fast
    assert fast["block_ms_max"] < 200 <= slow["block_ms_max"], (slow, fast)


def test_bmv2_pause_removes_the_collapse(measure):
    plain = measure(senders=SENDERS, **JUDGED)
    # Only runs flagged not faithful skip (a run that fails fails): they say themselves
    # that their losses are the emulator's (bmv2's ingress lagged longer than the headroom
    # above XOFF covers), so losslessness cannot be judged on this machine in real time.
    # Virtual time judges it (test_bmv2_pause_in_virtual_time_is_lossless).
    paused = measure(senders=SENDERS, pause="on")
    # Measured: 8.6 Mbit/s, 0 drops in most runs, 1 in some (against ~120 without
    # PAUSE); one drop that costs a 200 ms timeout leaves ~7 Mbit/s.
    assert paused["goodput_mbps"] >= 1.5 * plain["goodput_mbps"], (plain, paused)
    assert paused["goodput_mbps"] > 0.65 * paused["link_mbps"], paused
    per_block = int(BASE["--blocks"]) / JUDGED["blocks"]
    assert paused["bottleneck_drops"] <= 0.25 * per_block * plain["bottleneck_drops"], (plain, paused)
    # The machinery did it: XOFF and XON events, frames sent and obeyed.
    assert paused["pause_xoff_events"] > 0 and paused["pause_xon_events"] > 0, paused
    assert paused["pause_frames"] > 0 and paused["pause_frames_received"] > 0, paused
    assert paused["paused_ms"] > 0, paused
    assert paused["mac_control_rx"] > 0, paused          # the agents' own frames, consumed
    assert paused["pause_reaction_us_p50"] < 2000, paused


def test_bmv2_telemetry_from_the_p4_pipeline(measure):
    s = measure(senders=SENDERS, set="telemetry.enabled=true")
    import pandas as pd
    tele = pd.read_parquet(f"{s['run_dir']}/telemetry.parquet")
    port = s["bottleneck_port"]
    q = tele[(tele["port"] == port) & (tele["event"] != "drop")]
    # The program's byte limit holds, and the queue does fill to it.
    assert q["bytes"].max() <= BUFFER
    assert q["bytes"].max() >= BUFFER - 1514
    assert (q["sojourn_us"].dropna() >= 0).all()
    drops = tele[(tele["port"] == port) & (tele["event"] == "drop") & (tele["time_us"] >= 0)]
    assert s["bottleneck_drops"] > 0
    assert abs(len(drops) - s["bottleneck_drops"]) <= s["telemetry_lost"], (len(drops), s)


def _flags(**extra) -> list[str]:
    return [x for kv in {**BASE, **extra}.items() for x in kv]


def test_bmv2_collapse_is_explained(tmp_path, no_leftovers):
    """incast explain reads a P4 switch's run as it reads a kernel bridge's: the servers'
    capture holds every timeout the kernel counted (and no more than timeouts plus loss
    probes), each classified, and some block waited out one of them.

    The kernel's TCPTimeouts alone may be 0 here: when the last segment of a fragment is
    lost, the tail loss probe is armed no earlier than the RTO (one packet out: 2 srtt +
    RTOmin) and the resend after 200 ms of silence is counted as a probe (measured: 1-4
    TCPTimeouts, 30 probes, 8 timeout-length waits in the trace over 20 blocks)."""
    import json
    from conftest import incast_cmd, run_json
    s = run_json(*_flags(**{"--senders": str(SENDERS)}), "--capture", "--out", tmp_path / "r")
    assert s["capture_dropped"] == 0 and s["drops"] > 0, s
    r = incast_cmd("explain", str(tmp_path / "r"), "--json")
    assert r.returncode == 0, r.stderr
    t = json.loads(r.stdout)
    from incast.report import explain
    assert t["consistent_with_kernel"], t
    assert sum(t[c] for c in explain.CAUSES) == t["timeouts"] > 0, t
    assert t["blocks_decided_by_a_timeout"] > 0, t


def test_bmv2_forwards_across_two_switches(tmp_path, measure):
    """Each switch's tables send a host behind the other switch to the trunk."""
    from conftest import run_json
    import pandas as pd
    s = run_json(*_flags(**{"--senders": "4"}), "--set", "topology.kind=two_switch",
                 "--set", "topology.others=1", "--out", tmp_path / "two")
    blocks = pd.read_parquet(tmp_path / "two" / "blocks.parquet")
    assert len(blocks) == 20 and s["goodput_mbps"] > 0.5 * s["link_mbps"], s
    queues = pd.read_parquet(tmp_path / "two" / "queues.parquet")
    trunk = queues[(queues["switch"] == "s2") & (queues["peer"] == "s1")]
    # servers 3-4 sit on s2: 20 blocks of 8 KiB each crossed the trunk, at least.
    assert trunk["sent_bytes"].sum() >= 2 * 20 * 8192, trunk


def test_bmv2_forwards_over_a_leaf_spine_without_looping(tmp_path, measure):
    """Two spines close a loop: the l2_forward tables send the client's traffic through
    s3 only and floods (ARP) take one tree, so every block completes."""
    from conftest import run_json
    import pandas as pd
    s = run_json(*_flags(**{"--senders": "4"}), "--set", "topology.kind=leaf_spine",
                 "--set", "topology.spines=2", "--out", tmp_path / "ls")
    assert len(pd.read_parquet(tmp_path / "ls" / "blocks.parquet")) == 20, s
    q = pd.read_parquet(tmp_path / "ls" / "queues.parquet").groupby(["switch", "peer"])["sent_bytes"].sum()
    far_data = 2 * 20 * 8192            # servers 3-4 sit on leaf s2
    assert q["s3", "s1"] >= far_data and q["s4", "s1"] < far_data / 10, q


def test_bmv2_marks_ecn_above_the_threshold(measure):
    plain = measure(senders=SENDERS)
    marked = measure(senders=SENDERS, ecn_threshold="8KiB", ecn="on")
    # Reno with ECN halves its window on a mark instead of a loss.
    assert marked["ecn_marks"] > 0, marked
    assert marked["bottleneck_drops"] < plain["bottleneck_drops"], (plain, marked)
    import pandas as pd
    flows = pd.read_parquet(f"{marked['run_dir']}/flows.parquet")
    assert flows["delivered_ce"].sum() > 0      # the senders saw the marks echoed


def _virtual(tmp_path, name, *extra, rate="100Mbit"):
    from conftest import run_json
    return run_json("scenarios/fast08-pause-bmv2.toml", "--clock", "virtual", "--kernel", "stock",
                    "--link-rate", rate, *extra, "--out", tmp_path / name)


def test_bmv2_in_virtual_time_holds_100_mbits(tmp_path):
    """simple_switch runs unmodified inside User-Mode Linux with time-travel: its packet
    rate stops bounding the experiment (measured: 92.7 of 94.1 Mbit/s, one sender)."""
    from test_virtual_time import skip_reason
    if skip_reason("uml-stock"):
        pytest.skip(skip_reason("uml-stock"))
    one = _virtual(tmp_path, "one", "--senders", "1", "--sru", "64KiB", "--blocks", "10")
    assert one["goodput_mbps"] > 0.95 * 100 * 1448 / 1538, one
    assert one["fidelity"]["ok"] and one["switch_ingress_late_packets"] == 0, one


@pytest.mark.parametrize("rate, payload_mbps", [("100Mbit", 100 * 1448 / 1538), ("1Gbit", 1000 * 1448 / 1538)])
def test_bmv2_pause_in_virtual_time_is_lossless(tmp_path, rate, payload_mbps):
    """FAST'08 section 5.4 on the P4 switch: with PAUSE, 8 servers through a 32 KiB port
    lose nothing and get near the link (within 15% of the payload limit), where without
    it they collapse below half of it. (Measured: 100 Mbit/s 88.6-88.8 Mbit/s, 1 Gbit/s
    841.9-878.5 Mbit/s: runs that differ in a few clock reads take different turns at
    XOFF. With UML's
    upstream 256 ns per clock read bmv2 was a slow switch: at 100 Mbit/s 72.7 Mbit/s
    and 26 drops, at 1 Gbit/s 34.6 Mbit/s and 126 drops; see incast.vm.uml.)"""
    from test_virtual_time import skip_reason
    if skip_reason("uml-stock"):
        pytest.skip(skip_reason("uml-stock"))
    import pandas as pd
    plain = _virtual(tmp_path, "plain", "--senders", "8", rate=rate)
    paused = _virtual(tmp_path, "paused", "--senders", "8", "--pause", "on", rate=rate)
    numbers = {k: (plain[k], paused[k]) for k in ("goodput_mbps", "timeouts", "bottleneck_drops")}
    # The collapse: below half the link, with losses the senders waited out on a timer.
    # Today's TCP waits on a tail loss probe as often as on the RTO (measured at 100 Mbit/s,
    # ten runs: 9.3-39.7 Mbit/s, 0-4 timeouts and 11-21 loss probes a run), so both count.
    probes = int(pd.read_parquet(f"{plain['run_dir']}/counters.parquet")["TCPLossProbes"].sum())
    assert plain["bottleneck_drops"] > 0 and plain["timeouts"] + probes > 0, (numbers, probes)
    assert plain["goodput_mbps"] < 0.5 * payload_mbps, numbers
    assert paused["bottleneck_drops"] == 0 and paused["drops"] == 0 and paused["timeouts"] == 0, numbers
    assert paused["goodput_mbps"] > 0.85 * payload_mbps, numbers
    assert paused["pause_frames_received"] > 0 and paused["switch_ingress_late_packets"] == 0, paused
    assert paused["pause_headroom_needed_bytes"] <= paused["pause_headroom_bytes"], paused


def test_bmv2_reruns_in_virtual_time_spread_little(tmp_path):
    """bmv2 in virtual time is repeatable in its statistics, not to the packet: its
    threads read the clock a few more or fewer times from one boot to the next, and at
    XOFF a nanosecond decides which sender is paused first (measured: two reruns gave
    identical blocks, to 0.5 us, in one session and not in another; 1 Gbit/s with PAUSE
    841.9-878.5 Mbit/s). Three reruns: all lossless, goodput within 10% of their median."""
    import statistics
    from test_virtual_time import skip_reason
    if skip_reason("uml-stock"):
        pytest.skip(skip_reason("uml-stock"))
    runs = [_virtual(tmp_path, name, "--senders", "8", "--pause", "on", "--seed", "3", rate="1Gbit")
            for name in ("a", "b", "c")]
    goodput = [r["goodput_mbps"] for r in runs]
    assert all(r["drops"] == 0 and r["timeouts"] == 0 for r in runs), [(r["drops"], r["timeouts"]) for r in runs]
    assert (max(goodput) - min(goodput)) < 0.1 * statistics.median(goodput), goodput


def test_bmv2_pfc_in_virtual_time_spares_the_innocent_class(tmp_path):
    """incast.p4's PFC names the incast's class only: an innocent flow in another class,
    from a host the switch's 802.3x PAUSE stops with every other sender, keeps its rate
    (measured at 100 Mbit/s: innocent 84.1 Mbit/s under 802.3x, 94.3 under PFC, 94.2 with
    no flow control; the incast 92.4, 92.3 and 64.1)."""
    from conftest import run_json
    from test_virtual_time import skip_reason
    if skip_reason("uml-stock"):
        pytest.skip(skip_reason("uml-stock"))
    runs = {name: run_json("scenarios/star-pfc-bmv2.toml", *extra, "--out", tmp_path / name)
            for name, extra in (("pfc", ()), ("pause", ("--set", "switch.pause.pfc=false")))}
    numbers = {name: (r["goodput_mbps"], r["background_mbps"], r["pause_frames_received"])
               for name, r in runs.items()}
    payload = 100 * 1448 / 1538
    assert runs["pfc"]["background_mbps"][0] > 0.95 * payload, numbers
    assert runs["pause"]["background_mbps"][0] < 0.95 * runs["pfc"]["background_mbps"][0], numbers
    assert all(r["pause_frames_received"] > 0 and r["timeouts"] == 0 for r in runs.values()), numbers


@pytest.fixture(scope="module")
def two_bmv2(tmp_path_factory):
    from test_flow_control import two_switch_runs
    from test_virtual_time import skip_reason
    if skip_reason("uml-stock"):
        pytest.skip(skip_reason("uml-stock"))
    return two_switch_runs(tmp_path_factory.mktemp("two-bmv2"), ("--switch", "bmv2"))


def test_bmv2_pause_stops_the_innocent_flow_across_two_switches(two_bmv2, no_leftovers):
    """The two-switch head-of-line scenario on P4 switches, asserted as on the kernel
    bridges, lossless too: s2 obeys s1's PAUSE on the trunk (its hold loop), fills and
    pauses far1, and the innocent flow stops with the incast (measured, 3 runs:
    126.0-131.9 Mbit/s against 941.5 without flow control)."""
    from test_flow_control import check_pause_stops_the_innocent_flow
    check_pause_stops_the_innocent_flow(two_bmv2)
    ports = pd.read_parquet(two_bmv2["pause"]["dir"] / "pause_ports.parquet")
    assert ports["held_packets"].sum() > 0 and ports["held_at_end"].sum() == 0, ports


def test_bmv2_flow_control_across_two_switches_says_whether_it_kept_up(two_bmv2):
    """Whether bmv2 kept up with flow control: the longest wait of a packet between
    bmv2's receive and its egress queue, against the buffer above XOFF (at the link rate,
    every sender's frames while a PAUSE is on its way). A run is flagged exactly when the
    wait exceeds it. Measured with 802.3x PAUSE: 2 us in 5 runs, once 88 us (flagged);
    with PFC 11-25 us (8 runs) against 24.2 us of headroom in a 32 KiB class queue for 8
    servers at 1 Gbit/s, so some runs are flagged. Reading the counters at the
    measurement's edges with a new simple_switch_CLI each time once stalled bmv2 for
    273-325 us while the innocent flow ran, and s2's trunk queue of its class dropped
    20-44 frames a run; the reads now go over one CLI session per switch, started before
    the traffic (bmv2.CliSession)."""
    import tomllib
    from incast import scenario as scn
    from incast.network.flow_control import headroom_us
    for mode in ("pause", "pfc"):
        r = two_bmv2[mode]
        s = scn.build(tomllib.loads((r["dir"] / "scenario.toml").read_text()))
        lag = headroom_us(s)
        wait = r["switch_ingress_wait_max_us"]
        flagged = "PAUSE could not keep this switch lossless" in r["fidelity"]["reasons"]
        print(f"{mode}: longest wait {wait} us, headroom {lag:.1f} us, faithful: {r['fidelity']['ok']}")
        assert flagged == (wait > lag), (mode, wait, lag, r["fidelity"]["reasons"])
        assert r["drops"] == 0 or flagged, (mode, r["drops"], r["fidelity"]["reasons"])


def test_bmv2_pfc_pauses_only_the_congested_class_across_two_switches(two_bmv2, no_leftovers):
    """As on the kernel bridges, lossless too."""
    from test_flow_control import check_pfc_pauses_only_the_congested_class
    check_pfc_pauses_only_the_congested_class(two_bmv2)
