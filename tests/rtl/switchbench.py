"""A cocotb bench for rtl/src/incast_switch.sv: drives the ports' receive sides with
whole frames at link rate, collects what every port and the telemetry port send,
and reads and writes the management registers.

Inputs change and outputs are sampled on the falling edge, half a cycle away from
the edges the design acts on. Every frame sent or received carries the cycle it
started on (`now`, the switch's own cycle counter), so tests can state timing in cycles.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge

# Management addresses (see the address map in incast_switch.sv).
CFG = {"switch_id": 0, "pause_on": 1, "xoff": 2, "xon": 3, "quanta": 4, "pause_cycles": 5,
       "refresh_cycles": 6, "tel_mode": 7, "tel_n": 8, "tel_threshold": 9, "tel_delta": 10,
       "ecn_k": 12, "pfc": 13, "obey": 14, "quantum": 15, "pool_bytes": 16, "pool_alpha16": 17, "us_mul": 24}
LIMIT, XOFF_Q, XON_Q = 0x1000, 0x2000, 0x3000
OCC, PKTS, DROPS, DROP_BYTES, TX_PKTS, TX_BYTES, ECN, Q_CONGESTED = (
    0x4000, 0x5000, 0x6000, 0x7000, 0x8000, 0x9000, 0xA000, 0xC000)
PORT_STATS = 0xB000
SHAPER = 0x0102    # + 4 * port: cycles between the starts of two frames (0: line rate)
PORT_STAT = {"bytes": 0, "mac_control_rx": 1, "pause_rx": 2, "xon_rx": 3, "pause_tx": 4, "xon_tx": 5,
             "rx_errors": 6, "congested": 7}
SWITCH_STAT = {"congested_ports": 0, "cells_used": 1, "pool_bytes": 2, "postcards": 3, "postcards_lost": 4}


def host_mac(port: int) -> str:
    return f"02:00:00:00:00:{port + 1:02x}"


def switch_mac(port: int) -> str:
    return f"02:00:00:00:ff:{port + 1:02x}"


def mac_int(mac: str) -> int:
    return int(mac.replace(":", ""), 16)


@dataclass
class Sent:
    frame: bytes
    cls: int = 0         # the class the switch will put it in (for a host obeying PFC)
    start: int = -1      # cycle its first byte went in
    end: int = -1


@dataclass
class Received:
    frame: bytes
    start: int           # cycle its first byte came out
    end: int


@dataclass
class Port:
    index: int
    lw: int
    pending: deque = field(default_factory=deque)
    current: Sent | None = None
    pos: int = 0
    gap: int = 0
    rx_buf: bytearray = field(default_factory=bytearray)
    rx_start: int = -1
    received: list = field(default_factory=list)
    obeys: bool = False                  # the host stops sending while the switch pauses it
    paused_until: list = field(default_factory=lambda: [0] * 8)   # per class, in cycles


def wire_gap(length: int, lw: int) -> int:
    """Idle cycles after a frame: what the MAC adds (FCS, padding, preamble, gap)."""
    wire = max(length + 4, 64) + 20
    return -(-wire // lw) - -(-length // lw)


class SwitchBench:
    def __init__(self, dut):
        self.dut = dut
        self.nports = int(dut.NPORTS.value) if hasattr(dut, "NPORTS") else len(dut.rx_valid)
        self.lw = len(dut.tel_keep)
        self.cw = int(dut.CW.value)
        self.ports = [Port(i, self.lw) for i in range(self.nports)]
        self.telemetry = Port(-1, self.lw)
        self.cycle = 0
        self.watchers = []   # called every cycle with the bench (cycle-level checks)

    async def start(self, period_ns: float = 8.0):
        d = self.dut
        cocotb.start_soon(Clock(d.clk, period_ns, units="ns").start())
        d.rst.value = 1
        d.rx_valid.value = 0
        d.rx_data.value = 0
        d.rx_keep.value = 0
        d.rx_last.value = 0
        d.mgmt_we.value = 0
        d.mgmt_addr.value = 0
        d.mgmt_wdata.value = 0
        d.skip_valid.value = 0
        d.skip_cycles.value = 0
        for _ in range(3):
            await RisingEdge(d.clk)
        await FallingEdge(d.clk)
        d.rst.value = 0
        cocotb.start_soon(self._pump())

    # ------------------------------------------------------------ management
    async def write(self, addr: int, value: int):
        d = self.dut
        await FallingEdge(d.clk)
        d.mgmt_we.value = 1
        d.mgmt_addr.value = addr
        d.mgmt_wdata.value = value & 0xFFFFFFFF
        await FallingEdge(d.clk)
        d.mgmt_we.value = 0

    async def read(self, addr: int) -> int:
        d = self.dut
        await FallingEdge(d.clk)
        d.mgmt_addr.value = addr
        await ReadOnly()
        return int(d.mgmt_rdata.value)

    async def cfg(self, **kw):
        for k, v in kw.items():
            await self.write(CFG[k], v)

    async def hold(self, port: int):
        """Stop the port sending data frames (its shaper at its maximum) after the first:
        its queues build up, as behind a slow link."""
        await self.write(SHAPER + port * 4, 0xFFFFFFFF)

    async def release(self, port: int):
        await self.write(SHAPER + port * 4, 0)

    async def sent_in(self, settle: int = 100):
        """Run until every frame handed to send() has gone into the switch."""
        await self.until(lambda b: not any(p.pending or p.current for p in b.ports))
        await self.cycles(settle)

    async def port_stat(self, port: int, name: str) -> int:
        return await self.read(PORT_STATS + port * 8 + PORT_STAT[name])

    async def switch_stat(self, name: str) -> int:
        return await self.read(0xD000 + SWITCH_STAT[name])

    async def base_config(self, limit: int = 32768):
        """incast.p4's test configuration: host n's MAC on port n, every class queue
        `limit` bytes, DSCP 8 -> class 1, DSCP 16 -> class 2."""
        for p in range(self.nports):
            mac = mac_int(switch_mac(p))
            await self.write(0x0100 + p * 4, mac & 0xFFFFFFFF)
            await self.write(0x0101 + p * 4, mac >> 32)
            hm = mac_int(host_mac(p))
            await self.write(0x0400 + p * 2, hm & 0xFFFFFFFF)
            await self.write(0x0401 + p * 2, (hm >> 32) | (p << 16) | (1 << 31))
            for c in range(8):
                await self.write(LIMIT + p * 8 + c, limit)
        await self.write(0x0600 + 8, 0x100 | 1)
        await self.write(0x0600 + 16, 0x100 | 2)

    # -------------------------------------------------------------- traffic
    def send(self, port: int, frame: bytes, cls: int = 0) -> Sent:
        s = Sent(bytes(frame), cls)
        self.ports[port].pending.append(s)
        return s

    def frames(self, port: int) -> list[bytes]:
        return [r.frame for r in self.ports[port].received]

    async def cycles(self, n: int):
        for _ in range(n):
            await FallingEdge(self.dut.clk)

    async def until(self, predicate, limit: int = 1_000_000):
        """Run until predicate(bench) holds (at most `limit` cycles)."""
        for _ in range(limit):
            await FallingEdge(self.dut.clk)
            if predicate(self):
                return
        raise AssertionError(f"not reached in {limit} cycles")

    async def until_idle(self, limit: int = 2_000_000, settle: int = 200):
        """Run until nothing is waiting to be sent in and the switch has been quiet
        for `settle` cycles (at most `limit` cycles)."""
        quiet_for = 0
        for _ in range(limit):
            await FallingEdge(self.dut.clk)
            d = self.dut
            waiting = int(d.wake.value) > int(d.now.value)   # a pause or the shaper holds a frame
            busy = any(p.pending or p.current for p in self.ports) or not int(d.quiet.value) or waiting
            quiet_for = 0 if busy else quiet_for + 1
            if quiet_for >= settle:
                return
        raise AssertionError(f"the switch was still busy after {limit} cycles")

    async def _pump(self):
        d, lw = self.dut, self.lw
        while True:
            await FallingEdge(d.clk)
            self.cycle = int(d.now.value)
            # what the switch sent
            tv, td, tk, tl = int(d.tx_valid.value), int(d.tx_data.value), int(d.tx_keep.value), int(d.tx_last.value)
            for p in self.ports:
                if tv >> p.index & 1:
                    self._collect(p, td >> (p.index * lw * 8), tk >> (p.index * lw), tl >> p.index & 1)
            if int(d.tel_valid.value):
                self._collect(self.telemetry, int(d.tel_data.value), int(d.tel_keep.value), int(d.tel_last.value))
            # what goes in next
            valid = data = keep = last = 0
            for p in self.ports:
                if (p.current is None and p.gap == 0 and p.pending
                        and self.cycle >= p.paused_until[p.pending[0].cls]):
                    p.current, p.pos = p.pending.popleft(), 0
                    p.current.start = self.cycle
                if p.current is not None:
                    chunk = p.current.frame[p.pos:p.pos + lw]
                    p.pos += len(chunk)
                    valid |= 1 << p.index
                    data |= int.from_bytes(chunk, "little") << (p.index * lw * 8)
                    keep |= ((1 << len(chunk)) - 1) << (p.index * lw)
                    if p.pos >= len(p.current.frame):
                        last |= 1 << p.index
                        p.current.end = self.cycle
                        p.gap = wire_gap(len(p.current.frame), lw)
                        p.current = None
                elif p.gap:
                    p.gap -= 1
            d.rx_valid.value = valid
            d.rx_data.value = data
            d.rx_keep.value = keep
            d.rx_last.value = last
            for w in self.watchers:
                w(self)

    def _collect(self, p: Port, data: int, keep: int, last: int):
        if not p.rx_buf:
            p.rx_start = self.cycle
        n = bin(keep & ((1 << self.lw) - 1)).count("1")
        p.rx_buf += (data & ((1 << (8 * n)) - 1)).to_bytes(n, "little")
        if last:
            frame = bytes(p.rx_buf)
            p.received.append(Received(frame, p.rx_start, self.cycle))
            p.rx_buf = bytearray()
            if p.obeys and frame[12:14] == b"\x88\x08":
                self._obey(p, frame)

    def _obey(self, p: Port, frame: bytes):
        # A host MAC takes a PAUSE (PFC) when its last byte arrives: no new frame (of the
        # class) starts for quanta * 512 bit times.
        quantum = 64 // self.lw
        opcode = int.from_bytes(frame[14:16], "big")
        if opcode == 1:
            q = int.from_bytes(frame[16:18], "big")
            p.paused_until = [self.cycle + 1 + q * quantum] * 8
        elif opcode == 0x0101:
            enable = int.from_bytes(frame[16:18], "big")
            for c in range(8):
                if enable >> c & 1:
                    q = int.from_bytes(frame[18 + 2 * c:20 + 2 * c], "big")
                    p.paused_until[c] = self.cycle + 1 + q * quantum


def udp(src: int, dst: int, dscp: int = 0, size: int = 100, ecn: int = 0, sport: int | None = None) -> bytes:
    """A UDP frame from host `src` to host `dst` (ports are 0-based here)."""
    from scapy.compat import raw
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    return raw(Ether(src=host_mac(src), dst=host_mac(dst)) /
               IP(src=f"10.0.0.{src + 1}", dst=f"10.0.0.{dst + 1}", tos=dscp << 2 | ecn) /
               UDP(sport=sport or 1000 + src, dport=2000) / (b"x" * size))
