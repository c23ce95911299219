"""Configure the emulated hosts: their TCP profile and their NIC.

Every setting is per network namespace (sysctls under net.ipv4 and per-route metrics),
so hosts never change the machine's own TCP. A host's sysctls and NIC offloads are set
from inside its namespace by a thread of this process, over netlink: no process is
started for a host (under User-Mode Linux a process costs about 30 ms of host time).

The host's NIC is a token bucket (tbf) at the link rate: a server cannot put more than
1 Gbit/s on its link, as on real hardware. Its queue is the host's transmit queue (bounded by TCP
small queues, never dropping: its limit is far above what TSQ lets a socket queue);
losses happen only at the switch.
"""
from __future__ import annotations

import os
import socket
import subprocess
import threading
from dataclasses import dataclass, field

from incast.constants import ETH_HLEN, NIC_SLACK_FRAMES_MAX, NIC_TIMER_SLACK_US, WIRE_OVERHEAD
from incast.eras import ERA_KNOBS, ERA_SYSCTLS
from incast.machine import netdev
from incast.machine.resources import setns
from incast.registry import DATAPLANES

NIC_QUEUE_PACKETS = 10_000
# A NIC sends at line rate and no faster: its bucket holds one frame plus what the
# link carries while the timer that restarts it is late. That lateness is worst when
# the machine is idle (the CPU sleeps between packets; measured here: p99 400-700 us at
# 20 Mbit/s, 13-30 us at 300 Mbit/s and up): with 100 us of slack one sender's NIC
# was served at 97% of 20 Mbit/s (goodput 91-92% of the link); with 1 ms, at 99.6%
# (93.8-94%, the payload limit is 94.1%). But a deeper bucket leaves as a burst after
# idle, at the start of every block: capped at 8 frames, one sender's burst fits the
# shallowest buffer the papers use (32 KiB = 21 frames) with room to spare, and with
# many senders the port overflows at the block's start either way.
# (NIC_TIMER_SLACK_US and NIC_SLACK_FRAMES_MAX are in incast.constants: fidelity judges by them.)


# IPv4 and TCP headers with the timestamp option (on in both eras): MSS = MTU - this.
TCP_IP_HEADERS = 20 + 20 + 12


def linux_2_6_28_windows(mss: int) -> dict[str, int]:
    """2.6.28's initial windows in segments for this MSS, as route options: its send
    window (tcp_init_cwnd: RFC 3390, 3 segments at 1448 bytes) and the receive window
    it advertised first (tcp_select_initial_window: 4 segments up to 1460 bytes)."""
    return {"initcwnd": 2 if mss > 1460 else 3 if mss > 1095 else 4,
            "initrwnd": 4 if mss <= 1460 else 3 if mss <= 3 * 1460 else 2}


@dataclass(frozen=True)
class TcpProfile:
    """A host's TCP as the scenario asks for it and this kernel can give it, resolved
    once: what the hosts are configured with is what the results report."""
    cc: str
    rto_min_us: int         # tcp.rto_min, with "min" replaced by the lowest this kernel accepts
    hrtimer: bool           # retransmission timers in microseconds (the hrtimer kernel)
    rto_floor_us: int       # the shortest timeout the kernel will actually wait
    sysctls: dict           # per-namespace sysctls; one the kernel lacks fails the host's configuration
    route_metrics: dict     # per-route options by ip's names (rto_min in ms), {} for none
    era: str = "modern"     # tcp.era
    # The era's sysctls: set where this kernel has them; the ones it lacks are reported
    # (tcp_hosts.json), not fatal: an older kernel lacks a knob because the behaviour it
    # switches off never came, a newer one may have dropped it (tcp_fack, tcp_abc).
    era_sysctls: dict = field(default_factory=dict)

    @classmethod
    def resolve(cls, tcp, features, mtu: int = 1500) -> "TcpProfile":
        """From scenario.TcpSettings (one profile), for links of this MTU."""
        rto_min_us = features.lowest_rto_min_us if tcp.rto_min == "min" else tcp.rto_min
        hrtimer = bool(features.hrtimer_rto and tcp.hrtimer_rto is not False)
        sysctls = _sysctls(tcp, rto_min_us, features)
        # tcp.sysctls win over the era's: a run can turn one knob back or forward.
        era = {k: v for k, v in ERA_SYSCTLS[tcp.era].items() if k not in sysctls}
        return cls(tcp.cc, rto_min_us, hrtimer, features.effective_rto_floor(rto_min_us, hrtimer),
                   sysctls, _route_metrics(tcp, rto_min_us, features, mtu), tcp.era, era)

    @classmethod
    def of(cls, scenario, features, host: str) -> "TcpProfile":
        """The profile of a host, or of a role (``client``, ``servers``)."""
        return cls.resolve(scenario.tcp.for_host(host), features, scenario.link.mtu)


