"""The qdiscs the testbed makes over netlink (machine.netdev, hostconfig.nic_by_netlink)
are the ones its tc lines describe: the same parameters as tc reads them back."""
import json
import subprocess
import uuid
from types import SimpleNamespace

import pytest

from conftest import needs_root
from incast.machine import netdev
from incast.machine.probe import probe
from incast.network import hostconfig
from incast.scenario import build

pytestmark = [needs_root, pytest.mark.network]


@pytest.fixture
def veth_pair():
    """Both ends of a veth in a namespace of their own: 'a' gets tc's qdiscs, 'b' ours."""
    ns = f"netdevtest-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "name", "a", "type", "veth", "peer", "name", "b"],
                       check=True)
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def in_namespace(ns: str, fn):
    """fn(ipr, ifindex of b) from inside ns, by the build's own walker (InEachNamespace)."""
    from pyroute2 import IPRoute

    def on_b(_):
        with IPRoute() as ipr:
            fn(ipr, ipr.link_lookup(ifname="b")[0])
    host = SimpleNamespace(name="b", netns_path=f"/run/netns/{ns}")
    error, _ = hostconfig.InEachNamespace([host], on_b, (Exception,)).join()["b"]
    if error is not None:
        raise netdev.NetdevError(error)


def shown(ns: str, dev: str) -> list[dict]:
    out = subprocess.run(["tc", "-n", ns, "-j", "-d", "qdisc", "show", "dev", dev],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


# 8 bit/s is a paused NIC (its bucket's time overflows tc's 32-bit ticks); 40 Gbit/s
# passes 2^32 bytes per second (TCA_TBF_RATE64).
@pytest.mark.parametrize("rate,burst,limit", [(8, 1514, 153000), (10_000_000, 1514, 20000),
                                              (1_000_000_000, 3028, 153000),
                                              (10_000_000_000, 9000, 200000),
                                              (40_000_000_000, 9000, 200000)])
def test_token_bucket_over_netlink_is_tcs(veth_pair, rate, burst, limit):
    ns = veth_pair
    subprocess.run(["tc", "-n", ns, "qdisc", "replace", "dev", "a", "root", "handle", "1:", "tbf", "rate",
                    f"{rate}bit", "burst", str(burst), "limit", str(limit), "overhead", "24"], check=True)
    in_namespace(ns, lambda ipr, b: netdev.tbf_replace(ipr, b, handle="1:", rate_bps=rate, burst=burst,
                                                       limit=limit, overhead=24))
    theirs, ours = shown(ns, "a"), shown(ns, "b")
    assert ours[0]["kind"] == "tbf" and ours[0]["options"]["overhead"] == 24
    assert ours == theirs


@pytest.mark.parametrize("rate", ["100Mbit", "1Gbit"])
def test_host_nic_over_netlink_is_the_tc_lines(veth_pair, rate):
    """The whole NIC (and its plug for PAUSE, where the kernel has one) as the build
    makes it, against nic_tc_commands' lines run by tc."""
    ns, features = veth_pair, probe()
    scenario = build({}, {"link_rate": rate, "switch": "bmv2", "pause": "on"})
    for line in hostconfig.nic_tc_commands("a", scenario, features):
        subprocess.run(["tc", "-n", ns, *line.split()[1:]], check=True)
    in_namespace(ns, lambda ipr, b: hostconfig.nic_by_netlink(ipr, b, scenario, features))
    theirs, ours = shown(ns, "a"), shown(ns, "b")
    assert [q["kind"] for q in ours] == [q["kind"] for q in theirs]
    assert ours == theirs


def test_a_refused_qdisc_names_what_was_asked(veth_pair):
    with pytest.raises(netdev.NetdevError, match="tbf on ifindex .* limit 0"):
        in_namespace(veth_pair, lambda ipr, b: netdev.tbf_replace(ipr, b, handle="1:", rate_bps=1_000_000,
                                                                  burst=0, limit=0, overhead=24))
