"""Queue telemetry: one row per packet event at a switch's egress queues.

The table (``telemetry.parquet``) has the same schema for every data plane:

=============  ========  ==========================================================
column         type      meaning
=============  ========  ==========================================================
time_us        float64   µs since the first measured block started (CLOCK_MONOTONIC)
switch         category  switch name ("s1")
port           category  egress port ("s1-eth1")
queue          int8      class queue (0 = highest priority)
event          category  "enqueue", "dequeue" or "drop"
packets        int32     packets in this class queue after the event
bytes          int32     bytes in this class queue after the event
sojourn_us     float64   time the packet spent in the queue (dequeue only, else NaN)
flow           category  "src>dst" host names of the packet ("-" if not IPv4)
pkt_len        int32     bytes of the frame (as the queue counts them)
port_packets   int32     packets in all of the port's queues after the event
port_bytes     int32     bytes in all of the port's queues after the event
=============  ========  ==========================================================

Lost records (events the kernel produced but the recorder could not keep) are counted
and reported next to the table, never silently dropped.

On the linux data plane the recorder is a bpftrace program on the ``qdisc:qdisc_enqueue``
and ``qdisc:qdisc_dequeue`` tracepoints (which fire for the port's root qdisc) and on
``skb:kfree_skb`` with a qdisc drop reason. The class queue is the one the switch's DSCP
rule picks, and per-class occupancy is kept in BPF maps updated under the qdisc lock, so
it is exact; ``port_*`` come straight from the kernel's root qdisc.
"""
from __future__ import annotations

import io
import os
import re
import signal
import socket
import struct
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from incast.measure.instrument import Facts, Instrument, Readings

MAX_BULK = 16   # longest dequeue chain the BPF program walks (veth bulks a few)
EVENTS = {"E": "enqueue", "D": "dequeue", "X": "drop"}
RAW_COLUMNS = ["kind", "ts", "ifindex", "queue", "packets", "bytes", "port_packets",
               "port_bytes", "pkt_len", "saddr", "daddr", "sojourn_ns"]
COLUMNS = ["time_us", "switch", "port", "queue", "event", "packets", "bytes", "sojourn_us",
           "flow", "pkt_len", "port_packets", "port_bytes"]


def empty_table() -> pd.DataFrame:
    df = pd.DataFrame({c: pd.Series(dtype="float64") for c in COLUMNS})
    return _typed(df)


def build_table(columns: dict | pd.DataFrame) -> pd.DataFrame:
    """The telemetry table from its columns (exactly COLUMNS): in time order, typed. The
    one place every recorder's rows (bpftrace, the compiled recorder, the P4
    collector) become the table, so they cannot drift apart."""
    names = set(columns.columns if isinstance(columns, pd.DataFrame) else columns)
    if names != set(COLUMNS):
        raise ValueError(f"telemetry columns: missing {sorted(set(COLUMNS) - names)}, "
                         f"unknown {sorted(names - set(COLUMNS))}")
    df = pd.DataFrame(columns)
    if df.empty:
        return empty_table()
    return _typed(df.sort_values("time_us", kind="stable").reset_index(drop=True))


def flow_labels(saddr, daddr, host_of_ip: dict[str, str]) -> np.ndarray:
    """"server3>client" per row from IPv4 source and destination keys (see _ip_key);
    "-" where the packet carried no IPv4 (saddr 0), "?" for an address of no host.
    Named once per distinct pair, then spread to the rows."""
    names = {_ip_key(ip): h for ip, h in host_of_ip.items()}
    pair = (np.asarray(saddr).astype(np.uint64) << np.uint64(32)) | np.asarray(daddr).astype(np.uint64)
    upair, inv = np.unique(pair, return_inverse=True)
    labels = np.array(["-" if (p >> 32) == 0 else
                       f"{names.get(int(p >> 32), '?')}>{names.get(int(p & 0xFFFFFFFF), '?')}"
                       for p in upair.tolist()], dtype=object)
    return labels[inv.reshape(-1)]


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    for c in ("switch", "port", "event", "flow"):
        df[c] = df[c].astype("category")
    for c in ("packets", "bytes", "pkt_len", "port_packets", "port_bytes"):
        df[c] = df[c].astype("int32")
    df["queue"] = df["queue"].astype("int8")
    return df[COLUMNS]


