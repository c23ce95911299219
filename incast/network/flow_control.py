"""Flow control while a run measures: PAUSE (802.3x) and PFC (802.1Qbb) at the hosts
and the switches.

A veth ignores PAUSE. With ``switch.pause`` on, a host whose NIC queue has the plug
qdisc of the UML kernels (kernels/patches-um/0005) has its kernel obey PAUSE and PFC
there, as a NIC's MAC does: the plug holds the queue for the quanta the frame asks, no
process wakes. Any other host (a kernel whose plug refuses that, a NIC without the plug,
the host that storms) runs an agent (hosts/pause_agent.py) that stops its NIC's queue
when a PAUSE reaches it. The data plane starts what sends and obeys PAUSE at the
switches
(``DataPlane.start_flow_control``: a process for the linux plane, nothing for a P4
switch that does it in its pipeline). A storming host's agent keeps sending PAUSE from
``switch.pause.storm.after`` past the first measured block. What they did lands in
the summary (frames, paused time, the hosts' reaction, the headroom that reaction
needs against the headroom the buffer has) and, per switch port, in
``pause_ports.parquet``.
"""
from __future__ import annotations

import errno
import json
import signal
import socket
import subprocess
import sys

import numpy as np

from incast.constants import ETH_HLEN, HOSTS_DIR
from incast.errors import RunFailed
from incast.measure.instrument import Facts, Instrument, Readings
from incast.machine import netdev
from incast.network import hostconfig
from incast.scenario import PAUSE_FRAMES_IN_FLIGHT


