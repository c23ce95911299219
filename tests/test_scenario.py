import pytest

from incast import scenario as scn
from incast.errors import ScenarioError
from incast.scenario import build


def test_defaults_follow_the_papers():
    s = build()
    assert s.workload.kind == "fixed-fragment"
    assert s.workload.sru == 256 * 1024
    assert s.switch.buffer == 32 * 1024
    assert s.tcp.rto_min == 200_000
    assert s.tcp.cc == "reno"
    assert s.link.rate == 10**9


def test_aliases_and_units():
    s = build({}, {"senders": "16", "buffer": "64KiB", "rto_min": "200us", "link_rate": "100Mbit",
                   "delayed_ack": "off", "cc": "cubic"})
    assert s.topology.senders == 16
    assert s.switch.buffer == 65536
    assert s.tcp.rto_min == 200
    assert s.link.rate == 10**8
    assert s.tcp.delayed_ack is False
    assert s.tcp.cc == "cubic"


def test_rto_min_keyword():
    assert build({}, {"rto_min": "min"}).tcp.rto_min == "min"


def test_fragments():
    ff = build({}, {"senders": "4", "sru": "100KB"})
    assert ff.fragments() == [100_000] * 4
    fb = build({}, {"senders": "3", "workload": "fixed-block", "block": "1000"})
    assert fb.fragments() == [334, 333, 333]
    assert fb.block_bytes() == 1000