def microbursts(table: pd.DataFrame, port: str, gap_us: float) -> pd.DataFrame:
    """A port's records split wherever none came for more than gap_us: with telemetry
    sampled above a threshold (telemetry.sample = "above:SIZE"), each stretch is one
    microburst, the queue at or above SIZE. One row each: start_us (its first record),
    end_us (its last: a dequeue), duration_us, peak_bytes (the class queue's largest
    occupancy), records (postcards: one enqueue and one dequeue row each)."""
    t = table[(table["port"] == port) & table["event"].isin(["enqueue", "dequeue"])].sort_values("time_us")
    if t.empty:
        return pd.DataFrame(columns=["start_us", "end_us", "duration_us", "peak_bytes", "records"])
    burst = (t["time_us"].diff() > gap_us).cumsum()
    g = t.groupby(burst)
    out = pd.DataFrame({"start_us": g["time_us"].min(), "end_us": g["time_us"].max(),
                        "peak_bytes": g["bytes"].max(),
                        "records": g["event"].apply(lambda e: int((e == "enqueue").sum()))})
    out["duration_us"] = out["end_us"] - out["start_us"]
    return out[["start_us", "end_us", "duration_us", "peak_bytes", "records"]].reset_index(drop=True)


@dataclass
class TelemetryResult:
    table: pd.DataFrame
    lost: int
    notes: list[str] = field(default_factory=list)
    pool: pd.DataFrame | None = None     # a shared pool's occupancy (time_us, switch, bytes), where recorded



class QueueTelemetry(Instrument):
    """The data plane's recorder at the switch queues (DataPlane.telemetry): the
    telemetry table, and the summary's telemetry_notes (what it could not record,
    and how it sampled)."""

    def __init__(self, bench):
        super().__init__(bench)
        b = bench
        self.recorder = b.dataplane.telemetry(b.run_dir, {h.IP(): h.name for h in b.net.hosts}, b.world_inode)

    @classmethod
    def wanted(cls, scenario, features) -> bool:
        return scenario.telemetry.enabled

    def start(self) -> None:
        self.recorder.start()

    def stop(self) -> Readings:
        result = self.recorder.stop(self.bench.t0_ns)
        tables = {"telemetry.parquet": result.table}
        if result.pool is not None:
            tables["pool.parquet"] = result.pool
        return Readings(tables=tables,
                        summary={"telemetry_notes": result.notes} if result.notes else {},
                        messages=list(result.notes), facts=Facts(telemetry_lost=result.lost))

BPFTRACE_PROGRAM = r"""
// Generated by incast.telemetry: per-packet events at the switch egress queues.
// $1: inode of the network namespace holding the switch ports.
BEGIN
{
%(class_map)s
  printf("READY\n");
}

tracepoint:qdisc:qdisc_enqueue
/((struct sk_buff *)args->skbaddr)->dev->nd_net.net->ns.inum == $1/
{
  $if = args->ifindex;   // copied first: ctx reads inside branches upset the verifier
  $skb = (struct sk_buff *)args->skbaddr;
  $ip = (struct iphdr *)($skb->head + $skb->network_header);
  $v4 = $skb->protocol == 0x0008;
  $c = %(class_expr)s;
  $s = $v4 ? $ip->saddr : 0;
  $d = $v4 ? $ip->daddr : 0;
  if (args->qdisc->q.qlen == 1) {
    // Alone in the port: whatever the class counters held left without a dequeue
    // event (a qdisc reset purges queues silently), so they restart from zero.
%(reset_classes)s
  }
  @qb[$if, $c] = @qb[$if, $c] + $skb->len;
  @qp[$if, $c] = @qp[$if, $c] + 1;
  @ts[(uint64)args->skbaddr] = nsecs;
  @cl[(uint64)args->skbaddr] = $c;
  printf("E,%%llu,%%d,%%d,%%d,%%d,%%u,%%u,%%u,%%u,%%u,0\n", nsecs, $if, $c,
         @qp[$if, $c], @qb[$if, $c],
         args->qdisc->q.qlen, args->qdisc->qstats.backlog, $skb->len, $s, $d);
}

tracepoint:qdisc:qdisc_dequeue
/args->skbaddr != 0 && ((struct sk_buff *)args->skbaddr)->dev->nd_net.net->ns.inum == $1/
{
  // A bulk dequeue hands over a chain of skbs linked by ->next: account each one, and
  // give each the port occupancy just after it left (the root's counters already
  // reflect the whole chain).
  $skb = (struct sk_buff *)args->skbaddr;
  $n = 0;
  $rest_b = (uint64)0;
  unroll(%(max_bulk)d) {
    if ($skb != 0 && $n < args->packets) {
      $rest_b = $rest_b + $skb->len;
      $skb = $skb->next;
      $n = $n + 1;
    }
  }
  $rest_p = $n;
  $skb = (struct sk_buff *)args->skbaddr;
  $n = 0;
  unroll(%(max_bulk)d) {
    if ($skb != 0 && $n < args->packets) {
      $rest_b = $rest_b - $skb->len;
      $rest_p = $rest_p - 1;
      $k = (uint64)$skb;
      if (@ts[$k] != 0) {
        $ip = (struct iphdr *)($skb->head + $skb->network_header);
        $v4 = $skb->protocol == 0x0008;
        $s = $v4 ? $ip->saddr : 0;
        $d = $v4 ? $ip->daddr : 0;
        $c = @cl[$k];
        @qb[args->ifindex, $c] = @qb[args->ifindex, $c] - $skb->len;
        @qp[args->ifindex, $c] = @qp[args->ifindex, $c] - 1;
        printf("D,%%llu,%%d,%%d,%%d,%%d,%%u,%%u,%%u,%%u,%%u,%%llu\n", nsecs, args->ifindex, $c,
               @qp[args->ifindex, $c], @qb[args->ifindex, $c],
               args->qdisc->q.qlen + $rest_p, args->qdisc->qstats.backlog + $rest_b,
               $skb->len, $s, $d, nsecs - @ts[$k]);
        delete(@ts[$k]);
        delete(@cl[$k]);
      }
      $skb = $skb->next;
      $n = $n + 1;
    }
  }
  if (args->packets > %(max_bulk)d) { @bulk_truncated = count(); }
}

tracepoint:skb:kfree_skb
/%(drop_filter)s && ((struct sk_buff *)args->skbaddr)->dev->nd_net.net->ns.inum == $1/
{
  $skb = (struct sk_buff *)args->skbaddr;
  $dev = $skb->dev;
  $ip = (struct iphdr *)($skb->head + $skb->network_header);
  $v4 = $skb->protocol == 0x0008;
  $c = %(class_expr)s;
  $s = $v4 ? $ip->saddr : 0;
  $d = $v4 ? $ip->daddr : 0;
  $q = $dev->qdisc;
  printf("X,%%llu,%%d,%%d,%%d,%%d,%%u,%%u,%%u,%%u,%%u,0\n", nsecs, $dev->ifindex, $c,
         @qp[$dev->ifindex, $c], @qb[$dev->ifindex, $c],
         $q->q.qlen, $q->qstats.backlog, $skb->len, $s, $d);
}

END
{
  clear(@ts); clear(@cl); clear(@qb); clear(@qp);%(clear_dscp)s
}
"""


