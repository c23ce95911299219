"""Topologies beyond one switch, and background traffic measured beside the incast."""
from __future__ import annotations

import pandas as pd
import pytest

from conftest import needs_root, run_json
from incast import topology
from incast.errors import ScenarioError
from incast.scenario import build


def test_two_switch_is_a_plain_mininet_topo():
    t = topology.load("two_switch", 6, far=2, others=1)
    hosts, switches = set(t.hosts()), set(t.switches())
    assert switches == {"s1", "s2"}
    assert hosts == {"client", *(f"server{i}" for i in range(1, 7)), "near1", "far1"}
    links = {frozenset(link) for link in t.links()}
    assert frozenset({"s1", "s2"}) in links                      # one trunk
    assert frozenset({"server5", "s2"}) in links and frozenset({"server4", "s1"}) in links
    assert frozenset({"far1", "s2"}) in links and frozenset({"near1", "s1"}) in links
    assert t.client == "client" and len(t.servers) == 6


def test_fan_in_spreads_servers_over_edges_within_a_bridges_ports():
    t = topology.load("fan_in", 2048, edges=3)
    assert set(t.switches()) == {"s1", "s2", "s3", "s4"} and len(t.servers) == 2048
    ports = {sw: sum(1 for link in t.links() if sw in link) for sw in t.switches()}
    assert ports == {"s1": 4, "s2": 684, "s3": 684, "s4": 683}   # servers and a trunk
    assert next(iter(t.links())) == ("client", "s1")             # s1's port 1: the bottleneck
    s = build({"topology": {"kind": "fan_in", "senders": 2048, "trunk_rate": "1000Gbit"}})
    assert s.topology.params()["edges"] == 3 and s.topology.most_hosts_on_a_switch() == 684


def test_scenario_knows_the_topologys_hosts():
    s = build({"topology": {"kind": "two_switch", "senders": 4, "others": 2}})
    assert s.topology.hosts() == ["client", "server1", "server2", "server3", "server4",
                                  "near1", "near2", "far1", "far2"]


@pytest.mark.parametrize("data, message", [
    ({"background": [{"src": "far1", "dst": "client"}]}, "no host 'far1'"),
    ({"topology": {"others": 1}, "background": [{"src": "near1", "dst": "near1"}]}, "the same host"),
    ({"topology": {"far": 1}}, "for kinds two_switch and leaf_spine"),
    ({"topology": {"trunk_rate": "10Gbit"}}, "for kinds two_switch, leaf_spine, fan_in"),
    ({"topology": {"senders": 2048}}, "2049 ports on one switch.*at most 1023"),
    ({"topology": {"kind": "fan_in", "senders": 2048, "edges": 2}}, "1025 ports on one switch"),
    ({"topology": {"kind": "fan_in", "senders": 2, "edges": 3}}, "more than the 2 servers"),
    ({"topology": {"edges": 2, "senders": 4}}, "for kind fan_in"),
    ({"topology": {"trunk_buffer": "1MiB"}}, "trunk_buffer is for kinds"),
    ({"dataplane": "bmv2", "topology": {"kind": "fan_in", "senders": 4, "trunk_buffer": "1MiB"}},
     "trunk_buffer: for dataplane linux"),
    ({"topology": {"kind": "two_switch", "spines": 2}}, "for kind leaf_spine"),
    ({"topology": {"kind": "two_switch", "senders": 2, "far": 3}}, "more than the 2 servers"),
])
def test_bad_topologies_and_flows_are_refused(data, message):
    with pytest.raises(ScenarioError, match=message):
        build(data)


@needs_root
@pytest.mark.network
@pytest.mark.parametrize("mtu", [1040, 9000])
def test_link_mtu_is_every_interfaces_and_sets_the_hosts_segments(mtu, tmp_path, no_leftovers):
    """link.mtu is the MTU of both ends of every link: each host's TCP takes its segment
    size from it (MTU less 40 bytes of headers and 12 of timestamps), and the switch's
    ports carry frames of that size (9000: jumbo frames cross the bridge)."""
    s = run_json("--senders", "2", "--link-rate", "100Mbit", "--sru", "64KiB", "--blocks", "3",
                 "--warmup", "1", "--set", f"link.mtu={mtu}", "--out", tmp_path / "r")
    flows = pd.read_parquet(tmp_path / "r" / "flows.parquet")
    assert set(flows["pmtu"]) == {mtu} and set(flows["snd_mss"]) == {mtu - 52}, flows[["pmtu", "snd_mss"]]
    assert s["goodput_mbps"] > 0 and s["timeouts"] == 0


