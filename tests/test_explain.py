"""incast explain: timeouts found in the servers' packet capture and classified as
FAST'08 Table 3 does. Synthetic traces with known answers first (through a real pcap
written by Scapy), then a real collapsing run checked against the kernel's counts."""
from __future__ import annotations

import pytest
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether
from scapy.utils import wrpcap

from conftest import incast_cmd, needs_root, run_json
from incast.report import explain

SERVER, CLIENT = "10.0.0.2", "10.0.0.1"
MS = 1_000_000
FLOOR = 200 * MS          # ns
ISN = 999                 # data starts at 1000


class Trace:
    """A server's view of one connection, built packet by packet (times in ms)."""

    def __init__(self):
        self.frames = []
        self.add(0, SERVER, flags="SA", seq=ISN)

    def add(self, t_ms, src, flags="A", seq=0, ack=0, payload=0):
        dst = CLIENT if src == SERVER else SERVER
        sport, dport = (5001, 40000) if src == SERVER else (40000, 5001)
        f = Ether() / IP(src=src, dst=dst) / TCP(sport=sport, dport=dport, flags=flags, seq=seq, ack=ack)
        if payload:
            f = f / (b"x" * payload)
        f.time = t_ms / 1000
        self.frames.append(f)
        return self

    def data(self, t_ms, rel, n=1000):
        return self.add(t_ms, SERVER, flags="PA", seq=ISN + 1 + rel, payload=n)

    def ack(self, t_ms, rel):
        return self.add(t_ms, CLIENT, ack=ISN + 1 + rel)

    def request(self, t_ms):
        return self.add(t_ms, CLIENT, flags="PA", ack=ISN + 1, payload=8)

    def timeouts(self, tmp_path):
        path = tmp_path / "server.pcap"
        wrpcap(str(path), self.frames)
        return explain.find_timeouts(explain.read_pcap(path), SERVER, FLOOR, dupthresh=3)


def test_a_whole_window_lost_is_a_full_window_loss(tmp_path):
    t = Trace().request(1)
    for i in range(4):
        t.data(1.1, i * 1000)
    t.data(201.2, 0)                                 # nothing came back: the RTO
    [to] = t.timeouts(tmp_path)
    assert (to["cause"], to["dart"], to["seq"]) == ("full_window", 0, 0)
    assert to["wait_us"] == pytest.approx(200_100)


def test_the_fragments_last_segment_lost_is_a_last_packet_loss(tmp_path):
    t = Trace().request(1)
    for i in range(4):
        t.data(1.1, i * 1000)
    t.ack(2, 3000)                                   # three arrived, the fourth did not
    t.data(202.5, 3000)
    [to] = t.timeouts(tmp_path)
    assert (to["cause"], to["seq"]) == ("last_packet", 3000)


def test_a_retransmission_lost_again_is_a_lost_retransmit(tmp_path):
    t = Trace().request(1)
    for i in range(6):
        t.data(1.1, i * 1000)
    for k in range(5):
        t.ack(2 + 0.1 * k, 0)                        # the first was lost: five duplicate ACKs
    t.data(2.5, 0)                                   # fast retransmit, lost as well
    t.data(203, 0)                                   # the RTO
    [to] = t.timeouts(tmp_path)
    assert (to["cause"], to["dart"], to["sends_before"]) == ("lost_retransmit", 5, 2)


def test_too_few_duplicate_acks_and_late_ones_do_not_restart_the_timer(tmp_path):
    t = Trace().request(1)
    for i in range(3):
        t.data(1.1, i * 1000)
    t.ack(150, 0).ack(150.1, 0)                      # two duplicate ACKs, late
    t.data(201.5, 0)                                 # the RTO, counted from the send
    [to] = t.timeouts(tmp_path)
    assert (to["cause"], to["dart"]) == ("little_feedback", 2)


def test_a_quick_retransmission_is_not_a_timeout(tmp_path):
    t = Trace().request(1)
    for i in range(4):
        t.data(1.1, i * 1000)
    t.ack(2, 0).ack(2.1, 0).ack(2.2, 0)
    t.data(2.3, 0)                                   # fast retransmit
    t.ack(3, 4000)
    assert t.timeouts(tmp_path) == []


