"""Queue telemetry by sampling: the switch ports' qdisc statistics read every interval.

The linux data plane's recorder where the kernel cannot run BPF programs on its qdisc
tracepoints, above all in virtual time (User-Mode Linux has no BPF events). There the
sampler is exact in time and free: the guest CPU is infinitely fast, so
hosts/qdisc_sampler.py wakes exactly every ``telemetry.interval`` of virtual time and the
experiment does not see it.

Same interface and table as the event recorders (see incast.telemetry), with what a
sample can know:
  event "sample"  a queue's occupancy changed since the previous sample: packets and
                  bytes of the class queue, port_packets/port_bytes of the whole port;
  event "drop"    one row per packet the queue dropped since the previous sample, at
                  the sample's time (so to within one interval);
  missing         per-packet fields: flow ("-"), pkt_len (0), sojourn_us (NaN); and any
                  excursion shorter than the interval.

With a shared pool (switch.pool) it also gives the pool's occupancy over time
(``pool.parquet``: time_us, switch, bytes; a row whenever a switch's pool changed at a
sample), read from the plugs' statistics in the same dump as the queues.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from incast.measure.qdisc_recorder import LEAF_MAJOR_BASE
from incast.measure.telemetry import KernelQueueRecorder, TelemetryResult, build_table, empty_table
from incast.constants import HOSTS_DIR

SAMPLER = HOSTS_DIR / "qdisc_sampler.py"
RECORD_DTYPE = np.dtype([("ts_ns", "<u8"), ("ifindex", "<u4"), ("queue", "<i4"), ("qlen", "<u4"),
                         ("backlog", "<u4"), ("drops", "<u4"), ("pool", "<u4"), ("packets", "<u8")])
NO_POOL = 0xFFFFFFFF        # hosts/rtnl.py: the queue is in no pool
POOL_COLUMNS = ["time_us", "switch", "bytes"]
assert RECORD_DTYPE.itemsize == 40


def decode_samples(rec: np.ndarray, t0_ns: int, ports: dict[int, tuple[str, str]]) -> pd.DataFrame:
    """Sampler records -> the telemetry table: a "sample" row per changed class queue
    (with its port's totals at that sample) and a "drop" row per dropped packet."""
    if len(rec) == 0:
        return empty_table()
    df = pd.DataFrame({k: rec[k] for k in ("ts_ns", "ifindex", "queue", "qlen", "backlog", "drops")})
    df = df.astype({"ts_ns": "int64", "ifindex": "int64", "queue": "int64", "qlen": "int64",
                    "backlog": "int64", "drops": "int64"})
    root = df[df["queue"] < 0].rename(columns={"qlen": "port_packets", "backlog": "port_bytes"})
    leaf = df[df["queue"] >= 0].sort_values(["ts_ns"], kind="stable")
    # The port's totals at each leaf record: its latest root record at or before it.
    leaf = pd.merge_asof(leaf, root[["ts_ns", "ifindex", "port_packets", "port_bytes"]],
                         on="ts_ns", by="ifindex", direction="backward")
    leaf[["port_packets", "port_bytes"]] = leaf[["port_packets", "port_bytes"]].fillna(0)
    # A queue's first record is the counter's baseline: drops before it are not the run's.
    new_drops = leaf.groupby(["ifindex", "queue"])["drops"].diff().fillna(0)
    drop_rows = leaf.loc[leaf.index.repeat(new_drops.clip(lower=0).astype(int))]
    rows = pd.concat([leaf.assign(event="sample"), drop_rows.assign(event="drop")], ignore_index=True)
    return build_table({
        "time_us": (rows["ts_ns"] - t0_ns) / 1000.0,
        "switch": [ports.get(int(i), ("?", ""))[0] for i in rows["ifindex"]],
        "port": [ports.get(int(i), ("?", f"if{int(i)}"))[1] for i in rows["ifindex"]],
        "queue": rows["queue"],
        "event": rows["event"],
        "packets": rows["qlen"],
        "bytes": rows["backlog"],
        "sojourn_us": np.nan,
        "flow": "-",
        "pkt_len": 0,
        "port_packets": rows["port_packets"].astype(int),
        "port_bytes": rows["port_bytes"].astype(int),
    })


def decode_pool(rec: np.ndarray, t0_ns: int, ports: dict[int, tuple[str, str]]) -> pd.DataFrame:
    """Sampler records -> each switch's pool occupancy: a row per sample at which it
    changed (its queues are read in one dump, at one instant of virtual time)."""
    rec = rec[(rec["queue"] >= 0) & (rec["pool"] != NO_POOL)]
    df = pd.DataFrame({"ts_ns": rec["ts_ns"].astype("int64"), "bytes": rec["pool"].astype("int64"),
                       "switch": [ports.get(int(i), ("?", ""))[0] for i in rec["ifindex"]]})
    if df.empty:
        return pd.DataFrame({"time_us": pd.Series(dtype="float64"), "switch": pd.Series(dtype="category"),
                             "bytes": pd.Series(dtype="int64")})
    df = df.groupby(["switch", "ts_ns"], as_index=False)["bytes"].max().sort_values(["switch", "ts_ns"])
    df = df[df.groupby("switch")["bytes"].diff().ne(0)]         # the first of each switch, then changes
    out = pd.DataFrame({"time_us": (df["ts_ns"] - t0_ns) / 1000.0, "switch": df["switch"].astype("category"),
                        "bytes": df["bytes"]})
    return out.sort_values("time_us", kind="stable").reset_index(drop=True)[POOL_COLUMNS]


class QdiscSampler(KernelQueueRecorder):
    """Samples the switch ports' queues every ``interval_us`` while a run goes on."""

    def __init__(self, run_dir: Path, netns_inode: int, ports: dict[int, tuple[str, str]],
                 host_of_ip: dict[str, str], interval_us: float, pooled: bool = False):
        super().__init__(run_dir, netns_inode, ports, host_of_ip)
        self.interval_us = interval_us
        self.pooled = pooled        # switch.pool: the pools' occupancy too
        self.raw_path = self.run_dir / "telemetry.samples.bin"

    def start(self, timeout: float = 60.0) -> None:
        # Runs in the caller's network namespace: the runner is in the switch's (world).
        self._spawn([sys.executable, str(SAMPLER), "--interval-us", str(self.interval_us),
                     "--ifindex", ",".join(map(str, self.ports)), "--out", str(self.raw_path),
                     "--leaf-major-base", hex(LEAF_MAJOR_BASE)], stdin=subprocess.DEVNULL)
        if not self._ready.wait(timeout) or "READY" not in self._lines:
            self._kill()
            self.raw_path.unlink(missing_ok=True)
            err = self._stderr.decode(errors="replace").strip().splitlines()
            raise RuntimeError(f"telemetry: the qdisc sampler did not start: {err[-1] if err else 'no READY'}")

    def _pump(self) -> None:
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").strip()
            self._lines.append(line)
            if line == "READY":
                self._ready.set()
        self._ready.set()

    def _count(self, key: str) -> int | None:
        value = self._value(key)
        return value[0] if value else None

    def stop(self, t0_ns: int) -> TelemetryResult:
        self._interrupt()
        records, samples = self._count("RECORDS"), self._count("SAMPLES")
        if self.proc.returncode != 0 or records is None:
            err = self._stderr.decode(errors="replace").strip().splitlines()
            raise RuntimeError(f"telemetry: the qdisc sampler failed: {err[-1] if err else 'no report'}")
        size = self.raw_path.stat().st_size
        rec = np.fromfile(self.raw_path, dtype=RECORD_DTYPE, count=size // RECORD_DTYPE.itemsize)
        self.raw_path.unlink()
        achieved = (self._count("SPAN_NS") or 0) / 1000 / max(1, samples - 1)
        notes = [f"telemetry: qdisc statistics sampled every {self.interval_us:g} us "
                 f"(achieved {achieved:.1f} us on average, {samples} samples): "
                 "no per-packet fields (flow, pkt_len, sojourn_us), drops placed at the sample "
                 "that saw them, excursions shorter than the interval not seen"]
        if len(rec) != records:
            notes.append(f"telemetry: the sampler reported {records} records, the file holds {len(rec)}")
        return TelemetryResult(table=decode_samples(rec, t0_ns, self.ports), lost=0, notes=notes,
                               pool=decode_pool(rec, t0_ns, self.ports) if self.pooled else None)
