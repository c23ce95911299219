#!/usr/bin/env python3
"""Measure TCP retransmission timeouts: how long after a lost tail segment does the RTO
retransmit it?

Two network namespaces joined by a veth pair (offloads off); a TCP connection from the
sender (namespace A) to the receiver (namespace B) exchanges small requests. In each
trial the sender sends one request whose only segment the receiver's ingress drops once
(tc u32 filter on the request's marker, gact "drop, every 2nd pass"), so that nothing
but the RTO can recover it: no later data (no dupACKs), tail loss probes off
(tcp_early_retrans=0), timestamps off (a 20-byte TCP header, so the marker sits at a
fixed offset). A packet socket on the sender's veth timestamps both copies of the
segment as they leave; the delay between them is the retransmission timeout as it
happened. Before each trial a few warm-up requests (acked at once: TCP_QUICKACK) give
fresh RTT samples, so the RTO is not backed off; the sender's RTO (tcpi_rto) is read
just before the segment is sent. TcpExtTCPTimeouts of namespace A cross-checks the
number of RTOs.

    python3 kernels/rto_bench.py --trials 100 --rto-min-us 200 --hrtimer 1 --json out.json

--mode ack measures the receiver's delayed ACK instead: one-way requests --gap-ms
apart that the receiving application does not read until the end, each acked by the
receiver's delayed ACK timer (net.ipv4.tcp_delack_us, set in both namespaces); the
delay from each request to the ACK covering it, and the receiver's TcpExtDelayedACKs.
(With tcp_delack_us=0 a 6.12 receiver acks these requests at once, so this mode shows
the microsecond timer, not the stock 40 ms one.)

Sysctls the kernel lacks (tcp_rto_hrtimer, tcp_rto_random_pct, tcp_delack_us on a
stock kernel) are reported as unsupported, and an explicit non-zero request for one is
an error. Run as root; it needs ip, tc (iproute2) and, optionally, ethtool. Only
standard library.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import secrets
import select
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time

CLONE_NEWNET = 0x40000000
ETH_P_ALL = 0x0003
SO_TIMESTAMPNS = 35
TCP_INFO = 11
TCP_QUICKACK = 12
MSG_LEN = 64                       # bytes of every request (one segment)
ADDR_A, ADDR_B = "198.18.0.1", "198.18.0.2"   # RFC 2544 benchmarking range, inside our netns
PORT = 5001

_libc = ctypes.CDLL(None, use_errno=True)


def sh(*args, check=True, ns=None, input=None):
    cmd = list(map(str, args))
    if ns:
        cmd = ["ip", "netns", "exec", ns, *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, input=input)
    if check and r.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return r


class Netns:
    """Enter a named network namespace for socket creation (sockets keep theirs)."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.old = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        fd = os.open(f"/run/netns/{self.name}", os.O_RDONLY)
        try:
            if _libc.setns(fd, CLONE_NEWNET):
                raise OSError(ctypes.get_errno(), "setns")
        finally:
            os.close(fd)
        return self

    def __exit__(self, *exc):
        _libc.setns(self.old, CLONE_NEWNET)
        os.close(self.old)


def sysctl_path(name: str) -> str:
    return "/proc/sys/" + name.replace(".", "/")


def read_sysctl(ns: str, name: str) -> str | None:
    r = sh("cat", sysctl_path(name), ns=ns, check=False)
    return r.stdout.strip() if r.returncode == 0 else None


def write_sysctl(ns: str, name: str, value) -> bool:
    r = sh("sh", "-c", f"echo {value} > {sysctl_path(name)}", ns=ns, check=False)
    return r.returncode == 0


def netstat_counter(ns: str, name: str) -> int:
    """A TcpExt counter of namespace ns."""
    lines = sh("cat", "/proc/net/netstat", ns=ns).stdout.splitlines()
    for head, vals in zip(lines[::2], lines[1::2]):
        if head.startswith("TcpExt:"):
            d = dict(zip(head.split()[1:], vals.split()[1:]))
            return int(d.get(name, 0))
    return 0


def tcp_info(sock) -> dict:
    b = sock.getsockopt(socket.IPPROTO_TCP, TCP_INFO, 104)
    state, ca_state, retransmits, probes, backoff = b[0], b[1], b[2], b[3], b[4]
    rto, ato = struct.unpack_from("II", b, 8)
    rtt, rttvar = struct.unpack_from("II", b, 68)
    total_retrans = struct.unpack_from("I", b, 100)[0]
    return dict(rto_us=rto, ato_us=ato, rtt_us=rtt, rttvar_us=rttvar, backoff=backoff,
                ca_state=ca_state, total_retrans=total_retrans)


