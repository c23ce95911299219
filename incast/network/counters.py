"""Counters around the measured blocks: the hosts' TCP, the switches' queues, the
kernel's CPU input backlogs.

Each is read just before a repetition's first measured block and just after its
last; the differences are the tables ``counters.parquet`` (one row per host and
repetition: TCP MIB counters) and ``queues.parquet`` (one row per switch queue and
repetition: the data plane's counters and its queue's limit). Once everything else
has stopped, the data plane says whether it kept up with what its ports sent
(``DataPlane.health``).
"""
from __future__ import annotations

import pandas as pd

from incast.constants import RTO_COUNTERS
from incast.measure.instrument import Facts, Instrument, Readings
from incast.network.hostconfig import InEachNamespace

# TCPSpuriousRtxHostQueues: retransmissions (an RTO's among them) the kernel deferred
# because the original was still in the host's own queue: counted, never on the wire,
# so a capture cannot see them: where a trace finds fewer timeouts than the kernel
# counted, this says whether that is why.
COUNTERS = [*RTO_COUNTERS, "RetransSegs", "TCPLossProbes", "TCPSpuriousRTOs", "TCPFastRetrans",
            "TCPSlowStartRetrans", "TCPLostRetransmit", "DelayedACKs", "TCPSackRecovery",
            "TCPRenoRecovery", "TCPSpuriousRtxHostQueues", "InSegs", "OutSegs"]
QUEUE_KEY = ["switch", "port", "queue"]
QUEUE_COUNTERS = ("sent_packets", "sent_bytes", "drops", "marks", "overlimits")


def read_counters(hosts) -> dict[str, dict[str, int]]:
    """The TCP MIB counters of each host's namespace, from its /proc/thread-self/net."""
    read = InEachNamespace(hosts, lambda h: _mib_counters("/proc/thread-self/net")).join()
    failed = [f"{name}: {error}" for name, (error, _) in read.items() if error]
    if failed:
        raise RuntimeError(f"reading TCP counters failed: {failed[0]}")
    return {name: counters for name, (_, counters) in read.items()}


def _mib_counters(net_dir: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in ("snmp", "netstat"):
        try:
            lines = open(f"{net_dir}/{name}").read().splitlines()
        except OSError:
            continue
        for head, vals in zip(lines[::2], lines[1::2]):
            prefix, keys = head.split(":", 1)
            _, values = vals.split(":", 1)
            if prefix not in ("Tcp", "TcpExt"):
                continue
            for k, v in zip(keys.split(), values.split()):
                out[k] = int(v)
    return out


def softnet_drops() -> int:
    """Packets the kernel dropped because a CPU's input backlog was full
    (net.core.netdev_max_backlog): a loss point outside the switch queues."""
    total = 0
    for line in open("/proc/net/softnet_stat"):
        total += int(line.split()[1], 16)
    return total


def counter_rows(hosts, before: dict, after: dict, rep: int) -> list[dict]:
    rows = []
    for h in hosts:
        row = {"rep": rep, "host": h.name}
        for k in COUNTERS:
            row[k] = after[h.name].get(k, 0) - before[h.name].get(k, 0)
        rows.append(row)
    return rows


def queue_delta(before: pd.DataFrame, after: pd.DataFrame, rep: int) -> pd.DataFrame:
    delta = after.copy()
    b = before.set_index(QUEUE_KEY)
    a = after.set_index(QUEUE_KEY)
    for col in QUEUE_COUNTERS:
        delta[col] = (a[col] - b[col]).values
    delta.insert(0, "rep", rep)
    return delta


class Counters(Instrument):
    """counters.parquet and queues.parquet; backlog_drops and the data plane's health
    in the summary."""

    def __init__(self, bench):
        super().__init__(bench)
        self.before: dict = {}
        self.counter_rows: list[dict] = []
        self.queue_frames: list[pd.DataFrame] = []
        self.backlog_drops = 0

    def measuring(self, rep: int) -> None:
        b = self.bench
        self.before = {"counters": read_counters(b.net.hosts), "queues": b.dataplane.queue_counters(),
                       "softnet": softnet_drops()}

    def measured(self, rep: int) -> None:
        b, before = self.bench, self.before
        after = read_counters(b.net.hosts)
        self.queue_frames.append(queue_delta(before["queues"], b.dataplane.queue_counters(), rep))
        self.backlog_drops += softnet_drops() - before["softnet"]
        self.counter_rows += counter_rows(b.net.hosts, before["counters"], after, rep)

    def stop(self) -> Readings:
        queues = pd.concat(self.queue_frames, ignore_index=True)
        health, warnings = self.bench.dataplane.health(int(queues["sent_packets"].sum()))
        messages = list(warnings)
        if self.backlog_drops:
            messages.append(f"warning: {self.backlog_drops} packets dropped by full CPU input backlogs, not "
                            "by the switch (raise net.core.netdev_max_backlog)")
        return Readings(tables={"counters.parquet": pd.DataFrame(self.counter_rows), "queues.parquet": queues},
                        summary={"backlog_drops": self.backlog_drops, **health}, messages=messages,
                        facts=Facts(dataplane_warnings=warnings))
