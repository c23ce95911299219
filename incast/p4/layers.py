"""Scapy layers for the frames the testbed defines or relies on.

``IncastTelemetry`` is the queue-telemetry record that p4src/incast.p4 puts in front of
each cloned packet (EtherType 0x88B5). This class is the one definition of that
format: the packet tests build and dissect it with Scapy, and the collector decodes
millions of records at once with :func:`record_dtype`, which it derives from these
fields. PAUSE frames are Scapy's own ``MACControlPause`` (802.3x, EtherType 0x8808).
"""
from __future__ import annotations

import numpy as np
from scapy.contrib.mac_control import MACControl, MACControlPause  # noqa: F401  (re-exported)
from scapy.fields import BitField, ByteEnumField, ByteField, IntField, ShortField
from scapy.layers.l2 import Ether
from scapy.packet import Packet, bind_layers

from incast.p4 import program as p4program

ETHERTYPE_TELEMETRY = p4program.constants()["ETHERTYPE_TELEMETRY"]
PAUSE_DST = "01:80:c2:00:00:01"
EVENTS = {0: "dequeue", 1: "drop"}


class IncastTelemetry(Packet):
    name = "IncastTelemetry"
    fields_desc = [
        IntField("seq", 0),
        ShortField("switch_id", 0),
        ShortField("ingress_port", 0),
        ShortField("egress_port", 0),
        ByteField("queue", 0),
        ByteEnumField("event", 0, EVENTS),
        IntField("enq_qdepth", 0),
        IntField("deq_qdepth", 0),
        IntField("occ_enq_bytes", 0),
        IntField("occ_deq_bytes", 0),
        IntField("port_enq_bytes", 0),
        IntField("port_deq_bytes", 0),
        IntField("deq_timedelta", 0),
        BitField("enq_ts", 0, 48),
        BitField("deq_ts", 0, 48),
        IntField("pkt_len", 0),
        IntField("flow_hash", 0),
        IntField("saddr", 0),
        IntField("daddr", 0),
    ]


bind_layers(Ether, IncastTelemetry, type=ETHERTYPE_TELEMETRY)
bind_layers(IncastTelemetry, Ether)   # the cloned packet follows the record


def record_dtype() -> np.dtype:
    """A big-endian numpy dtype with the fields of IncastTelemetry, in order.

    48-bit fields become 6-byte unsigned arrays (see :func:`decode_records`)."""
    fields = []
    for f in IncastTelemetry.fields_desc:
        size = f.sz if not isinstance(f, BitField) else f.size // 8
        if size == 6:
            fields.append((f.name, "u1", (6,)))
        else:
            fields.append((f.name, f">u{size}"))
    return np.dtype(fields)


RECORD_SIZE = len(IncastTelemetry())


def decode_records(frames: bytes, frame_len: int) -> dict[str, np.ndarray]:
    """Decode back-to-back frames of frame_len bytes (Ethernet + record + payload)."""
    dt = record_dtype()
    raw = np.frombuffer(frames, dtype=np.uint8).reshape(-1, frame_len)[:, 14:14 + dt.itemsize]
    rec = np.ascontiguousarray(raw).view(dt).reshape(-1)
    out = {}
    for name in dt.names:
        col = rec[name]
        if col.ndim == 2:   # 48-bit big-endian
            col = col.astype(np.uint64)
            col = sum(col[:, i] << np.uint64(8 * (5 - i)) for i in range(6))
        out[name] = col.astype(np.int64) if col.dtype.kind == "u" else col
    return out