def test_file_then_flags(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('name = "lab1"\n[topology]\nsenders = 8\n[switch]\nbuffer = "64KiB"\n[sweep]\nsenders = [1, 2]\n')
    s = build(scn.load_file(f), {"senders": "4"})
    assert s.name == "lab1" and s.topology.senders == 4 and s.switch.buffer == 65536


def test_buffer_packets_replaces_bytes():
    s = build({}, {"buffer_packets": "20"})
    assert s.switch.buffer is None and s.switch.buffer_packets == 20
    assert s.switch.class_limits(1500) == [20]


def test_qos_partitioning():
    s = build({}, {"qos_queues": "4", "buffer": "64KiB"})
    assert s.switch.class_limits(1500) == [16384] * 4
    assert s.switch.qos.dscp_table()[8] == 1 and s.switch.qos.dscp_table()[0] == 0
    assert s.switch.qos.class_dscp() == {0: 0, 1: 8, 2: 16, 3: 24}
    w = build({}, {"qos_queues": "2", "buffer": "60000", "switch.qos.weights": "[2,1]"})
    assert w.switch.class_limits(1500) == [40000, 20000]
    cyc = build({}, {"qos_queues": "2", "sender_class": "[0,1]"})
    assert [cyc.switch.qos.class_of_sender(i) for i in range(4)] == [0, 1, 0, 1]


def test_resolved_toml_round_trips():
    import tomllib
    s = build({"switch": {"qos": {"queues": 2, "dscp_map": {"10": 1}}}}, {"senders": "8", "rto_min": "min"})
    again = build(tomllib.loads(scn.to_toml(s)))
    assert again == s


@pytest.mark.parametrize("overrides,field", [
    ({"senders": "0"}, "topology.senders"),
    ({"senders": "many"}, "topology.senders"),
    ({"buffer": "12XB"}, "switch.buffer"),
    ({"buffer": "1000"}, "switch.buffer"),              # less than one frame
    ({"qos_queues": "9"}, "switch.qos.queues"),
    ({"qos_queues": "8", "buffer": "8KiB"}, "class"),   # a class below one frame
    ({"sender_class": "3"}, "sender_class"),
    ({"rto_min": "0us"}, "tcp.rto_min"),
    ({"rto_min": "fast"}, "tcp.rto_min"),
    ({"cc": "Reno!"}, "tcp.cc"),
    ({"delayed_ack": "maybe"}, "tcp.delayed_ack"),
    ({"workload": "variable"}, "workload.kind"),
    ({"link_rate": "0bit"}, "link.rate"),
    ({"switch.qos.weights": "[1,2]"}, "weights"),
    ({"link.jitter": "10us"}, "jitter"),
    ({"no_such_field": "1"}, "no_such_field"),
])
def test_bad_values_name_the_field(overrides, field):
    with pytest.raises(ScenarioError) as e:
        build({}, overrides)
    msg = str(e.value)
    assert "\n" not in msg
    assert field in msg


def test_unknown_table_key_is_refused():
    with pytest.raises(ScenarioError, match="topology.color"):
        build({"topology": {"color": "red"}})


def test_bad_toml(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("senders = = 3")
    with pytest.raises(ScenarioError, match="not valid TOML"):
        scn.load_file(f)
    with pytest.raises(ScenarioError, match="no such scenario file"):
        scn.load_file(tmp_path / "missing.toml")


def test_what_a_data_plane_cannot_do_is_refused_by_asking_it():
    with pytest.raises(ScenarioError, match="telemetry.sample: the linux data plane records every packet"):
        build({}, {"telemetry_sample": "1/10"})
    assert build({}, {"telemetry_sample": "1/10", "switch": "bmv2"}).telemetry.sample_mode() == (2, 10)
    with pytest.raises(ScenarioError, match="limits its queues in bytes"):
        build({}, {"buffer_packets": "20", "switch": "bmv2"})


def test_virtual_time_needs_a_uml_kernel_and_an_explicit_rate():
    s = build({}, {"clock": "virtual", "kernel": "hrtimer", "link_rate": "10Gbit"})
    assert s.clock == "virtual" and s.kernel == "hrtimer"
    assert build({}, {}).clock == "real"
    with pytest.raises(ScenarioError, match="kernel stock or hrtimer"):
        build({}, {"clock": "virtual"})
    with pytest.raises(ScenarioError, match="link.rate auto"):
        build({}, {"clock": "virtual", "kernel": "stock", "link_rate": "auto"})
    with pytest.raises(ScenarioError, match="clock"):
        build({}, {"clock": "simulated"})
    assert build({}, {"telemetry.interval": "50us"}).telemetry.interval == 50


PROFILES = {"tcp": {"rto_min": "200us",
                    "profiles": {"stock_client": {"rto_min": "200ms", "delayed_ack": True},
                                 "quick": {"delayed_ack": False, "cc": "cubic"}},
                    "hosts": {"client": "stock_client", "servers": "quick", "server2": "stock_client"}}}


def test_tcp_profiles_lay_their_fields_over_tcp_by_role_then_host():
    t = build(PROFILES).tcp
    assert t.for_host("client").rto_min == 200_000 and t.for_host("client").delayed_ack
    s1 = t.for_host("server1")
    assert (s1.rto_min, s1.delayed_ack, s1.cc) == (200, False, "cubic")      # the servers' role
    assert t.profile_of("server2") == "stock_client"                         # its own entry wins
    assert t.for_host("server2").cc == "reno"
    assert t.for_host("servers") == s1
    plain = build().tcp
    assert plain.profile_of("client") is None and plain.for_host("server7") == plain.settings()


@pytest.mark.parametrize("tcp, message", [
    ({"hosts": {"client": "nope"}}, "hosts.client: no profile 'nope'"),
    ({"profiles": {"a": {}}, "hosts": {"switch1": "a"}}, "neither a role"),
    ({"profiles": {"a": {"rto_min": "1ns"}}}, "tcp.profiles.a.rto_min"),
    ({"profiles": {"a": {"dupack_threshold": 0}}}, "tcp.profiles.a.dupack_threshold"),
    ({"profiles": {"a": {"colour": 1}}}, "tcp.profiles.a.colour"),
    ({"profiles": {"a b": {}}}, "not a profile name"),
])
def test_bad_tcp_profiles_name_the_field(tcp, message):
    with pytest.raises(ScenarioError, match=message.replace(".", r"\.")):
        build({"tcp": tcp})


def test_tcp_profiles_survive_toml_and_are_set_like_any_field():
    import tomllib
    s = build(PROFILES)
    assert build(tomllib.loads(scn.to_toml(s))) == s
    t = build({}, {"tcp.profiles.c.delack_us": "200", "tcp.profiles.c.delayed_ack": "off",
                   "tcp.hosts.client": "c"}).tcp
    assert t.for_host("client").delack_us == 200 and not t.for_host("client").delayed_ack
    assert t.for_host("server1").delayed_ack
    with pytest.raises(ScenarioError, match="tcp.profiles.c.nope: no such scenario field"):
        build({}, {"tcp.profiles.c.nope": "1"})


def test_ecn_marking_threshold_is_checked_against_each_class_queue():
    s = build({}, {"buffer": "128KiB", "ecn_threshold": "32KiB", "cc": "dctcp"})
    assert s.switch.ecn == 32 * 1024 and s.tcp.cc == "dctcp"
    with pytest.raises(ScenarioError, match="below every class queue's share"):
        build({}, {"buffer": "64KiB", "qos_queues": "2", "ecn_threshold": "40KiB"})
    with pytest.raises(ScenarioError, match="needs switch.buffer in bytes"):
        build({}, {"buffer_packets": "40", "ecn_threshold": "10KiB"})
    assert build({}, {"switch": "bmv2", "ecn_threshold": "10KiB"}).switch.ecn == 10 * 1024


def test_ecn_marking_queue_on_the_linux_plane():
    from incast.dataplane.linux import port_tc_commands
    s = build({}, {"buffer": "128KiB", "ecn_threshold": "30000", "qos_queues": "2"})
    leaves = [ln for ln in port_tc_commands("p1", s) if "handle 1" in ln and "parent 1:1" in ln]
    assert len(leaves) == 2
    for ln in leaves:
        assert " red limit 65536 min 30000 max 30001 " in ln and ln.endswith("probability 1.0 ecn")
    plain = port_tc_commands("p1", build({}, {"buffer": "128KiB"}))
    assert not any(" red " in ln for ln in plain)


def test_flow_control_fields_are_checked_and_unset_by_none():
    storm = {"switch": {"pause": {"enabled": True, "storm": {"host": "near1", "duration": "60ms"},
                                  "watchdog": {"detect": "5ms"}}},
             "topology": {"others": 1}, "background": [{"src": "server1", "dst": "near1"}]}
    s = build(storm)
    assert s.switch.pause.storm.duration == 60_000 and s.switch.pause.watchdog.restore == 50_000
    assert build(storm, {"switch.pause.watchdog": "none"}).switch.pause.watchdog is None
    with pytest.raises(ScenarioError, match="no host 'near9'"):
        build(storm, {"switch.pause.storm.host": "near9"})
    with pytest.raises(ScenarioError, match="switch.pause.watchdog.action"):
        build(storm, {"switch.pause.watchdog.action": "ignore"})
    # bmv2 sends and obeys PAUSE and PFC in its pipeline, across switches too, but has
    # no watchdog.
    assert build({}, {"switch": "bmv2", "pause": "on", "pfc": "on"}).switch.pause.pfc
    assert build({"topology": {"kind": "two_switch", "senders": 2}},
                 {"switch": "bmv2", "pause": "on"}).switch.pause.enabled
    with pytest.raises(ScenarioError, match="no PFC watchdog .*dataplane linux"):
        build(storm, {"switch": "bmv2"})
    with pytest.raises(ScenarioError, match="one at a time"):
        build({}, {"pause": "on", "switch.ecn": "16KiB"})
    # Background flows (an array of tables) survive the resolved TOML.
    import tomllib
    assert build(tomllib.loads(scn.to_toml(s))) == s


def test_flow_control_thresholds_are_each_class_queues():
    from incast.dataplane import Port
    from incast.dataplane.linux import flow_control_config, port_tc_commands
    s = build({"switch": {"buffer": "64KiB", "qos": {"queues": 2}, "pause": {"enabled": True, "pfc": True}}},
              {"senders": "8"})
    ports = [Port("s1", "s1-eth1", 1, "client", 5), Port("s1", "s1-eth2", 2, "s2", 6, trunk=True)]
    cfg = flow_control_config(s, ports)
    assert cfg["pfc"] and cfg["classes"] == 2 and cfg["ports"][1]["limits"] == [32768, 32768]
    # A 32 KiB class queue: XOFF leaves two frames per sender of headroom, but is at
    # least an eighth of it and at most half; XON a quarter of XOFF.
    assert cfg["xoff"] == [32768 - 2 * 1514 * 8] * 2 and cfg["xon"] == [(32768 - 2 * 1514 * 8) // 4] * 2
    assert abs(cfg["interval_us"] - 1538 * 8 / 1000 / 4) < 1e-9     # a quarter of a full frame at 1 Gbit/s
    leaves = [ln for ln in port_tc_commands("p1", s) if "parent 1:1" in ln and "handle 1" in ln]
    assert any("plug limit 32768" in ln for ln in leaves)
    assert any("plug release_indefinite" in ln for ln in leaves)


def test_pause_headroom_is_the_buffer_above_xoff_at_every_senders_rate():
    from incast.network.flow_control import headroom_us
    assert headroom_us(build({}, {"senders": "8"})) is None       # no PAUSE
    s = build({}, {"senders": "8", "buffer": "32KiB", "link_rate": "10Mbit", "pause": "on"})
    xoff, _ = s.switch.port_pause_thresholds(s.link.mtu, 8)
    # 8 servers at 10 Mbit/s fill the 32 KiB above XOFF in a few milliseconds; twice the
    # rate halves it.
    assert headroom_us(s) == pytest.approx((32768 - xoff) * 8 / 80e6 * 1e6)
    assert 1000 < headroom_us(s) < 4000
    faster = build({}, {"senders": "8", "buffer": "32KiB", "link_rate": "20Mbit", "pause": "on"})
    assert headroom_us(faster) == pytest.approx(headroom_us(s) / 2)


def test_a_shared_pool_is_validated_and_only_where_a_data_plane_has_one(monkeypatch):
    for plane in ("bmv2", "linux"):
        s = scn.build({"dataplane": plane, "switch": {"buffer": "128KiB", "pool": {"size": "768KiB", "alpha": 2}}})
        assert s.switch.pool.size == 768 * 1024 and s.switch.pool.alpha == 2
    from dataclasses import replace
    monkeypatch.setitem(scn.DATAPLANES, "linux", replace(scn.DATAPLANES["linux"], shared_buffer=False))
    with pytest.raises(scn.ScenarioError, match="switch.pool: the linux data plane has a fixed buffer per port"):
        scn.build({"switch": {"pool": {"size": "768KiB"}}})
    with pytest.raises(scn.ScenarioError, match="multiple of 0.0625"):
        scn.build({"dataplane": "bmv2", "switch": {"pool": {"size": "64KiB", "alpha": 0.3}}})
    with pytest.raises(scn.ScenarioError, match="1 byte to 16 MiB"):
        scn.build({"dataplane": "bmv2", "switch": {"pool": {"size": "32MiB"}}})


def test_with_a_pool_pause_places_xoff_below_what_the_pool_admits_a_lone_queue():
    """A 64 KiB pool under alpha 1 holds a lone busy queue to alpha/(1+alpha) of it,
    32 KiB, whatever its 128 KiB cap: XOFF and the headroom are placed against that, so
    the headroom (two frames a sender) is there when PAUSE is sent; an XOFF of the
    user's at or above it is refused, naming the limit."""
    from incast.network.flow_control import headroom_bytes
    pooled = scn.build({"dataplane": "bmv2", "topology": {"senders": 8}, "switch": {
        "buffer": "128KiB", "pool": {"size": "64KiB"}, "pause": {"enabled": True}}})
    assert pooled.switch.pool.lone_queue_bytes() == 32768
    headroom = 2 * 1514 * 8
    assert pooled.switch.port_pause_thresholds(1500, 8) == (32768 - headroom, (32768 - headroom) // 4)
    assert headroom_bytes(pooled) == headroom
    alone = scn.build({"dataplane": "bmv2", "topology": {"senders": 8}, "switch": {
        "buffer": "128KiB", "pause": {"enabled": True}}})
    assert alone.switch.port_pause_thresholds(1500, 8)[0] == 65536      # half the cap, as without a pool
    # alpha 2: a lone queue two thirds of the pool; a cap below that is the limit again
    assert scn.build({"dataplane": "bmv2", "switch": {"buffer": "128KiB", "pool": {
        "size": "96KiB", "alpha": 2}}}).switch.held_bytes(131072) == 65536
    assert scn.build({"dataplane": "bmv2", "switch": {"buffer": "16KiB", "pool": {
        "size": "96KiB", "alpha": 2}}}).switch.held_bytes(16384) == 16384
    with pytest.raises(ScenarioError, match=r"xoff must be below what the pool admits a lone busy queue "
                                            r"\(alpha x size / \(1 \+ alpha\) = 32768 B\)"):
        scn.build({"dataplane": "bmv2", "switch": {"buffer": "128KiB", "pool": {"size": "64KiB"},
                                                   "pause": {"enabled": True, "xoff": "40KiB"}}})


def test_a_buffer_is_bytes_or_packets_whichever_the_last_layer_gives():
    """One rule (scenario.keep_given_buffer_unit) for every layer: a file over a testbed,
    --set over a file, either unit over the other."""
    from incast import scenario as scn
    assert build({"switch": {"buffer_packets": 20}}, {"buffer": "64KiB"}).switch.buffer_packets is None
    s = build({"switch": {"buffer": 65536}}, {"buffer_packets": "20"})
    assert s.switch.buffer is None and s.switch.buffer_packets == 20
    s = build({"testbed": "sigcomm09-s50", "switch": {"buffer_packets": 40}}, {})
    assert s.switch.buffer is None and s.switch.buffer_packets == 40
    switch = {"buffer": 1, "buffer_packets": 2, "pool": {}}
    scn.keep_given_buffer_unit(switch, ["pool"])          # gave neither: both stay (the model refuses)
    assert switch == {"buffer": 1, "buffer_packets": 2, "pool": {}}
    scn.keep_given_buffer_unit(switch, ["buffer_packets"])
    assert switch == {"buffer_packets": 2, "pool": {}}