def test_a_fast_retransmit_after_a_long_wait_is_not_a_timeout(tmp_path):
    """With a microsecond floor a flow's timer can run past it before the third
    duplicate ACK comes; the retransmission that answers that ACK (seen 50 us later,
    after the host's egress delay) is a fast retransmit, not a timeout. One that leaves
    long after the last duplicate ACK is still a timeout."""
    floor, reaction = 200_000, (50 + explain.REACTION_US) * 1000      # ns
    t = Trace().request(0.0)
    for i in range(5):
        t.data(0.1, i * 1000)
    t.ack(0.2, 0).ack(0.3, 0).ack(0.6, 0)            # the first lost; the third dup ACK late
    t.data(0.65, 0)                                  # fast retransmit, 50 us after it
    t.ack(0.8, 5000)
    for i in range(5, 9):
        t.data(0.85, i * 1000)
    t.ack(0.9, 5000).ack(0.95, 5000).ack(1.0, 5000)  # the sixth lost, three dup ACKs
    t.data(2.0, 5000)                                # an RTO a millisecond after the last
    path = tmp_path / "server.pcap"
    wrpcap(str(path), t.frames)
    found = explain.find_timeouts(explain.read_pcap(path), SERVER, floor, dupthresh=3, reaction_ns=reaction)
    assert [(to["seq"], to["cause"]) for to in found] == [(5000, "other")]
    # Without the rule the fast retransmit (550 us after the send, past the floor) counts too.
    both = explain.find_timeouts(explain.read_pcap(path), SERVER, floor, dupthresh=3, reaction_ns=0)
    assert [to["seq"] for to in both] == [0, 5000]


def test_a_retransmission_deferred_in_the_host_queue_lowers_what_the_trace_must_show():
    """The kernel counts an RTO each time the timer fires; where the retransmission
    waited because the original was still in the host's queue, the timer fires again
    and counts it twice, while the wire shows one timeout."""
    import pandas as pd
    e = explain.Explanation(pd.DataFrame(), pd.DataFrame(), kernel_timeouts=25, kernel_probes=0,
                            capture_dropped=0, floor_us=200_000, kernel_deferred=0)
    assert not e.consistent(24) and e.consistent(25) and not e.consistent(26)
    e.kernel_deferred = 1
    assert e.consistent(24) and not e.consistent(23)


def test_explain_refuses_a_run_without_capture(tmp_path):
    (tmp_path / "summary.json").write_text("{}")
    r = incast_cmd("explain", str(tmp_path))
    assert r.returncode == 2 and "--capture" in r.stderr


@needs_root
@pytest.mark.network
def test_a_collapsing_run_has_every_timeout_explained(tmp_path, no_leftovers):
    """16 servers, 32 KiB SRUs through a 32 KiB buffer at 100 Mbit/s, 20 ms RTOmin
    (measured in two faithful 20-block runs: 31 and 45 timeouts found where the kernel
    counted 27 and 41 timeouts plus 206 and 211 loss probes; 25 and 37 full window
    losses). The trace's count must lie within the kernel's: at least its timeouts (less
    the retransmissions it deferred in the host queue), at most timeouts plus loss probes
    (a probe sent in the RTO's place)."""
    s = run_json("--senders", "16", "--link-rate", "100Mbit", "--sru", "32KiB", "--blocks", "10",
                 "--rto-min", "20ms", "--capture", "--out", tmp_path / "r")
    assert s["capture_dropped"] == 0
    r = incast_cmd("explain", str(tmp_path / "r"), "--json")
    assert r.returncode == 0, r.stderr
    import json
    t = json.loads(r.stdout)
    assert t["kernel_timeouts"] > 0, "the scenario is meant to time out"
    assert t["consistent_with_kernel"], t
    assert sum(t[c] for c in explain.CAUSES) == t["timeouts"]
    assert t["full_window"] > 0
    assert t["blocks_decided_by_a_timeout"] > 0
    assert (tmp_path / "r" / "timeouts.parquet").is_file() and (tmp_path / "r" / "explain.png").is_file()
