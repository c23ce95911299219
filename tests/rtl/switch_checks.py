"""Cycle-level checks of rtl/src/incast_switch.sv, run with cocotb by
tests/test_rtl_switch.py: what the P4 program's packet tests ask of a switch, and what
only a cycle-accurate model can answer (when PAUSE leaves, how far the buffer overshoots
XOFF, that no byte is lost or invented). Ports are 0-based here; postcards number
them from 1."""
import cocotb

from frame_checks import check_ecn_marks, check_report_frame
from switchbench import (DROP_BYTES, DROPS, ECN, LIMIT, OCC, TX_BYTES, TX_PKTS, XOFF_Q, XON_Q,
                         SwitchBench, host_mac, switch_mac, udp)

PAUSE_DST = "01:80:c2:00:00:01"


def pause_frame(src_mac: str, quanta: int) -> bytes:
    from scapy.compat import raw
    from scapy.contrib.mac_control import MACControlPause
    from scapy.layers.l2 import Ether
    return raw(Ether(dst=PAUSE_DST, src=src_mac) / MACControlPause(pause_time=quanta))


def pfc_frame(src_mac: str, cls: int, quanta: int) -> bytes:
    from scapy.compat import raw
    from scapy.contrib.mac_control import MACControlClassBasedFlowControl
    from scapy.layers.l2 import Ether
    return raw(Ether(dst=PAUSE_DST, src=src_mac) /
               MACControlClassBasedFlowControl(**{f"c{cls}_enabled": 1, f"c{cls}_pause_time": quanta}))


def occupancy_cap(sw, cap):
    """A watcher: the buffer never holds more than `cap` bytes; records the peak."""
    sw.peak = 0

    def check(bench):
        occ = int(bench.dut.pool_bytes.value)
        bench.peak = max(bench.peak, occ)
        assert occ <= cap, f"cycle {bench.cycle}: {occ} bytes buffered, cap {cap}"
    sw.watchers.append(check)


@cocotb.test()
async def forwards_to_the_learned_port_only(dut):
    sw = SwitchBench(dut)
    await sw.start()
    await sw.base_config()
    f = udp(0, 2)
    sw.send(0, f)
    await sw.until_idle()
    assert sw.frames(2) == [f]
    assert sw.frames(1) == [] and sw.frames(3) == []


@cocotb.test()
async def floods_an_unknown_destination_to_every_other_port(dut):
    from scapy.compat import raw
    from scapy.layers.l2 import ARP, Ether
    sw = SwitchBench(dut)
    await sw.start()
    await sw.base_config()
    arp = raw(Ether(src=host_mac(0), dst="ff:ff:ff:ff:ff:ff") / ARP(psrc="10.0.0.1", pdst="10.0.0.3"))
    sw.send(0, arp)
    await sw.until_idle()
    assert [sw.frames(p) for p in range(4)] == [[], [arp], [arp], [arp]]
    assert int(dut.cells_used.value) == 0 and int(dut.pool_bytes.value) == 0   # not counted, all freed


@cocotb.test()
async def classifies_dscp_into_class_queues(dut):
    sw = SwitchBench(dut)
    await sw.start()
    await sw.base_config()
    for dscp, cls in ((0, 0), (8, 1), (16, 2), (46, 0)):
        before = await sw.read(TX_PKTS + 2 * 8 + cls)
        sw.send(0, udp(0, 2, dscp=dscp))
        await sw.until_idle()
        assert await sw.read(TX_PKTS + 2 * 8 + cls) == before + 1, (dscp, cls)


@cocotb.test()
async def class_zero_is_served_first(dut):
    """Strict priority: frames of class 1 wait at a slow port; a class-0 frame that
    comes later leaves before those still waiting."""
    sw = SwitchBench(dut)
    await sw.start()
    await sw.base_config()
    await sw.hold(2)
    low = [udp(0, 2, dscp=8, size=200, sport=3000 + i) for i in range(5)]
    for f in low:
        sw.send(0, f)
    await sw.sent_in()
    high = udp(1, 2, size=200)
    sw.send(1, high)
    await sw.sent_in()
    await sw.release(2)
    await sw.until_idle()
    # the first class-1 frame left at once (a port's shaper holds only from its first frame)
    assert sw.frames(2) == low[:1] + [high] + low[1:]


