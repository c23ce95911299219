"""Virtual time: the testbed inside User-Mode Linux with time-travel (incast/vm/uml.py).

There the emulated links hold their rate on any machine, a microsecond timeout fires
after exactly that long, and the same scenario gives the same block times again. The
tests run `incast run --clock virtual` as users do; they skip where the UML kernels
are not built for the current inputs (kernels/build.sh --uml) or when not root.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from conftest import run_json
from incast.vm import guest, uml

pytestmark = pytest.mark.network

PAYLOAD_SHARE = 1448 / 1538      # TCP payload of a full frame with timestamps, on the wire


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
    s = run_json(*BASE, "--kernel", "stock", "--senders", "1", "--sru", "256KiB",
                 "--buffer", "64KiB", "--out", tmp_path / "n1")
    limit = s["link_mbps"] * PAYLOAD_SHARE
    assert s["clock"] == "virtual" and s["fidelity"]["clock"] == "virtual"
    assert abs(s["goodput_mbps"] - limit) / limit < 0.01, (s["goodput_mbps"], limit)
    assert s["host_seconds"] > 0 and s["guest_seconds"] > 0


@needs("uml-stock")
def test_same_scenario_same_block_times(tmp_path, no_leftovers):
    """Determinism: two runs of one scenario (8 servers, losses and timeouts included)
    drop and retransmit the same packets and give every block the same duration, to
    within a few clock reads: UML charges each clock read in process context 256 ns of
    virtual time (TIMER_MULTIPLIER in arch/um/kernel/time.c), and a run's processes do
    not read the clock the same number of times in every boot (measured: some blocks
    differ by 256 ns to 1.024 us, most not at all; a full frame takes 12 us)."""
    args = [*BASE, "--kernel", "stock", "--senders", "8", "--rto-min", "min", "--seed", "7"]
    a = run_json(*args, "--out", tmp_path / "a")
    b = run_json(*args, "--out", tmp_path / "b")
    ta = pd.read_parquet(tmp_path / "a" / "blocks.parquet")["duration_ms"]
    tb = pd.read_parquet(tmp_path / "b" / "blocks.parquet")["duration_ms"]
    assert len(ta) == 20
    assert (ta - tb).abs().max() <= 0.002, (ta - tb).abs().max()
    for k in ("drops", "timeouts", "retransmits", "bottleneck_drops"):
        assert a[k] == b[k], k


@needs("uml-hrtimer")
@needs("uml-stock")
def test_collapse_at_16_servers_and_hrtimer_recovery(tmp_path, no_leftovers):
    """SIGCOMM'09 Figure 1 at 16 servers: 1 MiB blocks through a 64 KiB buffer at
    1 Gbit/s. With the stock 200 ms minimum RTO goodput collapses (a block waits out a
    whole RTO); with microsecond RTOs on the hrtimer kernel it stays near the link.
    (Measured: 193 and 883 Mbit/s.)"""
    args = ["--clock", "virtual", "--link-rate", "1Gbit", "--buffer", "64KiB", "--workload", "fixed-block",
            "--block", "1MiB", "--blocks", "20", "--warmup", "3", "--cc", "reno", "--senders", "16"]
    stock = run_json(*args, "--kernel", "stock", "--rto-min", "200ms", "--out", tmp_path / "stock")
    hr = run_json(*args, "--kernel", "hrtimer", "--rto-min", "200us", "--out", tmp_path / "hr")
    limit = stock["link_mbps"] * PAYLOAD_SHARE
    assert stock["goodput_mbps"] < 0.3 * limit and stock["block_ms_max"] > 200, stock
    assert hr["goodput_mbps"] > 0.8 * limit and hr["block_ms_max"] < 50, hr
    assert hr["goodput_mbps"] > 3 * stock["goodput_mbps"]


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
    # Samples are 20 us apart (in virtual time exactly, but for the 256 ns UML charges
    # each clock read: a few per sample); a queue that did not change is not recorded.
    steps = samples["time_us"].drop_duplicates().diff().dropna()
    assert steps.min() > 18 and 19.5 < steps.median() < 20.5, steps.describe()
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
