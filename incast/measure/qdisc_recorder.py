"""Queue telemetry with a compiled recorder: libbpf CO-RE program + BPF ring buffer.

Drop-in replacement for :class:`incast.telemetry.QdiscTracer` (same constructor, same
``start``/``stop``, same table; see the schema in :mod:`incast.telemetry`). The probes
and their semantics are those of the bpftrace program, but the kernel side writes
fixed-size binary records (layout: ``incast/bpf/qdisc_trace.h``, mirrored here as
:data:`RECORD_DTYPE`) and the userspace loader (``build/bpf/qdisc-trace``, built by
``scripts/build-bpf.sh``) only copies them to a file. Nothing is formatted while the
experiment runs, so recording does not compete with packet processing for the CPU.

Two differences from the bpftrace program, both about exactness:

* ``packets``/``bytes`` (class occupancy) are read from the class's leaf qdisc
  (handle ``(LEAF_MAJOR_BASE + class):``, as the linux data plane builds ports) instead
  of being summed from the events. The kernel does not hand every tracepoint hit to BPF
  programs (on the testbed VM, hits in softirqs that interrupt PID 1's threads never
  arrive, for bpftrace as much as for this recorder), and a summed occupancy drifts for
  the rest of the run after one missed dequeue. Ports without such leaves fall back to
  summing, resynchronised whenever a port's queue is empty.
* Missed hits are counted: under the qdisc lock the root qdisc's queue length must
  change by exactly what the recorded events and requeues explain. The shortfall (a
  lower bound) is part of ``lost`` and explained in the notes.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd

from incast.measure.telemetry import EVENTS, KernelQueueRecorder, TelemetryResult, build_table, empty_table, flow_labels

from incast.constants import BPF_BUILD_DIR
BINARY = BPF_BUILD_DIR / "qdisc-trace"
MAX_BULK = 16           # QT_MAX_BULK in qdisc_trace.h
PAGE = 4096
# Class c of a switch port is the HTB leaf qdisc with handle (0x10 + c):0, as
# incast.dataplane.linux.port_tc_commands builds it; the recorder reads the class
# occupancy from that qdisc (ports without it fall back to counters kept by the probes).
LEAF_MAJOR_BASE = 0x10

# One record, exactly struct qt_record of incast/bpf/qdisc_trace.h (56 bytes, LE).
RECORD_DTYPE = np.dtype([
    ("ts_ns", "<u8"),           # bpf_ktime_get_ns (CLOCK_MONOTONIC)
    ("sojourn_ns", "<u8"),      # dequeue only, else 0
    ("ifindex", "<u4"),
    ("packets", "<i4"),         # class queue after the event (leaf qdisc q.qlen)
    ("bytes", "<i4"),           # (leaf qdisc qstats.backlog)
    ("port_packets", "<u4"),    # root qdisc q.qlen (dequeue: + the chain's later skbs)
    ("port_bytes", "<u4"),      # root qdisc qstats.backlog (likewise)
    ("pkt_len", "<u4"),         # skb->len
    ("saddr", "<u4"),           # IPv4 header bytes read as a little-endian u32; 0 if not IPv4
    ("daddr", "<u4"),
    ("kind", "u1"),             # b'E', b'D', b'X'
    ("queue", "u1"),
    ("pad0", "<u2"),
    ("pad1", "<u4"),
])
assert RECORD_DTYPE.itemsize == 56


def recorder_binary() -> Path | None:
    """The built loader (build/bpf/qdisc-trace), or None if scripts/build-bpf.sh has not
    been run. INCAST_QDISC_TRACE overrides the location."""
    path = Path(os.environ.get("INCAST_QDISC_TRACE", BINARY))
    return path if path.is_file() and os.access(path, os.X_OK) else None


def ringbuf_mb(perf_pages: int, cpus: int | None = None) -> int:
    """Ring buffer size for a bpftrace perf_pages setting: at least what bpftrace's per-CPU
    buffers hold together, at least 64 MiB, a power of two, at most 1 GiB."""
    cpus = cpus or os.cpu_count() or 1
    want = max(64, -(-perf_pages * PAGE * cpus // (1 << 20)))
    mb = 1
    while mb < want:
        mb <<= 1
    return min(mb, 1024)


def decode_records(rec: np.ndarray, t0_ns: int, ports: dict[int, tuple[str, str]],
                   host_of_ip: dict[str, str]) -> pd.DataFrame:
    """Binary records (RECORD_DTYPE) -> the telemetry table, as telemetry.decode_raw makes it."""
    if len(rec) == 0:
        return empty_table()
    kind = rec["kind"]

    uif, if_inv = np.unique(rec["ifindex"], return_inverse=True)
    known = [ports.get(int(i), ("?", f"if{int(i)}")) for i in uif]
    switch = np.array([k[0] for k in known], dtype=object)[if_inv]
    port = np.array([k[1] for k in known], dtype=object)[if_inv]

    ukind, k_inv = np.unique(kind, return_inverse=True)
    event = np.array([EVENTS.get(chr(k), np.nan) for k in ukind], dtype=object)[k_inv]

    return build_table({
        "time_us": (rec["ts_ns"].astype(np.int64) - t0_ns) / 1000.0,
        "switch": switch,
        "port": port,
        "queue": rec["queue"],
        "event": event,
        "packets": rec["packets"],
        "bytes": rec["bytes"],
        "sojourn_us": np.where(kind == ord("D"), rec["sojourn_ns"] / 1000.0, np.nan),
        "flow": flow_labels(rec["saddr"], rec["daddr"], host_of_ip),
        "pkt_len": rec["pkt_len"],
        "port_packets": rec["port_packets"],
        "port_bytes": rec["port_bytes"],
    })


def read_records(path: Path) -> np.ndarray:
    """The complete records of a raw file (a torn tail, if any, is ignored)."""
    size = Path(path).stat().st_size
    return np.fromfile(path, dtype=RECORD_DTYPE, count=size // RECORD_DTYPE.itemsize)


class QdiscRecorder(KernelQueueRecorder):
    """Records the switch ports' qdisc events with the compiled recorder while a run goes on.

    Same interface as incast.telemetry.QdiscTracer."""

    def __init__(self, run_dir: Path, netns_inode: int, ports: dict[int, tuple[str, str]],
                 dscp_table: list[int], drop_reasons: dict[str, int], host_of_ip: dict[str, str],
                 perf_pages: int = 4096):
        super().__init__(run_dir, netns_inode, ports, host_of_ip)
        if len(dscp_table) != 64:
            raise ValueError(f"dscp_table needs 64 entries, got {len(dscp_table)}")
        self.dscp_table = [int(c) for c in dscp_table]
        self.reasons = sorted(set(drop_reasons.values()))
        if not self.reasons:
            raise ValueError("no qdisc drop reasons known for skb:kfree_skb")
        self.ringbuf_mb = ringbuf_mb(perf_pages)
        self.raw_path = self.run_dir / "telemetry.raw.bin"
        self.probe_mode = "auto"            # or "tp_btf" / "tracepoint" (tests; auto falls back)
        self.leaf_major_base = LEAF_MAJOR_BASE   # 0: occupancy from counters only
        self.mode: str | None = None        # "tp_btf" or "tracepoint" once attached

    def command(self, binary: Path) -> list[str]:
        return [str(binary), "--netns-inode", str(self.inode),
                "--dscp-table", ",".join(map(str, self.dscp_table)),
                "--drop-reasons", ",".join(map(str, self.reasons)),
                "--out", str(self.raw_path), "--ringbuf-mb", str(self.ringbuf_mb),
                "--leaf-major-base", str(self.leaf_major_base), "--mode", self.probe_mode]

    def start(self, timeout: float = 60.0) -> None:
        binary = recorder_binary()
        if binary is None:
            raise RuntimeError(f"telemetry: the recorder is not built ({BINARY} is missing): "
                               "run scripts/build-bpf.sh")
        size = subprocess.run([str(binary), "--record-size"], capture_output=True, text=True)
        if size.returncode or size.stdout.strip() != str(RECORD_DTYPE.itemsize):
            raise RuntimeError(f"telemetry: {binary} writes {size.stdout.strip() or '?'}-byte "
                               f"records, incast expects {RECORD_DTYPE.itemsize}: "
                               "rebuild it with scripts/build-bpf.sh")
        self._spawn(self.command(binary), stdin=subprocess.DEVNULL)
        if not self._ready.wait(timeout) or "READY" not in self._lines:
            self._kill()
            self.raw_path.unlink(missing_ok=True)
            raise RuntimeError(f"telemetry: the recorder did not attach: {self._error_line()}")

    def _pump(self) -> None:
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").strip()
            self._lines.append(line)
            if line.startswith("ATTACHED "):
                self.mode = line.split()[1]
            elif line == "READY":
                self._ready.set()
        self._ready.set()

    def _error_line(self) -> str:
        err = self._stderr.decode(errors="replace").strip().splitlines()
        line = next((ln for ln in reversed(err) if "error:" in ln), err[-1] if err else None)
        if line is None:
            rc = self.proc.returncode if self.proc else None
            return f"no output (exit status {rc})" if rc is not None else "no READY in time"
        return line.replace("qdisc-trace: error: ", "")

    def stop(self, t0_ns: int) -> TelemetryResult:
        self._interrupt()
        lost = self._value("LOST")
        records = self._value("RECORDS")
        if self.proc.returncode != 0 or lost is None or records is None:
            raise RuntimeError(f"telemetry: the recorder failed: {self._error_line()}")
        notes = []
        trunc = self._value("TRUNCATED") or [0, 0]
        if trunc[0]:
            notes.append(f"{trunc[0]} dequeue chains longer than {MAX_BULK} packets: "
                         f"their tail packets' dequeues are missing ({trunc[1]} records)")
        missed = (self._value("MISSED") or [0])[0]
        if missed:
            notes.append(f"at least {missed} queue events were not handed to the recorder by "
                         "the kernel (seen in the root qdiscs' queue lengths; counted as lost): "
                         "their records are missing (occupancy read from the class qdiscs stays exact)")
        ringbuf_lost = (self._value("RINGBUF_LOST") or [0])[0]
        if ringbuf_lost:
            notes.append(f"{ringbuf_lost} records dropped because the ring buffer "
                         f"({self.ringbuf_mb} MiB) was full")
        untracked = (self._value("UNTRACKED") or [0])[0]
        if untracked:
            notes.append(f"{untracked} enqueued packets did not fit in the recorder's skb map: "
                         "their dequeue records are missing")
        fallback = [ln for ln in self._stderr.decode(errors="replace").splitlines()
                    if "falling back" in ln]
        if fallback:
            notes.append("telemetry: " + fallback[-1].replace("qdisc-trace: ", ""))
        rec = read_records(self.raw_path)
        if len(rec) != records[0]:
            notes.append(f"telemetry: the recorder reported {records[0]} records, "
                         f"the file holds {len(rec)}")
        table = decode_records(rec, t0_ns, self.ports, self.host_of_ip)
        self.raw_path.unlink()
        return TelemetryResult(table=table, lost=lost[0], notes=notes)