@cocotb.test()
async def byte_limit_admission_conserves_bytes(dut):
    """A class queue of 5000 bytes at a port that drains slowly: frames past the limit
    are dropped and counted, the buffer never holds more than the limit, and every
    byte sent in is either sent out or counted as dropped."""
    sw = SwitchBench(dut)
    await sw.start()
    await sw.base_config()
    limit = 5000
    await sw.write(LIMIT + 2 * 8, limit)
    await sw.hold(2)
    occupancy_cap(sw, limit)
    frames = [udp(0, 2, size=1000, sport=3000 + i) for i in range(20)]   # 1042 bytes each
    for f in frames:
        sw.send(0, f)
    await sw.sent_in()
    await sw.release(2)
    await sw.until_idle()
    got = sw.frames(2)
    drops = await sw.read(DROPS + 2 * 8)
    assert drops > 0 and len(got) + drops == len(frames)
    assert len(got) >= limit // len(frames[0])
    assert got == [f for f in frames if f in got]                    # in order, unchanged
    assert await sw.read(TX_BYTES + 2 * 8) + await sw.read(DROP_BYTES + 2 * 8) == sum(map(len, frames))
    assert await sw.read(OCC + 2 * 8) == 0 and int(dut.cells_used.value) == 0
    assert 4 * 1042 <= sw.peak <= limit
    assert len(got) == 1 + limit // 1042    # the one that left at once, and what fit


@cocotb.test()
async def ecn_marks_capable_packets_above_k_with_a_valid_checksum(dut):
    from scapy.layers.l2 import Ether
    sw = SwitchBench(dut)
    await sw.start()
    await sw.base_config()
    k = 3000
    await sw.cfg(ecn_k=k)
    await sw.hold(1)
    frames = [udp(0, 1, size=1000, ecn=2 if i % 3 else 0, sport=3000 + i) for i in range(12)]
    for f in frames:
        sw.send(0, f)
    await sw.sent_in()
    await sw.release(1)
    await sw.until_idle()
    got = [Ether(f) for f in sw.frames(1)]
    # the frames before it still queued, but the first, which left at once
    marked = check_ecn_marks(frames, got, k, ahead=lambda i: max(0, i - 1))
    assert marked == 6 and await sw.read(ECN + 1 * 8) == marked


async def pause_config(sw, xoff=3000, xon=1500, quanta=0x1234, pfc=0):
    await sw.cfg(pause_on=1, xoff=xoff, xon=xon, quanta=quanta, pause_cycles=quanta * 64 // sw.lw,
                 refresh_cycles=1000, pfc=pfc)


@cocotb.test()
async def pause_leaves_within_two_cycles_of_xoff_and_xon_follows(dut):
    """802.3x: the cycle the port's bytes pass XOFF, a PAUSE frame (byte-exact) starts
    on every idle port but the congested one, within two cycles; quanta 0 once the port
    falls to XON."""
    from scapy.compat import raw
    from scapy.contrib.mac_control import MACControlPause
    from scapy.layers.l2 import Ether
    sw = SwitchBench(dut)
    await sw.start()
    await sw.base_config()
    await pause_config(sw)
    await sw.hold(2)
    crossed = []

    def watch(bench):
        if not crossed and int(bench.dut.pool_bytes.value) > 3000:
            crossed.append(bench.cycle)
    sw.watchers.append(watch)
    frame = udp(0, 2, size=1000)
    for _ in range(6):
        sw.send(0, frame)
    await sw.sent_in()
    await sw.release(2)
    await sw.until_idle()
    assert crossed
    for n in (0, 1, 3):
        xoff = raw(Ether(dst=PAUSE_DST, src=switch_mac(n)) / MACControlPause(pause_time=0x1234))
        xon = raw(Ether(dst=PAUSE_DST, src=switch_mac(n)) / MACControlPause(pause_time=0))
        got = sw.ports[n].received
        assert [r.frame for r in got] == [xoff, xon], (n, [r.frame.hex() for r in got])
        # pool_bytes shows the admission the cycle after it; the PAUSE starts one later
        assert got[0].start - crossed[0] <= 2, (n, got[0].start, crossed[0])
    sw.reaction = got[0].start - crossed[0]
    dut._log.info("PAUSE reaction: %d cycles after the buffer passed XOFF", sw.reaction)
    assert sw.frames(2) == [frame] * 6       # nothing toward the congested port but its frames


