"""The switches' telemetry reports (INT, Telemetry Report Format v2.0) read three ways
agree: the Scapy layers, the collector's bulk decoder, and tshark with the testbed's
dissector (scripts/wireshark/int-report.lua). The reports here are built with the
layers; tests/test_p4_switch.py and tests/rtl/switch_checks.py read the switches' own."""
import numpy as np
import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import Ether

from frame_checks import tshark_fields
from incast.measure.postcards import TELEMETRY_FRAME, lost_reports
from incast.p4.layers import TELEMETRY_UDP_PORT, IntReport, TelemetryReport, decode_records, is_report, layout

FIELDS = ["seq", "node_id", "ingress_port", "egress_port", "hop_latency", "queue", "queue_occupancy",
          "ingress_ts", "egress_ts", "occ_enq_bytes", "occ_deq_bytes", "port_enq_bytes", "port_deq_bytes",
          "enq_qdepth", "deq_qdepth", "pkt_len"]


def report(i: int, dropped: int = 0) -> bytes:
    """A report as the switches send it, with distinct values in every field."""
    inner = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:03") / IP(src="10.0.0.1", dst="10.0.0.3") / \
        TCP(sport=5000 + i, dport=80) / (b"x" * 1000)
    body = TelemetryReport(seq=(4_194_300 + i) % (1 << 22), node_id=7) / IntReport(
        rep_len=2 + 17 + 14, dropped=dropped, ingress_port=1 + i, egress_port=3, hop_latency=10 * i, queue=1,
        queue_occupancy=1000 + i, ingress_ts=1_000_000 + i, egress_ts=1_000_000 + 11 * i,
        occ_enq_bytes=1000 + i, occ_deq_bytes=900 + i, port_enq_bytes=2000 + i, port_deq_bytes=1900 + i,
        enq_qdepth=3 + i, deq_qdepth=2 + i, pkt_len=1054, flow_hash=0xABCD0000 + i,
        saddr=0x0A000001, daddr=0x0A000003) / bytes(inner)[:56]
    return bytes(Ether(dst="ff:ff:ff:ff:ff:ff", src="00:00:00:00:00:00") /
                 IP(src="198.18.0.7", dst="198.19.255.254", flags="DF") /
                 UDP(sport=TELEMETRY_UDP_PORT, dport=TELEMETRY_UDP_PORT, chksum=0) / body)


def test_the_collectors_decoder_reads_what_the_scapy_layers_write():
    frames = [report(i, dropped=i % 2) for i in range(6)]
    assert all(len(f) == TELEMETRY_FRAME for f in frames)
    cols = decode_records(b"".join(frames), TELEMETRY_FRAME)
    for i, f in enumerate(frames):
        pkt = Ether(f)
        for name, _, _ in layout():
            layer = pkt[TelemetryReport] if name in {x.name for x in TelemetryReport.fields_desc} else pkt[IntReport]
            assert cols[name][i] == getattr(layer, name), name
    assert list(cols["dropped"]) == [0, 1, 0, 1, 0, 1]
    arr = np.frombuffer(b"".join(frames + [bytes(Ether() / IP() / UDP(dport=53)).ljust(TELEMETRY_FRAME, b"\0")]),
                        dtype=np.uint8).reshape(-1, TELEMETRY_FRAME)
    assert list(is_report(arr)) == [True] * 6 + [False]      # other IPv4 on the collector port is not a report


def test_lost_reports_are_counted_across_the_sequence_numbers_wrap():
    seq = np.array([4_194_302, 4_194_303, 0, 2, 1, 5]) # wraps at 2**22; 1 comes late; 3 and 4 are missing
    assert lost_reports(seq) == 2
    assert lost_reports(np.array([7, 8, 9])) == 0
    assert lost_reports(np.array([], dtype=np.int64)) == 0


def test_tshark_names_the_fields_with_the_dissector(tmp_path):
    frames = [report(i, dropped=int(i == 3)) for i in range(4)]
    rows = tshark_fields(frames, FIELDS + ["dropped", "saddr", "tcp.srcport"], tmp_path)
    if rows is None:
        pytest.skip("tshark is not installed (scripts/setup.sh installs it)")
    assert len(rows) == 4, rows
    for f, row in zip(frames, rows):
        pkt = Ether(f)
        want = [getattr(pkt[TelemetryReport] if n in ("seq", "node_id") else pkt[IntReport], n) for n in FIELDS]
        assert [int(v) for v in row[:len(FIELDS)]] == want
        assert row[len(FIELDS)] in (("True", "1") if pkt[IntReport].dropped else ("False", "0"))
        assert row[len(FIELDS) + 1] == "10.0.0.1"
        assert int(row[-1]) == pkt[TCP].sport            # the packet's own headers, dissected after the report
