"""Packet capture at the servers' NICs: what `incast explain` reads.

With ``telemetry.capture`` on, every server's namespace runs tcpdump on its NIC for the
whole measurement, headers only (``SNAPLEN`` bytes: Ethernet, IP and TCP with options,
so SACK blocks are kept). A server's NIC sees each data segment as the server sent it,
before the switch could drop it, and each ACK that came back: the sender's view that
FAST'08 classified its timeouts from. Files: ``capture/<server>.pcap`` in the run
directory, and ``capture/capture.json`` with the packets each tcpdump says the kernel
dropped (a capture that lost packets is reported, not trusted silently) and the clock
that maps capture timestamps (CLOCK_REALTIME) to the run's time axis (µs since the first
measured block, CLOCK_MONOTONIC).
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

from incast.errors import RunFailed
from incast.measure.instrument import Instrument, Readings

SNAPLEN = 128
CAPTURE_DIR = "capture"
META = "capture.json"
_DROPPED = re.compile(r"(\d+) packets? dropped by kernel")
_CAPTURED = re.compile(r"(\d+) packets? captured")


class CaptureError(RunFailed):
    pass


def realtime_minus_monotonic_ns() -> int:
    """CLOCK_REALTIME - CLOCK_MONOTONIC now (the pair read as close together as Python can)."""
    best = None
    for _ in range(5):
        a = time.monotonic_ns()
        r = time.time_ns()
        b = time.monotonic_ns()
        if best is None or b - a < best[0]:
            best = (b - a, r - (a + b) // 2)
    return best[1]


class ServerCapture(Instrument):
    """tcpdump on each server's NIC, started before the measurement and stopped after;
    the summary's capture_dropped."""

    def __init__(self, bench):
        super().__init__(bench)
        self.dir = Path(bench.run_dir) / CAPTURE_DIR
        self.popen = bench.popen
        self.procs: list = []

    @classmethod
    def wanted(cls, scenario, features) -> bool:
        return scenario.telemetry.capture

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        for h in self.bench.servers:
            intf = h.defaultIntf().name
            # --immediate-mode: with TPACKET_V3 a partly filled ring block is not read
            # before tcpdump exits, and a short run can fit in one.
            cmd = ["tcpdump", "-i", intf, "-n", "--immediate-mode", "--time-stamp-precision", "nano", "-s", str(SNAPLEN), "-B", "8192",
                   "-w", str(self.dir / f"{h.name}.pcap"), "tcp"]
            self.procs.append((h, self.popen(h, cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                             text=True)))
        for h, p in self.procs:
            # tcpdump says "listening on IF" once its socket is open: from then on it sees
            # every packet, so the measurement may start.
            line = p.stderr.readline()
            while line and "listening on" not in line:
                line = p.stderr.readline()
            if not line:
                p.wait()
                raise CaptureError(f"tcpdump on {h.name} exited ({p.returncode}) before capturing")

    def stop(self) -> Readings:
        meta = self.finish(self.bench.t0_ns)
        dropped = [h["dropped_by_kernel"] for h in meta["hosts"].values()]
        total = None if None in dropped else sum(dropped)
        messages = []
        if total:
            messages.append(f"warning: the capture lost {total} packets (tcpdump's kernel drops): "
                            "incast explain will say so")
        return Readings(summary={"capture_dropped": total}, messages=messages)

    def finish(self, t0_monotonic_ns: int | None) -> dict:
        """Stop every tcpdump (it writes out what it holds) and write capture.json."""
        per_host = {}
        for h, p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for h, p in self.procs:
            try:
                err = p.communicate(timeout=60)[1]
            except subprocess.TimeoutExpired:
                p.kill()
                err = p.communicate()[1]
            dropped = _DROPPED.search(err or "")
            captured = _CAPTURED.search(err or "")
            per_host[h.name] = {"captured": int(captured.group(1)) if captured else None,
                                "dropped_by_kernel": int(dropped.group(1)) if dropped else None}
        meta = {"snaplen": SNAPLEN, "t0_monotonic_ns": t0_monotonic_ns,
                "realtime_minus_monotonic_ns": realtime_minus_monotonic_ns(), "hosts": per_host}
        (self.dir / META).write_text(json.dumps(meta, indent=1) + "\n")
        self.procs = []
        return meta

    def kill(self) -> None:
        for _, p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.procs = []
