"""Per-host TCP profiles: each host's namespace gets its own profile, read back from
the namespace itself after the run's hosts are configured (tcp_hosts.json). The era
(tcp.era = "linux-2.6.28") turns a profile's TCP back to the papers' kernel where
this one can be (docs/tcp-profiles.md)."""
from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import uuid
from types import SimpleNamespace

import pytest

from conftest import incast_cmd, needs_root, run_json

OLD = "linux-2.6.28"


@needs_root
@pytest.mark.network
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


# --- the papers' TCP as a profile (tcp.era) ------------------------------------------

def _features(hrtimer=False):
    """What TcpProfile.resolve asks of the probed kernel (a 6.12 without the hrtimer patches)."""
    return SimpleNamespace(lowest_rto_min_us=1, hrtimer_rto=hrtimer, rto_min_us_sysctl=True,
                           effective_rto_floor=lambda rto_min_us, hrtimer: rto_min_us)


def _profile(mtu=1500, **tcp):
    from incast.network.hostconfig import TcpProfile
    from incast.scenario import TcpSettings
    return TcpProfile.resolve(TcpSettings(**tcp), _features(), mtu)


def test_modern_era_changes_nothing():
    p = _profile()
    assert p.era == "modern" and p.era_sysctls == {} and "initcwnd" not in p.route_metrics


def test_linux_2_6_28_turns_loss_recovery_back():
    p = _profile(era=OLD)
    # No tail loss probe, no RACK (nor the early retransmit it took over): a lost tail
    # waits for the RTO.
    assert p.era_sysctls["net.ipv4.tcp_early_retrans"] == "0"
    assert p.era_sysctls["net.ipv4.tcp_recovery"] == "0"
    # F-RTO stays on (2.6.28 had it on), the receiver ACKs every out-of-order segment.
    assert p.era_sysctls["net.ipv4.tcp_frto"] == "2"
    assert p.era_sysctls["net.ipv4.tcp_comp_sack_nr"] == "0"
    assert p.era_sysctls["net.ipv4.tcp_autocorking"] == "0"
    # RFC 3390's 3 segments at a 1448-byte MSS, and 2.6.28's first receive window.
    assert p.route_metrics == {"initcwnd": 3, "initrwnd": 4}
    # What the era sets is optional (reported where missing), never required.
    assert not set(p.era_sysctls) & set(p.sysctls)


def test_the_era_keeps_the_other_fields():
    p = _profile(era=OLD, delayed_ack=False, rto_min=200, sack=False)
    assert p.sysctls["net.ipv4.tcp_sack"] == "0" and p.sysctls["net.ipv4.tcp_rto_min_us"] == "200"
    assert p.route_metrics["quickack"] == 1


def test_explicit_initcwnd_and_sysctls_win_over_the_era():
    p = _profile(era=OLD, initcwnd=10, sysctls={"tcp_early_retrans": 3})
    assert p.route_metrics["initcwnd"] == 10
    assert p.sysctls["net.ipv4.tcp_early_retrans"] == "3"
    assert "net.ipv4.tcp_early_retrans" not in p.era_sysctls
    assert p.era_sysctls["net.ipv4.tcp_recovery"] == "0"


@pytest.mark.parametrize("mtu,initcwnd,initrwnd", [(1500, 3, 4), (1100, 4, 4), (9000, 2, 2), (576, 4, 4)])
def test_initial_windows_follow_the_mss_as_2_6_28_did(mtu, initcwnd, initrwnd):
    assert _profile(mtu, era=OLD).route_metrics == {"initcwnd": initcwnd, "initrwnd": initrwnd}


def test_tcp_sysctls_cannot_name_what_a_field_sets():
    from incast.network.hostconfig import TcpProfile
    from incast.scenario import SYSCTLS_OWNED, TcpSettings
    written = {**TcpProfile.resolve(TcpSettings(), _features()).sysctls,
               **TcpProfile.resolve(TcpSettings(), _features(hrtimer=True)).sysctls}
    tcp = {k.removeprefix("net.ipv4.") for k in written if k.startswith("net.ipv4.tcp_")}
    assert tcp <= set(SYSCTLS_OWNED)


