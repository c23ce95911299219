"""Configure the emulated hosts: their TCP profile and their NIC.

Every setting is per network namespace (sysctls under net.ipv4 and per-route metrics),
so hosts never change the machine's own TCP. Each host gets one shell script, run in
one round trip.

The host's NIC is an HTB at the link rate: a server cannot put more than 1 Gbit/s on
its link, as on real hardware. Its queue is the host's transmit queue (bounded by TCP
small queues, never dropping: its limit is far above what TSQ lets a socket queue);
losses happen only at the switch.
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass

from incast import dataplane as dataplanes
from incast.machine.netdev import offloads_off_command, tx_checksum_off_command
from incast.constants import NIC_SLACK_FRAMES_MAX, NIC_TIMER_SLACK_US, WIRE_OVERHEAD
from incast.constants import RTO_COUNTERS
from incast.constants import ETH_HLEN

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


@dataclass(frozen=True)
class TcpProfile:
    """A host's TCP as the scenario asks for it and this kernel can give it, resolved
    once: what the hosts are configured with is what the results report."""
    cc: str
    rto_min_us: int         # tcp.rto_min, with "min" replaced by the lowest this kernel accepts
    hrtimer: bool           # retransmission timers in microseconds (the hrtimer kernel)
    rto_floor_us: int       # the shortest timeout the kernel will actually wait
    sysctls: dict           # per-namespace sysctls
    route_metrics: str      # per-route options ("" for none)

    @classmethod
    def resolve(cls, tcp, features) -> "TcpProfile":
        """From scenario.TcpSettings (one profile)."""
        rto_min_us = features.lowest_rto_min_us if tcp.rto_min == "min" else tcp.rto_min
        hrtimer = bool(features.hrtimer_rto and tcp.hrtimer_rto is not False)
        return cls(tcp.cc, rto_min_us, hrtimer, features.effective_rto_floor(rto_min_us, hrtimer),
                   _sysctls(tcp, rto_min_us, features), _route_metrics(tcp, rto_min_us, features))

    @classmethod
    def of(cls, scenario, features, host: str) -> "TcpProfile":
        """The profile of a host, or of a role (``client``, ``servers``)."""
        return cls.resolve(scenario.tcp.for_host(host), features)


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
    return s


def _route_metrics(tcp, rto_min_us: int, features) -> str:
    opts = []
    if not tcp.delayed_ack:
        opts.append("quickack 1")      # the receiver ACKs every segment at once
    if tcp.initcwnd:
        opts.append(f"initcwnd {tcp.initcwnd}")
    if not features.rto_min_us_sysctl:
        opts.append(f"rto_min {max(1, rto_min_us // 1000)}ms")
    return " ".join(opts)


def nic_queue_bytes(mtu: int) -> int:
    """What a host NIC's queue holds: enough that it never drops (TCP small queues
    bound what a socket puts there)."""
    return NIC_QUEUE_PACKETS * (mtu + ETH_HLEN + WIRE_OVERHEAD)


def nic_qdisc(dev: str, rate: int, mtu: int, paused: bool = False, exact_timers: bool = False) -> str:
    """The host NIC: a token bucket at the link rate (tc batch syntax).

    TBF rather than HTB because a PAUSE must stop and restart it: changing a TBF
    refills its bucket, while an HTB class keeps the token debt of whatever it sent
    at the paused rate and would stay silent long after the PAUSE ends. With exact
    timers (virtual time) the bucket holds two frames: the NIC never sends more than
    two back to back, and makes up the fraction of a microsecond a wake-up can still be
    late there (UML charges each clock read 256 ns; with one frame, measured: 905.5
    instead of 941.6 Mbit/s for one sender at 1 Gbit/s)."""
    frame = mtu + ETH_HLEN
    limit = nic_queue_bytes(mtu)
    if paused:   # nothing more leaves (bar the frame already on its way, as on a real NIC)
        return f"qdisc change dev {dev} root handle 1: tbf rate 8bit burst {frame} limit {limit}"
    slack = frame if exact_timers else min(int(rate * NIC_TIMER_SLACK_US / 8e6), NIC_SLACK_FRAMES_MAX * frame)
    burst = frame + slack
    return (f"qdisc replace dev {dev} root handle 1: tbf rate {rate}bit burst {burst} "
            f"limit {limit} overhead {WIRE_OVERHEAD}")


def _exact_timers(features) -> bool:
    """Timers fire on time (virtual time): the NIC's bucket needs no slack."""
    return bool(features is not None and features.virtual_time)


# The plug qdisc under the NIC's token bucket, where the kernel has it and PAUSE is on.
PLUG_HANDLE = "10:"


def pause_by_plug(scenario, features) -> bool:
    """How a host's egress stops for PAUSE: a `plug` qdisc under the token bucket holds
    every frame at once; without it (or under netem) the bucket is changed to a rate
    that sends nothing."""
    return bool(scenario.switch.pause.enabled and features is not None and features.qdiscs.get("plug")
                and not scenario.link.needs_netem)


def nic_tc_commands(dev: str, scenario, features=None) -> list[str]:
    link = scenario.link
    cmds = ["tc " + nic_qdisc(dev, link.rate, link.mtu, exact_timers=_exact_timers(features))]
    if pause_by_plug(scenario, features):
        # A new plug holds everything until told otherwise.
        cmds += [f"tc qdisc replace dev {dev} parent 1:1 handle {PLUG_HANDLE} plug limit {nic_queue_bytes(link.mtu)}",
                 f"tc qdisc change dev {dev} parent 1:1 handle {PLUG_HANDLE} plug release_indefinite"]
    if link.needs_netem:
        netem = f"netem limit {NIC_QUEUE_PACKETS}"
        if link.delay:
            netem += f" delay {link.delay}us"
            if link.jitter:
                netem += f" {link.jitter}us"
        if link.loss:
            netem += f" loss {link.loss}%"
        cmds.append(f"tc qdisc replace dev {dev} parent 1:1 handle 10: {netem}")
    return cmds


