"""The papers' claims, reproduced at small scale on the linux data plane.

Each run takes seconds; runs shared by several claims are measured once per session.
Setting: fixed-fragment reads of 256 KiB per server (FAST'08, WREN'09), 32 KiB per-port
buffers, Reno, RTOmin 200 ms unless a claim varies one of them, and links at the
papers' 1 Gbit/s or, where this machine cannot hold that for 16 servers, the highest
rate it can (incast calibrate): every run a claim rests on must be faithful.
"""
import pytest

from conftest import faithful_rate_bps, measurer, needs_root

pytestmark = [needs_root, pytest.mark.network, pytest.mark.scenario]

BASE = {"--buffer": "32KiB", "--sru": "256KiB", "--cc": "reno",
        "--rto-min": "200ms", "--blocks": "30", "--warmup": "2"}


@pytest.fixture(scope="module")
def measure(tmp_path_factory):
    rate = min(10**9, faithful_rate_bps(16))
    m = measurer({**BASE, "--link-rate": f"{rate}bit"}, tmp_path_factory.mktemp("scenarios"))

    def faithful(**kw):
        s = m(**kw)
        assert s["fidelity"]["ok"], f"run {kw} not faithful: {s['fidelity']['reasons']}"
        return s
    return faithful


def onset(measure, senders_range, **kw) -> int:
    """The first number of servers at which goodput falls below half the link."""
    for n in senders_range:
        s = measure(senders=n, **kw)
        if s["goodput_mbps"] < 0.5 * s["link_mbps"]:
            return n
    return max(senders_range) + 1


def test_collapse_with_200ms_rto(measure):
    one, sixteen = measure(senders=1), measure(senders=16)
    assert one["goodput_mbps"] > 0.5 * one["link_mbps"], one     # sanity; scripts/benchmark.py measures it
    assert sixteen["goodput_mbps"] < 0.30 * one["goodput_mbps"], (one, sixteen)
    assert sixteen["timeouts"] > 0 and sixteen["bottleneck_drops"] > 0


def test_recovery_with_lowest_rto_min(measure):
    slow, fast = measure(senders=16), measure(senders=16, rto_min="min")
    assert fast["rto_min_us"] < slow["rto_min_us"]
    assert fast["goodput_mbps"] >= 3 * slow["goodput_mbps"], (slow, fast)


def test_doubling_the_buffer_delays_the_collapse(measure):
    small = onset(measure, range(2, 17), buffer="32KiB")
    large = onset(measure, range(2, 17), buffer="64KiB")
    assert large > small, f"onset {small} servers at 32 KiB, {large} at 64 KiB"


def test_larger_sru_raises_goodput(measure):
    small = measure(senders=16, sru="64KiB")
    large = measure(senders=16, sru="1MiB", blocks=10)
    assert small["timeouts"] > 0
    assert large["goodput_mbps"] > 1.5 * small["goodput_mbps"], (small, large)


def test_qos_partitioning_collapses_earlier(measure):
    one_queue = onset(measure, range(2, 17), buffer="64KiB", qos_queues=1)
    four_queues = onset(measure, range(2, 17), buffer="64KiB", qos_queues=4)
    assert four_queues < one_queue, f"onset {four_queues} servers with 4 queues, {one_queue} with 1"