def _sysctls(tcp, rto_min_us: int, features) -> dict[str, str]:
    s = {
        # Set explicitly: the machine's default may be anything (bbr here).
        "net.ipv4.tcp_congestion_control": tcp.cc,
        "net.ipv4.tcp_sack": "1" if tcp.sack else "0",
        "net.ipv4.tcp_reordering": str(tcp.dupack_threshold),
        "net.ipv4.tcp_slow_start_after_idle": "1" if tcp.slow_start_after_idle else "0",
        # Each run starts cold: no ssthresh/RTT cached from an earlier connection.
        "net.ipv4.tcp_no_metrics_save": "1",
        # The testbed speaks IPv4: no IPv6 neighbour/MLD chatter in the switch queues.
        "net.ipv6.conf.all.disable_ipv6": "1",
        "net.ipv6.conf.default.disable_ipv6": "1",
        # 2 (the kernel's default) answers ECN but never asks; dctcp asks whatever this says.
        "net.ipv4.tcp_ecn": "1" if tcp.ecn else "2",
    }
    if features.rto_min_us_sysctl:
        s["net.ipv4.tcp_rto_min_us"] = str(rto_min_us)
    if features.hrtimer_rto:
        s["net.ipv4.tcp_rto_hrtimer"] = "0" if tcp.hrtimer_rto is False else "1"
        s["net.ipv4.tcp_rto_random_pct"] = str(tcp.rto_random_pct)
        s["net.ipv4.tcp_delack_us"] = str(tcp.delack_us)
    # tcp.sysctls last: a name this kernel lacks fails the host's configuration, naming it.
    s.update({f"net.ipv4.{name}": value for name, value in tcp.sysctls.items()})
    return s


