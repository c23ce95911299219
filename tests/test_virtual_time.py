"""Virtual time: the testbed inside User-Mode Linux with time-travel (incast/vm/uml.py).

There the emulated links hold their rate on any machine, a microsecond timeout fires
after exactly that long, and a rerun repeats the block times where nothing is dropped
(and the statistics where something is). The
tests run `incast run --clock virtual` as users do; they skip where the UML kernels
are not built for the current inputs (kernels/build.sh --uml) or when not root.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from conftest import incast_cmd, run_json
from incast.vm import guest, uml

pytestmark = pytest.mark.network

from incast.campaign.judge import PAYLOAD_SHARE   # TCP payload of a full frame with timestamps, on the wire


def skip_reason(variant: str) -> str | None:
    if os.geteuid() != 0:
        return "User-Mode Linux runs the testbed as root: run as root"
    if guest.kernel_dir(variant) is None:
        return f"the {variant} kernel is not built for the current inputs: run kernels/build.sh --uml"
    return None


def needs(variant: str):
    reason = skip_reason(variant)
    return pytest.mark.skipif(reason is not None, reason=reason or "")


BASE = ["--clock", "virtual", "--link-rate", "1Gbit", "--buffer", "32KiB", "--sru", "32KiB",
        "--blocks", "20", "--warmup", "2"]


@needs("uml-stock")
def test_one_sender_holds_the_payload_limit_at_1gbit(tmp_path, no_leftovers):
    r = incast_cmd("run", *BASE, "--kernel", "stock", "--senders", "1", "--sru", "256KiB",
                   "--buffer", "64KiB", "--out", tmp_path / "n1", "--json", "-v")
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads(r.stdout.strip().splitlines()[-1])
    # The host follows the guest's run as it goes: what it does, and every block.
    assert "guest: network of 2 hosts built" in r.stderr, r.stderr[-2000:]
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("block ")][-1] == "block 20/20", r.stderr[-2000:]
    limit = s["link_mbps"] * PAYLOAD_SHARE
    assert s["clock"] == "virtual" and s["fidelity"]["clock"] == "virtual"
    assert abs(s["goodput_mbps"] - limit) / limit < 0.01, (s["goodput_mbps"], limit)
    assert s["host_seconds"] > 0 and s["guest_seconds"] > 0


@needs("uml-stock")
def test_rerun_without_drops_repeats_every_block_time(tmp_path, no_leftovers):
    """Where nothing is dropped, two runs of one scenario give every block the same
    duration, to within a few clock reads: UML charges each clock read in process
    context some virtual time (incast.vm.uml.CLOCK_READ_COST_NS), and a run's
    processes do not read the clock exactly as often in every boot. (Measured:
    identical to the nanosecond in three runs.)"""
    args = [*BASE, "--kernel", "stock", "--senders", "8", "--buffer", "1MiB", "--seed", "7"]
    a = run_json(*args, "--out", tmp_path / "a")
    b = run_json(*args, "--out", tmp_path / "b")
    assert a["drops"] == b["drops"] == 0, "the scenario is meant to be lossless"
    ta = pd.read_parquet(tmp_path / "a" / "blocks.parquet")["duration_ms"]
    tb = pd.read_parquet(tmp_path / "b" / "blocks.parquet")["duration_ms"]
    assert len(ta) == len(tb) == 20
    assert (ta - tb).abs().max() <= 0.002, (ta - tb).abs().max()


@needs("uml-stock")
def test_rerun_with_drops_repeats_the_statistics(tmp_path, no_leftovers):
    """Where the switch drops, a shift of a few clock reads can decide which of two
    packets meets the full queue, and a rerun may follow another trajectory. What repeats
    is the drop count, to a few percent (measured, 16 servers, seed 7, eight runs: drops
    1360-1491). The goodput does not repeat: the same eight gave 233.0-396.7 Mbit/s (one
    run's blocks settle at 8 ms, another's at 16-20 ms, with one and four timeouts of the
    4 ms floor), more than its timeouts explain. That is why every figure claim is judged
    on the median of repetitions, never on one run; the spread is printed here."""
    args = [*BASE, "--kernel", "stock", "--senders", "16", "--rto-min", "min", "--seed", "7"]
    a = run_json(*args, "--out", tmp_path / "a")
    b = run_json(*args, "--out", tmp_path / "b")
    assert a["drops"] > 100 and b["drops"] > 100
    assert abs(a["drops"] - b["drops"]) < 0.1 * a["drops"], (a["drops"], b["drops"])
    print(f"reruns: goodput {a['goodput_mbps']} and {b['goodput_mbps']} Mbit/s, "
          f"drops {a['drops']} and {b['drops']}, timeouts {a['timeouts']} and {b['timeouts']}")


@needs("uml-hrtimer")
@needs("uml-stock")
def test_collapse_and_hrtimer_recovery_at_40_servers(tmp_path, no_leftovers):
    """Both kernels end to end at 40 servers (1 MiB blocks through a 64 KiB buffer at
    1 Gbit/s, this kernel's default TCP otherwise): the stock kernel loses tails and
    recovers them by timer, and where an RTO fired its block waited out the 200 ms
    RTOmin; with microsecond RTOs on the hrtimer kernel no block waits that long, and
    goodput is higher. Not every run has an RTO: a tail loss probe recovers most tails
    within two round trips (with one segment in flight Linux adds RTOmin to the probe's
    timeout, tcp_schedule_loss_probe, and such a block waits 200 ms too). Measured: 0, 0
    and 3 RTOs with 487-501 probes in three runs, each with blocks of 207-216 ms; one
    run with 0 RTOs and 479 probes whose longest block took 63.8 ms. (Goodput, seeds 1-3
    at an earlier commit: 200.1, 98.6, 99.0 Mbit/s; 552.8, 553.7, 559.1.) The papers'
    thresholds (below 10% and above 85% of the link) are judged in the papers' setting,
    over repetitions: the sigcomm09-fig1 figure's claims."""
    args = ["--clock", "virtual", "--link-rate", "1Gbit", "--buffer", "64KiB", "--workload", "fixed-block",
            "--block", "1MiB", "--blocks", "20", "--warmup", "3", "--cc", "reno", "--senders", "40"]
    stock = run_json(*args, "--kernel", "stock", "--rto-min", "200ms", "--out", tmp_path / "stock")
    hr = run_json(*args, "--kernel", "hrtimer", "--rto-min", "200us", "--out", tmp_path / "hr")
    # Tails were lost and recovered by timer; an RTO's block waited the whole 200 ms
    # RTOmin; with 200 us none can.
    timers = pd.read_parquet(tmp_path / "stock" / "counters.parquet")[["TCPTimeouts", "TCPLossProbes"]].sum()
    assert timers.sum() > 0, timers.to_dict()
    assert timers["TCPTimeouts"] == 0 or stock["block_ms_max"] > 200, (stock, timers.to_dict())
    assert hr["block_ms_max"] < 200, hr
    assert hr["goodput_mbps"] > stock["goodput_mbps"], (stock, hr)


@needs("uml-stock")
def test_queue_telemetry_is_sampled_in_virtual_time(tmp_path, no_leftovers):
    """No BPF events in UML: the queues are sampled every telemetry.interval. The
    bottleneck's occupancy never exceeds its buffer, it fills up when drops happen, and
    the drop rows count exactly the drops of the queue's own counters."""
    s = run_json(*BASE, "--kernel", "stock", "--senders", "8", "--rto-min", "min",
                 "--telemetry", "--set", "telemetry.interval=20us", "--out", tmp_path / "t")
    t = pd.read_parquet(tmp_path / "t" / "telemetry.parquet")
    q = pd.read_parquet(tmp_path / "t" / "queues.parquet")
    port = s["bottleneck_port"]
    at = t[t["port"] == port]
    samples = at[at["event"] == "sample"]
    assert len(samples) > 100
    assert samples["bytes"].max() <= 32 * 1024
    assert samples["bytes"].max() > 32 * 1024 - 2 * 1514       # it filled up
    # Samples are 20 us apart (in virtual time exactly, but for what UML charges each
    # clock read: a few per sample); a queue that did not change is not recorded.
    steps = samples["time_us"].drop_duplicates().diff().dropna()
    # A sample the scheduler served late (other tasks ran first, reading the clock)
    # is followed by one on the grid again, a shorter step: rare (one CI run had a
    # few; shortest 11.3 us).
    assert 19.5 < steps.median() < 20.5 and (steps < 18).mean() < 0.05, steps.describe()
    assert any("sampled every 20 us" in n for n in s["telemetry_notes"])
    drops = int(q.loc[q["port"] == port, "drops"].sum())
    assert drops > 0
    # The recorder starts before the first repetition and stops after the last: its
    # drop rows cover at least the counters' window (warm-up drops add to them).
    assert len(at[at["event"] == "drop"]) >= drops


@needs("uml-stock")
def test_a_killed_guest_leaves_nothing(tmp_path):
    """A guest that never finishes (a busy loop stops virtual time) is killed at its
    timeout, with every UML process and UML's control directory."""
    r = uml.run("while :; do :; done", kernel="uml-stock", results_dir=tmp_path / "r", timeout=8,
                memory_mb=256)
    assert r.timed_out and r.returncode is None
    left = subprocess.run(["pgrep", "-f", f"uml_dir={tmp_path / 'r'}"], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"UML processes left: {left.stdout}"
    assert not any(Path(tmp_path / "r").glob("incast-*/pid"))


ECN = ["--clock", "virtual", "--kernel", "stock", "--link-rate", "1Gbit", "--buffer", "64KiB",
       "--workload", "fixed-block", "--rto-min", "200ms"]
MARK_16K = ["--set", "switch.ecn=16KiB"]


@needs("uml-stock")
def test_dctcp_keeps_the_queue_near_the_marking_threshold(tmp_path, no_leftovers):
    """Four DCTCP senders, marking above K = 16 KiB: the bottleneck queue stays near K
    (measured: time-weighted mean 18.7 KB, p10-p90 13.6-24.2 KB), not at the 64 KiB
    buffer, and the senders saw the marks the switch made (delivered_ce counts the
    warm-up blocks too)."""
    s = run_json(*ECN, *MARK_16K, "--cc", "dctcp", "--senders", "4", "--block", "4MiB", "--blocks", "10",
                 "--telemetry", "--out", tmp_path / "d")
    t = pd.read_parquet(tmp_path / "d" / "telemetry.parquet")
    q = t[(t["port"] == s["bottleneck_port"]) & (t["event"] == "sample") & (t["time_us"] >= 0)]
    q = q.sort_values("time_us")
    weight = q["time_us"].diff().shift(-1).fillna(0)
    mean = float((q["bytes"] * weight).sum() / weight.sum())
    assert 0.5 * 16384 < mean < 1.5 * 16384, mean
    assert s["ecn_marks"] > 1000 and s["timeouts"] == 0
    flows = pd.read_parquet(tmp_path / "d" / "flows.parquet")
    assert flows["delivered_ce"].sum() >= s["ecn_marks"]


@needs("uml-stock")
def test_dctcp_with_marking_avoids_the_collapse_reno_suffers(tmp_path, no_leftovers):
    """Figure 1's 16 servers through 64 KiB: Reno (200 ms RTOmin) loses whole windows
    and waits out RTOs; DCTCP with K = 16 KiB neither drops nor times out (940.8 Mbit/s).
    With 16 flows DCTCP's floor of two segments each, not K, sets its queue (mean 36 KB).
    A 20-block Reno run waits out from none to six RTOs (measured 117-402 Mbit/s, and
    554-833 in runs that waited out none), so Reno is judged over six request orders
    pooled: their bytes over their time. (Over three, a draw of three runs that waited
    out none, 832.6, 555.4 and 722.8 Mbit/s, once pooled above the bound: the claim is
    about Reno's collapse, not one draw's.)"""
    args = [*ECN, "--senders", "16", "--block", "1MiB", "--blocks", "20", "--warmup", "3"]
    dctcp = run_json(*args, *MARK_16K, "--cc", "dctcp", "--out", tmp_path / "dctcp")
    renos = [run_json(*args, "--cc", "reno", "--seed", str(seed), "--out", tmp_path / f"reno{seed}")
             for seed in range(6)]                  # the same buffer, no marking
    limit = dctcp["link_mbps"] * PAYLOAD_SHARE
    assert dctcp["goodput_mbps"] > 0.95 * limit and dctcp["timeouts"] == 0, dctcp
    assert dctcp["ecn_marks"] > 0 and dctcp["bottleneck_drops"] <= 5
    # Equal work per run, so the pooled goodput is the harmonic mean of the runs'.
    pooled = len(renos) / sum(1 / r["goodput_mbps"] for r in renos)
    assert pooled < 0.7 * dctcp["goodput_mbps"], [r["goodput_mbps"] for r in renos]
    assert all(r["bottleneck_drops"] > 100 for r in renos), renos
