"""The P4 pipeline's queue postcards, collected: one reader for every data plane that
runs incast.p4's telemetry (bmv2, and the RTL switch, which sends the same frames).
The postcards are INT telemetry reports (Telemetry Report Format v2.0, postcard mode)
over UDP; incast.p4.layers defines them."""
from __future__ import annotations

import gzip
import socket
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

from incast.measure.telemetry import TelemetryResult, build_table, empty_table, flow_labels
from incast.p4 import program as p4program
from incast.p4.layers import decode_records, is_report

TELEMETRY_FRAME = p4program.constants()["TELEMETRY_FRAME_BYTES"]
REPORTS_PCAP = "telemetry-reports.pcap.gz"   # the reports as they came, for Wireshark and tshark
ETH_P_IP = 0x0800
SEQ_BITS = 22   # the group header's sequence number


def lost_reports(seq: np.ndarray) -> int:
    """Reports missing from a switch's sequence numbers, in arrival order: 22 bits wrap
    (4 Mi reports), and the RTL switch's drop and departure queues take turns, so a
    number may come a little after a larger one."""
    if len(seq) == 0:
        return 0
    half, full = 1 << (SEQ_BITS - 1), 1 << SEQ_BITS
    step = (np.diff(seq) + half) % full - half          # the signed distance to the one before
    unwrapped = np.unique(seq[0] + np.concatenate([[0], np.cumsum(step)]))
    return int(unwrapped[-1] - unwrapped[0] + 1 - len(unwrapped))


class PostcardCollector:
    """Reads the telemetry frames at each P4 switch's telemetry port (bmv2's or the RTL
    switch's: the pipeline's postcards, the same on both) into the telemetry table.
    Reports are decoded in bulk with the layout of incast.p4.layers' TelemetryReport and
    IntReport; lost reports are counted from sequence gaps and from the socket's own drops."""

    def __init__(self, run_dir, switches, ports, host_of_ip):
        self.run_dir = Path(run_dir)
        self.switches = switches
        self.ports = {(p.switch, p.number): p.name for p in ports}
        self.host_of_ip = host_of_ip
        self.socks, self.threads = [], []
        self.frames: dict[str, list] = {}
        self.stop_flag = threading.Event()

    def start(self, timeout: float = 60.0) -> None:
        for sw in self.switches:
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_IP))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
            s.bind((sw.collector_intf, ETH_P_IP))
            s.settimeout(0.1)
            self.socks.append(s)
            buf: list = []
            self.frames[sw.name] = buf
            t = threading.Thread(target=self._read, args=(s, buf), daemon=True)
            t.start()
            self.threads.append(t)

    def _read(self, s, buf):
        while True:
            try:
                frame = s.recv(2048)
            except socket.timeout:
                if self.stop_flag.is_set():
                    return   # asked to stop and the socket is drained
                continue
            buf.append((time.monotonic_ns(), frame))

    def stop(self, t0_ns: int) -> TelemetryResult:
        # The traffic has ended: each reader returns at its first idle timeout.
        self.stop_flag.set()
        for t in self.threads:
            t.join()
        lost = 0
        for s in self.socks:
            # struct tpacket_stats {packets, drops}: the socket's own losses.
            packets, drops = struct.unpack("II", s.getsockopt(263, 6, 8))   # SOL_PACKET, PACKET_STATISTICS
            lost += drops
            s.close()
        tables = []
        for sw in self.switches:
            buf = self.frames[sw.name]
            if not buf:
                continue
            frames = b"".join(f.ljust(TELEMETRY_FRAME, b"\0")[:TELEMETRY_FRAME] for _, f in buf)
            keep = is_report(np.frombuffer(frames, dtype=np.uint8).reshape(-1, TELEMETRY_FRAME))
            if not keep.any():
                continue
            recv = np.array([t for t, _ in buf], dtype=np.int64)[keep]
            rec = {k: v[keep] for k, v in decode_records(frames, TELEMETRY_FRAME).items()}
            lost += lost_reports(rec["seq"])
            tables.append(self._table(sw, rec, recv, t0_ns))
        self.write_pcap(self.run_dir / REPORTS_PCAP)
        table = build_table(pd.concat(tables, ignore_index=True)) if tables else empty_table()
        return TelemetryResult(table=table, lost=lost,
                               notes=[] if lost == 0 else [f"{lost} telemetry records lost"])

    def write_pcap(self, path: Path) -> None:
        """Every frame the collector received, in the order it came, as a gzipped pcap
        with nanosecond times of this host's wall clock (tshark and Wireshark read it;
        scripts/wireshark/int-report.lua names the report's fields)."""
        frames = sorted((t, f) for buf in self.frames.values() for t, f in buf)
        wall_minus_mono = time.time_ns() - time.monotonic_ns()
        with gzip.open(path, "wb", compresslevel=1) as out:
            # pcap with nanosecond timestamps (magic 0xa1b23c4d), Ethernet (linktype 1)
            out.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1))
            for t, f in frames:
                sec, nsec = divmod(t + wall_minus_mono, 1_000_000_000)
                out.write(struct.pack("<IIII", sec, nsec, len(f), len(f)))
                out.write(f)

    def _table(self, sw, rec, recv_ns, t0_ns) -> pd.DataFrame:
        # The switch's clock (us since it started) to CLOCK_MONOTONIC: the smallest
        # difference between a record's arrival and its dequeue time.
        offset_us = float(np.min(recv_ns / 1000.0 - rec["egress_ts"]))
        # saddr arrives big-endian decoded: turn it into the host-order key bpftrace uses.
        flow = flow_labels(rec["saddr"].astype(np.uint32).byteswap(), rec["daddr"].astype(np.uint32).byteswap(),
                           self.host_of_ip)
        port = [self.ports.get((sw.name, int(p)), f"port{int(p)}") for p in rec["egress_port"]]
        drop = rec["dropped"] == 1
        base = {"switch": sw.name, "port": port, "queue": rec["queue"], "flow": flow,
                "pkt_len": rec["pkt_len"]}
        to_us = lambda ts: ts + offset_us - t0_ns / 1000.0  # noqa: E731
        enq = pd.DataFrame({**base, "time_us": to_us(rec["ingress_ts"]), "event": "enqueue",
                            "packets": rec["enq_qdepth"], "bytes": rec["occ_enq_bytes"],
                            "sojourn_us": np.nan, "port_packets": -1, "port_bytes": rec["port_enq_bytes"]})[~drop]
        deq = pd.DataFrame({**base, "time_us": to_us(rec["egress_ts"]), "event": "dequeue",
                            "packets": rec["deq_qdepth"], "bytes": rec["occ_deq_bytes"],
                            "sojourn_us": rec["hop_latency"].astype(float), "port_packets": -1,
                            "port_bytes": rec["port_deq_bytes"]})[~drop]
        drp = pd.DataFrame({**base, "time_us": to_us(rec["egress_ts"]), "event": "drop",
                            "packets": rec["enq_qdepth"], "bytes": rec["occ_enq_bytes"],
                            "sojourn_us": np.nan, "port_packets": -1, "port_bytes": rec["port_enq_bytes"]})[drop]
        return pd.concat([enq, deq, drp], ignore_index=True)