class Sniffer(threading.Thread):
    """Kernel-timestamped copies of the sender's marked segments, as they leave veth A."""

    def __init__(self, sock, marker: bytes):
        super().__init__(daemon=True)
        self.sock, self.marker = sock, marker
        self.seen: dict[int, list[int]] = {}     # trial -> [ns timestamps]
        self.segments: list[tuple] = []          # (ns, src, seq, ack, payload length)
        self.lock = threading.Lock()
        self.stop = False

    def run(self):
        while not self.stop:
            r, _, _ = select.select([self.sock], [], [], 0.2)
            if not r:
                continue
            data, anc, _, _ = self.sock.recvmsg(2048, 256)
            ts = None
            for level, typ, val in anc:
                if level == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS:
                    sec, nsec = struct.unpack("qq", val[:16])
                    ts = sec * 1_000_000_000 + nsec
            trial = self.parse(data, ts)
            if trial is not None and ts is not None:
                with self.lock:
                    self.seen.setdefault(trial, []).append(ts)

    def parse(self, frame: bytes, ts=None):
        if len(frame) < 14 + 20 + 20 or frame[12:14] != b"\x08\x00":
            return None
        ip = frame[14:]
        ihl = (ip[0] & 0x0F) * 4
        if ip[9] != socket.IPPROTO_TCP:
            return None
        tcp = ip[ihl:]
        doff = (tcp[12] >> 4) * 4
        payload = tcp[doff:struct.unpack("!H", ip[2:4])[0] - ihl]
        if ts is not None:
            seq, ack = struct.unpack("!II", tcp[4:12])
            with self.lock:
                self.segments.append((ts, socket.inet_ntoa(ip[12:16]), seq, ack, len(payload)))
        if payload[:4] != self.marker or len(payload) < 8:
            return None
        return struct.unpack("!I", payload[4:8])[0]

    def copies(self, trial: int) -> list[int]:
        with self.lock:
            return list(self.seen.get(trial, []))


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed")
        buf += chunk
    return buf


RECEIVER_INFO: dict = {}


def receiver(lsock, quickack: bool = True, hold=None):
    """Answer every request with one byte, after acking it at once (quickack). Without
    quickack, read nothing until ``hold`` is set (an application that reads pushed data
    at once makes TCP ack it at once), then answer only QUIT: every request waits for
    the delayed ACK timer."""
    conn, _ = lsock.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if hold is not None:
        hold.wait()
        RECEIVER_INFO.update(tcp_info(conn))
    try:
        while True:
            if quickack:
                conn.setsockopt(socket.IPPROTO_TCP, TCP_QUICKACK, 1)
            msg = recv_exact(conn, MSG_LEN)
            if quickack:
                conn.setsockopt(socket.IPPROTO_TCP, TCP_QUICKACK, 1)
            if quickack or msg[:4] == b"QUIT":
                conn.sendall(b"k")
            if msg[:4] == b"QUIT":
                return
    except (ConnectionError, OSError):
        return


def ack_delays(sniffer, addr_a: str, first_seq: int) -> list[float]:
    """For each data segment the sender sent from first_seq on, the time until the
    first ACK that covers it came back, in us."""
    with sniffer.lock:
        segs = list(sniffer.segments)
    data = [(ts, (seq + n) & 0xFFFFFFFF) for ts, src, seq, ack, n in segs
            if src == addr_a and n > 0 and ((seq - first_seq) & 0xFFFFFFFF) < 1 << 30]
    acks = [(ts, ack) for ts, src, seq, ack, n in segs if src != addr_a]
    out = []
    for ts, end in data:
        for ats, ack in acks:
            if ats >= ts and ((ack - end) & 0xFFFFFFFF) < 1 << 30:
                out.append((ats - ts) / 1000)
                break
    return out


