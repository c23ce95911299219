"""How faithful a run was: did every emulated link hold its rate, and did the machine
keep up?

An emulated link is a token bucket served by kernel timers and CPUs. When the timers
wake late or the CPUs are busy, a 1 Gbit/s port may forward at 600 Mbit/s while its
queue is full, and the experiment then measures the machine, not TCP. Every run
therefore measures (like Mininet-HiFi's link monitor):

* per link (switch ports and host NICs): the rate at which it was served while it had
  a backlog, against its configured rate, and the spacing of those dequeues
  (``build/bpf/link-monitor``: aggregates kept in BPF maps, nothing per packet leaves
  the kernel);
* the lateness of the qdisc watchdog timers that pace those links;
* CPU use over the measured blocks: busy at normal priority (the emulation's and what
  competes with it), niced work beside it, stolen by the hypervisor (incast.measure.cpu);
* packets dropped outside the switch (full CPU input backlogs) and, on bmv2, packets
  the switch itself fell behind on (its health warning).

``assess()`` turns these into the summary's ``fidelity`` object: ``ok``, ``reasons``
(short strings, empty when ok) and the numbers behind them. Thresholds, and the
measurements behind them, are in README.md ("Fidelity").
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from incast.clock import REAL, Clock
from incast.constants import BPF_BUILD_DIR, ETH_HLEN, NIC_SLACK_FRAMES_MAX, WIRE_OVERHEAD
from incast.machine import resources
from incast.measure.cpu import describe_load
from incast.measure.instrument import Facts, Instrument, Readings
from incast.registry import DATAPLANES

BINARY = BPF_BUILD_DIR / "link-monitor"
SUB_BITS = 3            # LM_SUB_BITS in incast/bpf/link_monitor.h
HIST_BUCKETS = 320      # LM_HIST_BUCKETS

# A link served below this share of its rate while backlogged did not hold its rate.
# Measured on held links: 0.97-1.01 (bucket bursts after late timers push it above 1).
MIN_SERVICE_RATIO = 0.95
# ... and that matters when the service it lost (busy time x the shortfall) is this
# share of the measured time or more. A link that stalls once for a millisecond (a
# late timer, a hypervisor stealing the CPU: seen up to 1.4 ms here) in a second-long
# run has not changed the experiment; a bottleneck served at 94% throughout has.
MAX_DEFICIT_SHARE = 0.01
# Below this many backlogged dequeues a link's ratio is not evidence either way.
MIN_BUSY_PACKETS = 50
# A CPU this busy at normal priority over the measured blocks is the bottleneck: one
# flow's packets are processed mostly on one CPU, and a link too fast for it may never
# build a backlog to judge. (Not every such link saturates a CPU: one sender at 20 Gbit/s here left the
# busiest at 75-90%; the calibrated rate catches those.)
MAX_CPU_BUSY = 0.95
# Time the hypervisor gave to other machines (steal, in /proc/stat) is time this one's
# timers, shapers and hosts all stood still, as a link's deficit: at this share of the
# CPUs' time the run is not the experiment. (Seen here: 2.5% of a 1.7 s run, a 24 ms
# stall in one block, the one sender's goodput 2% short, its link at 98% while
# backlogged, under MIN_SERVICE_RATIO.)
MAX_STEAL_SHARE = MAX_DEFICIT_SHARE


def skip_first(port_burst_frames: int) -> int:
    """Dequeues left out at the start of each backlogged stretch: a token bucket that
    filled while its link was idle sends that many at once, faster than the rate. The
    deepest bucket decides: a switch port's (the data plane's port_burst_frames) or a
    host NIC's (one frame plus up to NIC_SLACK_FRAMES_MAX), plus the frame being sent."""
    return max(port_burst_frames, 1 + NIC_SLACK_FRAMES_MAX) + 1