def pause_commands(dev: str, scenario, features=None) -> tuple[str, str]:
    """tc batch lines that stop and restart a host's egress (for the PAUSE agent)."""
    link = scenario.link
    if pause_by_plug(scenario, features):
        plug = f"qdisc change dev {dev} parent 1:1 handle {PLUG_HANDLE} plug"
        return f"{plug} block", f"{plug} release_indefinite"
    resume = nic_qdisc(dev, link.rate, link.mtu, exact_timers=_exact_timers(features))
    resume = resume.replace("qdisc replace", "qdisc change", 1)
    return nic_qdisc(dev, link.rate, link.mtu, paused=True), resume


def pause_agent_args(dev: str, scenario, features=None) -> list[str]:
    """Arguments of hosts/pause_agent.py for this host's NIC."""
    pause_cmd, resume_cmd = pause_commands(dev, scenario, features)
    args = ["--dev", dev, "--rate", str(scenario.link.rate), "--mtu", str(scenario.link.mtu),
            "--pause-cmd", pause_cmd, "--resume-cmd", resume_cmd]
    if not pause_by_plug(scenario, features):
        args.append("--spend-token")   # the paused token bucket starts full: spend it
    return args


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


def host_script(host, scenario, tcp: TcpProfile, features,
                neighbours: list[tuple[str, str]] = ()) -> str:
    intf = host.defaultIntf().name
    ip = host.IP()
    sysctls = " ".join(f"{k}={v}" for k, v in tcp.sysctls.items())
    metrics = tcp.route_metrics
    lines = [
        "set -e",
        f"sysctl -q -w {sysctls}",
        offloads_off_command(intf) + " >/dev/null",
        *([tx_checksum_off_command(intf) + " >/dev/null"]
          if dataplanes.REGISTRY[scenario.dataplane].host_tx_checksum else []),
        *nic_tc_commands(intf, scenario, features),
    ]
    if metrics:
        lines.append(f"ip route replace 10.0.0.0/8 dev {intf} proto kernel scope link src {ip} {metrics}")
    if neighbours:
        lines += ["ip -batch - <<'NEIGHBOURS'",
                  *(f"neigh replace {nip} lladdr {mac} dev {intf} nud permanent" for nip, mac in neighbours),
                  "NEIGHBOURS"]
    lines.append("echo CONFIGURED")
    # Read back what the namespace now has: the results report that, not the request.
    lines.append(f"sysctl {' '.join(tcp.sysctls)}")
    lines.append("ip route show 10.0.0.0/8 | sed 's/^/route: /'")
    lines.append("echo \"static neighbours: $(ip neigh show nud permanent | wc -l)\"")
    return "\n".join(lines)


def host_popen(host, cmd: list[str], **kwargs) -> subprocess.Popen:
    """Start a process in a host's network namespace, and only there.

    (Mininet's Host.popen attaches to the host shell's mount namespace as well, which
    leaves a chroot or container the testbed may be running in.)"""
    return subprocess.Popen(["nsenter", f"--net=/proc/{host.pid}/ns/net", "--", *cmd], **kwargs)


def configure_hosts(hosts, servers, scenario, features) -> dict[str, dict]:
    """Apply each host's TCP profile, its NIC and its static neighbours (all hosts in
    parallel); raise with the first host's error. Returns, per host, its profile's name and the TCP settings read
    back from its namespace (sysctls, and the route carrying the per-route options)."""
    procs = []
    neighbours = static_neighbours(hosts, servers)
    for h in hosts:
        tcp = TcpProfile.of(scenario, features, h.name)
        script = host_script(h, scenario, tcp, features, neighbours[h.name])
        procs.append((h, host_popen(h, ["sh", "-c", script],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    failed, applied = [], {}
    for h, p in procs:
        out, _ = p.communicate()
        if p.returncode or "CONFIGURED" not in out:
            lines = out.strip().splitlines()
            failed.append(f"configuring host {h.name} failed: {lines[-1] if lines else 'no output'}")
            continue
        readback = out.split("CONFIGURED", 1)[1].strip().splitlines()
        sysctls = dict(ln.split(" = ", 1) for ln in readback if " = " in ln)
        route = next((ln[len("route: "):] for ln in readback if ln.startswith("route: ")), "")
        statics = next((ln.split(": ", 1)[1] for ln in readback if ln.startswith("static neighbours: ")), "0")
        applied[h.name] = {"profile": scenario.tcp.profile_of(h.name) or "tcp", "sysctls": sysctls,
                           "route": route.strip(), "static_neighbours": int(statics)}
    if failed:
        raise RuntimeError(failed[0])
    return applied


def read_counters(pid: int) -> dict[str, int]:
    """The TCP MIB counters of a host's namespace, read from the root namespace via /proc."""
    out: dict[str, int] = {}
    for name in ("snmp", "netstat"):
        try:
            lines = open(f"/proc/{pid}/net/{name}").read().splitlines()
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


COUNTERS = [*RTO_COUNTERS, "RetransSegs", "TCPLossProbes", "TCPSpuriousRTOs", "TCPFastRetrans",
            "TCPSlowStartRetrans", "TCPLostRetransmit", "DelayedACKs", "TCPSackRecovery",
            "TCPRenoRecovery", "InSegs", "OutSegs"]