def test_a_frame_longer_than_the_rtl_model_takes_is_refused_by_name():
    from incast.dataplane import rtl
    why = rtl.RtlDataPlane.host_missing(build({"link": {"mtu": 9000}, "dataplane": "rtl"}))
    assert why and "link.mtu 9000" in why and f"{rtl.MAXLEN} bytes" in why


@needs_root
@pytest.mark.network
def test_two_switches_forward_and_an_innocent_flow_is_measured(tmp_path, no_leftovers):
    """Client and half the servers on s1, the rest on s2; a bulk flow from far1 to near1
    crosses only the trunk; the trunk is slower than the other links (50 of 100 Mbit/s)."""
    s = run_json("scenarios/two-switch-innocent.toml", "--blocks", "10",
                 "--set", "topology.trunk_rate=50Mbit", "--out", tmp_path / "r")
    blocks = pd.read_parquet(tmp_path / "r" / "blocks.parquet")
    assert len(blocks) == 10 and s["goodput_mbps"] > 0
    bg = pd.read_parquet(tmp_path / "r" / "background.parquet")
    assert list(bg[["src", "dst"]].iloc[0]) == ["far1", "near1"]
    assert 1 < bg["goodput_mbps"].iloc[0] < 50, bg      # it got through, and the trunk bounds it
    assert s["background_mbps"] == [round(float(bg["goodput_mbps"].iloc[0]), 3)]
    q = pd.read_parquet(tmp_path / "r" / "queues.parquet")
    assert {("s1", "s2"), ("s2", "s1")} <= set(zip(q["switch"], q["peer"]))
    tc = (tmp_path / "r" / "switch.tc").read_text().splitlines()
    trunk = [ln for ln in tc if "classid 1:1 " in ln and ("dev s1-eth7 " in ln or "dev s2-eth6 " in ln)]
    assert len(trunk) == 2 and all(" rate 50000000bit " in ln for ln in trunk), trunk


def test_forwarding_reaches_hosts_behind_other_switches():
    from incast.dataplane import Port
    from incast.dataplane.forwarding import flood_ports, next_hops
    ports = [Port("s1", "s1-eth1", 1, "client", 11), Port("s1", "s1-eth2", 2, "server1", 12),
             Port("s1", "s1-eth3", 3, "s2", 13, trunk=True),
             Port("s2", "s2-eth1", 1, "server2", 21), Port("s2", "s2-eth2", 2, "s1", 22, trunk=True),
             Port("s2", "s2-eth3", 3, "s3", 23, trunk=True),
             Port("s3", "s3-eth1", 1, "server3", 31), Port("s3", "s3-eth2", 2, "s2", 32, trunk=True)]
    hops = next_hops(ports, ["client", "server1", "server2", "server3"])
    assert hops["s1"] == {"client": 1, "server1": 2, "server2": 3, "server3": 3}
    assert hops["s2"] == {"client": 2, "server1": 2, "server2": 1, "server3": 3}
    assert hops["s3"] == {"client": 2, "server1": 2, "server2": 2, "server3": 1}
    assert flood_ports(ports) == {"s1": {1, 2, 3}, "s2": {1, 2, 3}, "s3": {1, 2}}   # a tree: every trunk


def _ports_of(topo) -> list:
    """The Port list a started network would give, from the Topo alone (Mininet numbers
    a node's ports in the order its links were added)."""
    from incast.dataplane import Port
    switches, number, ports = set(topo.switches()), {}, []
    for a, b in topo.links(sort=False):
        for node, peer in ((a, b), (b, a)):
            if node in switches:
                number[node] = number.get(node, 0) + 1
                ports.append(Port(node, f"{node}-eth{number[node]}", number[node], peer, 0, trunk=peer in switches))
    return ports


def test_leaf_spine_is_a_plain_mininet_topo():
    t = topology.load("leaf_spine", 4, others=1, spines=2)
    assert set(t.switches()) == {"s1", "s2", "s3", "s4"}
    links = {frozenset(link) for link in t.links()}
    assert {frozenset({leaf, spine}) for leaf in ("s1", "s2") for spine in ("s3", "s4")} <= links
    assert frozenset({"s1", "s2"}) not in links                 # leaves meet only through spines
    assert frozenset({"server3", "s2"}) in links and frozenset({"server2", "s1"}) in links
    assert len(set(topology.load("leaf_spine", 4, spines=1).switches())) == 3


