"""What the running kernel and machine can do, found out before an experiment starts.

Features are probed by trying them in a scratch network namespace (a qdisc that the
kernel lacks fails to be created), not by trusting a kernel config that may be absent.
"""
from __future__ import annotations

import gzip
import os
import platform
import re
import shutil
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from incast.clock import Clock
from incast.clock import of_clocksource as clock_of
from incast.errors import MissingFeature
from incast.machine import netdev
from incast.machine.resources import setns

TRACEFS_CANDIDATES = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
REQUIRED_TOOLS = ("ip", "tc", "ethtool", "mnexec", "nsenter")


@dataclass
class Features:
    kernel: str
    hz: int
    qdiscs: dict[str, bool]
    u32: bool
    rto_min_us_sysctl: bool
    hrtimer_rto: bool
    cc_available: list[str]
    cc_allowed: list[str]
    tools: dict[str, bool]
    bpftrace: str | None
    tracefs: str | None
    tracepoints: dict[str, bool] = field(default_factory=dict)
    qdisc_drop_reasons: dict[str, int] = field(default_factory=dict)
    clocksource: str = ""
    # The plug qdisc draws from a buffer shared between queues (kernels/patches-um/0006):
    # the linux data plane's switch.pool.
    plug_pool: bool = False

    @property
    def clock(self) -> Clock:
        """The clock this kernel runs on (incast.clock): virtual in User-Mode Linux with
        time-travel, real otherwise."""
        return clock_of(self.clocksource)

    @property
    def virtual_time(self) -> bool:
        return self.clock.simulated

    @property
    def jiffy_us(self) -> int:
        return 1_000_000 // self.hz

    def effective_rto_floor(self, rto_min_us: int, hrtimer: bool) -> int:
        return rto_min_us if hrtimer else self.effective_rto_floor_us(rto_min_us)

    @property
    def lowest_rto_min_us(self) -> int:
        # tcp_rto_min_us accepts 1 µs; the per-route metric (older kernels) counts ms.
        return 1 if self.rto_min_us_sysctl else 1000

    def effective_rto_floor_us(self, rto_min_us: int) -> int:
        """The shortest timeout the kernel can arm for this rto_min: timers run on jiffies."""
        jiffies = max(1, -(-rto_min_us // self.jiffy_us))
        return jiffies * self.jiffy_us

    def telemetry_ok(self) -> tuple[bool, str]:
        if not self.bpftrace:
            return False, "bpftrace is not installed (apt-get install bpftrace)"
        if not self.tracefs:
            return False, "tracefs is not mounted (mount -t tracefs nodev /sys/kernel/tracing)"
        missing = [t for t, ok in self.tracepoints.items() if not ok]
        if missing:
            return False, f"kernel lacks tracepoints {', '.join(missing)}"
        return True, ""

    def summary_lines(self) -> list[str]:
        lines = [f"kernel {self.kernel}, HZ={self.hz} (jiffy {self.jiffy_us} us)"]
        if not self.clock.bpf:
            lines.append("virtual time (User-Mode Linux, time-travel): no BPF events; "
                         "queue telemetry is sampled")
        missing = [q for q, ok in self.qdiscs.items() if not ok]
        if missing:
            lines.append("qdiscs missing: " + ", ".join(missing))
        if not self.qdiscs.get("netem"):
            lines.append("no netem: link.delay, jitter and loss unavailable")
        if not self.qdiscs.get("plug"):
            lines.append("no plug: PAUSE stops a host by setting its NIC's token bucket to a rate "
                         "that sends nothing")
        if not self.u32:
            lines.append("tc u32 classifier missing: QoS classification unavailable")
        if not self.rto_min_us_sysctl:
            lines.append("net.ipv4.tcp_rto_min_us missing: rto_min set per route in ms")
        ok, why = self.telemetry_ok()
        if not ok:
            lines.append("telemetry unavailable: " + why)
        tools = [t for t, ok in self.tools.items() if not ok]
        if tools:
            lines.append("tools missing: " + ", ".join(tools))
        return lines

    def as_dict(self) -> dict:
        d = asdict(self)
        d["jiffy_us"] = self.jiffy_us
        d["lowest_rto_min_us"] = self.lowest_rto_min_us
        d["virtual_time"] = self.virtual_time
        return d


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def kernel_hz() -> int:
    """CONFIG_HZ from the kernel config, else measured from the jiffies counter."""
    sources = [Path("/proc/config.gz"), Path(f"/boot/config-{platform.release()}")]
    for src in sources:
        try:
            text = gzip.open(src, "rt").read() if src.suffix == ".gz" else src.read_text()
        except OSError:
            continue
        m = re.search(r"^CONFIG_HZ=(\d+)$", text, re.M)
        if m:
            return int(m.group(1))
    return _measure_hz()


def _measure_hz() -> int:
    def jiffies() -> int:
        m = re.search(r"^jiffies: (\d+)", Path("/proc/timer_list").read_text(), re.M)
        if not m:
            raise MissingFeature("cannot tell the kernel's HZ (no kernel config, no /proc/timer_list)")
        return int(m.group(1))
    j0, t0 = jiffies(), time.monotonic()
    time.sleep(0.2)  # a measurement interval, not synchronization
    j1, t1 = jiffies(), time.monotonic()
    rate = (j1 - j0) / (t1 - t0)
    return min((100, 250, 300, 1000), key=lambda hz: abs(hz - rate))


def _probe_netns() -> tuple[dict[str, bool], bool, bool, bool, bool]:
    """Try each qdisc and the u32 classifier on a veth link in a scratch namespace, and
    whether a plug joins a shared pool."""
    ns = f"incast-probe-{uuid.uuid4().hex[:8]}"
    qdiscs = {}
    subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
    try:
        def nsrun(*args):
            return _run(["ip", "netns", "exec", ns, *args])
        nsrun("ip", "link", "add", "probe0", "type", "veth", "peer", "name", "probe1")
        for qd, args in (("htb", ["htb"]), ("bfifo", ["bfifo", "limit", "10000"]),
                         ("pfifo", ["pfifo", "limit", "10"]), ("netem", ["netem", "delay", "1ms"]),
                         ("tbf", ["tbf", "rate", "1mbit", "burst", "10k", "latency", "1ms"]),
                         ("plug", ["plug", "limit", "10000"]),
                         ("red", ["red", "limit", "60000", "min", "15000", "max", "15001", "avpkt", "1514",
                                  "burst", "10", "probability", "1.0", "ecn"])):
            nsrun("tc", "qdisc", "del", "dev", "probe0", "root")
            r = nsrun("tc", "qdisc", "add", "dev", "probe0", "root", "handle", "1:", *args)
            qdiscs[qd] = r.returncode == 0
        nsrun("tc", "qdisc", "del", "dev", "probe0", "root")
        nsrun("tc", "qdisc", "add", "dev", "probe0", "root", "handle", "1:", "htb")
        r = nsrun("tc", "filter", "add", "dev", "probe0", "parent", "1:", "protocol", "ip", "prio", "1",
                  "u32", "match", "ip", "dsfield", "0x20", "0xfc", "flowid", "1:10")
        u32 = r.returncode == 0
        r = nsrun("sysctl", "-n", "net.ipv4.tcp_rto_min_us")
        rto_us = r.returncode == 0
        hr = nsrun("sysctl", "-n", "net.ipv4.tcp_rto_hrtimer").returncode == 0
        pool = False
        if qdiscs["plug"]:
            nsrun("tc", "qdisc", "del", "dev", "probe0", "root")
            nsrun("tc", "qdisc", "add", "dev", "probe0", "root", "handle", "1:", "plug", "limit", "10000")
            pool = _plug_joins_pool(ns, "probe0")
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    return qdiscs, u32, rto_us, hr, pool


def _plug_joins_pool(ns: str, dev: str) -> bool:
    """Whether the root plug of dev in namespace ns joins a shared pool (a kernel
    without kernels/patches-um/0006 refuses with EINVAL); from a thread in ns."""
    answer = []

    def join():
        setns(f"/run/netns/{ns}")
        try:
            netdev.plug_action(socket.if_nametoindex(dev), handle="1:", parent="ffff:ffff",   # TC_H_ROOT
                               action=netdev.TCQ_PLUG_POOL, limit=1)
            answer.append(True)
        except OSError:
            answer.append(False)
    t = threading.Thread(target=join, name="incast-probe-pool")
    t.start()
    t.join()
    return bool(answer and answer[0])


def _drop_reasons(tracefs: str | None) -> dict[str, int]:
    """Numeric skb drop reasons of the qdisc layer, from the tracepoint's format."""
    if not tracefs:
        return {}
    try:
        fmt = Path(tracefs, "events/skb/kfree_skb/format").read_text()
    except OSError:
        return {}
    return {name: int(num) for num, name in re.findall(r'\{ (\d+), "(QDISC[A-Z_]*)" \}', fmt)}


def _clocksource() -> str:
    try:
        return Path("/sys/devices/system/clocksource/clocksource0/current_clocksource").read_text().strip()
    except OSError:
        return ""


@lru_cache(maxsize=1)
def probe() -> Features:
    if os.geteuid() != 0:
        raise MissingFeature("incast builds networks and must run as root")
    tools = {t: shutil.which(t) is not None for t in REQUIRED_TOOLS}
    if not all(tools.values()):
        missing = ", ".join(t for t, ok in tools.items() if not ok)
        raise MissingFeature(f"missing tools: {missing} (run scripts/setup.sh)")
    qdiscs, u32, rto_us, hrtimer, plug_pool = _probe_netns()
    sysctl = Path("/proc/sys/net/ipv4")
    cc_avail = (sysctl / "tcp_available_congestion_control").read_text().split()
    cc_allowed = (sysctl / "tcp_allowed_congestion_control").read_text().split()
    bpftrace = shutil.which("bpftrace")
    version = None
    if bpftrace:
        r = _run([bpftrace, "--version"])
        version = r.stdout.strip() or "unknown"
    tracefs = next((p for p in TRACEFS_CANDIDATES if Path(p, "events").is_dir()), None)
    tps = {}
    for tp in ("qdisc/qdisc_enqueue", "qdisc/qdisc_dequeue", "skb/kfree_skb"):
        tps[tp.replace("/", ":")] = bool(tracefs) and Path(tracefs, "events", tp).is_dir()
    return Features(kernel=platform.release(), hz=kernel_hz(), qdiscs=qdiscs, u32=u32,
                    rto_min_us_sysctl=rto_us, hrtimer_rto=hrtimer, cc_available=cc_avail, cc_allowed=cc_allowed,
                    tools=tools, bpftrace=version, tracefs=tracefs, tracepoints=tps,
                    qdisc_drop_reasons=_drop_reasons(tracefs), clocksource=_clocksource(), plug_pool=plug_pool)
