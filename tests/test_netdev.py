"""What the testbed makes over netlink (machine.netdev, hostconfig.nic_by_netlink and
host_requests) is what its ip and tc lines make: the same qdiscs, addresses, routes and
neighbours as ip and tc read them back. netem's comparison runs in a UML guest (this
machine's kernel may lack netem): `python tests/test_netdev.py netem OUT.json` there."""
import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path
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


def in_namespace(ns: str, fn, dev: str = "b"):
    """fn(rtnl, ifindex of dev) from inside ns, by the build's own walker
    (InEachNamespace), rtnl a netdev.HostRtnl committed after it."""
    def on_b(_):
        with netdev.HostRtnl() as rtnl:
            fn(rtnl, socket.if_nametoindex(dev))
            rtnl.commit()
    host = SimpleNamespace(name=dev, netns_path=f"/run/netns/{ns}")
    error, _ = hostconfig.InEachNamespace([host], on_b, (Exception,)).join()[dev]
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
    in_namespace(ns, lambda rtnl, b: rtnl.tbf(b, handle="1:", rate_bps=rate, burst=burst, limit=limit,
                                              overhead=24))
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
    in_namespace(ns, lambda rtnl, b: hostconfig.nic_by_netlink(rtnl, b, "b", scenario, features))
    theirs, ours = shown(ns, "a"), shown(ns, "b")
    assert [q["kind"] for q in ours] == [q["kind"] for q in theirs]
    assert ours == theirs


def test_a_refused_qdisc_names_what_was_asked(veth_pair):
    with pytest.raises(netdev.NetdevError, match="tbf on ifindex .* limit 0"):
        in_namespace(veth_pair, lambda rtnl, b: rtnl.tbf(b, handle="1:", rate_bps=1_000_000, burst=0, limit=0,
                                                         overhead=24))


# --- a host's links, address, route and neighbours -----------------------------------
HOST_IP, ROUTE = "10.0.0.2", {"quickack": 1, "initcwnd": 3, "initrwnd": 4, "rto_min": 5}
NEIGHBOURS = [(f"10.0.0.{i}", f"02:00:00:00:00:{i:02x}") for i in (1, 3, 200)]


@pytest.fixture
def two_hosts():
    """Two namespaces, each with one end of a veth named h0: 'ip' gets ip's lines, 'ours' ours."""
    tag = uuid.uuid4().hex[:8]
    names = {"ip": f"netdevtest-ip-{tag}", "ours": f"netdevtest-ours-{tag}"}
    try:
        for ns in names.values():
            subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(["ip", "link", "add", "h0", "netns", names["ip"], "type", "veth", "peer", "name", "h0",
                        "netns", names["ours"]], check=True)
        yield names
    finally:
        for ns in names.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def ip_json(ns: str, *what: str) -> list[dict]:
    # IPv4 only: IPv6's link-local routes come in their own time (the hosts turn IPv6 off)
    return json.loads(subprocess.run(["ip", "-4", "-n", ns, "-j", "-d", *what], capture_output=True, text=True,
                                     check=True).stdout or "[]")


def ip_text(ns: str, *what: str) -> str:
    """As ip prints it: its JSON leaves out a metric's lock (which TCP's rto_min needs)."""
    return subprocess.run(["ip", "-4", "-n", ns, "-d", *what], capture_output=True, text=True, check=True).stdout


def test_a_hosts_addresses_route_and_neighbours_over_netlink_are_ips(two_hosts):
    from incast.network.hostconfig import host_requests
    lines = ["link set dev lo up", f"address replace {HOST_IP}/8 dev h0", "link set dev h0 up",
             f"route replace 10.0.0.0/8 dev h0 proto kernel scope link src {HOST_IP} "
             + " ".join(f"{k} {v}ms" if k == "rto_min" else f"{k} {v}" for k, v in ROUTE.items()),
             *(f"neigh replace {a} lladdr {m} dev h0 nud permanent" for a, m in NEIGHBOURS)]
    subprocess.run(["ip", "-n", two_hosts["ip"], "-batch", "-"], input="\n".join(lines) + "\n", text=True,
                   check=True)
    intf = SimpleNamespace(name="h0", IP=lambda: HOST_IP, prefixLen="8")
    host = SimpleNamespace(intfList=lambda: [intf], defaultIntf=lambda: intf, IP=lambda: HOST_IP)
    got = {}

    def ours(rtnl, index):
        host_requests(rtnl, host, SimpleNamespace(route_metrics=ROUTE), NEIGHBOURS)
        rtnl.commit()
        got["routes"], got["statics"] = rtnl.link_routes(index, "h0"), rtnl.permanent_neighbours(index)
    in_namespace(two_hosts["ours"], ours, dev="h0")
    ip_ns, our_ns = two_hosts["ip"], two_hosts["ours"]
    assert ip_json(our_ns, "route", "show", "table", "all") == ip_json(ip_ns, "route", "show", "table", "all")
    assert ip_text(our_ns, "route", "show", "table", "all") == ip_text(ip_ns, "route", "show", "table", "all")
    assert sorted(ip_json(our_ns, "neigh", "show"), key=lambda n: n["dst"]) == \
        sorted(ip_json(ip_ns, "neigh", "show"), key=lambda n: n["dst"])      # a hash table's order
    mine, theirs = (ip_json(ns, "address", "show") for ns in (our_ns, ip_ns))
    assert [(a["ifname"], a["operstate"], a["addr_info"]) for a in mine] == \
        [(a["ifname"], a["operstate"], a["addr_info"]) for a in theirs]
    # What a run reports of it (tcp_hosts.json) is what ip prints.
    printed = subprocess.run(["ip", "-n", ip_ns, "route", "show", "10.0.0.0/8"], capture_output=True,
                             text=True, check=True).stdout.split()
    assert got["routes"][0].split() == printed and got["statics"] == len(NEIGHBOURS)


