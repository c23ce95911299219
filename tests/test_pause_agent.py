"""The host PAUSE agent: a PAUSE frame stops the host's sending for quanta x 512 bit
times, and quanta 0 resumes it. Two namespaces: the host (a UDP sender behind a 100
Mbit/s NIC as runs build it, with the agent) and a peer that receives, timestamps every
packet and sends the PAUSE frames. The NIC stops by whichever mechanism this kernel
offers: a plug qdisc, or the token bucket's rate (tests/test_vm_pause.py runs this file
in the VM kernels, which have plug)."""
import contextlib
import functools
import json
import subprocess
import sys
import textwrap
import uuid

import pytest

from conftest import REPO, needs_root
from incast.network.flow_control import pause_agent_args
from incast.network.hostconfig import nic_tc_commands
from incast.machine.probe import probe
from incast.scenario import build

pytestmark = [needs_root, pytest.mark.network]

RATE = 100_000_000
SCENARIO = build({}, {"link_rate": f"{RATE}bit", "switch": "bmv2", "pause": "on"})


@functools.lru_cache(maxsize=1)
def host_nic() -> tuple[list[str], list[str]]:
    """The host NIC's tc commands and the agent's command line, for the mechanism this
    kernel offers (a plug qdisc, or the token bucket's rate)."""
    features = probe()
    return (nic_tc_commands("h0", SCENARIO, features),
            [sys.executable, str(REPO / "hosts/pause_agent.py"), *pause_agent_args("h0", SCENARIO, features)])

PEER = textwrap.dedent(r"""
    import json, socket, struct, sys, time
    from scapy.layers.l2 import Ether
    from scapy.contrib.mac_control import MACControlPause
    from scapy.compat import raw
    dev, plan = sys.argv[1], json.loads(sys.argv[2])
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("0.0.0.0", 9000)); rx.settimeout(0.002)
    # Kernel arrival timestamps: the receiving loop may lag behind the wire.
    SO_TIMESTAMPNS = 35   # asm-generic/socket.h; Python 3.11 does not export it
    rx.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW); tx.bind((dev, 0))
    arrivals, sent = [], []
    print("READY", flush=True)
    sys.stdin.readline()   # the plan starts when the test says GO
    start = time.time()
    steps = [(start + at, quanta) for at, quanta in plan["pauses"]]
    end = start + plan["duration"]
    while time.time() < end:
        now = time.time()
        while steps and steps[0][0] <= now:
            _, quanta = steps.pop(0)
            frame = raw(Ether(dst="01:80:c2:00:00:01", src="02:00:00:00:00:02") / MACControlPause(pause_time=quanta))
            sent.append((time.time(), quanta)); tx.send(frame)
        try:
            _, anc, _, _ = rx.recvmsg(2048, 64)
        except socket.timeout:
            continue
        for level, kind, data in anc:
            if kind == SO_TIMESTAMPNS:
                sec, nsec = struct.unpack("qq", data[:16])
                arrivals.append(sec + nsec * 1e-9)
    print(json.dumps({"arrivals": arrivals, "sent": sent}))
""")

SENDER = textwrap.dedent(r"""
    import socket, sys
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    payload = b"x" * 1000
    print("READY", flush=True)
    sys.stdin.readline()   # sends from GO until the test kills it
    while True:
        try:
            s.sendto(payload, socket.MSG_DONTWAIT, (sys.argv[1], 9000))
        except OSError:
            pass   # the host queue is full while paused
""")


