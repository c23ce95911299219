"""The linux data plane's shared buffer (switch.pool): its switch ports' class queues,
made as a run makes them (linux.port_tc_commands, linux.pool_actions), draw from one pool
in the UML kernels' plug qdisc (kernels/patches-um/0006) and admit exactly the frames
the rule of tests/pool_cases.py admits, as incast.p4 does (tests/test_p4_switch.py
checks bmv2 and the RTL switch against the same cases).

The queues are held (TCQ_PLUG_BUFFER) while the frames arrive, so what is admitted
depends on the arrivals alone; then released, and the frames that come out of each
port are the admitted ones. Runs in a UML guest: this machine's kernel has no pool."""
from __future__ import annotations

import errno
import json
import socket
import struct
import sys
import time
from pathlib import Path

import pytest

from conftest import needs_root
from pool_cases import CASES, admitted

pytestmark = [needs_root, pytest.mark.network]

MAGIC = b"incast-pool"
ETH_P_ALL = 0x0003
IPPROTO_EXPERIMENT = 253


def frame(seq: int, dscp: int, length: int) -> bytes:
    """An IPv4 frame of `length` bytes (Ethernet header included) with this DSCP,
    carrying MAGIC and its sequence number."""
    body = MAGIC + struct.pack("!I", seq)
    total = length - 14
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, dscp << 2, total, seq & 0xFFFF, 0, 64, IPPROTO_EXPERIMENT, 0,
                     bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]))
    eth = bytes.fromhex("020000000002" "020000000001") + struct.pack("!H", 0x0800)
    return (eth + ip + body).ljust(length, b"\0")


def seq_of(data: bytes) -> int | None:
    at = 14 + 20
    if len(data) >= at + len(MAGIC) + 4 and data[at:at + len(MAGIC)] == MAGIC:
        return struct.unpack_from("!I", data, at + len(MAGIC))[0]
    return None


def run_case(case) -> dict:
    """In the guest: the case's ports made as the linux data plane makes them, held, fed
    the arrivals, released; what each queue admitted and what the pool counted."""
    from incast.dataplane import Port
    from incast.dataplane.linux import pool_actions, port_tc_commands
    from incast.machine import netdev
    from incast.scenario import build
    scenario = build({}, {"link_rate": "1Gbit", **case.overrides})
    ports = sorted({p for p, _, _ in case.arrivals})
    devs = {}
    for p in ports:
        dev, peer = f"s1-eth{p}", f"h{p}-eth0"
        netdev.batch("ip", [f"link add {dev} type veth peer name {peer}", f"link set {dev} up",
                            f"link set {peer} up"])
        netdev.batch("tc", port_tc_commands(dev, scenario))
        devs[p] = Port("s1", dev, p, f"h{p}", socket.if_nametoindex(dev))
    netdev.plug_actions(pool_actions(list(devs.values()), scenario))
    leaves = [(devs[p].ifindex, f"{0x10 + c:x}:", f"1:{0x10 + c:x}") for p in ports
              for c in range(scenario.switch.qos.queues)]
    netdev.plug_actions([(*leaf, 0, 0) for leaf in leaves])          # TCQ_PLUG_BUFFER: hold
    table = scenario.switch.qos.dscp_table()
    dscp_of = {c: table.index(c) for c in range(scenario.switch.qos.queues)}
    send = {}
    for p in ports:
        send[p] = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        send[p].bind((devs[p].name, 0))
    recv = {}
    for p in ports:
        recv[p] = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        recv[p].bind((f"h{p}-eth0", 0))
        recv[p].setblocking(False)
    refused = 0
    for seq, (p, c, n) in enumerate(case.arrivals):
        try:
            send[p].send(frame(seq, dscp_of[c], n))
        except OSError as e:        # the qdisc dropped it: NET_XMIT_DROP comes back as ENOBUFS
            if e.errno != errno.ENOBUFS:
                raise
            refused += 1
    held = netdev.plug_xstats(devs[ports[0]].ifindex, "10:")
    netdev.plug_actions([(*leaf, 2, 0) for leaf in leaves])          # TCQ_PLUG_RELEASE_INDEFINITE
    # Until every queue has sent what it held: read their backlogs again (virtual time
    # moves on while this process waits in the kernel).
    while any(q["backlog"] for d in devs.values() for q in netdev.qdiscs_by_dev(stats=True).get(d.name, [])):
        time.sleep(0.001)
    got = {}
    for p in ports:
        while True:
            try:
                data = recv[p].recv(65536)
            except BlockingIOError:
                break
            seq = seq_of(data)
            if seq is not None:
                got[seq] = p
    drops = {f"{p}/{q['handle']}": q["drops"] for p in ports
             for q in netdev.qdiscs_by_dev(stats=True)[devs[p].name] if q["kind"] == "plug"}
    end = netdev.plug_xstats(devs[ports[0]].ifindex, "10:")
    for p in ports:
        netdev.delete_link(devs[p].name)
    return {"admitted": sorted(got), "ports": {str(s): p for s, p in got.items()}, "drops": drops,
            "refused": refused,
            "held": held, "end": end, "caps": scenario.switch.class_limits(scenario.link.mtu)}