def test_a_refused_request_names_it(two_hosts):
    def ours(rtnl, index):
        rtnl.link_route(index, "10.0.0.0", 8, "10.9.9.9", {}, "h0")     # a source it does not have
    with pytest.raises(netdev.NetdevError, match="`route replace 10.0.0.0/8 dev h0 src 10.9.9.9 {}` failed: "):
        in_namespace(two_hosts["ours"], ours, dev="h0")


# --- netem, in a UML guest ---------------------------------------------------------
# Each NIC the hosts get where the link needs netem, as (name, overrides).
NETEM_NICS = [("20 us, 10 Gbit/s", {"link_rate": "10Gbit", "delay": "20us"}),
              ("50 us, 1 Gbit/s, PAUSE", {"link_rate": "1Gbit", "delay": "50us", "pause": "on"}),
              ("jitter and loss", {"link_rate": "1Gbit", "delay": "100us", "link.jitter": "7us",
                                   "link.loss": 0.5})]


def compare_netem_nics(out: Path) -> None:
    """In a kernel with netem: each of NETEM_NICS made by its tc lines on one veth end
    and by nic_by_netlink on the other; both as tc shows them, to out (JSON)."""
    features = probe()
    shown_both = {}
    for name, overrides in NETEM_NICS:
        scenario = build({}, overrides)
        ns = f"netdevtest-{uuid.uuid4().hex[:8]}"
        subprocess.run(["ip", "netns", "add", ns], check=True)
        try:
            subprocess.run(["ip", "-n", ns, "link", "add", "name", "a", "type", "veth", "peer", "name", "b"],
                           check=True)
            for line in hostconfig.nic_tc_commands("a", scenario, features):
                subprocess.run(["tc", "-n", ns, *line.split()[1:]], check=True)
            held = {}

            def ours(rtnl, b):
                hostconfig.nic_by_netlink(rtnl, b, "b", scenario, features)
                held.update(tc=rtnl.netem_ns(socket.if_nametoindex("a")), ours=rtnl.netem_ns(b))
            in_namespace(ns, ours)
            shown_both[name] = {"tc": shown(ns, "a"), "ours": shown(ns, "b"), "netem_ns": held,
                                "asked_ns": [scenario.link.delay * 1000, scenario.link.jitter * 1000]}
        finally:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    out.write_text(json.dumps(shown_both))


def test_a_nic_with_netem_over_netlink_is_the_tc_lines(tmp_path):
    from test_virtual_time import skip_reason

    from incast.vm import uml
    reason = skip_reason("uml-stock")
    if reason:
        pytest.skip(reason)
    repo = Path(__file__).resolve().parents[1]
    uml.run(f"{sys.executable} {Path(__file__).resolve()} netem $RESULTS/netem.json", kernel="uml-stock",
            results_dir=tmp_path / "r", cwd=repo, env={"PYTHONPATH": f"{repo}:{repo / 'tests'}"},
            memory_mb=512, timeout=300, check=True)
    got = json.loads((tmp_path / "r" / "netem.json").read_text())
    assert list(got) == [name for name, _ in NETEM_NICS]
    for name, both in got.items():
        kinds = [q["kind"] for q in both["ours"]]
        assert kinds[:2] == ["tbf", "netem"], name
        assert both["ours"] == both["tc"], name        # as tc shows them: in whole microseconds
        # As the kernel holds them: ours exact, tc's in 64 ns ticks (20 us is 19.968)
        assert both["netem_ns"]["ours"] == both["asked_ns"], name
        assert both["netem_ns"]["tc"] == [t // 64 * 64 for t in both["asked_ns"]], name
    assert [q["kind"] for q in got["50 us, 1 Gbit/s, PAUSE"]["ours"]] == ["tbf", "netem", "plug"]


if __name__ == "__main__" and sys.argv[1:2] == ["netem"]:
    compare_netem_nics(Path(sys.argv[2]))