@cocotb.test()
async def xon_waits_for_the_congested_port(dut):
    sw = SwitchBench(dut)
    await sw.start()
    await sw.base_config()
    await pause_config(sw)
    await sw.hold(2)
    for _ in range(4):
        sw.send(0, udp(0, 2, size=1000))
    await sw.until(lambda b: len(b.ports[3].received) == 1, limit=50_000)
    sw.send(0, udp(0, 1, size=1000))      # leaves port 1 at once, its queue empty
    await sw.until(lambda b: len(b.frames(1)) >= 2, limit=50_000)
    await sw.cycles(2000)
    assert [len(f) for f in sw.frames(3)] == [60]          # no quanta 0 while port 2 is still full
    assert await sw.port_stat(2, "congested") == 1 and await sw.switch_stat("congested_ports") == 1


@cocotb.test()
async def no_loss_when_headroom_covers_the_reaction(dut):
    """Three hosts that obey PAUSE send 1500-byte frames to one port at line rate: with
    XOFF below the limit by what can still arrive after it (per sender, the frame on the
    wire and one more already in the switch), nothing is dropped, nothing exceeds the
    limit, and every frame arrives in order."""
    sw = SwitchBench(dut)
    await sw.start()
    await sw.base_config()
    limit = 32768
    senders = (0, 1, 3)
    headroom = len(senders) * 2 * (1514 + 24)
    xoff = limit - headroom
    await pause_config(sw, xoff=xoff, xon=xoff - 3000, quanta=0xFFFF)
    occupancy_cap(sw, limit)
    sent = {}
    for s in senders:
        sw.ports[s].obeys = True
        sent[s] = [udp(s, 2, size=1472, sport=5000 + i) for i in range(20)]
        for f in sent[s]:
            sw.send(s, f)
    await sw.until_idle(limit=2_000_000)
    assert await sw.read(DROPS + 2 * 8) == 0
    got = sw.frames(2)
    for s in senders:
        assert [f for f in got if f in sent[s]] == sent[s], s
    assert xoff < sw.peak <= limit
    dut._log.info("peak %d bytes with XOFF at %d: %d bytes of headroom used of %d",
                  sw.peak, xoff, sw.peak - xoff, headroom)
    assert await sw.port_stat(0, "pause_tx") > 0


@cocotb.test()
async def pfc_pauses_only_the_congested_class(dut):
    sw = SwitchBench(dut)
    await sw.start()
    await sw.base_config()
    await pause_config(sw, pfc=1)
    for q in range(32):
        xoff, xon = (3000, 1500) if q == 2 * 8 + 1 else (30000, 15000)
        await sw.write(XOFF_Q + q, xoff)
        await sw.write(XON_Q + q, xon)
    await sw.hold(2)
    for _ in range(6):                     # class 0: 6252 bytes, above class 1's XOFF, not its own
        sw.send(0, udp(0, 2, size=1000))
    await sw.sent_in()
    assert [r for r in sw.ports[3].received] == []
    for _ in range(6):
        sw.send(0, udp(0, 2, dscp=8, size=1000))
    await sw.sent_in()
    await sw.release(2)
    await sw.until_idle()
    for n in (0, 1, 3):
        pfc = [r.frame for r in sw.ports[n].received]
        assert pfc == [pfc_frame(switch_mac(n), 1, 0x1234), pfc_frame(switch_mac(n), 1, 0)], \
            (n, [f.hex() for f in pfc])
    assert len(sw.frames(2)) == 12