def bpftrace_program(dscp_table: list[int], drop_reasons: dict[str, int]) -> str:
    """The bpftrace source for a switch whose DSCP rule is dscp_table (64 entries)."""
    if any(dscp_table):
        class_map = "\n".join(f"  @dscp[{d}] = {c};" for d, c in enumerate(dscp_table) if c)
        # Same rule as the tc u32 filters: DSCP -> class, non-IPv4 -> class 0.
        class_expr = "$v4 ? @dscp[$ip->tos >> 2] : 0"
    else:
        class_map, class_expr = "", "0"
    reasons = sorted(drop_reasons.values())
    if not reasons:
        raise ValueError("no qdisc drop reasons known for skb:kfree_skb")
    drop_filter = "(" + " || ".join(f"args->reason == {r}" for r in reasons) + ")"
    return BPFTRACE_PROGRAM % {"class_map": class_map, "class_expr": class_expr,
                               "drop_filter": drop_filter, "max_bulk": MAX_BULK,
                               "reset_classes": "\n".join(
                                   f"    @qb[$if, {c}] = 0; @qp[$if, {c}] = 0;"
                                   for c in range(max(dscp_table) + 1)),
                               "clear_dscp": " clear(@dscp);" if class_map else ""}


class KernelQueueRecorder:
    """What every recorder of the linux data plane's qdisc events is given: where to
    write, which namespace's ports to watch (ifindex -> (switch, port name)), and the
    names of the hosts by address."""

    def __init__(self, run_dir: Path, netns_inode: int, ports: dict[int, tuple[str, str]],
                 host_of_ip: dict[str, str]):
        self.run_dir = Path(run_dir)
        self.inode = netns_inode
        self.ports = ports
        self.host_of_ip = host_of_ip
        self.proc: subprocess.Popen | None = None
        self._stderr = b""
        self._ready = threading.Event()   # the recorder said READY (or its stdout closed)
        self._reader: threading.Thread | None = None
        self._err_reader: threading.Thread | None = None
        self._lines: list[str] = []       # the recorder's stdout lines (READY, its reports)

    def _spawn(self, argv: list[str], **popen) -> None:
        """Start the recorder process; _pump reads its stdout, _pump_err its stderr."""
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()
        self._err_reader = threading.Thread(target=self._pump_err, daemon=True)
        self._err_reader.start()

    def _pump(self) -> None:
        raise NotImplementedError

    def _value(self, key: str) -> list[int] | None:
        for line in reversed(self._lines):
            parts = line.split()
            if parts and parts[0] == key:
                return [int(x) for x in parts[1:]]
        return None

    def _pump_err(self) -> None:
        self._stderr = self.proc.stderr.read()

    def _kill(self) -> None:
        """The recorder did not attach: stop it without waiting for a report."""
        self.proc.kill()
        self.proc.wait()
        self._reader.join(5)
        self._err_reader.join(5)

    def _interrupt(self) -> None:
        """SIGINT: the recorder detaches, drains its buffers and reports; wait for it."""
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join()
        self._err_reader.join()


