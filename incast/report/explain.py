"""`incast explain RUN_DIR`: why each block was slow, from the servers' side.

A run made with ``--capture`` holds every server's packets as its NIC saw them (see
capture.py): each data segment as sent, before the switch could drop it, and each ACK
that came back. From that sender's view, every retransmission timeout is found and
classified as FAST'08 did by hand (§5.1, Table 3), by the number of duplicate ACKs the
flow had received when it timed out (DART):

- ``lost_retransmit``: the segment had been retransmitted before, and that copy was lost
  too (no sender can tell; it waits for the timer);
- ``last_packet``: the fragment's last segment was lost: nothing after it could bring
  duplicate ACKs;
- ``full_window``: DART 0, a whole window lost, no feedback at all;
- ``little_feedback``: some duplicate ACKs, fewer than the threshold that starts fast
  retransmit;
- ``other``: enough duplicate ACKs came, and the flow timed out anyway.

A timeout is a retransmission of the first unacknowledged segment when the flow's
retransmission timer (restarted by an ACK of new data, a retransmission of that segment,
or data sent into an empty pipe; not by duplicate ACKs, nor by a probe or a recovery
retransmission of a later segment; and, as Linux re-arms it where a tail loss probe is
armed, running from the segment's own latest transmission if that was earlier, though
never from before its latest retransmission) has run for at least the run's effective RTO floor plus the flow's
smoothed RTT as the trace measures it (Linux's RTO is at least srtt + rto_min), less a
10% margin for timer slack: the flow waited out an RTO. A retransmission that leaves
right after an ACK came in (within the host's egress delay, link.delay and its
jitter, which the capture sees it after, plus REACTION_US) answers that ACK (a fast
retransmit on the third duplicate, or recovery going on after a timeout) and is not a
timeout, however long the timer had run: with microsecond RTOs a flow's timer often
runs longer than its floor before its third duplicate ACK comes. Linux may send a tail loss probe
in the timeout's place at that moment (it caps the probe's timer at the RTO; with one
segment in flight the probe is that segment), and counts it as TCPLossProbes, not
TCPTimeouts; for the block, the wait is the same. So the trace's count is checked
against the kernel's own (counters.parquet, the servers, the measured blocks): at least
TCPTimeouts, at most TCPTimeouts + TCPLossProbes. The report says whether it is.

A block's duration is *decided by a timeout* when its last server to finish timed out
during the block.

Writes ``timeouts.parquet`` (one row per timeout) and ``explain.png``, prints a
Table-3-like summary.
"""
from __future__ import annotations

import json
import struct
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import MaxNLocator

from incast.errors import BadInput
from incast.measure.capture import CAPTURE_DIR, META
from incast.measure.results import complete_run
from incast.scenario import build

CAUSES = ("lost_retransmit", "last_packet", "full_window", "little_feedback", "other")
FLOOR_MARGIN = 0.9
# How soon after an ACK's arrival a retransmission it triggers leaves, beyond the
# host's egress delay: in virtual time at once; on a loaded host in real time, tens of
# microseconds.
REACTION_US = 20
COLUMNS = ["rep", "block", "measured", "server", "time_us", "seq", "dart", "sends_before", "wait_us",
           "cause", "decided_block"]


class ExplainError(BadInput):
    """Bad input (exit 2), as the CLI reports scenario errors."""


@dataclass
class Segment:
    """What one TCP/IPv4 frame says (Ethernet II, IPv4, TCP)."""
    t_ns: int
    src: str
    dst: str
    sport: int
    dport: int
    seq: int
    ack: int
    flags: int
    payload: int


def parse_frame(raw: bytes, t_ns: int) -> Segment | None:
    """The TCP fields of an Ethernet/IPv4 frame, or None for anything else. Fixed
    offsets: this runs once per captured packet."""
    if len(raw) < 34 or raw[12:14] != b"\x08\x00":
        return None
    ihl = (raw[14] & 0x0F) * 4
    if raw[23] != 6:                # not TCP
        return None
    total_len = struct.unpack_from("!H", raw, 16)[0]
    tcp = 14 + ihl
    if len(raw) < tcp + 20:
        return None
    sport, dport, seq, ack, off_flags = struct.unpack_from("!HHIIH", raw, tcp)
    doff = (off_flags >> 12) * 4
    src = ".".join(map(str, raw[26:30]))
    dst = ".".join(map(str, raw[30:34]))
    return Segment(t_ns, src, dst, sport, dport, seq, ack, off_flags & 0x3F, total_len - ihl - doff)


