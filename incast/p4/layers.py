"""Scapy layers for the frames the testbed defines or relies on.

The queue telemetry leaves p4src/incast.p4 (and the RTL switch, which sends the same
frames) as INT telemetry reports, in the P4.org Telemetry Report Format v2.0: UDP to
the collector (port TELEMETRY_UDP_PORT), then ``TelemetryReport`` (the group header:
version, sequence number, node id), then ``IntReport`` (the individual report header,
its INT main contents, the baseline metadata its RepMdBits name, and the testbed's
domain-specific metadata: the queue and port bytes), then the packet's first bytes
(``Ether``). These classes are the one definition of that format: the packet tests
build and dissect reports with them, and the collector decodes millions at once with
:func:`decode_records`, whose layout it derives from their fields.

PAUSE frames are Scapy's own ``MACControlPause`` (802.3x, EtherType 0x8808).
"""
from __future__ import annotations

import numpy as np
from scapy.contrib.mac_control import MACControl, MACControlPause  # noqa: F401  (re-exported)
from scapy.fields import (BitEnumField, BitField, ByteField, ConditionalField, IntField, LongField,
                          ShortField, XShortField)
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, bind_layers

from incast.p4 import program as p4program

_C = p4program.constants()
TELEMETRY_UDP_PORT = _C["TELEMETRY_UDP_PORT"]
INT_DOMAIN_ID = _C["INT_DOMAIN_ID"]
INT_REP_MD_BITS = _C["INT_REP_MD_BITS"]
INT_DS_MD_BITS = _C["INT_DS_MD_BITS"]
PAUSE_DST = "01:80:c2:00:00:01"
REP_TYPES = {0: "inner only", 1: "INT", 2: "IOAM"}
IN_TYPES = {0: "none", 1: "TLV", 2: "domain-specific extension", 3: "Ethernet", 4: "IPv4", 5: "IPv6"}


class TelemetryReport(Packet):
    """Telemetry Report Group Header (v2.0), 8 bytes."""
    name = "TelemetryReport"
    fields_desc = [
        BitField("version", 2, 4),
        BitField("hw_id", 0, 6),
        BitField("seq", 0, 22),          # per switch, +1 per report: gaps are lost reports
        IntField("node_id", 0),          # the switch id
    ]


def _md(bit):
    """A baseline metadata field present when RepMdBits has this bit (bit 0 the MSB)."""
    return lambda p: bool(p.rep_md_bits & (0x8000 >> bit))


def _ds(bit):
    """A domain-specific field of the testbed's domain, present when DSMdBits has this bit."""
    return lambda p: p.domain_id == INT_DOMAIN_ID and bool(p.ds_md_bits & (0x8000 >> bit))