@pytest.fixture(scope="module")
def guest_results(tmp_path_factory):
    from test_virtual_time import skip_reason

    from incast.vm import uml
    reason = skip_reason("uml-stock")
    if reason:
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("pool")
    repo = Path(__file__).resolve().parents[1]
    uml.run(f"{sys.executable} {Path(__file__).resolve()} $RESULTS/pool.json", kernel="uml-stock",
            results_dir=out / "r", cwd=repo, env={"PYTHONPATH": f"{repo}:{repo / 'tests'}"},
            memory_mb=512, timeout=600, check=True)
    return json.loads((out / "r" / "pool.json").read_text())


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_linux_plane_admits_what_the_pool_rule_admits(guest_results, case):
    got = guest_results[case.name]
    assert "error" not in got, got.get("error")
    want, most = admitted(case, got["caps"])
    assert got["admitted"] == [i for i, ok in enumerate(want) if ok]
    # Every frame admitted left by its own port; every other was counted a drop there.
    assert all(got["ports"][str(i)] == case.arrivals[i][0] for i in got["admitted"])
    assert sum(got["drops"].values()) == got["refused"] == len(case.arrivals) - len(got["admitted"])
    held_bytes = sum(case.arrivals[i][2] for i in got["admitted"])
    # While held the pool counts every admitted byte; once drained, none.
    assert got["held"]["pool_used"] == held_bytes == most == got["held"]["pool_max"]
    assert got["end"]["pool_used"] == 0 and got["end"]["pool_max"] == most


# Eight servers into one port with a 128 KiB cap, in virtual time on the stock kernel.
EIGHT_SERVERS = ["--clock", "virtual", "--kernel", "stock", "--link-rate", "1Gbit", "--buffer", "128KiB",
                 "--sru", "64KiB", "--senders", "8", "--blocks", "5", "--warmup", "1", "--rto-min", "min"]


def _needs_uml_stock():
    from test_virtual_time import skip_reason
    reason = skip_reason("uml-stock")
    if reason:
        pytest.skip(reason)