def read_pcap(path: Path) -> list[Segment]:
    from scapy.utils import RawPcapReader     # late: scapy takes 0.4 s to import, and only a capture needs it
    out = []
    r = RawPcapReader(str(path))
    try:
        scale = 1 if getattr(r, "nano", False) else 1000
        for raw, meta in r:
            s = parse_frame(raw, meta.sec * 1_000_000_000 + meta.usec * scale)
            if s is not None:
                out.append(s)
    finally:
        r.close()
    return out


@dataclass
class _Flow:
    """One connection seen from its server: sequence numbers relative to the first byte."""
    base: int | None = None
    snd_una: int = 0
    snd_max: int = 0
    dup: int = 0
    timer_t: int = 0        # when the retransmission timer was last (re)started, as the trace shows
    srtt_ns: float | None = None
    first_sent: dict = field(default_factory=dict)  # end seq of a segment sent once -> when
    sends: dict = field(default_factory=dict)       # relative seq -> number of transmissions
    last_sent: dict = field(default_factory=dict)   # relative seq -> its latest transmission
    head_rtx_t: int = 0     # the latest retransmission of the first unacknowledged segment
    ack_t: int | None = None        # the latest ACK's arrival
    fragment_starts: list = field(default_factory=list)
    timeouts: list = field(default_factory=list)


def _rel(seq: int, base: int) -> int:
    return (seq - base) % (1 << 32)


def find_timeouts(segments: list[Segment], server_ip: str, floor_ns: int, dupthresh: int,
                  reaction_ns: int = REACTION_US * 1000) -> list[dict]:
    """Every retransmission timeout of the server's connections, classified.
    reaction_ns: a retransmission leaving within this of an ACK's arrival answers it
    (the host's egress delay plus REACTION_US)."""
    flows: dict[tuple, _Flow] = {}
    for s in segments:
        outgoing = s.src == server_ip
        key = (s.sport, s.dst, s.dport) if outgoing else (s.dport, s.src, s.sport)
        f = flows.setdefault(key, _Flow())
        if outgoing and s.flags & 0x02:           # SYN-ACK: data starts after it
            f.base = (s.seq + 1) % (1 << 32)
            f.timer_t = s.t_ns
            continue
        if f.base is None:
            if not (outgoing and s.payload):
                continue
            f.base = s.seq                          # joined mid-connection: start here
        if outgoing and s.payload:
            rel = _rel(s.seq, f.base)
            if rel < f.snd_max:                     # a retransmission
                # Where a tail loss probe is armed, Linux's RTO fires an RTO after the head's
                # latest transmission, even when an ACK came since (tcp_rearm_rto takes the
                # time since then off); never before the head was last resent (go-back-N after
                # a timeout resends segments sent long before, each within an RTT).
                head_t = f.last_sent.get(rel, f.timer_t)
                wait = s.t_ns - max(f.head_rtx_t, min(f.timer_t, head_t))
                f.first_sent.pop(rel + s.payload, None)   # Karn: no RTT sample from it
                # Linux's RTO is at least srtt + rto_min (the minimum bounds rttvar); a
                # tail loss probe fires after about 2 srtt, so this keeps most apart.
                answers_ack = f.ack_t is not None and s.t_ns - f.ack_t <= reaction_ns
                if rel == f.snd_una and not answers_ack and wait >= (floor_ns + (f.srtt_ns or 0)) * FLOOR_MARGIN:
                    f.timeouts.append({"t_ns": s.t_ns, "seq": rel, "len": s.payload, "dart": f.dup,
                                       "sends_before": f.sends.get(rel, 0), "wait_us": wait / 1000})
                if rel == f.snd_una:                # the head resent: the timer restarts
                    f.timer_t = f.head_rtx_t = s.t_ns
                # Other retransmissions (a probe of the tail, recovery's) leave it be.
            else:
                f.first_sent[rel + s.payload] = s.t_ns
                if f.snd_una == f.snd_max:          # nothing was in flight: the timer starts
                    f.timer_t = s.t_ns
            f.sends[rel] = f.sends.get(rel, 0) + 1
            f.last_sent[rel] = s.t_ns
            f.snd_max = max(f.snd_max, rel + s.payload)
        elif not outgoing:
            if s.payload:                           # a request: the next fragment starts here
                f.fragment_starts.append(f.snd_max)
            if s.flags & 0x10:
                f.ack_t = s.t_ns
                rel = _rel(s.ack, f.base)
                if rel > f.snd_una and rel <= f.snd_max:
                    sent = f.first_sent.pop(rel, None)
                    if sent is not None:
                        sample = s.t_ns - sent
                        f.srtt_ns = sample if f.srtt_ns is None else 0.875 * f.srtt_ns + 0.125 * sample
                    f.snd_una, f.dup = rel, 0
                    f.timer_t = s.t_ns                  # new data acknowledged: restarted
                elif rel == f.snd_una and not s.payload and f.snd_max > f.snd_una:
                    f.dup += 1
    out = []
    for f in flows.values():
        ends = f.fragment_starts[1:] + [f.snd_max]
        for t in f.timeouts:
            end = next((e for e in ends if e >= t["seq"] + t["len"]), f.snd_max)
            if t["sends_before"] >= 2:
                cause = "lost_retransmit"
            elif t["seq"] + t["len"] == end:
                cause = "last_packet"
            elif t["dart"] == 0:
                cause = "full_window"
            elif t["dart"] < dupthresh:
                cause = "little_feedback"
            else:
                cause = "other"
            out.append({**t, "cause": cause})
    return out