def start_sender(host):
    sender = subprocess.Popen(["ip", "netns", "exec", host, sys.executable, "-c", SENDER, "10.9.0.2"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert sender.stdout.readline().strip() == "READY"
    return sender


def go(proc):
    proc.stdin.write("GO\n")
    proc.stdin.flush()


def start_peer(peer, pauses, duration):
    proc = subprocess.Popen(["ip", "netns", "exec", peer, "/usr/bin/python3", "-c", PEER, "p0",
                             json.dumps({"pauses": pauses, "duration": duration})],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "READY"
    return proc


def finish_peer(proc):
    """Start the peer's plan and return what it saw."""
    out, _ = proc.communicate("GO\n", timeout=60)
    assert proc.returncode == 0
    return json.loads(out)


def sh(*cmd, ns=None, check=True):
    if ns:
        cmd = ("ip", "netns", "exec", ns, *cmd)
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


@pytest.fixture
def pair():
    tag = uuid.uuid4().hex[:6]
    host, peer = f"pausetest-{tag}-h", f"pausetest-{tag}-p"
    try:
        sh("ip", "netns", "add", host)
        sh("ip", "netns", "add", peer)
        sh("ip", "link", "add", "h0", "netns", host, "type", "veth", "peer", "name", "p0", "netns", peer)
        for ns, dev, ip in ((host, "h0", "10.9.0.1/24"), (peer, "p0", "10.9.0.2/24")):
            sh("ip", "addr", "add", ip, "dev", dev, ns=ns)
            sh("ip", "link", "set", dev, "up", ns=ns)
            sh("ethtool", "-K", dev, "tso", "off", "gso", "off", "gro", "off", ns=ns, check=False)
        for cmd in host_nic()[0]:
            sh(*cmd.split(), ns=host)
        yield host, peer
    finally:
        for ns in (host, peer):
            subprocess.run(["ip", "netns", "pids", ns], capture_output=True)
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                subprocess.run(["kill", "-9", pid])
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@contextlib.contextmanager
def agent_and_sender(host, *agent_args):
    """The agent on the host and a sender waiting for GO; both stopped on the way out,
    when the agent's statistics fill the yielded dict."""
    agent = subprocess.Popen(["ip", "netns", "exec", host, *host_nic()[1], *agent_args],
                             stdout=subprocess.PIPE, text=True)
    sender = None
    stats = {}
    try:
        assert agent.stdout.readline().strip() == "READY"
        sender = start_sender(host)
        yield agent, sender, stats
    finally:
        if sender:
            sender.kill()
            sender.wait()
        agent.terminate()
        stats.update(json.loads(agent.communicate(timeout=10)[0].strip().splitlines()[-1]))


def run_plan(host, peer, pauses, duration=0.6):
    """The peer sends its PAUSE frames at the planned times while the host sends."""
    with agent_and_sender(host) as (_, sender, stats):
        peer_proc = start_peer(peer, pauses, duration)
        go(sender)
        out = finish_peer(peer_proc)
    return out, stats


def longest_gap(arrivals, after, until):
    times = [t for t in arrivals if after <= t <= until]
    gaps = [(b - a, a) for a, b in zip(times, times[1:])]
    return max(gaps) if gaps else (0.0, None)


def test_pause_stops_the_host_for_its_quanta(pair):
    host, peer = pair
    pause_s = 0.050
    quanta = round(pause_s * RATE / 512)
    out, stats = run_plan(host, peer, [(0.2, quanta)])
    (sent_at, _), = out["sent"]
    gap, gap_start = longest_gap(out["arrivals"], sent_at - 0.01, sent_at + 0.2)
    reaction = gap_start - sent_at
    print(f"\npause {pause_s * 1e3:.1f} ms -> sending stopped after {reaction * 1e3:.2f} ms "
          f"for {gap * 1e3:.2f} ms; agent: {stats}")
    assert stats["pause_frames"] == 1 and stats["expiries"] == 1
    # Measured on an idle 2-core machine: 0.3-0.4 ms to stop, the quanta's length within
    # 0.5 ms. The bounds leave room for a machine that is busy with other work.
    assert -0.001 < reaction < 0.005
    assert abs(gap - pause_s) < 0.008
    assert stats["paused_ms"] == pytest.approx(pause_s * 1e3, abs=8)


def test_quanta_zero_resumes_at_once(pair):
    host, peer = pair
    out, stats = run_plan(host, peer, [(0.2, 0xFFFF), (0.22, 0)])
    (pause_at, _), (resume_at, _) = out["sent"]
    gap, gap_start = longest_gap(out["arrivals"], pause_at - 0.01, pause_at + 0.3)
    print(f"\nresumed {resume_at - pause_at:.4f} s after the PAUSE; gap {gap * 1e3:.2f} ms; agent: {stats}")
    assert stats["pause_frames"] == 1 and stats["resume_frames"] == 1 and stats["expiries"] == 0
    assert abs(gap - (resume_at - pause_at)) < 0.008   # 0xFFFF quanta would be 335 ms


def test_a_host_that_starts_sending_during_a_pause_stays_silent(pair):
    """Changing the NIC's token bucket to the paused rate fills it: unless the agent
    spends that token at once, the first frame sent later in the pause leaves."""
    host, peer = pair
    pause_s = 0.3
    quanta = round(pause_s * RATE / 512)
    with agent_and_sender(host, "--events") as (agent, sender, stats):
        peer_proc = start_peer(peer, [(0.2, quanta)], 1.0)
        go(peer_proc)
        # The host is idle when the PAUSE arrives; it starts sending once the gate is shut.
        assert agent.stdout.readline().strip() == "CLOSED"
        go(sender)
        out = json.loads(peer_proc.communicate(timeout=60)[0])
    (sent_at, _), = out["sent"]
    first = min(out["arrivals"])
    mechanism = "token bucket" if "--spend-token" in host_nic()[1] else "plug"
    print(f"\nfirst datagram {(first - sent_at) * 1e3:.2f} ms after a {pause_s * 1e3:.0f} ms PAUSE "
          f"(mechanism: {mechanism}); agent: {stats}")
    if "--spend-token" in host_nic()[1]:
        assert stats["drains"] == 1
    # Nothing during the pause; then at once what waited (the host was sending all along).
    assert pause_s - 0.008 < first - sent_at < pause_s + 0.05, (first - sent_at)


def test_a_pfc_frame_stops_a_host_only_for_a_class_it_sends_in():
    """Frames built with scapy (the definitions the P4 tests use), read by the agent."""
    import importlib.util
    from scapy.compat import raw
    from scapy.contrib.mac_control import MACControlClassBasedFlowControl, MACControlPause
    from scapy.layers.l2 import Ether
    spec = importlib.util.spec_from_file_location("pause_agent", REPO / "hosts/pause_agent.py")
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)
    eth = Ether(dst="01:80:c2:00:00:01", src="02:00:00:00:00:01", type=0x8808)
    pfc = raw(eth / MACControlClassBasedFlowControl(c0_enabled=0, c1_enabled=1, c1_pause_time=300))
    assert agent.pause_quanta(pfc, {1}) == 300
    assert agent.pause_quanta(pfc, {0}) is None          # not this host's class: ignored
    assert agent.pause_quanta(pfc, {0, 1}) == 300
    assert agent.pause_quanta(raw(eth / MACControlPause(pause_time=7)), {0}) == 7
