"""The ``linux`` data plane: a kernel bridge per switch, a tc hierarchy per egress port.

Each switch port gets, in the world namespace of the run::

    root htb (rate = link rate)            the port's transmitter
      class 1:1 rate = ceil = link rate
        class 1:1c  prio c, ceil = link    strict priority: class 0 first
          bfifo limit = buffer share c     the class queue (pfifo for packet buffers)
    u32 filters: DSCP -> class c           the classification rule (k > 1 only)

The bfifo limit counts the bytes of whole frames (Ethernet header included), so a
32 KiB buffer holds 21 full-size frames, as a shallow-buffered switch does. HTB's token
burst is a few frames: the default (rate/HZ, 500 KB at 1 Gbit/s and HZ=250) would let a
burst leave at memory speed and the queue would never fill as on a real port.
"""
from __future__ import annotations

import pandas as pd
from mininet.node import Switch

from .. import netdev
from ..netdev import WIRE_OVERHEAD
from ..probe import MissingFeature
from ..scenario import ETH_HLEN
from ..telemetry import QdiscTracer
from . import DataPlane, port_rate, switch_ports

BURST_FRAMES = 4        # HTB bucket depth, in full frames
LEAF_RATE_SHARE = 1e-3  # guaranteed rate of a class; the rest is borrowed in prio order


class KernelBridge(Switch):
    """A Mininet switch that is a plain Linux bridge, configured over netlink only.

    (Mininet's LinuxBridge drives brctl, which falls back to sysfs paths of whatever
    network namespace /sys was mounted for.)"""

    def __init__(self, name, **params):
        Switch.__init__(self, name, **params)

    def start(self, controllers):
        ports = [i.name for i in self.intfList() if i.name != "lo"]
        netdev.batch("ip", [f"link add name {self.name} type bridge stp_state 0 forward_delay 0 "
                            "mcast_snooping 0 ageing_time 30000",
                            *(f"link set dev {p} master {self.name}" for p in ports),
                            *(f"link set dev {p} up" for p in ports),
                            f"link set dev {self.name} up"])

    def stop(self, deleteIntfs=True):
        netdev.delete_link(self.name)
        super().stop(deleteIntfs)


def htb_burst(mtu: int) -> int:
    return BURST_FRAMES * (mtu + ETH_HLEN)


def port_tc_commands(dev: str, scenario, rate: int | None = None) -> list[str]:
    """tc batch lines giving one switch port its shaped, partitioned egress buffer
    (at `rate`, default the link's)."""
    rate = rate or scenario.link.rate
    mtu = scenario.link.mtu
    qos = scenario.switch.qos
    frame = mtu + ETH_HLEN
    burst = htb_burst(mtu)
    limits = scenario.switch.class_limits(mtu)
    leaf_kind = "bfifo" if scenario.switch.buffer is not None else "pfifo"
    ecn = scenario.switch.ecn
    leaf_rate = max(8000, int(rate * LEAF_RATE_SHARE))
    lines = [
        f"qdisc replace dev {dev} root handle 1: htb default 10",
        f"class replace dev {dev} parent 1: classid 1:1 htb rate {rate}bit ceil {rate}bit "
        f"burst {burst} cburst {burst} overhead {WIRE_OVERHEAD} quantum {frame}",
    ]
    for c, limit in enumerate(limits):
        minor = 0x10 + c
        lines.append(f"class replace dev {dev} parent 1:1 classid 1:{minor:x} htb rate {leaf_rate}bit "
                     f"ceil {rate}bit burst {burst} cburst {burst} overhead {WIRE_OVERHEAD} prio {c} quantum {frame}")
        lines.append(f"qdisc replace dev {dev} parent 1:{minor:x} handle {minor:x}: "
                     + (red_marking(limit, ecn, frame) if ecn else f"{leaf_kind} limit {limit}"))
    if qos.queues > 1:
        for dscp, c in enumerate(qos.dscp_table()):
            if c:
                lines.append(f"filter add dev {dev} parent 1: protocol ip prio 1 u32 "
                             f"match ip dsfield {dscp << 2:#04x} 0xfc flowid 1:{0x10 + c:x}")
    return lines