@dataclass
class Explanation:
    timeouts: pd.DataFrame
    blocks: pd.DataFrame            # blocks.parquet with timeouts, cause, decided_by_timeout
    kernel_timeouts: int | None     # TCPTimeouts of the servers over the measured blocks
    kernel_probes: int | None       # TCPLossProbes of the same
    capture_dropped: int | None
    floor_us: float
    dupthresh: int = 3
    # TCPSpuriousRtxHostQueues of the same: retransmissions the kernel did not send
    # because the original was still in the host's own queue. An RTO whose
    # retransmission is deferred so is counted again when its timer fires once more,
    # and the wire shows one timeout where the kernel counted two.
    kernel_deferred: int | None = None
    reaction_us: float = REACTION_US    # a retransmission this soon after an ACK answers it

    def table3(self) -> dict:
        m = self.timeouts[self.timeouts["measured"]]
        causes = Counter(m["cause"])
        lost = m[m["cause"] == "lost_retransmit"]
        return {
            "timeouts": int(len(m)),
            "kernel_timeouts": self.kernel_timeouts,
            "kernel_loss_probes": self.kernel_probes,
            "kernel_deferred_retransmits": self.kernel_deferred,
            "consistent_with_kernel": self.consistent(len(m)),
            **{c: int(causes.get(c, 0)) for c in CAUSES},
            "lost_retransmit_dart_at_least_threshold": int((lost["dart"] >= self.dupthresh).sum()),
            "blocks": int(len(self.blocks)),
            "blocks_decided_by_a_timeout": int(self.blocks["decided_by_timeout"].sum()),
            "capture_dropped": self.capture_dropped,
        }

    def allowed(self) -> tuple[int, int] | None:
        """The timeouts a trace may find, by the kernel's counts: at least its RTOs
        less the retransmissions it deferred, at most its RTOs plus loss probes."""
        if self.kernel_timeouts is None or self.kernel_probes is None:
            return None
        return self.kernel_timeouts - (self.kernel_deferred or 0), self.kernel_timeouts + self.kernel_probes

    def consistent(self, found: int) -> bool | None:
        bounds = self.allowed()
        return None if bounds is None else bounds[0] <= found <= bounds[1]

    def text(self) -> str:
        t = self.table3()
        kernel = ""
        if t["kernel_timeouts"] is not None:
            kernel = (f"   (kernel: {t['kernel_timeouts']} timeouts, {t['kernel_loss_probes']} loss probes: "
                      f"{'consistent' if t['consistent_with_kernel'] else 'NOT consistent'})")
        lines = [f"timeouts over the measured blocks      {t['timeouts']:>6}{kernel}",
                 f"  full window losses (DART 0)          {t['full_window']:>6}",
                 f"  lost retransmits                     {t['lost_retransmit']:>6}",
                 f"    with DART >= {self.dupthresh}                      {t['lost_retransmit_dart_at_least_threshold']:>6}",
                 f"  last packet of a fragment lost       {t['last_packet']:>6}",
                 f"  too few duplicate ACKs (1-{self.dupthresh - 1})         {t['little_feedback']:>6}",
                 f"  enough duplicate ACKs, still waited  {t['other']:>6}",
                 f"blocks                                 {t['blocks']:>6}",
                 f"  decided by a timeout                 {t['blocks_decided_by_a_timeout']:>6}",
                 f"(a timeout: the first unacked segment resent after {FLOOR_MARGIN:.0%} of "
                 f"{self.floor_us:.0f} us + srtt of silence, not within {self.reaction_us:.0f} us of an ACK)"]
        if t["consistent_with_kernel"] is False:
            low, high = self.allowed()
            lines.append(f"note: the trace finds {t['timeouts']} where the kernel's counts allow "
                         f"{low}-{high}: "
                         "the classes above may not cover every timeout")
        if t["capture_dropped"]:
            lines.append(f"note: the capture lost {t['capture_dropped']} packets: classes may be wrong")
        return "\n".join(lines)


