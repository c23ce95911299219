"""The machine's calibration record: the highest link rate it emulates faithfully per
number of senders, as ``incast calibrate`` (incast.run.calibrate) measured it, cached
per machine in /var/cache/incast/calibration. Reading it is all a run needs; measuring
it takes runs, which is why the two live in different stages.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

from incast.constants import NIC_SLACK_FRAMES_MAX, NIC_TIMER_SLACK_US
from incast.errors import MissingFeature
from incast.registry import DATAPLANES

CACHE_DIR = Path(os.environ.get("INCAST_CACHE", "/var/cache/incast")) / "calibration"
VERSION = 8     # bump when the procedure or its criteria change
LADDER_MBPS = [1000, 800, 600, 500, 400, 300, 200, 100, 50, 20, 10]
# A calibration made while other processes at normal priority took this share of the
# CPUs or more was made on a busy machine: it is not reused once the machine is quiet
# (incast.run.calibrate.calibrate), and a test finding no faithful rate in it skips.
BUSY_SHARE = 0.05


def made_busy(calibration: dict | None) -> bool:
    """Whether the calibration was measured beside other work (BUSY_SHARE)."""
    load = (calibration or {}).get("load") or {}
    return (load.get("cpu_others") or 0) >= BUSY_SHARE


def machine() -> dict:
    model = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"kernel": platform.release(), "kernel_build": platform.version(), "cpu_model": model,
            "cpus": len(os.sched_getaffinity(0))}


def cache_key() -> str:
    burst = max(e.port_burst_frames for e in DATAPLANES.values() if e.calibrated)
    inputs = {"version": VERSION, **machine(), "switch_burst_frames": burst,
              "nic_timer_slack_us": NIC_TIMER_SLACK_US,
              "nic_slack_frames_max": NIC_SLACK_FRAMES_MAX, "ladder": LADDER_MBPS}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def cache_path() -> Path:
    return CACHE_DIR / f"{cache_key()}.json"


def cached() -> dict | None:
    try:
        return json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return None


def faithful_rate(calibration: dict, senders: int) -> int:
    """bit/s: the highest calibrated rate faithful for every calibrated sender count up
    to the first one >= senders (beyond the largest: that one's, flagged by the run
    itself if it does not hold)."""
    rates = {int(k): v for k, v in calibration["rates_bps"].items()}
    counts = sorted(rates)
    upto = next((c for c in counts if c >= senders), counts[-1])
    usable = [rates[c] for c in counts if c <= upto and rates[c]]
    if not usable:
        raise NoFaithfulRate(calibration)
    return min(usable)


class NoFaithfulRate(MissingFeature):
    """Calibration found no rate this machine holds in real time: one line on why, and
    what to do instead."""

    def __init__(self, calibration: dict):
        trials = calibration.get("trials") or []
        why = next((t["reasons"][0] for t in reversed(trials) if t.get("reasons")), "")
        load = calibration.get("load") or {}
        beside = (f", beside other work at normal priority using {100 * load['cpu_others']:.0f}% of the CPUs"
                  if made_busy(calibration) else "")
        super().__init__(
            f"no link rate holds in real time on this machine now (calibration at {LADDER_MBPS[-1]} Mbit/s: "
            f"{why or 'not faithful'}{beside}); run it in virtual time (--clock virtual --kernel stock, after "
            "kernels/build.sh --uml), or calibrate again on a quieter machine (incast calibrate --force)")


def describe(c: dict) -> list[str]:
    rates = ", ".join(f"{'up to ' if n != '1' else ''}{n} sender{'s' if n != '1' else ''} {int(r) / 1e6:g} Mbit/s"
                      for n, r in c["rates_bps"].items())
    return [f"faithful link rate: {rates}",
            f"qdisc timer lateness p99 {c['timer_late_us_p99']} us; backlogged dequeues late by up to "
            f"{c['dequeue_lateness_us_p99']} us (p99); {c['cpu_us_per_packet']} us of CPU per forwarded packet",
            f"calibrated {c['created']} in {c['seconds']} s ({len(c['trials'])} runs), cached as {cache_path()}",
            *([load_line(c["load"])] if c.get("load") else [])]


def load_line(load: dict) -> str:
    """The machine's other work during calibration (medians over its trials)."""
    pct = lambda k: f"{100 * load[k]:.0f}%" if load.get(k) is not None else "?"   # noqa: E731
    return (f"beside other work: CPUs {pct('cpu_busy')} busy, of which calibration's own {pct('cpu_run')}, "
            f"niced work {pct('cpu_niced')}, other processes at normal priority {pct('cpu_others')}")


def brief() -> dict | None:
    """What a run's environment.json says of the calibration it was judged by."""
    c = cached()
    if c is None:
        return None
    return {k: c.get(k) for k in ("key", "created", "rates_bps", "timer_late_us_p99",
                                  "dequeue_lateness_us_p99", "cpu_us_per_packet", "load")}


def resolve_auto_rate(scenario, senders: int | None = None):
    """The scenario with link.rate "auto" replaced by the highest rate the calibration
    found faithful here for `senders` (default: the scenario's). The machine must be
    calibrated (incast.run.calibrate.ensure does it first where a command may)."""
    if scenario.link.rate != "auto":
        return scenario
    c = cached()
    if c is None:
        raise MissingFeature("link.rate auto: this machine is not calibrated (incast calibrate: "
                             "under a minute, once)")
    rate = faithful_rate(c, senders or scenario.topology.senders)
    return scenario.model_copy(update={"link": scenario.link.model_copy(update={"rate": rate})})
