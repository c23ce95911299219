"""The P4 pipeline's queue postcards, collected: one reader for every data plane that
runs incast.p4's telemetry (bmv2, and the RTL switch, which sends the same frames)."""
from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

from incast.measure.telemetry import TelemetryResult, build_table, empty_table, flow_labels
from incast.p4 import program as p4program
from incast.p4.layers import decode_records

TELEMETRY_FRAME = p4program.constants()["TELEMETRY_FRAME_BYTES"]
ETHERTYPE_TELEMETRY = p4program.constants()["ETHERTYPE_TELEMETRY"]


class PostcardCollector:
    """Reads the telemetry frames at each P4 switch's telemetry port (bmv2's or the RTL
    switch's: the pipeline's postcards, the same on both) into the telemetry table. Records are decoded in bulk with the layout of incast.layers.IncastTelemetry;
    lost records are counted from sequence gaps and from the socket's own drops."""

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
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETHERTYPE_TELEMETRY))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
            s.bind((sw.collector_intf, ETHERTYPE_TELEMETRY))
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
            buf.append((time.monotonic_ns(), frame.ljust(TELEMETRY_FRAME, b"\0")[:TELEMETRY_FRAME]))

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
            recv = np.array([t for t, _ in buf], dtype=np.int64)
            rec = decode_records(b"".join(f for _, f in buf), TELEMETRY_FRAME)
            seq = np.sort(rec["seq"])
            lost += int(seq[-1] - seq[0] + 1 - len(np.unique(seq)))
            tables.append(self._table(sw, rec, recv, t0_ns))
        table = build_table(pd.concat(tables, ignore_index=True)) if tables else empty_table()
        return TelemetryResult(table=table, lost=lost,
                               notes=[] if lost == 0 else [f"{lost} telemetry records lost"])

    def _table(self, sw, rec, recv_ns, t0_ns) -> pd.DataFrame:
        # The switch's clock (us since it started) to CLOCK_MONOTONIC: the smallest
        # difference between a record's arrival and its dequeue time.
        offset_us = float(np.min(recv_ns / 1000.0 - rec["deq_ts"]))
        # saddr arrives big-endian decoded: turn it into the host-order key bpftrace uses.
        flow = flow_labels(rec["saddr"].astype(np.uint32).byteswap(), rec["daddr"].astype(np.uint32).byteswap(),
                           self.host_of_ip)
        port = [self.ports.get((sw.name, int(p)), f"port{int(p)}") for p in rec["egress_port"]]
        drop = rec["event"] == 1
        base = {"switch": sw.name, "port": port, "queue": rec["queue"], "flow": flow,
                "pkt_len": rec["pkt_len"]}
        to_us = lambda ts: ts + offset_us - t0_ns / 1000.0  # noqa: E731
        enq = pd.DataFrame({**base, "time_us": to_us(rec["enq_ts"]), "event": "enqueue",
                            "packets": rec["enq_qdepth"], "bytes": rec["occ_enq_bytes"],
                            "sojourn_us": np.nan, "port_packets": -1, "port_bytes": rec["port_enq_bytes"]})[~drop]
        deq = pd.DataFrame({**base, "time_us": to_us(rec["deq_ts"]), "event": "dequeue",
                            "packets": rec["deq_qdepth"], "bytes": rec["occ_deq_bytes"],
                            "sojourn_us": rec["deq_timedelta"].astype(float), "port_packets": -1,
                            "port_bytes": rec["port_deq_bytes"]})[~drop]
        drp = pd.DataFrame({**base, "time_us": to_us(rec["deq_ts"]), "event": "drop",
                            "packets": rec["enq_qdepth"], "bytes": rec["occ_enq_bytes"],
                            "sojourn_us": np.nan, "port_packets": -1, "port_bytes": rec["port_enq_bytes"]})[drop]
        return pd.concat([enq, deq, drp], ignore_index=True)