@cocotb.test()
async def obeys_a_received_pause_and_keeps_order(dut):
    """A PAUSE received at port 2 holds what is queued for port 2 for its quanta (a
    quantum: 512 bit times); port 3 flows on; then the frames leave in order."""
    sw = SwitchBench(dut)
    await sw.start()
    await sw.base_config()
    await sw.cfg(obey=1)
    quanta = 200
    p = sw.send(2, pause_frame(host_mac(2), quanta))
    await sw.until(lambda b: p.end >= 0)
    pause_end = p.end + quanta * 64 // sw.lw
    frames = [udp(0, 2, size=100 + i) for i in range(3)]
    for f in frames:
        sw.send(0, f)
    other = udp(0, 3)
    sw.send(0, other)
    await sw.until_idle(limit=200_000)
    assert sw.frames(3) == [other] and sw.ports[3].received[0].start < pause_end
    assert sw.frames(2) == frames
    first = sw.ports[2].received[0].start
    # it goes whole into the port's FIFO once the pause ends, then onto the wire
    assert pause_end <= first <= pause_end + -(-len(frames[0]) // sw.cw) + 4, (first, pause_end)
    assert await sw.port_stat(2, "pause_rx") == 1


@cocotb.test()
async def quanta_zero_ends_a_pause_at_once(dut):
    sw = SwitchBench(dut)
    await sw.start()
    await sw.base_config()
    await sw.cfg(obey=1)
    sw.send(2, pause_frame(host_mac(2), 65535))
    f = udp(0, 2)
    sw.send(0, f)
    await sw.cycles(3000)
    assert sw.frames(2) == []
    xon = sw.send(2, pause_frame(host_mac(2), 0))
    await sw.until(lambda b: b.frames(2) == [f], limit=10_000)
    assert sw.ports[2].received[0].start - xon.end <= -(-len(f) // sw.cw) + 4
    assert await sw.port_stat(2, "xon_rx") == 1


@cocotb.test()
async def pfc_received_holds_only_the_class_it_names(dut):
    sw = SwitchBench(dut)
    await sw.start()
    await sw.base_config()
    await sw.cfg(obey=1)
    sw.send(2, pfc_frame(host_mac(2), 1, 65535))
    c1, c0 = udp(0, 2, dscp=8), udp(0, 2)
    sw.send(0, c1)
    sw.send(0, c0)
    await sw.cycles(3000)
    assert sw.frames(2) == [c0]
    sw.send(2, pfc_frame(host_mac(2), 1, 0))
    await sw.until(lambda b: b.frames(2) == [c0, c1], limit=10_000)


@cocotb.test()
async def pause_and_pfc_are_never_forwarded(dut):
    from scapy.compat import raw
    from scapy.contrib.mac_control import MACControlPause
    from scapy.layers.l2 import Ether
    sw = SwitchBench(dut)
    await sw.start()
    await sw.base_config()
    sw.send(0, pause_frame(host_mac(0), 100))
    sw.send(0, pfc_frame(host_mac(0), 0, 5))
    sw.send(0, raw(Ether(dst=host_mac(2), src=host_mac(0), type=0x8808) / MACControlPause(pause_time=100)))
    await sw.until_idle()
    assert all(sw.frames(p) == [] for p in (1, 2, 3))
    assert await sw.port_stat(0, "mac_control_rx") == 3


@cocotb.test()
async def telemetry_postcards_read_with_the_scapy_layer(dut):
    from scapy.layers.inet import IP
    from scapy.layers.l2 import Ether
    from incast.p4.layers import IntReport, TelemetryReport
    sw = SwitchBench(dut)
    await sw.start()
    await sw.base_config()
    await sw.cfg(tel_mode=1, switch_id=7)
    await sw.hold(2)
    for i in range(5):
        sw.send(0, udp(0, 2, dscp=8, size=500, sport=3000 + i))
    await sw.sent_in()
    await sw.release(2)
    await sw.until_idle()
    frames = [r.frame for r in sw.telemetry.received]
    recs = [Ether(f)[IntReport] for f in frames]
    assert len(recs) == 5
    assert [Ether(f)[TelemetryReport].seq for f in frames] == list(range(5))
    for f in frames:   # the same report as incast.p4's: a valid IPv4 header, lengths to the frame's end
        group, _ = check_report_frame(f)
        assert Ether(f)[IP].src == "198.18.0.7" and group.node_id == 7
    for i, r in enumerate(recs):
        assert r.ingress_port == 1 and r.egress_port == 3 and r.queue == 1 and r.md_len == 17
        assert r.dropped == 0 and r.pkt_len == 542 and r.saddr == 0x0A000001 and r.daddr == 0x0A000003
        assert r.egress_ts >= r.ingress_ts and r.hop_latency == r.egress_ts - r.ingress_ts
        assert r.queue_occupancy == r.occ_enq_bytes
        assert r.occ_deq_bytes == 542 * r.deq_qdepth                # what it left behind
        assert Ether(bytes(r.payload))["UDP"].sport == 3000 + i      # the packet's own headers follow
    assert recs[-1].occ_enq_bytes > recs[0].occ_enq_bytes
    assert max(r.occ_enq_bytes for r in recs) <= 5 * 542
    assert recs[-1].occ_deq_bytes == 0


@cocotb.test()
async def telemetry_records_drops(dut):
    from scapy.layers.l2 import Ether
    from incast.p4.layers import IntReport
    sw = SwitchBench(dut)
    await sw.start()
    await sw.base_config()
    await sw.cfg(tel_mode=4, tel_threshold=1 << 30)   # departures: none; drops: all
    await sw.write(LIMIT + 2 * 8, 2000)
    await sw.hold(2)
    for i in range(5):
        sw.send(0, udp(0, 2, size=1000, sport=3000 + i))
    await sw.sent_in()
    await sw.release(2)
    await sw.until_idle()
    recs = [Ether(r.frame)[IntReport] for r in sw.telemetry.received]
    drops = await sw.read(DROPS + 2 * 8)
    assert len(recs) == drops and drops >= 3
    assert all(r.dropped == 1 and r.egress_port == 3 and r.pkt_len == 1042 for r in recs)
    assert all(r.occ_enq_bytes + 1042 > 2000 for r in recs)   # what it found: no room


@cocotb.test()
async def shared_pool_with_dynamic_thresholds(dut):
    """Dynamic thresholds (alpha 1): a frame is admitted while its queue, with it, holds
    at most alpha times the pool's free bytes; a queue alone stops near half the pool,
    and a second queue then still finds room."""
    sw = SwitchBench(dut)
    await sw.start()
    await sw.base_config(limit=1 << 20)
    pool = 20000
    await sw.cfg(pool_bytes=pool, pool_alpha16=16)
    await sw.hold(2)
    await sw.hold(3)
    occupancy_cap(sw, pool)
    for i in range(20):
        sw.send(0, udp(0, 2, size=1000, sport=3000 + i))
    await sw.sent_in()
    first = await sw.read(OCC + 2 * 8)
    # admitted while the queue with the frame stays within the free pool before it
    assert pool / 2 - 1042 <= first <= pool / 2 + 1042, first
    for i in range(20):
        sw.send(1, udp(1, 3, size=1000, sport=4000 + i))
    await sw.sent_in()
    second = await sw.read(OCC + 3 * 8)
    # alpha * (pool - first - second) >= second: about a third of the pool each
    assert second >= 4 * 1042 and first + second <= pool, (first, second)
    assert await sw.read(DROPS + 2 * 8) > 0 and await sw.read(DROPS + 3 * 8) > 0


@cocotb.test()
async def garbage_never_wedges_the_switch(dut):
    import os
    sw = SwitchBench(dut)
    await sw.start()
    await sw.base_config()
    junk = [b"\x00", b"\xff" * 13, os.urandom(60), os.urandom(1500), udp(0, 2)[:20], udp(0, 2)[:34],
            bytes.fromhex("0180c2000001") + bytes(6) + b"\x88\x08", udp(0, 2, size=3000)]
    for f in junk:
        sw.send(0, f)
    await sw.until_idle()
    assert await sw.port_stat(0, "rx_errors") >= 3     # the runts and the oversized frame
    f = udp(0, 2)
    sw.send(0, f)
    await sw.until_idle()
    assert sw.frames(2)[-1] == f
    assert int(dut.cells_used.value) == 0 and int(dut.pool_bytes.value) == 0