def test_the_scenario_takes_the_eras_that_are_defined_and_no_other():
    """An era's name and what it sets live in one place (incast.eras); the scenario model
    accepts exactly those names."""
    from incast.eras import ERA_SYSCTLS
    from incast.errors import ScenarioError
    from incast.scenario import build
    for name in ERA_SYSCTLS:
        assert build({}, {"tcp.era": name}).tcp.era == name
    with pytest.raises(ScenarioError, match="linux-2.4"):
        build({}, {"tcp.era": "linux-2.4"})


def test_sysctls_the_kernel_lacks_are_reported_not_fatal():
    from incast.network.hostconfig import read_back
    p = _profile(era=OLD)
    printed = [f"{k} = {v}" for k, v in {**p.sysctls, **p.era_sysctls}.items()
               if k != "net.ipv4.tcp_backlog_ack_defer"]
    back = read_back(printed, ["10.0.0.0/8 dev eth0 proto kernel scope link initcwnd 3"], 1, None, p)
    assert back["static_neighbours"] == 1 and back["route"].endswith("initcwnd 3")
    assert back["era"] == OLD and back["missing_sysctls"] == ["net.ipv4.tcp_backlog_ack_defer"]
    assert back["sysctls"]["net.ipv4.tcp_recovery"] == "0"


def test_era_in_a_named_profile():
    from incast.scenario import build
    s = build({}, {"tcp.profiles.old.era": OLD, "tcp.profiles.old.sysctls.tcp_recovery": "1",
                   "tcp.sysctls.tcp_dsack": "0", "tcp.hosts.servers": "old"})
    servers, client = s.tcp.for_host("server1"), s.tcp.for_host("client")
    assert (servers.era, client.era) == (OLD, "modern")
    # A profile's sysctls are merged over [tcp]'s, name by name.
    assert servers.sysctls == {"tcp_dsack": "0", "tcp_recovery": "1"} and client.sysctls == {"tcp_dsack": "0"}


@pytest.mark.parametrize("field,value,needle", [
    ("tcp.era", "2.6.28", "tcp.era"),
    ("tcp.profiles.old.era", "linux-2.6", "tcp.profiles.old.era"),
    ("tcp.sysctls.tcp_sack", "0", "tcp.sack"),
    ("tcp.sysctls.rmem", "1", "tcp.sysctls"),
    ("tcp.sysctls.tcp_frto", "2;reboot", "tcp.sysctls"),
])
def test_bad_era_or_sysctl_is_one_line_naming_the_field(field, value, needle):
    from incast.scenario import ScenarioError, build
    with pytest.raises(ScenarioError) as e:
        build({}, {field: value})
    assert needle in str(e.value) and "\n" not in str(e.value)


@needs_root
def test_a_sysctl_the_kernel_lacks_is_skipped_and_reported(no_leftovers):
    """A host's sysctls, set from inside a fresh namespace as configure_hosts sets them,
    with one sysctl this kernel no longer has (tcp_abc, removed in 3.9) added to the
    era's; and a profile's own knob the kernel lacks, or a value it refuses, fails,
    naming the knob."""
    import threading
    from incast.machine.resources import setns
    from incast.network import hostconfig
    p = _profile(era=OLD)
    p = dataclasses.replace(p, era_sysctls={**p.era_sysctls, "net.ipv4.tcp_abc": "0"})
    bad = dataclasses.replace(p, sysctls={**p.sysctls, "net.ipv4.tcp_abc": "0"})
    refused = dataclasses.replace(p, sysctls={**p.sysctls, "net.ipv4.tcp_congestion_control": "no-such-cc"})
    ns = f"incast-era-{uuid.uuid4().hex[:8]}"
    own = open("/proc/sys/net/ipv4/tcp_recovery").read()
    subprocess.run(["ip", "netns", "add", ns], check=True)
    got = {}

    def inside():       # a thread of its own: it stays in the namespace it entered
        setns(f"/run/netns/{ns}")
        got["lines"] = hostconfig.apply_sysctls(p)
        got["recovery"] = open("/proc/sys/net/ipv4/tcp_recovery").read().strip()
        for name, profile in (("error", bad), ("refused", refused)):
            try:
                hostconfig.apply_sysctls(profile)
            except RuntimeError as e:
                got[name] = str(e)
    try:
        t = threading.Thread(target=inside)
        t.start()
        t.join()
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=True)
    back = hostconfig.read_back(got["lines"], [], 0, None, p)
    assert back["missing_sysctls"] == ["net.ipv4.tcp_abc"]
    assert back["sysctls"]["net.ipv4.tcp_recovery"] == "0" and got["recovery"] == "0"
    assert open("/proc/sys/net/ipv4/tcp_recovery").read() == own     # the machine's own untouched
    assert "net.ipv4.tcp_abc = 0: not set (no such knob)" in got["error"]
    assert "net.ipv4.tcp_congestion_control = no-such-cc: not set (the kernel refuses it" in got["refused"]


