"""Per-host TCP profiles: each host's namespace gets its own profile, read back from
the namespace itself after the run's hosts are configured (tcp_hosts.json)."""
from __future__ import annotations

import json

import pytest

from conftest import needs_root, run_json

pytestmark = [needs_root, pytest.mark.network]


def test_each_host_runs_its_own_profile(tmp_path, no_leftovers):
    s = run_json("--senders", "3", "--link-rate", "100Mbit", "--sru", "16KiB", "--blocks", "3",
                 "--warmup", "1", "--rto-min", "10ms",
                 "--set", "tcp.profiles.stock_client.rto_min=200ms",
                 "--set", "tcp.profiles.stock_client.delayed_ack=off",
                 "--set", "tcp.profiles.fast.rto_min=2ms", "--set", "tcp.profiles.fast.cc=cubic",
                 "--set", "tcp.hosts.client=stock_client", "--set", "tcp.hosts.server2=fast",
                 "--out", tmp_path / "r")
    applied = json.loads((tmp_path / "r" / "tcp_hosts.json").read_text())
    assert sorted(applied) == ["client", "server1", "server2", "server3"]
    rto = {h: int(a["sysctls"]["net.ipv4.tcp_rto_min_us"]) for h, a in applied.items()}
    assert rto == {"client": 200_000, "server1": 10_000, "server2": 2_000, "server3": 10_000}
    cc = {h: a["sysctls"]["net.ipv4.tcp_congestion_control"] for h, a in applied.items()}
    assert cc == {"client": "reno", "server1": "reno", "server2": "cubic", "server3": "reno"}
    # delayed ACK off is a per-route option: only the client's route carries it.
    assert [h for h, a in applied.items() if "quickack 1" in a["route"]] == ["client"]
    assert {h: a["profile"] for h, a in applied.items()} == {
        "client": "stock_client", "server1": "tcp", "server2": "fast", "server3": "tcp"}
    # Addresses are resolved before the run: the client knows every server, a server the client.
    assert {h: a["static_neighbours"] for h, a in applied.items()} == {
        "client": 3, "server1": 1, "server2": 1, "server3": 1}
    # The summary's headline is the servers' role; it names the assignments.
    assert s["rto_min_us"] == 10_000 and s["cc"] == "reno"
    assert s["tcp_hosts"] == {"client": "stock_client", "server2": "fast"}


class _Host:
    def __init__(self, name, ip, mac):
        self.name, self._ip, self._mac = name, ip, mac

    def IP(self):
        return self._ip

    def MAC(self):
        return self._mac


def test_static_neighbours_cover_every_measured_path():
    from incast.network.hostconfig import static_neighbours
    client, near = _Host("client", "10.0.0.1", "aa:00:00:00:00:01"), _Host("near1", "10.0.0.9", "aa:00:00:00:00:09")
    servers = [_Host(f"server{i}", f"10.0.0.{i + 1}", f"aa:00:00:00:00:0{i + 1}") for i in (1, 2)]
    n = static_neighbours([client, *servers, near], servers)
    # A server talks to the client and to hosts that are not servers, never to another server.
    assert n["server1"] == [("10.0.0.1", "aa:00:00:00:00:01"), ("10.0.0.9", "aa:00:00:00:00:09")]
    # Any other host knows every host but itself.
    assert [ip for ip, _ in n["client"]] == ["10.0.0.2", "10.0.0.3", "10.0.0.9"]
    assert [ip for ip, _ in n["near1"]] == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