class IntReport(Packet):
    """Individual Report Header with its INT main contents (RepType 1) and metadata.

    Baseline metadata as RepMdBits says (the switch sends bits 1-5); the domain
    INT_DOMAIN_ID's ten words as DSMdBits says. Times are microseconds of the switch's
    clock; occupancies are bytes. A drop report (``dropped``) has the time of refusal
    as both timestamps and what the packet found as its occupancies."""
    name = "IntReport"
    fields_desc = [
        BitEnumField("rep_type", 1, 4, REP_TYPES),
        BitEnumField("in_type", 3, 4, IN_TYPES),
        ByteField("rep_len", 0),         # 4-byte words after the first: contents, metadata, packet
        ByteField("md_len", 17),         # 4-byte words of metadata
        BitField("dropped", 0, 1),
        BitField("congested", 0, 1),
        BitField("tracked_flow", 1, 1),
        BitField("intermediate", 0, 1),
        BitField("rsvd", 0, 4),
        XShortField("rep_md_bits", INT_REP_MD_BITS),
        XShortField("domain_id", INT_DOMAIN_ID),
        XShortField("ds_md_bits", INT_DS_MD_BITS),
        XShortField("ds_md_status", 0),
        # baseline metadata
        ConditionalField(ShortField("ingress_port", 0), _md(1)),
        ConditionalField(ShortField("egress_port", 0), _md(1)),
        ConditionalField(IntField("hop_latency", 0), _md(2)),
        ConditionalField(ByteField("queue", 0), _md(3)),
        ConditionalField(BitField("queue_occupancy", 0, 24), _md(3)),
        ConditionalField(LongField("ingress_ts", 0), _md(4)),
        ConditionalField(LongField("egress_ts", 0), _md(5)),
        ConditionalField(IntField("l2_ingress_port", 0), _md(6)),
        ConditionalField(IntField("l2_egress_port", 0), _md(6)),
        ConditionalField(IntField("tx_utilization", 0), _md(7)),
        ConditionalField(ByteField("buffer_id", 0), _md(8)),
        ConditionalField(BitField("buffer_occupancy", 0, 24), _md(8)),
        ConditionalField(ByteField("drop_queue", 0), _md(15)),
        ConditionalField(ByteField("drop_reason", 0), _md(15)),
        ConditionalField(ShortField("drop_pad", 0), _md(15)),
        # the testbed's domain-specific metadata
        ConditionalField(IntField("occ_enq_bytes", 0), _ds(0)),   # class queue, after admission (drop: before)
        ConditionalField(IntField("occ_deq_bytes", 0), _ds(1)),   # class queue, after departure
        ConditionalField(IntField("port_enq_bytes", 0), _ds(2)),  # the port's queues, after admission
        ConditionalField(IntField("port_deq_bytes", 0), _ds(3)),
        ConditionalField(IntField("enq_qdepth", 0), _ds(4)),      # packets in the queue at enqueue
        ConditionalField(IntField("deq_qdepth", 0), _ds(5)),
        ConditionalField(IntField("pkt_len", 0), _ds(6)),         # bytes of the frame
        ConditionalField(IntField("flow_hash", 0), _ds(7)),       # crc32 of the IPv4 5-tuple
        ConditionalField(IntField("saddr", 0), _ds(8)),
        ConditionalField(IntField("daddr", 0), _ds(9)),
    ]

    def guess_payload_class(self, payload):
        return Ether if self.in_type == 3 else IP if self.in_type == 4 else Packet.guess_payload_class(self, payload)


bind_layers(UDP, TelemetryReport, dport=TELEMETRY_UDP_PORT)
bind_layers(TelemetryReport, IntReport)


def layout() -> list[tuple[str, int, int]]:
    """(field, bit offset from the frame's start, bits) of a report as the switches send
    it: Ethernet, IPv4 and UDP, then the two layers with the metadata the switch's
    RepMdBits and DSMdBits name."""
    out, off = [], 8 * (14 + 20 + 8)
    for pkt in (TelemetryReport(), IntReport()):
        for f in pkt.fields_desc:
            if isinstance(f, ConditionalField):
                if not f._evalcond(pkt):
                    continue
                f = f.fld
            bits = round(8 * f.sz)   # a bit field's sz is its bytes as a fraction
            out.append((f.name, off, bits))
            off += bits
    return out


REPORT_SIZE = sum(bits for _, _, bits in layout()) // 8   # group header to the end of the metadata


def decode_records(frames: bytes, frame_len: int) -> dict[str, np.ndarray]:
    """Decode back-to-back frames of frame_len bytes (each a report, padded) into a column
    per field of :func:`layout`, as int64."""
    raw = np.frombuffer(frames, dtype=np.uint8).reshape(-1, frame_len)
    out = {}
    for name, off, bits in layout():
        first, end = off // 8, (off + bits + 7) // 8
        v = np.zeros(len(raw), dtype=np.uint64)
        for b in range(first, end):
            v = (v << np.uint64(8)) | raw[:, b].astype(np.uint64)
        v = (v >> np.uint64(8 * end - off - bits)) & np.uint64((1 << bits) - 1)
        out[name] = v.astype(np.int64)
    return out


def is_report(frames: np.ndarray) -> np.ndarray:
    """Which rows of an (n, frame_len) uint8 array are telemetry reports: IPv4, UDP, to
    TELEMETRY_UDP_PORT."""
    return ((frames[:, 12] == 0x08) & (frames[:, 13] == 0x00) & (frames[:, 23] == 17)
            & (frames[:, 36] == TELEMETRY_UDP_PORT >> 8) & (frames[:, 37] == TELEMETRY_UDP_PORT & 0xFF))
