"""Topologies beyond one switch, and background traffic measured beside the incast."""
from __future__ import annotations

import pandas as pd
import pytest

from conftest import needs_root, run_json
from incast import topology
from incast.scenario import ScenarioError, build


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


def test_scenario_knows_the_topologys_hosts():
    s = build({"topology": {"kind": "two_switch", "senders": 4, "others": 2}})
    assert s.topology.hosts() == ["client", "server1", "server2", "server3", "server4",
                                  "near1", "near2", "far1", "far2"]


@pytest.mark.parametrize("data, message", [
    ({"background": [{"src": "far1", "dst": "client"}]}, "no host 'far1'"),
    ({"topology": {"others": 1}, "background": [{"src": "near1", "dst": "near1"}]}, "the same host"),
    ({"topology": {"far": 1}}, "for kind two_switch"),
    ({"topology": {"kind": "two_switch", "senders": 2, "far": 3}}, "more than the 2 servers"),
    ({"dataplane": "bmv2", "switch": {"pause": {"enabled": True, "pfc": True}}}, "obeys none at its ports"),
])
def test_bad_topologies_and_flows_are_refused(data, message):
    with pytest.raises(ScenarioError, match=message):
        build(data)


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


def test_bmv2_forwards_to_hosts_behind_other_switches():
    from incast.dataplane import Port
    from incast.dataplane.bmv2 import first_hop_ports
    ports = [Port("s1", "s1-eth1", 1, "client", 11), Port("s1", "s1-eth2", 2, "server1", 12),
             Port("s1", "s1-eth3", 3, "s2", 13, trunk=True),
             Port("s2", "s2-eth1", 1, "server2", 21), Port("s2", "s2-eth2", 2, "s1", 22, trunk=True),
             Port("s2", "s2-eth3", 3, "s3", 23, trunk=True),
             Port("s3", "s3-eth1", 1, "server3", 31), Port("s3", "s3-eth2", 2, "s2", 32, trunk=True)]
    assert first_hop_ports(ports, "s1") == {"client": 1, "server1": 2, "server2": 3, "server3": 3}
    assert first_hop_ports(ports, "s2") == {"client": 2, "server1": 2, "server2": 1, "server3": 3}
    assert first_hop_ports(ports, "s3") == {"client": 2, "server1": 2, "server2": 2, "server3": 1}
