"""The ``linux`` data plane: a kernel bridge per switch, a tc hierarchy per egress port.

Each switch port gets, in the world namespace of the run::

    root htb (rate = link rate)            the port's transmitter
      class 1:1 rate = ceil = link rate
        class 1:1c  prio c, ceil = link    strict priority: class 0 first
          bfifo limit = buffer share c     the class queue (pfifo for packet buffers;
                                           plug with PAUSE: a byte FIFO a pause can hold;
                                           plug with switch.pool: one that draws from the
                                           switch's shared buffer)
    u32 filters: DSCP -> class c           the classification rule (k > 1 only)

The bfifo limit counts the bytes of whole frames (Ethernet header included), so a
32 KiB buffer holds 21 full-size frames, as a shallow-buffered switch does. HTB's token
burst is a few frames: the default (rate/HZ, 500 KB at 1 Gbit/s and HZ=250) would let a
burst leave at memory speed and the queue would never fill as on a real port.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from mininet.node import Switch

from incast.constants import ETH_HLEN, HOSTS_DIR, WIRE_OVERHEAD
from incast.dataplane import DataPlane, Port, far_end, port_rate, switch_ports
from incast.dataplane.forwarding import flood_ports, next_hops
from incast.errors import MissingFeature
from incast.machine import netdev
from incast.measure.qdisc_recorder import QdiscRecorder, recorder_binary
from incast.measure.qdisc_sampler import QdiscSampler
from incast.measure.telemetry import QdiscTracer
from incast.registry import DATAPLANES

# HTB bucket depth, in full frames: the registry holds it, for the link monitor and
# calibration's key, which know the data plane without loading it.
BURST_FRAMES = DATAPLANES["linux"].port_burst_frames
EXACT_BURST_FRAMES = 2  # ... where timers are exact (virtual time): one frame of lateness made up
LEAF_RATE_SHARE = 1e-3  # guaranteed rate of a class; the rest is borrowed in prio order


CLOSED_FLOODS = "flood off mcast_flood off bcast_flood off"
OPEN_FLOODS = "flood on mcast_flood on bcast_flood on"


class KernelBridge(Switch):
    """A Mininet switch that is a plain Linux bridge, configured over netlink only.

    (Mininet's LinuxBridge drives brctl, which falls back to sysfs paths of whatever
    network namespace /sys was mounted for.)"""

    def __init__(self, name, **params):
        Switch.__init__(self, name, **params)

    def start(self, controllers):
        ports = [i.name for i in self.intfList() if i.name != "lo"]
        trunks = [i.name for i in self.intfList() if i.name != "lo" and i.link is not None
                  and isinstance(far_end(i).node, Switch)]
        netdev.batch("ip", bridge_start_commands(self.name, ports, trunks))

    def stop(self, deleteIntfs=True):
        netdev.delete_link(self.name)
        super().stop(deleteIntfs)


def bridge_start_commands(bridge: str, ports: list[str], trunks: list[str]) -> list[str]:
    """ip batch lines making a kernel bridge of `ports`, whose `trunks` (ports to other
    switches) flood nothing until forwarding_commands opens the spanning tree's:
    switches joined in a loop (two spines) would otherwise circulate the first multicast
    frame for ever, and in virtual time no clock runs while they do."""
    return [f"link add name {bridge} type bridge stp_state 0 forward_delay 0 "
            "mcast_snooping 0 ageing_time 30000",
            *(f"link set dev {p} master {bridge}" for p in ports),
            *(f"link set dev {p} type bridge_slave learning off {CLOSED_FLOODS}" for p in trunks),
            *(f"link set dev {p} up" for p in ports),
            f"link set dev {bridge} up"]


def htb_burst(mtu: int, exact_timers: bool = False) -> int:
    """HTB's bucket: a few frames where timers wake late, two where they are exact
    (virtual time: see hostconfig.nic_bucket)."""
    return (EXACT_BURST_FRAMES if exact_timers else BURST_FRAMES) * (mtu + ETH_HLEN)


def port_tc_commands(dev: str, scenario, rate: int | None = None, exact_timers: bool = False,
                     buffer: int | None = None) -> list[str]:
    """tc batch lines giving one switch port its shaped, partitioned egress buffer
    (at `rate`, default the link's; of `buffer` bytes, default the switch's)."""
    rate = rate or scenario.link.rate
    mtu = scenario.link.mtu
    qos = scenario.switch.qos
    frame = mtu + ETH_HLEN
    burst = htb_burst(mtu, exact_timers)
    switch = scenario.switch
    if buffer is not None:
        switch = switch.model_copy(update={"buffer": buffer, "buffer_packets": None})
    limits = switch.class_limits(mtu)
    leaf_kind = "bfifo" if switch.buffer is not None else "pfifo"
    ecn = scenario.switch.ecn
    leaf_rate = max(8000, int(rate * LEAF_RATE_SHARE))
    lines = [
        f"qdisc replace dev {dev} root handle 1: htb default 10",
        f"class replace dev {dev} parent 1: classid 1:1 htb rate {rate}bit ceil {rate}bit "
        f"burst {burst} cburst {burst} overhead {WIRE_OVERHEAD} quantum {frame}",
    ]
    # A byte FIFO that a PAUSE can hold (hosts/switch_pause.py), or that draws from a
    # shared buffer (pool_actions): the plug.
    plug = scenario.switch.pause.enabled or scenario.switch.pool is not None
    for c, limit in enumerate(limits):
        minor = 0x10 + c
        lines.append(f"class replace dev {dev} parent 1:1 classid 1:{minor:x} htb rate {leaf_rate}bit "
                     f"ceil {rate}bit burst {burst} cburst {burst} overhead {WIRE_OVERHEAD} prio {c} quantum {frame}")
        leaf = f"qdisc replace dev {dev} parent 1:{minor:x} handle {minor:x}: "
        if plug:
            # A new plug holds from the start, so it is opened at once.
            lines += [leaf + f"plug limit {limit}",
                      f"qdisc change dev {dev} parent 1:{minor:x} handle {minor:x}: plug release_indefinite"]
        else:
            lines.append(leaf + (red_marking(limit, ecn, frame) if ecn else f"{leaf_kind} limit {limit}"))
    if qos.queues > 1:
        for dscp, c in enumerate(qos.dscp_table()):
            if c:
                lines.append(f"filter add dev {dev} parent 1: protocol ip prio 1 u32 "
                             f"match ip dsfield {dscp << 2:#04x} 0xfc flowid 1:{0x10 + c:x}")
    return lines


def pool_actions(ports: list[Port], scenario) -> list[tuple[int, str, str, int, int]]:
    """netdev.plug_actions making every class queue of a switch draw from the switch's
    shared buffer (switch.pool; kernels/patches-um/0006): each switch a pool of its own
    (ids 1, 2, ... in the order of the switches' names), its size and alpha set once its
    first queue has joined."""
    pool = scenario.switch.pool
    if pool is None:
        return []
    classes = scenario.switch.qos.queues
    ids = {sw: i for i, sw in enumerate(sorted({p.switch for p in ports}), 1)}
    actions, sized = [], set()
    for p in ports:
        for c in range(classes):
            leaf = (p.ifindex, f"{0x10 + c:x}:", f"1:{0x10 + c:x}")
            actions.append((*leaf, netdev.TCQ_PLUG_POOL, ids[p.switch]))
            if p.switch not in sized:
                sized.add(p.switch)
                actions += [(*leaf, netdev.TCQ_PLUG_POOL_SIZE, pool.size),
                            (*leaf, netdev.TCQ_PLUG_POOL_ALPHA, round(pool.alpha * 16))]
    return actions


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


def forwarding_commands(ports: list[Port], macs: dict[str, str]) -> list[str]:
    """bridge batch lines making the kernel bridges forward as the topology says
    (dataplane.forwarding): a static FDB entry for every host on every switch, and no
    floods on trunks off the spanning tree (KernelBridge.start turned learning off on
    trunks: a host's frames may arrive over a trunk its replies do not take). `macs`:
    host -> MAC, in topology order."""
    by_number = {(p.switch, p.number): p.name for p in ports}
    tree = flood_ports(ports)
    lines = []
    for p in ports:
        if p.trunk:
            # KernelBridge.start closed every trunk's floods; the tree's open again.
            lines.append(f"link set dev {p.name} "
                         + (OPEN_FLOODS if p.number in tree[p.switch] else CLOSED_FLOODS))
    for sw, table in next_hops(ports, list(macs)).items():
        for host, number in table.items():
            lines.append(f"fdb replace {macs[host]} dev {by_number[sw, number]} master static")
    return lines


def flow_control_config(scenario, ports) -> dict:
    """hosts/switch_pause.py's configuration: the ports, their class queues' limits and
    XOFF/XON thresholds (each class queue's own: with one class, the port's), the poll
    interval, the watchdog."""
    sw, mtu = scenario.switch, scenario.link.mtu
    pause = sw.pause
    limits = sw.class_limits(mtu)
    senders = scenario.topology.senders
    thresholds = sw.class_pause_thresholds(mtu, senders)
    # A switch checks XOFF at every enqueue; these read their queues on a grid. A read a
    # frame's time apart let each server send a frame more than 802.3x's headroom holds
    # (FAST'08's 8 servers, 32 KB: 163 drops in 7 blocks; a quarter: none).
    frame_us = (mtu + ETH_HLEN + WIRE_OVERHEAD) * 8 / scenario.link.rate * 1e6
    interval = pause.interval or frame_us / 4
    wd = pause.watchdog
    return {"interval_us": interval, "frame_us": frame_us,
            # An interval asked for is a grid asked for (e.g. to see what a slower switch drops).
            "watch": "grid" if pause.interval else "told",
            "pfc": pause.pfc, "classes": len(limits), "leaf_base": 0x10,
            "quanta": pause.quanta,
            "xoff": [x for x, _ in thresholds], "xon": [y for _, y in thresholds],
            "watchdog": {"detect_us": wd.detect, "restore_us": wd.restore, "action": wd.action} if wd else None,
            "ports": [{"switch": p.switch, "dev": p.name, "ifindex": p.ifindex, "peer": p.peer,
                       "rate": port_rate(p, scenario), "limits": limits} for p in ports]}


class LinuxDataPlane(DataPlane):
    name = "linux"
    flow_control: subprocess.Popen | None = None   # hosts/switch_pause.py, while it runs
    pause_ports: pd.DataFrame | None = None        # its report: one row per port
    flow_control_report: dict | None = None        # ... and its poll statistics

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
        if scenario.switch.pause.enabled and not features.qdiscs.get("plug"):
            raise MissingFeature("switch.pause on the linux data plane holds class queues with the plug qdisc, "
                                 "which this kernel lacks (CONFIG_NET_SCH_PLUG); the UML kernels have it: "
                                 "--clock virtual --kernel stock|hrtimer")
        if scenario.switch.pool is not None:
            if not getattr(features, "plug_pool", False):
                raise MissingFeature("switch.pool on the linux data plane draws the class queues from a shared "
                                     "buffer in the plug qdisc of kernels/patches-um/0006, which this kernel "
                                     "lacks; the UML kernels have it: --clock virtual --kernel stock|hrtimer")
            if scenario.switch.ecn is not None:
                raise MissingFeature("switch.pool with switch.ecn: the linux data plane marks with the red qdisc, "
                                     "which has no shared buffer (use dataplane bmv2 or rtl)")
        if scenario.switch.qos.queues > 1 and not features.u32:
            raise MissingFeature("QoS partitioning needs the tc u32 classifier (CONFIG_NET_CLS_U32)")
        if scenario.telemetry.enabled and features.clock.bpf:
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
        self.bridge_script = "\n".join(forwarding_commands(self.ports, {h: net[h].MAC() for h in topo.hosts(sort=False)})) + "\n"
        netdev.batch("bridge", self.bridge_script.splitlines())
        lines = []
        for p in self.ports:
            lines += port_tc_commands(p.name, self.scenario, port_rate(p, self.scenario),
                                      exact_timers=self.features.clock.exact_timers,
                                      buffer=self.scenario.topology.trunk_buffer if p.trunk else None)
        self.tc_script = "\n".join(lines) + "\n"
        netdev.batch("tc", lines)
        # tc has no words for a plug's pool: the actions go over netlink, and the
        # artifact says them as (ifindex, handle, parent, action, limit).
        pool = pool_actions(self.ports, self.scenario)
        if pool:
            netdev.plug_actions(pool)
            self.tc_script += "".join(f"# plug action {a}\n" for a in pool)

    def artifacts(self) -> dict[str, str]:
        return {"switch.tc": self.tc_script, "switch.bridge": self.bridge_script} if self.ports else {}

    def health(self, sent_packets: int) -> tuple[dict, list[str]]:
        """With switch.pool, the most any switch's pool held (switch_pool_max_bytes) and
        what the pools still hold once the queues have drained (switch_pool_end_bytes:
        0 unless bytes leaked), from the plug's statistics of one queue of each switch (a
        pool's counts are its queues')."""
        if self.scenario.switch.pool is None:
            return {}, []
        self._until_drained()
        first = {}
        for p in self.ports:
            first.setdefault(p.switch, p)
        out = {"switch_pool_max_bytes": 0, "switch_pool_end_bytes": 0}
        for p in first.values():
            st = netdev.plug_xstats(p.ifindex, "10:") or {}
            out["switch_pool_max_bytes"] = max(out["switch_pool_max_bytes"], st.get("pool_max", 0))
            out["switch_pool_end_bytes"] += st.get("pool_used", 0)
        return out, []

    def _until_drained(self, polls: int = 1000) -> None:
        """Wait until the switches' queues hold nothing: the last frames of a run (its
        connections closing) may still be on their way out when it ends. Read again
        every 0.5 ms (at most `polls` times: a held queue never drains)."""
        ports = {p.name for p in self.ports}
        for _ in range(polls):
            every = netdev.qdiscs_by_dev(stats=True)
            if not any(q["backlog"] for dev in ports for q in every.get(dev, [])):
                return
            time.sleep(0.0005)      # between reads of a condition, not instead of one

    def queue_counters(self) -> pd.DataFrame:
        rows = []
        limits = self.scenario.switch.class_limits(self.scenario.link.mtu)
        unit = "bytes" if self.scenario.switch.buffer is not None else "packets"
        every = netdev.qdiscs_by_dev(stats=True)
        for p in self.ports:
            for q in every.get(p.name, []):
                handle = int(q["handle"].rstrip(":"), 16)
                if q["kind"] not in ("bfifo", "pfifo", "red", "plug") or not 0x10 <= handle < 0x18:
                    continue
                c = handle - 0x10
                rows.append({"switch": p.switch, "port": p.name, "peer": p.peer, "queue": c,
                             "sent_packets": q["packets"], "sent_bytes": q["bytes"],
                             "drops": q["drops"], "marks": q.get("marked", 0), "overlimits": q["overlimits"],
                             "backlog_bytes": q["backlog"], "backlog_packets": q["qlen"],
                             "limit": limits[c], "limit_unit": unit})
        return pd.DataFrame(rows)

    def start_flow_control(self, run_dir) -> None:
        if not self.scenario.switch.pause.enabled:
            return
        config = Path(run_dir) / "switch_pause.json"
        config.write_text(json.dumps(flow_control_config(self.scenario, self.ports), indent=1))
        # Runs in the caller's network namespace: the runner is in the switches' (world).
        self.flow_control = subprocess.Popen([sys.executable, str(HOSTS_DIR / "switch_pause.py"), str(config)],
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.flow_control.stdout.readline().strip()
        if line != "READY":
            self.flow_control.kill()
            err = self.flow_control.communicate()[1].strip()
            raise RuntimeError(f"switch PAUSE agent did not start: {err[-1500:] or line or 'no output'}")

    def stop_flow_control(self) -> pd.DataFrame | None:
        proc, self.flow_control = self.flow_control, None
        if proc is None:
            return None
        proc.terminate()
        out, err = proc.communicate(timeout=60)
        if proc.returncode != 0 or not out.strip():
            raise RuntimeError(f"switch PAUSE agent failed: {err.strip()[-1500:] or 'no report'}")
        report = json.loads(out.strip().splitlines()[-1])
        ports = pd.DataFrame(report.pop("ports"))
        ports["held_ms"] = ports["held_ms"].map(sum)    # over the port's class queues
        self.flow_control_report = report
        self.pause_ports = ports
        return ports

    def pause_counters(self) -> dict:
        ports = self.pause_ports
        if ports is None:
            return {}
        r = self.flow_control_report
        return {"pause_frames_sent": int(ports["pause_sent"].sum()), "xon_frames_sent": int(ports["xon_sent"].sum()),
                "switch_pause_frames_received": int(ports["pause_received"].sum()),
                "switch_held_ms": round(float(ports["held_ms"].sum()), 3),
                "watchdog_fired": int(ports["watchdog_fired"].sum()),
                "watchdog_restored": int(ports["watchdog_restored"].sum()),
                "switch_pause_polls": r["polls"], "switch_pause_poll_gap_us_p50": r["poll_gap_us_p50"],
                "switch_pause_poll_gap_us_max": r["poll_gap_us_max"],
                "switch_pause_xoff_lag_us_max": r["xoff_lag_us_max"],
                "switch_pause_sleeps": r["sleeps"], "switch_pause_slept_ms": r["slept_ms"],
                "switch_pause_woke_to_xoff": r["woke_to_xoff"],
                # "told": the kernel told each XOFF/XON crossing as it happened (the UML
                # kernels' plug watermarks), no read on a grid; "grid": read every interval.
                "switch_pause_watch": r["watch"], "switch_pause_crossings_told": r["crossings_told"],
                # System calls that sent the frames: one a decision, however many ports.
                "switch_pause_send_calls": r["send_calls"]}

    def telemetry(self, run_dir, host_of_ip: dict[str, str], world_inode: int):
        """In virtual time (User-Mode Linux), the queues' statistics sampled every
        telemetry.interval. Otherwise the compiled recorder (scripts/build-bpf.sh) when it is built: it costs the
        experiment nothing measurable. Otherwise bpftrace, which formats every event in
        user space and takes CPU from packet processing (it can soften a collapse)."""
        ports = {p.ifindex: (p.switch, p.name) for p in self.ports}
        if not self.features.clock.bpf:     # no BPF events on ARCH=um; sampling is free there
            return QdiscSampler(run_dir, world_inode, ports, host_of_ip, self.scenario.telemetry.interval,
                                pooled=self.scenario.switch.pool is not None)
        args = (run_dir, world_inode, ports, self.scenario.switch.qos.dscp_table(),
                self.features.qdisc_drop_reasons, host_of_ip)
        if recorder_binary() is not None:
            return QdiscRecorder(*args)
        ok, why = self.features.telemetry_ok()
        if not ok:
            raise MissingFeature("telemetry: " + why)
        return QdiscTracer(*args, perf_pages=self.scenario.telemetry.perf_buffer_pages)