class FlowControl(Instrument):

    def __init__(self, bench):
        super().__init__(bench)
        self.agents: list = []       # (host, its agent's process)
        self.in_kernel: list = []    # the hosts whose kernel obeys PAUSE itself
        self.storming = False

    @classmethod
    def wanted(cls, scenario, features) -> bool:
        return scenario.switch.pause.enabled

    def start(self) -> None:
        b, scenario = self.bench, self.bench.scenario
        classes = host_classes(scenario, b.net.hosts, b.servers, b.dscps)
        storm = scenario.switch.pause.storm
        # The storming host keeps its agent: the storm is the agent's.
        self.in_kernel = obey_in_kernel([h for h in b.net.hosts if not (storm and storm.host == h.name)],
                                        scenario, b.features, classes)
        kernel = {h.name for h in self.in_kernel}
        for h in b.net.hosts:
            if h.name in kernel:
                continue
            args = pause_agent_args(h.defaultIntf().name, scenario, b.features)
            args += ["--classes", ",".join(map(str, sorted(classes[h.name])))]
            if storm and storm.host == h.name:
                args += ["--storm-after-us", str(storm.after), "--storm-us", str(storm.duration),
                         "--quanta", str(scenario.switch.pause.quanta)]
            self.agents.append((h, b.popen(h, [sys.executable, str(HOSTS_DIR / "pause_agent.py"), *args],
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
        for h, a in self.agents:
            b.lines(a, f"PAUSE agent on {h.name}").expect("READY")
        b.dataplane.start_flow_control(b.run_dir)

    def measuring(self, rep: int) -> None:
        """The storming host's agent learns that the measured blocks begin (its storm
        starts switch.pause.storm.after later)."""
        storm = self.bench.scenario.switch.pause.storm
        if self.storming or not storm:
            return
        self.storming = True
        for h, a in self.agents:
            if h.name == storm.host:
                a.send_signal(signal.SIGUSR1)

    def stop(self) -> Readings:
        b, scenario = self.bench, self.bench.scenario
        ports = b.dataplane.stop_flow_control()
        pause = stop_agents(self.agents, b.dataplane)
        pause.update(obeyed_in_kernel(self.in_kernel, pause, len(self.agents),
                                  hostconfig.obeying_plug(scenario, b.features)))
        for edge in ("storm_start", "storm_end"):   # on the blocks' time axis
            if f"{edge}_ns" in pause and b.t0_ns is not None:
                pause[f"{edge}_us"] = round((pause.pop(f"{edge}_ns") - b.t0_ns) / 1000, 1)
        summary = pause_summary(scenario, pause)
        messages, lag = [], []
        room, needed = summary["pause_headroom_bytes"], summary["pause_headroom_needed_bytes"]
        if room is not None and needed > room:
            messages.append(
                f"warning: PAUSE cannot keep this buffer lossless: {room} B above XOFF, but "
                f"{needed} B can still arrive after it ({scenario.topology.senders} senders, each "
                "with the frames on their way and what it sends during the slowest reaction this run "
                "measured); give switch.buffer more room or switch.pause.xoff less")
        elif room is not None and (late := switch_detection_lag(summary, scenario, room)):
            lag.append(late)
            messages.append(late)
        return Readings(tables={"pause_ports.parquet": ports} if ports is not None else {},
                        summary=summary, messages=messages, facts=Facts(dataplane_warnings=lag))


def host_classes(scenario, hosts, servers, dscps) -> dict[str, set[int]]:
    """The traffic classes each host sends data in (the servers' DSCPs, background
    flows'); a host that sends only ACKs and requests sends them in class 0."""
    table = scenario.switch.qos.dscp_table()
    classes: dict[str, set[int]] = {h.name: set() for h in hosts}
    for server, dscp in zip(servers, dscps):
        classes[server.name].add(table[dscp])
    for f in scenario.background:
        classes[f.src].add(table[f.dscp])
    return {name: c or {0} for name, c in classes.items()}


def obey_in_kernel(hosts, scenario, features, classes: dict[str, set[int]]) -> list:
    """The hosts whose NIC's plug now obeys PAUSE and PFC itself: each plug told the
    link rate (TCQ_PLUG_OBEY) and the classes its host sends in (TCQ_PLUG_OBEY_PFC),
    from a thread entering each host's namespace (no process per host). None where the
    hosts' NICs have no plug to obey in (hostconfig.obeying_plug); a host whose kernel
    refuses the actions (EINVAL: a plug without kernels/patches-um/0005) is left out,
    for its agent."""
    where = hostconfig.obeying_plug(scenario, features)
    if not hosts or where is None or scenario.link.rate < 1000:
        return []
    plug = {"parent": where[0], "handle": where[1]}

    def obey(h) -> bool:
        index = socket.if_nametoindex(h.defaultIntf().name)
        try:
            # The classes first: obeying starts with the host's own.
            netdev.plug_action(index, **plug, action=netdev.TCQ_PLUG_OBEY_PFC,
                               limit=sum(1 << c for c in classes[h.name]))
            netdev.plug_action(index, **plug, action=netdev.TCQ_PLUG_OBEY, limit=scenario.link.rate // 1000)
        except OSError as e:
            if e.errno == errno.EINVAL:
                return False
            raise
        return True
    results = hostconfig.InEachNamespace(hosts, obey).join()
    failed = [f"{name}: {error}" for name, (error, _) in results.items() if error is not None]
    if failed:
        raise RunFailed(f"telling the hosts' plug to obey PAUSE failed: {failed[0]}")
    return [h for h in hosts if results[h.name][1]]


def obeyed_in_kernel(hosts, pause: dict, agents: int, where: tuple[str, str] | None = None) -> dict:
    """What the kernels of `hosts` obeyed (their plugs' statistics, read at the end),
    added to the agents' counts in `pause`; and how the hosts obeyed. The kernel stops
    the queue in the very softirq that receives the frame: no reaction to measure, so
    such hosts add none to reaction_us (the headroom then counts the frame on the wire,
    no more)."""
    out = {"host_pause_obeyed_by": "kernel" if not agents else "agent" if not hosts else "kernel and agent",
           "host_pause_agents": agents, "host_pause_pfc_ignored": 0}
    if not hosts:
        return out

    def read(h):
        return netdev.plug_xstats(socket.if_nametoindex(h.defaultIntf().name), where[1])
    results = hostconfig.InEachNamespace(hosts, read).join()
    paused_ns = 0
    frames = 0
    for h in hosts:
        error, stats = results[h.name]
        if error is not None or stats is None:
            raise RunFailed(f"reading {h.name}'s plug statistics failed: {error or 'none dumped'}")
        frames += stats["pause_frames"] + stats["resume_frames"]
        paused_ns += stats["paused_ns"]
        out["host_pause_pfc_ignored"] += stats["pfc_ignored"]
    out["paused_ms"] = round(pause["paused_ms"] + paused_ns / 1e6, 3)
    out["pause_frames_received"] = pause["pause_frames_received"] + frames
    return out


def stop_agents(agents, dp) -> dict:
    pause = {"paused_ms": 0.0, "pause_frames_received": 0, "pause_token_frames": 0, "reaction_us": []}
    for h, a in agents:
        a.terminate()
        out, err = a.communicate(timeout=30)
        if not out.strip():
            raise RunFailed(f"PAUSE agent on {h.name} failed: {err.strip()[-1500:] or 'no output'}")
        stats = json.loads(out.strip().splitlines()[-1])
        pause["paused_ms"] += stats["paused_ms"]
        pause["pause_frames_received"] += stats["pause_frames"] + stats["resume_frames"]
        pause["reaction_us"] += stats["reaction_us"]
        pause["pause_token_frames"] += stats["drains"]
        if "storm_frames" in stats:     # times as monotonic ns: the summary makes them relative
            pause.update({k: stats[k] for k in ("storm_frames", "storm_start_ns", "storm_end_ns") if k in stats})
    pause.update(dp.pause_counters())
    return pause


def pause_agent_args(dev: str, scenario, features=None) -> list[str]:
    """Arguments of hosts/pause_agent.py for this host's NIC: how hostconfig stops and
    restarts it (its plug, or its token bucket at a crawl)."""
    pause_cmd, resume_cmd = hostconfig.pause_commands(dev, scenario, features)
    args = ["--dev", dev, "--rate", str(scenario.link.rate), "--mtu", str(scenario.link.mtu),
            "--pause-cmd", pause_cmd, "--resume-cmd", resume_cmd]
    if not hostconfig.pause_by_plug(scenario, features):
        args.append("--spend-token")   # the paused token bucket starts full: spend it
    return args


def headroom_bytes(scenario) -> int | None:
    """With PAUSE (or PFC) on: the buffer above XOFF, the smallest over the queues
    PAUSE watches (each class queue under PFC, the port under 802.3x); with a pool,
    what the pool admits a lone busy queue above XOFF. None without PAUSE or with a
    buffer counted in packets."""
    sw = scenario.switch
    if not sw.pause.enabled or sw.buffer is None:
        return None
    mtu, senders = scenario.link.mtu, scenario.topology.senders
    if sw.pause.pfc:
        return min(sw.held_bytes(lim) - xoff for lim, (xoff, _) in
                   zip(sw.class_limits(mtu), sw.class_pause_thresholds(mtu, senders)))
    return sw.held_bytes(sw.buffer) - sw.port_pause_thresholds(mtu, senders)[0]


def headroom_needed(scenario, reaction_us: float) -> int:
    """Bytes that can still reach a port after it passes XOFF (as 802.3x and PFC
    headroom calculators count them): from every sender, the frame its NIC has
    committed, and the frame on its wire or, if more, what it sends at the link rate
    while the PAUSE reaches it and it reacts (reaction_us, measured by the run)."""
    frame = scenario.link.mtu + ETH_HLEN
    during = max(frame, int(reaction_us * scenario.link.rate / 8e6 + 0.999))
    per_sender = (PAUSE_FRAMES_IN_FLIGHT - 1) * frame + during
    return scenario.topology.senders * per_sender


def switch_detection_lag(summary: dict, scenario, room: int) -> str | None:
    """A warning where the switch learned of its queues too late for the buffer above
    XOFF, else None. A switch checks XOFF at every enqueue; the linux data plane's
    switches read their queues on a grid (hosts/switch_pause.py), and each sender keeps
    sending while a read is due. The slowest read this run measured counts as the
    hosts' reaction does: where the hosts alone fit in the room and the two together do
    not, the drops beyond are the emulator's, not the switch's (the 802.3x thresholds
    leave room for the frames on their way and one frame's time, no more)."""
    # The read that saw a queue above XOFF, the longest after the one before: a late
    # read while no queue was near XOFF (between blocks) costs nothing.
    gap = summary.get("switch_pause_xoff_lag_us_max")
    if not gap:
        return None
    needed = headroom_needed(scenario, (summary.get("pause_reaction_worst_us") or 0.0) + gap)
    if needed <= room:
        return None
    return (f"warning: PAUSE could not keep this switch lossless: it saw a queue above XOFF up to "
            f"{gap:.1f} us after the read before, and with that {needed} B can arrive after a port passes XOFF where the buffer above "
            f"it holds {room} B; frames beyond are dropped by the emulator's lag, not by the switch "
            "(a switch checks XOFF at every enqueue; switch.pause.interval shorter, or dataplane = bmv2)")


def headroom_us(scenario) -> float | None:
    """With PAUSE (or PFC) on: how long the buffer above XOFF takes every server's
    frames at the link rate, the smallest over the queues PAUSE watches. A switch that
    learns of its queue later than that drops what PAUSE would have held back. None
    without PAUSE or with a buffer counted in packets."""
    room = headroom_bytes(scenario)
    if room is None or not scenario.link.rate:
        return None
    return room * 8 / (scenario.topology.senders * scenario.link.rate) * 1e6


def pause_summary(scenario, pause: dict) -> dict:
    reactions = pause.pop("reaction_us")
    worst = float(max(reactions)) if reactions else 0.0
    return {"pause_frames": pause["pause_frames_sent"] + pause["xon_frames_sent"],
            # The buffer above XOFF against what can still arrive once a port passes it,
            # with the slowest reaction this run measured (a warning where it cannot hold it).
            "pause_headroom_bytes": headroom_bytes(scenario),
            "pause_headroom_needed_bytes": headroom_needed(scenario, worst),
            "paused_ms": round(pause["paused_ms"], 3),
            "pause_reaction_us_p50": float(np.median(reactions)) if reactions else None,
            "pause_reaction_us_p99": float(np.percentile(reactions, 99)) if reactions else None,
            "pause_reaction_worst_us": worst,
            **dict(zip(("pause_xoff_bytes", "pause_xon_bytes"), scenario.switch.port_pause_thresholds(
                scenario.link.mtu, scenario.topology.senders))),
            **pause}