def _route_metrics(tcp, rto_min_us: int, features, mtu: int = 1500) -> dict[str, int]:
    opts = {}
    if not tcp.delayed_ack:
        opts["quickack"] = 1      # the receiver ACKs every segment at once
    # 2.6.18 started flows with RFC 3390's window as 2.6.28 did.
    windows = linux_2_6_28_windows(mtu - TCP_IP_HEADERS) if tcp.era != "modern" else {}
    initcwnd = tcp.initcwnd or windows.get("initcwnd")     # an explicit tcp.initcwnd wins
    if initcwnd:
        opts["initcwnd"] = initcwnd
    if windows:
        opts["initrwnd"] = windows["initrwnd"]
    if not features.rto_min_us_sysctl:
        opts["rto_min"] = max(1, rto_min_us // 1000)      # milliseconds, as a route keeps it
    return opts


def nic_queue_bytes(mtu: int) -> int:
    """What a host NIC's queue holds: enough that it never drops (TCP small queues
    bound what a socket puts there)."""
    return NIC_QUEUE_PACKETS * (mtu + ETH_HLEN + WIRE_OVERHEAD)


def nic_bucket(rate: int, mtu: int, exact_timers: bool = False) -> tuple[int, int]:
    """The host NIC's token bucket at the link rate: (burst, limit) in bytes.

    TBF rather than HTB because a PAUSE must stop and restart it: changing a TBF
    refills its bucket, while an HTB class keeps the token debt of whatever it sent
    at the paused rate and would stay silent long after the PAUSE ends. With exact
    timers (virtual time) the bucket holds a frame and a half: the half makes up the
    fraction of a microsecond a wake-up can still be late there (one sender at 1 Gbit/s,
    measured: 905.5 Mbit/s with one frame, 941.6 with one and a half), and the NIC never
    sends two full frames at once, as no NIC does. (A bucket of two frames did: the veth
    delivered both at one instant, and when a PAUSE ended FAST'08's 8 servers put 16
    frames into the 32 KB port at once, more than 802.3x's headroom holds.)"""
    frame = mtu + ETH_HLEN
    slack = frame // 2 if exact_timers else min(int(rate * NIC_TIMER_SLACK_US / 8e6), NIC_SLACK_FRAMES_MAX * frame)
    return frame + slack, nic_queue_bytes(mtu)


@dataclass(frozen=True)
class NicQdisc:
    """One qdisc of a host's NIC (nic_layout): its kind, place and options, which
    nic_by_netlink sends over netlink and nic_tc_commands writes as tc lines."""
    kind: str               # "tbf", "plug" or "netem"
    parent: str             # "root" or a class
    handle: str
    options: dict


def nic_layout(scenario, features=None) -> list[NicQdisc]:
    """The qdiscs of a host's NIC, root first: the token bucket at the link rate (nic_bucket);
    netem under it where the link has a delay, jitter or loss; and where PAUSE stops the
    host by a plug, the plug under the bucket (or under netem where hosts obey PAUSE in
    their kernel). A plug is made holding everything and released at once."""
    link = scenario.link
    burst, limit = nic_bucket(link.rate, link.mtu, _exact_timers(features))
    layout = [NicQdisc("tbf", "root", "1:", {"rate_bps": link.rate, "burst": burst, "limit": limit,
                                             "overhead": WIRE_OVERHEAD})]
    plug = ("1:1", PLUG_HANDLE) if pause_by_plug(scenario, features) else None
    if link.needs_netem:
        layout.append(NicQdisc("netem", "1:1", "10:", {"limit": NIC_QUEUE_PACKETS, "delay_us": link.delay,
                                                        "jitter_us": link.jitter, "loss_pct": link.loss}))
        plug = obeying_plug(scenario, features)
    if plug:
        layout.append(NicQdisc("plug", plug[0], plug[1], {"limit": nic_queue_bytes(link.mtu)}))
    return layout


def nic_by_netlink(rtnl, index: int, dev: str, scenario, features) -> None:
    """nic_layout made over netlink from a thread in the host's namespace (rtnl: a
    netdev.HostRtnl opened there), without a tc process per host."""
    for q in nic_layout(scenario, features):
        o = q.options
        if q.kind == "tbf":
            rtnl.tbf(index, handle=q.handle, **o)
        elif q.kind == "netem":
            rtnl.netem(index, parent=q.parent, handle=q.handle, what=dev, **o)
        else:
            rtnl.plug(index, parent=q.parent, handle=q.handle, action="limit", limit=o["limit"])
            rtnl.plug(index, parent=q.parent, handle=q.handle, action="release_indefinite", change=True)
    rtnl.commit()


def nic_tc_commands(dev: str, scenario, features=None) -> list[str]:
    """nic_layout as tc lines (tc rounds netem's delay to 64 ns ticks, which the netlink
    build does not): what a user would type, and the reference the tests compare the
    netlink build with."""
    cmds = []
    for q in nic_layout(scenario, features):
        if q.kind == "plug":
            cmds += [f"tc {_tc_line(q, dev)}", f"tc {_tc_line(q, dev, 'change', release=True)}"]
        else:
            cmds.append(f"tc {_tc_line(q, dev)}")
    return cmds


def _tc_line(q: NicQdisc, dev: str, verb: str = "replace", release: bool = False) -> str:
    """One qdisc of nic_layout as a tc batch line."""
    o = q.options
    at = f"qdisc {verb} dev {dev} {'root' if q.parent == 'root' else 'parent ' + q.parent} handle {q.handle}"
    if q.kind == "tbf":
        return f"{at} tbf rate {o['rate_bps']}bit burst {o['burst']} limit {o['limit']} overhead {o['overhead']}"
    if q.kind == "plug":
        return f"{at} plug release_indefinite" if release else f"{at} plug limit {o['limit']}"
    netem = f"{at} netem limit {o['limit']}"
    if o["delay_us"]:
        netem += f" delay {o['delay_us']}us" + (f" {o['jitter_us']}us" if o["jitter_us"] else "")
    if o["loss_pct"]:
        netem += f" loss {o['loss_pct']}%"
    return netem


def _exact_timers(features) -> bool:
    """Timers fire on time (virtual time): the NIC's bucket needs no slack."""
    return bool(features is not None and features.clock.exact_timers)


# The plug qdisc under the NIC's token bucket, where the kernel has it and PAUSE is on.
PLUG_HANDLE = "10:"
# Under netem (a link delay, jitter or loss), a plug under netem where hosts obey PAUSE
# in their kernel: frames that have served their delay wait there, as they wait in the
# token bucket when the agent stops it.
NETEM_PLUG_HANDLE = "20:"


def obeying_plug(scenario, features) -> tuple[str, str] | None:
    """(parent, handle) of the plug qdisc on a host's NIC whose kernel may obey PAUSE
    itself (kernels/patches-um/0005: incast.network.flow_control tells it the rate):
    the plug under the token bucket, or under netem where the link needs netem. None
    where PAUSE is off, switch.pause.hosts asks for agents, or the kernel has no plug."""
    pause = scenario.switch.pause
    if not (pause.enabled and pause.hosts == "kernel" and features is not None and features.qdiscs.get("plug")):
        return None
    return ("10:1", NETEM_PLUG_HANDLE) if scenario.link.needs_netem else ("1:1", PLUG_HANDLE)


def pause_by_plug(scenario, features) -> bool:
    """How a host's egress stops for PAUSE: a `plug` qdisc under the token bucket holds
    every frame at once; without it (or under netem) the bucket is changed to a rate
    that sends nothing."""
    return bool(scenario.switch.pause.enabled and features is not None and features.qdiscs.get("plug")
                and not scenario.link.needs_netem)


def pause_commands(dev: str, scenario, features=None) -> tuple[str, str]:
    """tc batch lines that stop and restart a host's egress (for the PAUSE agent): the
    plug blocked and released where PAUSE stops the host by a plug; else the token bucket
    changed to one that sends nothing more (bar the frame already on its way, as on a
    real NIC) and back."""
    if pause_by_plug(scenario, features):
        plug = f"qdisc change dev {dev} parent 1:1 handle {PLUG_HANDLE} plug"
        return f"{plug} block", f"{plug} release_indefinite"
    bucket = nic_layout(scenario, features)[0]
    frame = scenario.link.mtu + ETH_HLEN
    stop = f"qdisc change dev {dev} root handle {bucket.handle} tbf rate 8bit burst {frame} limit {bucket.options['limit']}"
    return stop, _tc_line(bucket, dev, "change")


def static_neighbours(hosts, servers) -> dict[str, list[tuple[str, str]]]:
    """Per host, the (IP, MAC) of the hosts it exchanges packets with: a server, every
    host that is not a server (the client, background hosts); any other host, every host.

    Entered as permanent neighbours, so no host resolves an address during a run. Why:
    the client's ARP requests for a thousand servers are flooded to every switch port
    at once, a thousand broadcast frames on each port overflow a shallow buffer (more
    than 32 KiB from about 780 servers), the requests are lost again on every retry,
    and the connections fail with "No route to host". Address resolution is not what
    the testbed measures."""
    server_names = {s.name for s in servers}
    addr = {h.name: (h.IP(), h.MAC()) for h in hosts}
    talkers = [addr[h.name] for h in hosts if h.name not in server_names]
    every = list(addr.values())
    return {h.name: [a for a in (talkers if h.name in server_names else every) if a != addr[h.name]]
            for h in hosts}


def host_requests(rtnl, host, tcp: TcpProfile, neighbours: list[tuple[str, str]] = ()) -> None:
    """One host's loopback, address and interface brought up, the route carrying the
    profile's per-route options and its static neighbours, queued on rtnl (a
    netdev.HostRtnl in the host's namespace) in the order ip needs them: an address
    before its route, a link up before a route through it."""
    rtnl.link_up(socket.if_nametoindex("lo"), "lo")
    for intf in host.intfList():
        if intf.name == "lo":
            continue
        index = socket.if_nametoindex(intf.name)
        if intf.IP():
            rtnl.address(index, intf.IP(), int(intf.prefixLen), intf.name)
        rtnl.link_up(index, intf.name)
    intf = host.defaultIntf()
    index = socket.if_nametoindex(intf.name)
    if tcp.route_metrics:
        rtnl.link_route(index, "10.0.0.0", 8, host.IP(), tcp.route_metrics, intf.name)
    for nip, mac in neighbours:
        rtnl.neighbour(index, nip, mac, intf.name)


def apply_sysctls(tcp: TcpProfile) -> list[str]:
    """Set the profile's sysctls in the calling thread's network namespace (/proc/sys/net
    is the opener's namespace's) and read back every knob of the profile and of the
    eras, as sysctl(8) prints them (``name = value``; a knob this kernel lacks prints
    nothing). A profile's knob the kernel lacks or refuses raises; an era's is skipped
    and reported (missing_sysctls).

    Unbuffered os.open/os.write/os.read: a file object costs four more system calls
    than that (fstat, an isatty ioctl, lseek, a second read), each dear under
    User-Mode Linux, and a run of 2048 servers reads and writes some 70 thousand knobs."""
    for sysctls, skip_missing in ((tcp.sysctls, False), (tcp.era_sysctls, True)):
        for k, v in sysctls.items():
            try:
                fd = os.open(_sysctl_path(k), os.O_WRONLY)
            except FileNotFoundError:
                if skip_missing:
                    continue
                raise RuntimeError(f"sysctl {k} = {v}: not set (no such knob)") from None
            data = str(v).encode()
            try:
                if os.write(fd, data) != len(data):
                    raise OSError(0, "a short write")
            except OSError as e:
                raise RuntimeError(f"sysctl {k} = {v}: not set (the kernel refuses it: {e.strerror})") from None
            finally:
                os.close(fd)
    lines = []
    for k in [*tcp.sysctls, *(k for k in ERA_KNOBS if k not in tcp.sysctls)]:
        try:
            lines.append(f"{k} = {_read_knob(k)}")
        except FileNotFoundError:
            pass
    return lines


def _read_knob(name: str) -> str:
    fd = os.open(_sysctl_path(name), os.O_RDONLY)
    try:
        return os.read(fd, 4096).decode().rstrip("\n")
    finally:
        os.close(fd)


def _sysctl_path(name: str) -> str:
    return "/proc/sys/" + name.replace(".", "/")


def host_popen(host, cmd: list[str], **kwargs) -> subprocess.Popen:
    """Start a process in a host's network namespace, and only there (network.link's
    hosts have no shell to start it from)."""
    return subprocess.Popen(["nsenter", f"--net={host.netns_path}", "--", *cmd], **kwargs)


def configure_hosts(hosts, servers, scenario, features) -> dict[str, dict]:
    """Apply each host's TCP profile, its NIC and its static neighbours; raise with the
    first host's error. Returns, per host, its profile's name and the TCP settings read
    back from its namespace (sysctls, and the route carrying the per-route options),
    its era, and the era's sysctls the kernel lacks (missing_sysctls).

    Under User-Mode Linux a process costs about 30 ms of host time, so a thousand hosts
    cannot have one each: one thread of this process enters each host's namespace in
    turn and sets its sysctls (/proc/sys), its NIC's offloads (ethtool's ioctl), and
    over netlink its addresses, route, neighbours and NIC queue (netdev.HostRtnl: the
    messages ip and tc would send, a host's sent together; a client's neighbours for
    2048 servers are 2048 of them)."""
    neighbours = static_neighbours(hosts, servers)
    profiles = {h.name: TcpProfile.of(scenario, features, h.name) for h in hosts}
    tx_off = DATAPLANES[scenario.dataplane].host_tx_checksum

    def configure(h):
        dev = h.defaultIntf().name
        index = socket.if_nametoindex(dev)
        netdev.offloads_off([dev], tx_checksum=tx_off)
        # a netlink socket belongs to its opener's namespace: opened here, in the host's
        with netdev.HostRtnl() as rtnl:
            host_requests(rtnl, h, profiles[h.name], neighbours[h.name])
            nic_by_netlink(rtnl, index, dev, scenario, features)
            sysctl_lines = apply_sysctls(profiles[h.name])
            return (sysctl_lines, rtnl.link_routes(index, dev), rtnl.permanent_neighbours(index),
                    rtnl.netem_ns(index))
    in_namespace = InEachNamespace(hosts, configure, (OSError, RuntimeError)).join()
    failed, applied = [], {}
    for h in hosts:
        error, got = in_namespace.get(h.name, ("not configured", None))
        if error is not None:
            failed.append(f"configuring host {h.name} failed: {error}")
            continue
        applied[h.name] = {"profile": scenario.tcp.profile_of(h.name) or "tcp",
                           **read_back(*got, profiles[h.name])}
    if failed:
        raise RuntimeError(failed[0])
    return applied


def read_back(sysctl_lines: list[str], routes: list[str], statics: int, netem_ns: tuple | None,
              tcp: TcpProfile) -> dict:
    """What a host's namespace holds once configured: its sysctls (``name = value``
    lines), its route to the hosts (as ``ip route`` prints it), how many static
    neighbours it has, its NIC's netem delay and jitter in ns (where it has one), and
    (missing_sysctls) the era's sysctls this kernel lacks."""
    sysctls = dict(ln.split(" = ", 1) for ln in sysctl_lines if " = " in ln)
    route = next((ln for ln in routes if ln.startswith("10.0.0.0/8 ")), "")
    return {"era": tcp.era, "sysctls": sysctls, "route": route.strip(), "static_neighbours": statics,
            **({"nic_delay_ns": list(netem_ns)} if netem_ns else {}),
            "missing_sysctls": [k for k in tcp.era_sysctls if k not in sysctls]}


class InEachNamespace:
    """fn(host) run inside each host's network namespace in turn, by one thread of this
    process (started at once; join() gives host -> (error or None, fn's result)).

    A thread, not a process: under User-Mode Linux a process costs tens of milliseconds
    of host time, and the hosts have none of their own to enter. The thread ends in the
    last host's namespace, and ends."""

    def __init__(self, hosts, fn, errors: tuple[type[Exception], ...] = (OSError,)):
        self.results: dict[str, tuple[str | None, object]] = {}

        def each():
            for h in hosts:
                try:
                    setns(h.netns_path)
                    self.results[h.name] = (None, fn(h))
                except errors as e:
                    self.results[h.name] = (str(e), None)
        self.thread = threading.Thread(target=each, name="incast-in-namespaces")
        self.thread.start()

    def join(self) -> dict[str, tuple[str | None, object]]:
        self.thread.join()
        return self.results