def test_two_spines_split_destinations_and_floods_follow_one_tree():
    t = topology.load("leaf_spine", 4, others=1, spines=2)
    from incast.dataplane.forwarding import flood_ports, next_hops
    ports = _ports_of(t)
    hops = next_hops(ports, t.hosts(sort=False))
    port = {(p.switch, p.number): p for p in ports}
    spine_of = {h: port["s2", n].peer for h, n in hops["s2"].items() if port["s2", n].trunk}
    # Toward leaf s1's hosts, s2 alternates spines by host: both spines carry traffic.
    assert spine_of["client"] != spine_of["server1"] and set(spine_of.values()) == {"s3", "s4"}
    for spine in ("s3", "s4"):     # a spine sends each host down to its own leaf
        assert {port[spine, n].peer for h, n in hops[spine].items() if h in ("client", "near1")} == {"s1"}
    # Floods: one spanning tree (3 trunks of 4); every host port floods.
    flood = flood_ports(ports)
    assert sum(port[sw, n].trunk for sw, ns in flood.items() for n in ns) == 2 * 3
    assert all(p.number in flood[p.switch] for p in ports if not p.trunk)


def test_kernel_bridges_get_static_paths_and_no_loop():
    from incast.dataplane.linux import forwarding_commands
    t = topology.load("leaf_spine", 2, spines=2)
    ports = _ports_of(t)
    macs = {h: f"02:00:00:00:00:{i:02x}" for i, h in enumerate(t.hosts(sort=False))}
    lines = forwarding_commands(ports, macs)
    off_tree = [ln for ln in lines if "bcast_flood off" in ln]
    assert len(off_tree) == 2           # one leaf-spine link (two ends) carries no floods
    assert sum("bcast_flood on" in ln for ln in lines) == 6
    trunk_names = {p.name for p in ports if p.trunk}
    assert sum(ln.split()[3] in trunk_names for ln in lines if ln.startswith("link set")) == len(trunk_names) == 8
    fdb = [ln for ln in lines if ln.startswith("fdb replace")]
    assert len(fdb) == 4 * len(macs)    # every host on every switch


def test_a_bridge_floods_on_no_trunk_before_its_ports_come_up():
    """Between a bridge's start and its forwarding table, a loop of switches (two
    spines) would circulate a multicast frame for ever (in virtual time, with no clock
    running: a run that never ends)."""
    from incast.dataplane.linux import bridge_start_commands
    lines = bridge_start_commands("s1", ["s1-eth1", "s1-eth2", "s1-eth3"], ["s1-eth2", "s1-eth3"])
    assert sum("learning off" in ln for ln in lines) == 2     # trunks learn nothing, from the start
    first_up = next(i for i, ln in enumerate(lines) if ln.endswith(" up"))
    closed = {ln.split()[3]: i for i, ln in enumerate(lines) if "bcast_flood off" in ln and "flood off" in ln}
    assert set(closed) == {"s1-eth2", "s1-eth3"} and max(closed.values()) < first_up, lines


@needs_root
@pytest.mark.network
def test_leaf_spine_forwards_over_both_spines(tmp_path, no_leftovers):
    """Two spines close a loop between the leaves: floods take one tree, and each
    destination host its own spine (the client's traffic s3, near1's s4)."""
    s = run_json("scenarios/leaf-spine.toml", "--blocks", "10", "--out", tmp_path / "r")
    assert len(pd.read_parquet(tmp_path / "r" / "blocks.parquet")) == 10 and s["goodput_mbps"] > 0
    bg = pd.read_parquet(tmp_path / "r" / "background.parquet")
    q = pd.read_parquet(tmp_path / "r" / "queues.parquet").groupby(["switch", "peer"])["sent_bytes"].sum()
    far_data = 4 * 10 * 32 * 1024                   # server5-8's answers, at least
    assert q["s3", "s1"] >= far_data and q["s4", "s1"] >= bg["bytes"].iloc[0], q
    # The innocent flow stays off s3 (its bytes would double s3's).
    assert q["s3", "s1"] < far_data + bg["bytes"].iloc[0] / 2, q
    assert bg["goodput_mbps"].iloc[0] > 1, bg