class QdiscTracer(KernelQueueRecorder):
    """Records the switch ports' qdisc events with bpftrace while a run goes on."""

    def __init__(self, run_dir: Path, netns_inode: int, ports: dict[int, tuple[str, str]],
                 dscp_table: list[int], drop_reasons: dict[str, int], host_of_ip: dict[str, str],
                 perf_pages: int = 4096):
        super().__init__(run_dir, netns_inode, ports, host_of_ip)
        self.program = bpftrace_program(dscp_table, drop_reasons)
        self.perf_pages = perf_pages
        self.raw_path = self.run_dir / "telemetry.raw.csv"

    def start(self, timeout: float = 60.0) -> None:
        prog = self.run_dir / "telemetry.bt"
        prog.write_text(self.program)
        env = dict(os.environ, BPFTRACE_PERF_RB_PAGES=str(self.perf_pages),
                   BPFTRACE_STRLEN="16", BPFTRACE_MAP_KEYS_MAX="65536")
        self._spawn(["bpftrace", str(prog), str(self.inode)], env=env)
        if not self._ready.wait(timeout) or self.proc.poll() is not None:
            self._kill()
            err = self._stderr.decode(errors="replace").strip().splitlines()
            detail = next((line for line in err if "ERROR" in line and "RLIMIT" not in line),
                          err[-1] if err else "no output")
            raise RuntimeError(f"telemetry: bpftrace did not attach: {detail}")

    def _pump(self) -> None:
        """Copy bpftrace's stdout to the raw file, noticing the READY line."""
        with open(self.raw_path, "wb") as out:
            seen = b""
            while True:
                chunk = self.proc.stdout.read1(1 << 20)
                if not chunk:
                    break
                if not self._ready.is_set():
                    seen += chunk
                    if b"READY\n" in seen:
                        self._ready.set()
                        chunk = seen.split(b"READY\n", 1)[1]
                    else:
                        continue
                out.write(chunk)

    def stop(self, t0_ns: int) -> TelemetryResult:
        self._interrupt()   # bpftrace flushes its buffers and runs END
        return self.parse(t0_ns)

    def parse(self, t0_ns: int) -> TelemetryResult:
        data = self.raw_path.read_bytes()
        lost = sum(int(n) for n in re.findall(rb"Lost (\d+) events", data + self._stderr))
        notes = []
        bulk = re.search(rb"@bulk_truncated: (\d+)", data)
        if bulk and int(bulk.group(1)):
            lost += int(bulk.group(1))
            notes.append(f"{int(bulk.group(1))} dequeue chains longer than {MAX_BULK} packets: "
                         "their tail packets' dequeues are missing")
        table = decode_raw(data, t0_ns, self.ports, self.host_of_ip)
        self.raw_path.unlink()
        return TelemetryResult(table=table, lost=lost, notes=notes)


def _ip_key(ip: str) -> int:
    """An IPv4 address as bpftrace prints a __be32 read on a little-endian machine."""
    return struct.unpack("=I", socket.inet_aton(ip))[0]


def decode_raw(data: bytes, t0_ns: int, ports: dict[int, tuple[str, str]],
               host_of_ip: dict[str, str]) -> pd.DataFrame:
    lines = [ln for ln in data.split(b"\n") if ln[:2] in (b"E,", b"D,", b"X,")]
    if not lines:
        return empty_table()
    raw = pd.read_csv(io.BytesIO(b"\n".join(lines)), header=None, names=RAW_COLUMNS,
                      dtype={"kind": "category"}, engine="c")
    known = raw["ifindex"].map(lambda i: ports.get(i, ("?", f"if{i}")))
    return build_table({
        "time_us": (raw["ts"].astype("int64") - t0_ns) / 1000.0,
        "switch": [k[0] for k in known],
        "port": [k[1] for k in known],
        "queue": raw["queue"],
        "event": raw["kind"].astype(str).map(EVENTS),
        "packets": raw["packets"],
        "bytes": raw["bytes"],
        "sojourn_us": np.where(raw["kind"] == "D", raw["sojourn_ns"] / 1000.0, np.nan),
        "flow": flow_labels(raw["saddr"], raw["daddr"], host_of_ip),
        "pkt_len": raw["pkt_len"],
        "port_packets": raw["port_packets"],
        "port_bytes": raw["port_bytes"],
    })