@needs_root
def test_bad_era_exits_2_with_one_line(tmp_path):
    r = incast_cmd("run", "--set", "tcp.era=2.6.28", "--out", tmp_path / "r")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert r.stderr.startswith("incast: tcp.era: ") and not (tmp_path / "r").exists()


@needs_root
@pytest.mark.network
def test_linux_2_6_28_servers_read_back_from_their_namespaces(tmp_path, no_leftovers):
    s = run_json("--senders", "2", "--link-rate", "100Mbit", "--sru", "16KiB", "--blocks", "3",
                 "--warmup", "1", "--set", "tcp.profiles.old.era=linux-2.6.28",
                 "--set", "tcp.hosts.servers=old", "--out", tmp_path / "r")
    assert s["blocks"] == 3
    applied = json.loads((tmp_path / "r" / "tcp_hosts.json").read_text())
    from incast.eras import LINUX_2_6_28_SYSCTLS
    for server in ("server1", "server2"):
        a = applied[server]
        assert a["era"] == OLD and a["missing_sysctls"] == []
        got = {k: a["sysctls"][k] for k in LINUX_2_6_28_SYSCTLS}
        assert got == LINUX_2_6_28_SYSCTLS
        assert "initcwnd 3" in a["route"] and "initrwnd 4" in a["route"]
    # The client keeps this kernel's TCP, and reports it: tail loss probes and RACK on.
    client = applied["client"]
    assert client["era"] == "modern" and "initcwnd" not in client["route"]
    assert client["sysctls"]["net.ipv4.tcp_early_retrans"] == "3"
    assert client["sysctls"]["net.ipv4.tcp_recovery"] == "1"


# --- FAST'08 Table 3 under the era, without SACK (the paper's NewReno) ---------------
# The paper (ns-2, NewReno): 442 timeouts in 84 blocks (5.3 per block; Reno 12.0), 82%
# of them full-window losses (Reno 79%). Judged on the median of three seeds, the
# setting and seeds of docs/results/tcp-era-fast08-table3-sack.csv.
TABLE3 = ["--clock", "virtual", "--kernel", "stock", "--link-rate", "1Gbit", "--senders", "16",
          "--buffer-packets", "64", "--sru", "256KiB", "--cc", "reno", "--rto-min", "200ms",
          "--blocks", "40", "--capture", "--set", f"tcp.era={OLD}", "--set", "tcp.sack=false"]


@pytest.fixture(scope="module")
def table3(tmp_path_factory):
    from test_virtual_time import skip_reason
    if skip_reason("uml-stock"):
        pytest.skip(skip_reason("uml-stock"))
    rows = []
    for seed in (1, 2, 3):
        out = tmp_path_factory.mktemp("table3") / f"seed{seed}"
        s = run_json(*TABLE3, "--seed", str(seed), "--out", out, timeout=1800)
        r = incast_cmd("explain", str(out), "--json")
        assert r.returncode == 0, r.stderr
        t = json.loads(r.stdout)
        assert s["fidelity"]["ok"], f"seed {seed}: not faithful: {s['fidelity']['reasons']}"
        rows.append({"per_block": s["timeouts"] / s["blocks"], "full_window": t["full_window"] / t["timeouts"]})
    return rows


@needs_root
@pytest.mark.figure
def test_table3_era_without_sack_times_out_as_often_as_the_paper(table3):
    per_block = statistics.median([r["per_block"] for r in table3])
    assert 5.3 <= per_block <= 12.0, table3


@needs_root
@pytest.mark.figure
@pytest.mark.xfail(strict=True, reason="declared divergence (docs/tcp-profiles.md, Table 3 without SACK): "
                   "47-68% of the timeouts are full-window losses against the paper's 79-82%; an ACK per "
                   "segment and initial windows of 1 and 2 were tried")
def test_table3_era_without_sack_loses_whole_windows_as_the_paper(table3):
    assert statistics.median([r["full_window"] for r in table3]) >= 0.79, table3