def red_marking(limit: int, threshold: int, frame: int) -> str:
    """A class queue that marks CE above `threshold` bytes and tail-drops at `limit`.

    RED with min = threshold, max one byte above and probability 1 marks every ECN-capable
    packet that finds the average above the threshold (non-ECN packets are dropped there);
    a burst of threshold/frame + 1 packets gives the smallest EWMA weight tc allows from
    the threshold, so the average follows the queue within a few packets, as DCTCP wants
    an instantaneous queue."""
    burst = threshold // frame + 1
    return (f"red limit {limit} min {threshold} max {threshold + 1} avpkt {frame} burst {burst} "
            f"probability 1.0 ecn")


class LinuxDataPlane(DataPlane):
    name = "linux"
    port_burst_frames = BURST_FRAMES

    @classmethod
    def require(cls, features, scenario) -> list[str]:
        for qd in ("htb", "bfifo", "pfifo"):
            if not features.qdiscs.get(qd):
                raise MissingFeature(f"the kernel lacks the {qd} qdisc (CONFIG_NET_SCH_{qd.upper()}), "
                                     "needed for switch queues")
        if scenario.switch.ecn is not None and not features.qdiscs.get("red"):
            raise MissingFeature("switch.ecn on the linux data plane marks with the red qdisc, which this "
                                 "kernel lacks (CONFIG_NET_SCH_RED); the UML kernels have it: "
                                 "--clock virtual --kernel stock|hrtimer")
        if scenario.switch.qos.queues > 1 and not features.u32:
            raise MissingFeature("QoS partitioning needs the tc u32 classifier (CONFIG_NET_CLS_U32)")
        if scenario.telemetry.enabled and not features.virtual_time:
            from ..qdisc_recorder import recorder_binary
            ok, why = features.telemetry_ok()
            if recorder_binary() is None and not ok:    # the compiled recorder, else bpftrace
                raise MissingFeature(f"telemetry: {why}, and build/bpf/qdisc-trace is not built "
                                     "(scripts/build-bpf.sh)")
        return []

    def switch_class(self):
        return KernelBridge

    def configure(self, net, topo) -> None:
        self.ports = switch_ports(net)
        netdev.offloads_off([p.name for p in self.ports])
        lines = []
        for p in self.ports:
            lines += port_tc_commands(p.name, self.scenario, port_rate(p, self.scenario))
        self.tc_script = "\n".join(lines) + "\n"
        netdev.batch("tc", lines)

    def artifacts(self) -> dict[str, str]:
        return {"switch.tc": self.tc_script} if self.ports else {}

    def queue_counters(self) -> pd.DataFrame:
        rows = []
        limits = self.scenario.switch.class_limits(self.scenario.link.mtu)
        unit = "bytes" if self.scenario.switch.buffer is not None else "packets"
        for p in self.ports:
            for q in netdev.qdiscs(p.name, stats=True):
                handle = int(q["handle"].rstrip(":"), 16)
                if q["kind"] not in ("bfifo", "pfifo", "red") or not 0x10 <= handle < 0x18:
                    continue
                c = handle - 0x10
                rows.append({"switch": p.switch, "port": p.name, "peer": p.peer, "queue": c,
                             "sent_packets": q["packets"], "sent_bytes": q["bytes"],
                             "drops": q["drops"], "marks": q.get("marked", 0), "overlimits": q["overlimits"],
                             "backlog_bytes": q["backlog"], "backlog_packets": q["qlen"],
                             "limit": limits[c], "limit_unit": unit})
        return pd.DataFrame(rows)

    def telemetry(self, run_dir, host_of_ip: dict[str, str], world_inode: int):
        """In virtual time (User-Mode Linux), the queues' statistics sampled every
        telemetry.interval. Otherwise the compiled recorder (scripts/build-bpf.sh) when it is built: it costs the
        experiment nothing measurable. Otherwise bpftrace, which formats every event in
        user space and takes CPU from packet processing (it can soften a collapse)."""
        from ..qdisc_recorder import QdiscRecorder, recorder_binary
        ports = {p.ifindex: (p.switch, p.name) for p in self.ports}
        if self.features.virtual_time:      # no BPF events on ARCH=um; sampling is free there
            from ..qdisc_sampler import QdiscSampler
            return QdiscSampler(run_dir, world_inode, ports, host_of_ip, self.scenario.telemetry.interval)
        args = (run_dir, world_inode, ports, self.scenario.switch.qos.dscp_table(),
                self.features.qdisc_drop_reasons, host_of_ip)
        if recorder_binary() is not None:
            return QdiscRecorder(*args)
        ok, why = self.features.telemetry_ok()
        if not ok:
            raise MissingFeature("telemetry: " + why)
        return QdiscTracer(*args, perf_pages=self.scenario.telemetry.perf_buffer_pages)