def monitor_binary() -> Path | None:
    path = Path(os.environ.get("INCAST_LINK_MONITOR", BINARY))
    return path if path.is_file() and os.access(path, os.X_OK) else None


def watchdog_address() -> int:
    """Address of the kernel's qdisc_watchdog() (the hrtimer callback that paces
    token buckets), or 0 if kallsyms hides it."""
    try:
        with open("/proc/kallsyms") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[2] == "qdisc_watchdog":
                    return int(parts[0], 16)
    except OSError:
        pass
    return 0


def bucket_bounds(index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[low, high) in ns of log-linear histogram buckets (link_monitor.h)."""
    index = np.asarray(index, dtype=np.int64)
    sub = 1 << SUB_BITS
    msb = index // sub - 1 + SUB_BITS
    low = np.where(index < sub, index, (sub + index % sub) << np.maximum(msb - SUB_BITS, 0))
    width = np.where(index < sub, 1, 1 << np.maximum(msb - SUB_BITS, 0))
    return low.astype(float), (low + width).astype(float)


def hist_quantile(hist: dict, q: float) -> float | None:
    """The q-quantile (ns) of a sparse histogram {bucket: count}, by linear
    interpolation inside the bucket; None if empty."""
    if not hist:
        return None
    items = sorted((int(k), v) for k, v in hist.items())
    idx = np.array([k for k, _ in items])
    counts = np.array([v for _, v in items], dtype=float)
    total = counts.sum()
    if total <= 0:
        return None
    low, high = bucket_bounds(idx)
    cum = np.cumsum(counts)
    target = q * total
    i = int(np.searchsorted(cum, target, side="left"))
    i = min(i, len(idx) - 1)
    before = cum[i - 1] if i else 0.0
    frac = (target - before) / counts[i] if counts[i] else 0.0
    return float(low[i] + frac * (high[i] - low[i]))


@dataclass(frozen=True)
class WatchedLink:
    name: str           # "s1-eth1", "server3-eth0"
    role: str           # "switch" or "nic"
    netns_inode: int
    ifindex: int
    rate: int           # configured bit/s
    wire_overhead: int  # bytes the shaper adds per packet (preamble, FCS, gap)
    frame: int          # bytes of a full frame (mtu + Ethernet header)


class LinkMonitor(Instrument):
    """build/bpf/link-monitor over the links whose service it measures (watched_links):
    started before the measured blocks, stopped after them; links.parquet, and the
    links' service and the pacing timers' lateness for the fidelity object. Not where
    the clock has no BPF (ARCH=um), nor where the monitor is not built (the fidelity
    object then says the links were not measured)."""

    def __init__(self, bench):
        super().__init__(bench)
        self.links: list[WatchedLink] = []
        self.proc: subprocess.Popen | None = None

    @classmethod
    def wanted(cls, scenario, features) -> bool:
        return monitor_binary() is not None and features.clock.bpf

    def start(self) -> None:
        b = self.bench
        self.links = watched_links(b)
        binary = monitor_binary()
        if binary is None:
            raise FileNotFoundError("build/bpf/link-monitor is not built (scripts/build-bpf.sh)")
        skip = skip_first(DATAPLANES[b.scenario.dataplane].port_burst_frames)
        cmd = [str(binary), "--skip-first", str(skip)]
        addr = watchdog_address()
        if addr:
            cmd += ["--watchdog-fn", hex(addr)]
        for link in self.links:
            cmd += ["--watch", f"{link.netns_inode}:{link.ifindex}"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        if line != "READY":
            self.proc.wait()
            err = self.proc.stderr.read().strip().splitlines()
            raise RuntimeError(f"link monitor failed: {err[-1] if err else line or 'no output'}")

    def stop(self) -> Readings:
        p, self.proc = self.proc, None
        if p is None:
            return Readings()
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        if p.returncode:
            raise RuntimeError(f"link monitor failed: {err.strip()[-500:] or p.returncode}")
        raw = json.loads(out.strip().splitlines()[-1])
        if not raw:
            return Readings()
        rows = link_rows(self.links, raw)
        return Readings(tables={"links.parquet": pd.DataFrame(rows)},
                        facts=Facts(link_rows=rows, watchdog=raw.get("watchdog"), monitored=True))

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def watched_links(bench) -> list[WatchedLink]:
    """The links whose service the link monitor measures: the switch ports a qdisc
    paces (the data plane says which) and every host's NIC."""
    scenario = bench.scenario
    frame = scenario.link.mtu + ETH_HLEN
    links = [WatchedLink(p.name, "switch", bench.world_inode, p.ifindex, scenario.port_rate(p.trunk),
                         WIRE_OVERHEAD, frame)
             for p in bench.dataplane.paced_ports()]
    for h in bench.net.hosts:
        intf = h.defaultIntf().name
        inode, index = resources.interface_index(h.netns_path, intf)
        links.append(WatchedLink(intf, "nic", inode, index, scenario.link.rate, WIRE_OVERHEAD, frame))
    return links


def link_rows(links: list[WatchedLink], raw: dict) -> list[dict]:
    """One row per watched link: what it carried and how it was served when backlogged."""
    rows = []
    for link, st in zip(links, raw.get("links", [])):
        busy_bits = (st["busy_bytes"] + link.wire_overhead * st["busy_packets"]) * 8
        served = busy_bits / (st["busy_ns"] / 1e9) if st["busy_ns"] else None
        frame_us = (link.frame + link.wire_overhead) * 8 / link.rate * 1e6
        p50, p99 = (hist_quantile(st["gap_hist"], q) for q in (0.5, 0.99))
        rows.append({
            "link": link.name, "role": link.role, "rate_mbps": link.rate / 1e6,
            "packets": st["packets"], "busy_packets": st["busy_packets"],
            "busy_ms": round(st["busy_ns"] / 1e6, 3), "busy_mbit": round(busy_bits / 1e6, 4),
            "served_mbps": round(served / 1e6, 3) if served else None,
            "service_ratio": round(served / link.rate, 4) if served else None,
            "frame_us": round(frame_us, 3),
            "gap_p50_us": round(p50 / 1000, 2) if p50 is not None else None,
            "gap_p99_us": round(p99 / 1000, 2) if p99 is not None else None,
        })
    return rows


def assess(rows: list[dict], watchdog: dict | None, cpu: dict, backlog_drops: int,
           dataplane_warnings: list[str], monitored: bool, measured_ms: float,
           rate_bps: int | None = None, faithful_bps: int | None = None, senders: int = 1,
           clock: Clock = REAL) -> dict:
    """The summary's fidelity object. measured_ms: wall time of the measured blocks;
    faithful_bps: the rate calibration found faithful here for this many senders (None:
    not calibrated, or not applicable to this data plane). clock: the run's (incast.clock);
    in virtual time the CPU is infinitely fast and timers fire exactly: no CPU can
    saturate and no link fall behind for want of one, and the BPF link monitor cannot
    run (ARCH=um has no BPF events)."""
    reasons = []
    if faithful_bps is not None and rate_bps is not None and rate_bps > faithful_bps:
        # Measured, not assumed: above this rate calibration saw the machine fall short
        # for this many senders. A link too fast for the CPU may never backlog, so the
        # run's own link measurements alone cannot always tell (20 Gbit/s: no queue, 2
        # Gbit/s of goodput, CPUs at 75%).
        reasons.append(f"link rate {rate_bps / 1e6:g} Mbit/s is above this machine's faithful rate "
                       f"for {senders} sender{'s' if senders != 1 else ''}, {faithful_bps / 1e6:g} Mbit/s "
                       "(incast calibrate)")
    judged = [dict(r) for r in rows
              if r["service_ratio"] is not None and r["busy_packets"] >= MIN_BUSY_PACKETS]
    # Host NICs together too: with many servers each carries too little to judge alone.
    nics = [r for r in rows if r["role"] == "nic" and r["service_ratio"] is not None]
    if len(nics) > 1 and sum(r["busy_packets"] for r in nics) >= MIN_BUSY_PACKETS:
        capacity = sum(r["busy_ms"] / 1e3 * r["rate_mbps"] for r in nics)
        judged.append({"link": "host NICs together", "role": "nic", "rate_mbps": nics[0]["rate_mbps"],
                       "busy_packets": sum(r["busy_packets"] for r in nics),
                       "busy_ms": sum(r["busy_ms"] for r in nics),
                       "service_ratio": round(sum(r["busy_mbit"] for r in nics) / capacity, 4)})
    for r in judged:
        r["deficit_ms"] = r["busy_ms"] * max(0.0, 1 - r["service_ratio"])
    worst = min(judged, key=lambda r: r["service_ratio"], default=None)
    slow = [r for r in judged if r["service_ratio"] < MIN_SERVICE_RATIO
            and r["deficit_ms"] >= MAX_DEFICIT_SHARE * measured_ms]
    if slow:
        w = min(slow, key=lambda r: r["service_ratio"])
        more = f" (+{len(slow) - 1} more links)" if len(slow) > 1 else ""
        reasons.append(f"{w['link']} served at {100 * w['service_ratio']:.0f}% of {w['rate_mbps']:g} Mbit/s "
                       f"while backlogged, {w['deficit_ms']:.0f} ms short in {measured_ms:.0f} ms{more}")
    if not monitored and clock.bpf:
        reasons.append("link rates not measured (build/bpf/link-monitor missing: scripts/build-bpf.sh)")
    # Work at normal priority competes with the emulation; niced work (a build beside)
    # yields to it within microseconds and is only reported (incast.measure.cpu).
    contended = cpu.get("cpu_contended_max", cpu.get("cpu_busy_max", 0))
    if contended >= MAX_CPU_BUSY and clock.cpu_can_saturate:
        load = describe_load(cpu)
        reasons.append(f"a CPU saturated ({100 * contended:.0f}% busy at normal priority"
                       + (f"; {load})" if cpu.get("cpu_others", 0) >= 0.05 else ")"))
    steal = cpu.get("cpu_steal") or 0
    if steal >= MAX_STEAL_SHARE and clock.cpu_can_saturate:
        reasons.append(f"the hypervisor took {100 * steal:.1f}% of the CPUs' time (steal)")
    if backlog_drops:
        reasons.append(f"{backlog_drops} packets dropped by full CPU input backlogs")
    for w in dataplane_warnings:
        reasons.append(w.removeprefix("warning: ").split(":")[0])
    late = {}
    if watchdog and watchdog.get("fired"):
        hist = watchdog["late_hist"]
        late = {"timer_late_us_p50": round(hist_quantile(hist, 0.5) / 1000, 1),
                "timer_late_us_p99": round(hist_quantile(hist, 0.99) / 1000, 1),
                "timer_late_us_max": round(watchdog["late_ns_max"] / 1000, 1),
                "timer_fired": watchdog["fired"]}
    return {
        "ok": not reasons,
        "reasons": reasons,
        "clock": clock.name,
        "min_service_ratio": worst["service_ratio"] if worst else None,
        "min_service_link": worst["link"] if worst else None,
        "max_deficit_share": round(max((r["deficit_ms"] for r in judged), default=0.0) / measured_ms, 4)
        if measured_ms > 0 else None,
        "links_judged": len(judged),
        "faithful_rate_mbps": faithful_bps / 1e6 if faithful_bps is not None else None,
        **late,
        **cpu,
        "backlog_drops": backlog_drops,
    }


def warning_line(fidelity: dict) -> str:
    return "warning: not faithful: " + "; ".join(fidelity["reasons"])