def test_a_run_on_the_linux_plane_holds_its_busy_port_to_the_dynamic_threshold(tmp_path, no_leftovers):
    """Eight servers into one port with a 128 KiB cap: alone it fills past 64 KiB; with a
    64 KiB pool under alpha 1 the busy queue may hold about alpha/(1+alpha) of the pool,
    32 KiB, and the pool says so, and is empty at the end. (The pool's count is exact;
    the queue's telemetry is sampled every 20 us, so only its upper bound is tight.)
    The pool's occupancy over time (pool.parquet, from the same samples) never passes
    the pool's own peak, reaches the busy queue's sampled peak, and ends empty."""
    import pandas as pd

    from conftest import run_json
    _needs_uml_stock()
    args = [*EIGHT_SERVERS, "--telemetry", "--set", "telemetry.interval=20us"]     # sampled: no BPF events in UML
    alone = run_json(*args, "--out", tmp_path / "alone")
    pooled = run_json(*args, "--set", "switch.pool.size=64KiB", "--out", tmp_path / "pooled")
    assert alone["max_queue_bytes"] > 64 * 1024, alone["max_queue_bytes"]
    # The busy queue, holding q, is admitted a frame of n bytes while q + n <= 64 KiB - (q + a)
    # (a: the ACKs queued at the servers' ports, under 1 KiB): it stops above
    # (64 KiB - a - n) / 2 > 30 KiB and below (64 KiB + n) / 2 <= 32 KiB + 757 (a frame is
    # admitted whole), and the pool, which holds q + a, peaks between 30 KiB and 34 KiB.
    assert 30 * 1024 <= pooled["switch_pool_max_bytes"] <= 34 * 1024, pooled["switch_pool_max_bytes"]
    assert 16 * 1024 < pooled["max_queue_bytes"] <= (64 * 1024 + 1514) // 2, pooled["max_queue_bytes"]
    assert pooled["switch_pool_end_bytes"] == 0
    pool = pd.read_parquet(tmp_path / "pooled" / "pool.parquet")
    assert list(pool.columns) == ["time_us", "switch", "bytes"] and set(pool["switch"]) == {"s1"}, pool
    assert pool["time_us"].is_monotonic_increasing and (pool["bytes"].diff().dropna() != 0).all()
    assert pooled["max_queue_bytes"] <= pool["bytes"].max() <= pooled["switch_pool_max_bytes"], pool["bytes"].max()
    assert not (tmp_path / "alone" / "pool.parquet").exists()      # no pool, no table


def test_pause_with_a_pool_on_the_linux_plane_is_lossless(tmp_path, no_leftovers):
    """The same eight servers, pool and cap with 802.3x PAUSE: XOFF is placed below the
    32 KiB the pool admits a lone queue (scenario.Switch.held_bytes), so the switch
    pauses the servers before the dynamic threshold drops anything. (With XOFF from
    the 128 KiB cap, 64 KiB, the threshold held the queue near 32 KiB: no PAUSE was
    ever sent and 193 frames were dropped.)"""
    from conftest import run_json
    _needs_uml_stock()
    s = run_json(*EIGHT_SERVERS, "--set", "switch.pool.size=64KiB", "--pause", "on", "--out", tmp_path / "paused")
    assert s["pause_xoff_bytes"] == 32768 - 2 * 1514 * 8, s["pause_xoff_bytes"]
    assert s["pause_frames_sent"] > 0 and s["drops"] == 0 and s["bottleneck_drops"] == 0, s
    assert s["switch_pool_max_bytes"] <= 32768 and s["switch_pool_end_bytes"] == 0, s


def test_this_machines_kernel_refuses_a_pool_in_one_line(tmp_path):
    """Where the kernel's plug has no pool (this machine's, on the real clock), a run with
    switch.pool stops before it builds anything, saying where the pool is."""
    from conftest import incast_cmd

    from incast.machine.probe import probe
    if probe().plug_pool:
        pytest.skip("this kernel's plug has a shared pool")
    r = incast_cmd("run", "--senders", "2", "--buffer", "128KiB", "--set", "switch.pool.size=64KiB",
                   "--out", tmp_path / "r")
    assert r.returncode != 0
    assert "switch.pool on the linux data plane" in r.stderr and "--clock virtual" in r.stderr, r.stderr[-1500:]
    assert not (tmp_path / "r" / "summary.json").exists()


def test_the_uml_kernels_plug_has_a_pool(guest_results):
    assert guest_results["probe"]["plug_pool"] is True


if __name__ == "__main__":
    from incast.machine.probe import probe
    results = {"probe": {"plug_pool": probe().plug_pool}}
    for c in CASES:
        try:
            results[c.name] = run_case(c)
        except Exception as e:      # reported to the test, which names it
            results[c.name] = {"error": f"{type(e).__name__}: {e}"}
    Path(sys.argv[1]).write_text(json.dumps(results))