def pct(v, q):
    v = sorted(v)
    if not v:
        return None
    k = (len(v) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def summarize(xs):
    if not xs:
        return {}
    return {"n": len(xs), "min": min(xs), "p10": pct(xs, 0.1), "p50": pct(xs, 0.5),
            "p90": pct(xs, 0.9), "max": max(xs), "mean": statistics.fmean(xs)}


def bench(a) -> dict:
    tag = secrets.token_hex(3)
    ns_a, ns_b = f"rtoA-{tag}", f"rtoB-{tag}"
    dev_a, dev_b = f"ra{tag}", f"rb{tag}"
    marker = b"RTO!"
    out = {"kernel": platform.release(), "params": vars(a), "sysctls": {}, "unsupported": []}
    sh("ip", "netns", "add", ns_a)
    sh("ip", "netns", "add", ns_b)
    try:
        sh("ip", "link", "add", dev_a, "netns", ns_a, "type", "veth", "peer", "name", dev_b,
           "netns", ns_b)
        for ns, dev, addr in ((ns_a, dev_a, ADDR_A), (ns_b, dev_b, ADDR_B)):
            sh("ip", "link", "set", "lo", "up", ns=ns)
            sh("ip", "addr", "add", f"{addr}/24", "dev", dev, ns=ns)
            sh("ip", "link", "set", dev, "up", ns=ns)
            r = sh("ethtool", "-K", dev, "tso", "off", "gso", "off", "gro", "off", ns=ns, check=False)
            out.setdefault("offloads_off", r.returncode == 0)
        wanted = {
            "net.ipv4.tcp_rto_min_us": a.rto_min_us,
            "net.ipv4.tcp_early_retrans": 0,         # no tail loss probe: the RTO must recover
            "net.ipv4.tcp_timestamps": 0,            # 20-byte TCP header: marker at offset 40
            "net.ipv4.tcp_no_metrics_save": 1,
            "net.ipv4.tcp_rto_hrtimer": a.hrtimer,
            "net.ipv4.tcp_rto_random_pct": a.random_pct,
            "net.ipv4.tcp_delack_us": a.delack_us,
        }
        if a.delack_us is not None and read_sysctl(ns_b, "net.ipv4.tcp_delack_us") is not None:
            write_sysctl(ns_b, "net.ipv4.tcp_delack_us", a.delack_us)
        for name, value in wanted.items():
            if read_sysctl(ns_a, name) is None:
                out["unsupported"].append(name)
                if value:
                    raise SystemExit(f"rto_bench: this kernel has no {name}")
                continue
            if value is None:
                out["sysctls"][name] = read_sysctl(ns_a, name)
                continue
            if not write_sysctl(ns_a, name, value):
                raise SystemExit(f"rto_bench: cannot set {name}={value}")
            out["sysctls"][name] = read_sysctl(ns_a, name)
        sh("tc", "qdisc", "add", "dev", dev_b, "clsact", ns=ns_b)

        with Netns(ns_b):
            lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            lsock.bind((ADDR_B, PORT))
            lsock.listen(1)
        hold = threading.Event() if a.mode == "ack" else None
        rthread = threading.Thread(target=receiver, args=(lsock, a.mode == "rto", hold),
                                   daemon=True)
        rthread.start()
        with Netns(ns_a):
            psock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            psock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            psock.bind((dev_a, ETH_P_ALL))
            csock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sniffer = Sniffer(psock, marker)
        sniffer.start()
        csock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        csock.settimeout(30)
        csock.connect((ADDR_B, PORT))

        def request(head: bytes, trial: int):
            csock.sendall(head + struct.pack("!I", trial) + bytes(MSG_LEN - 8))
            if recv_exact(csock, 1) != b"k":
                raise RuntimeError("bad reply")

        if a.mode == "ack":
            return measure_acks(a, out, csock, sniffer, ns_b, hold)

        for _ in range(a.warmup * 3):
            request(b"WARM", 0)
        timeouts0 = netstat_counter(ns_a, "TCPTimeouts")
        trials = []
        t_start = time.monotonic()
        for i in range(1, a.trials + 1):
            for _ in range(a.warmup):
                request(b"WARM", 0)
            sh("tc", "filter", "replace", "dev", dev_b, "ingress", "pref", "10", "protocol", "ip",
               "u32", "match", "u32", f"0x{marker.hex()}", "0xffffffff", "at", "40",
               "match", "u32", f"0x{i:08x}", "0xffffffff", "at", "44",
               "action", "gact", "drop", "random", "determ", "ok", "2", ns=ns_b)
            before = tcp_info(csock)
            request(marker, i)
            after = tcp_info(csock)
            deadline = time.monotonic() + 2
            copies = sniffer.copies(i)
            while len(copies) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
                copies = sniffer.copies(i)
            rec = {"trial": i, "rto_us": before["rto_us"], "rtt_us": before["rtt_us"],
                   "rttvar_us": before["rttvar_us"], "backoff_before": before["backoff"],
                   "copies": len(copies),
                   "retrans": after["total_retrans"] - before["total_retrans"]}
            if len(copies) >= 2:
                rec["delay_us"] = (copies[1] - copies[0]) / 1000
                rec["ratio"] = rec["delay_us"] / before["rto_us"] if before["rto_us"] else None
            trials.append(rec)
        elapsed = time.monotonic() - t_start
        timeouts = netstat_counter(ns_a, "TCPTimeouts") - timeouts0
        request(b"QUIT", 0)
        sniffer.stop = True
        csock.close()

        delays = [t["delay_us"] for t in trials if "delay_us" in t]
        ratios = [t["ratio"] for t in trials if t.get("ratio") is not None]
        rtos = [t["rto_us"] for t in trials]
        jiffy_us = 1_000_000 / a.hz
        out.update({
            "trials": trials,
            "elapsed_s": elapsed,
            "tcp_timeouts": timeouts,
            "measured": len(delays),
            "delay_us": summarize(delays),
            "rto_us": summarize(rtos),
            "ratio": summarize(ratios),
            "below_jiffy": sum(d < jiffy_us for d in delays),
            "below_rto": sum(1 for t in trials if "delay_us" in t and t["delay_us"] < t["rto_us"]),
            "within_rto_1_5": sum(1 for t in trials if "delay_us" in t
                                  and t["rto_us"] <= t["delay_us"] <= 1.5 * t["rto_us"]),
        })
        return out
    finally:
        sh("ip", "netns", "del", ns_a, check=False)
        sh("ip", "netns", "del", ns_b, check=False)


def measure_acks(a, out, csock, sniffer, ns_b, hold) -> dict:
    """--mode ack: one-way requests a.gap_ms apart; the receiver acks them when its
    delayed ACK timer fires (tcp_delack_us, or the stock 40-200 ms)."""
    def send(head):
        csock.sendall(head + bytes(MSG_LEN - len(head)))

    for _ in range(20):                 # use up the receiver's initial quick ACKs
        send(b"WARM")
        time.sleep(a.gap_ms / 4000)
    time.sleep(a.gap_ms / 1000)
    first_seq = None
    t0 = time.monotonic()
    with sniffer.lock:
        n0 = len(sniffer.segments)
    for i in range(a.trials):
        send(b"DATA")
        time.sleep(a.gap_ms / 1000)
    with sniffer.lock:
        new = [s for s in sniffer.segments[n0:] if s[1] == ADDR_A and s[4] > 0]
    if new:
        first_seq = new[0][2]
    delays = ack_delays(sniffer, ADDR_A, first_seq) if first_seq is not None else []
    hold.set()
    csock.sendall(b"QUIT" + bytes(MSG_LEN - 4))
    recv_exact(csock, 1)
    out["receiver_tcp_info"] = dict(RECEIVER_INFO)
    sniffer.stop = True
    csock.close()
    with sniffer.lock:
        out["segments"] = sniffer.segments[n0:]
    out.update({"mode": "ack", "elapsed_s": time.monotonic() - t0,
                "ack_delay_us": summarize(delays), "ack_delays": delays,
                "delayed_acks": netstat_counter(ns_b, "DelayedACKs")})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=3, help="requests before each trial")
    ap.add_argument("--rto-min-us", type=int, default=200)
    ap.add_argument("--hrtimer", type=int, choices=(0, 1), default=None,
                    help="net.ipv4.tcp_rto_hrtimer (default: leave as is)")
    ap.add_argument("--random-pct", type=int, default=None, help="net.ipv4.tcp_rto_random_pct")
    ap.add_argument("--delack-us", type=int, default=None, help="net.ipv4.tcp_delack_us")
    ap.add_argument("--mode", choices=("rto", "ack"), default="rto",
                    help="rto: retransmission timeouts (default); ack: the receiver's "
                         "delayed ACK timeout")
    ap.add_argument("--gap-ms", type=float, default=100, help="--mode ack: time between requests")
    ap.add_argument("--hz", type=int, default=250, help="kernel HZ, for the below-one-jiffy count")
    ap.add_argument("--label", default="")
    ap.add_argument("--json", help="write the full result here")
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("rto_bench: run as root")
    r = bench(a)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)
    if a.mode == "ack":
        d = r["ack_delay_us"]
        print(f"{a.label or r['kernel']}: tcp_delack_us={a.delack_us} unsupported {r['unsupported']}")
        print("  ack delay us: " + " ".join(f"{k}={v:.0f}" if isinstance(v, float) else f"{k}={v}"
                                          for k, v in d.items())
              + f", receiver DelayedACKs {r['delayed_acks']}")
        return
    d, q = r["delay_us"], r["ratio"]
    fmt = lambda s: " ".join(f"{k}={v:.0f}" if isinstance(v, float) else f"{k}={v}" for k, v in s.items())
    print(f"{a.label or r['kernel']}: sysctls {r['sysctls']} unsupported {r['unsupported']}")
    print(f"  measured {r['measured']}/{a.trials} trials in {r['elapsed_s']:.1f} s, "
          f"TCPTimeouts +{r['tcp_timeouts']}")
    print(f"  tcpi_rto us : {fmt(r['rto_us'])}")
    print(f"  delay us    : {fmt(d)}")
    if q:
        print(f"  delay/rto   : " + " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                           for k, v in q.items()))
    print(f"  below one jiffy: {r['below_jiffy']}, below tcpi_rto: {r['below_rto']}, "
          f"within [rto, 1.5 rto]: {r['within_rto_1_5']}")


if __name__ == "__main__":
    main()