def explain(run_dir: Path) -> Explanation:
    run_dir = Path(run_dir)
    cap = run_dir / CAPTURE_DIR
    if not (cap / META).is_file():
        raise ExplainError(f"{run_dir}: no packet capture; run the scenario again with --capture")
    meta = json.loads((cap / META).read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    applied = json.loads((run_dir / "tcp_hosts.json").read_text()) if (run_dir / "tcp_hosts.json").is_file() else {}
    blocks = pd.read_parquet(run_dir / "blocks.parquet")
    floor_ns = int(summary["rto_floor_us"] * 1000)
    scenario = build(tomllib.loads((run_dir / "scenario.toml").read_text()))
    dupthresh = scenario.tcp.for_host("servers").dupack_threshold   # the servers' profile's
    # The capture sees a host's packets after its egress delay (netem: delay and jitter).
    reaction_ns = ((scenario.link.delay or 0) + (scenario.link.jitter or 0) + REACTION_US) * 1000
    offset = meta["realtime_minus_monotonic_ns"] + meta["t0_monotonic_ns"]
    rows = []
    ips = _server_ips(run_dir, applied)
    for pcap in sorted(cap.glob("*.pcap")):
        server = pcap.stem
        ip = ips.get(server)
        if ip is None:
            continue
        for t in find_timeouts(read_pcap(pcap), ip, floor_ns, dupthresh, reaction_ns):
            rows.append({"server": server, "time_us": (t["t_ns"] - offset) / 1000, **t})
    df = pd.DataFrame(rows, columns=["server", "time_us", "t_ns", "seq", "len", "dart", "sends_before",
                                     "wait_us", "cause"])
    df = df.sort_values("time_us", kind="stable").reset_index(drop=True)
    # Each timeout to the measured block it happened in (warm-up and between blocks: -1).
    df["rep"], df["block"] = -1, -1
    last_server = pd.Series("", index=df.index)
    for b in blocks.itertuples():
        inside = (df["time_us"] >= b.start_us) & (df["time_us"] <= b.end_us)
        df.loc[inside, "rep"], df.loc[inside, "block"] = b.rep, b.block
        last_server[inside] = b.last_server
    df["measured"] = df["block"] >= 0
    # A timeout of the block's last server to finish decided the block's duration.
    df["decided_block"] = df["measured"] & (df["server"] == last_server)
    per_block = df[df["measured"]].groupby(["rep", "block"])
    blocks = blocks.merge(per_block.size().rename("timeouts"), on=["rep", "block"], how="left")
    blocks = blocks.merge(per_block["decided_block"].any().rename("decided_by_timeout"), on=["rep", "block"],
                          how="left")
    # The cause shown for a block: its deciding timeout's, else its last timeout's.
    shown = df[df["measured"]].sort_values(["decided_block", "time_us"]).groupby(["rep", "block"])["cause"].last()
    blocks = blocks.merge(shown.rename("cause"), on=["rep", "block"], how="left")
    blocks["timeouts"] = blocks["timeouts"].fillna(0).astype(int)
    blocks["decided_by_timeout"] = blocks["decided_by_timeout"].astype("boolean").fillna(False).astype(bool)
    blocks["cause"] = blocks["cause"].fillna("")
    df["cause"] = pd.Categorical(df["cause"], categories=list(CAUSES))
    dropped = [h.get("dropped_by_kernel") for h in meta["hosts"].values()]
    return Explanation(df[COLUMNS], blocks, _kernel_count(run_dir, "TCPTimeouts"),
                       _kernel_count(run_dir, "TCPLossProbes"), None if None in dropped else sum(dropped),
                       summary["rto_floor_us"], dupthresh, _kernel_count(run_dir, "TCPSpuriousRtxHostQueues"),
                       reaction_ns / 1000)


def _server_ips(run_dir: Path, applied: dict) -> dict[str, str]:
    """Server name -> IPv4 address, from the route each host's namespace reported."""
    ips = {}
    for host, a in applied.items():
        route = a.get("route", "").split()
        if "src" in route:
            ips[host] = route[route.index("src") + 1]
    if not ips:
        raise ExplainError(f"{run_dir}: no tcp_hosts.json to find the servers' addresses in")
    return ips


def _kernel_count(run_dir: Path, counter: str) -> int | None:
    """A TCP MIB counter summed over the servers and the measured blocks."""
    p = run_dir / "counters.parquet"
    if not p.is_file():
        return None
    c = pd.read_parquet(p)
    if counter not in c:
        return None
    return int(c.loc[c["host"].astype(str).str.startswith("server"), counter].sum())


COLORS = {"lost_retransmit": "tab:red", "last_packet": "tab:purple", "full_window": "tab:orange",
          "little_feedback": "tab:olive", "other": "tab:gray", "": "tab:blue"}


def plot(e: Explanation, out: Path, title: str = "") -> Path:
    matplotlib.use("Agg")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.6), gridspec_kw={"width_ratios": [2, 1]})
    b = e.blocks.reset_index(drop=True)
    colors = [COLORS[c] if d else "tab:blue" for c, d in zip(b["cause"], b["decided_by_timeout"])]
    ax1.bar(range(len(b)), b["duration_ms"], color=colors)
    for i, k in enumerate(b["timeouts"]):
        if k:
            ax1.annotate(str(k), (i, b["duration_ms"].iloc[i]), ha="center", va="bottom", fontsize=7)
    ax1.set_xlabel("measured block (number above: flows' timeouts in it)")
    ax1.set_ylabel("block duration (ms)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[c]) for c in CAUSES] + \
              [plt.Rectangle((0, 0), 1, 1, color="tab:blue")]
    ax1.legend(handles, [f"decided by a timeout: {c.replace('_', ' ')}" for c in CAUSES] + ["no timeout decided it"],
               fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
    m = e.timeouts[e.timeouts["measured"]]
    dart = m["dart"].value_counts().sort_index()
    ax2.bar(dart.index, dart.values, color="tab:orange")
    ax2.set_xlabel("duplicate ACKs received at the timeout (DART)")
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.set_ylabel("timeouts")
    kern = (f" (kernel: {e.kernel_timeouts} timeouts + {e.kernel_probes} probes)"
            if e.kernel_timeouts is not None else "")
    ax2.set_title(f"{len(m)} timeouts{kern}", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def cmd_explain(args) -> int:
    run_dir = complete_run(args.run_dir)
    e = explain(run_dir)
    e.timeouts.to_parquet(run_dir / "timeouts.parquet", index=False)
    png = plot(e, Path(args.out) if args.out else run_dir / "explain.png", title=str(run_dir))
    if args.json:
        print(json.dumps(e.table3()))
    else:
        print(e.text())
        print(f"-> {run_dir / 'timeouts.parquet'}, {png}")
    return 0
