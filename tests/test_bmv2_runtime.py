"""The bmv2 plane over P4Runtime (incast.dataplane.bmv2_runtime): where
simple_switch_grpc is on PATH, a run's switches get their program, table entries,
default actions, multicast groups and clone sessions over P4Runtime, and their counters
are read over it; a second client that is not the controller can read them during the
run and is refused writes. Skipped, saying why, where bmv2, p4c, simple_switch_grpc or
the client library (finsy) is missing. The rendering of the plane's commands as
simple_switch_CLI lines (the Thrift path) needs none of them but a compiled program."""
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import REPO, needs_root, switch_output

bmv2 = pytest.importorskip("incast.dataplane.bmv2")
p4rt = bmv2.p4rt
from incast.machine import resources  # noqa: E402
from incast.machine.probe import MissingFeature  # noqa: E402
from incast.p4 import program as p4program  # noqa: E402

pytestmark = [pytest.mark.p4]


@pytest.fixture(scope="module")
def json_path():
    try:
        bmv2.bmv2_version()
        return bmv2.compile_program()
    except MissingFeature as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def runtime_present(json_path):
    reason = bmv2.runtime_missing()
    if reason:
        pytest.skip(f"P4Runtime is not used here: {reason}")
    return json_path


def test_commands_render_as_the_thrift_commands_they_replace(json_path):
    """Without P4Runtime the plane sends the same simple_switch_CLI lines as before
    the commands became Entry, Group and Clone."""
    k = bmv2.queue_index(3, 2)
    assert bmv2.queue_commands(json_path, 3, 2, limit=5, xoff=3) == [
        f"table_add IncastIngress.queue_config configure_queue {k} => 5 3 0",
        f"table_add IncastEgress.egress_queue_config configure_queue {k} => 5 3 0"]
    assert bmv2.port_mac_command(json_path, 3, "02:00:00:00:00:0a") == \
        f"table_add IncastEgress.port_config IncastEgress.set_port_mac 3 => {0x02000000000a}"
    settings = bmv2.settings_commands(json_path, {"switch_id": 4})
    assert settings[0] == ("table_set_default IncastIngress.switch_config configure 4 "
                           + " ".join(["0"] * (len(bmv2.SETTINGS) - 1)))
    l2 = bmv2.table_entry(json_path, "IncastIngress.l2_forward", "IncastIngress.set_egress", "02:00:00:00:00:0a", 4)
    assert l2.cli() == "table_add IncastIngress.l2_forward IncastIngress.set_egress 02:00:00:00:00:0a => 4"
    items = [p4rt.Group(1, (1, 2, 3), rid=0, node=0), p4rt.Group(2, (1, 2, 3, 4), rid=1, node=1),
             p4rt.Clone(bmv2.PAUSE_MC_SESSION, (1, 2, 3, 4), group=2), p4rt.Clone(bmv2.TELEMETRY_SESSION, (510,))]
    assert [line for i in items for line in p4rt.cli_lines(i)] == [
        "mc_mgrp_create 1", "mc_node_create 0 1 2 3", "mc_node_associate 1 0",
        "mc_mgrp_create 2", "mc_node_create 1 1 2 3 4", "mc_node_associate 2 1",
        f"mirroring_add_mc {bmv2.PAUSE_MC_SESSION} 2", f"mirroring_add {bmv2.TELEMETRY_SESSION} 510"]


class GrpcSwitch:
    """simple_switch_grpc without a program on one veth port in a scratch namespace,
    its P4Runtime server on a Unix socket."""

    def __init__(self, tmp_path, device_id=3):
        self.ns = f"p4rttest-{uuid.uuid4().hex[:8]}"
        self.device_id = device_id
        subprocess.run(["ip", "netns", "add", self.ns], check=True)
        subprocess.run(["ip", "-n", self.ns, "-batch", "-"], text=True, check=True,
                       input="link set lo up\nlink add s1 type veth peer name h1\nlink set s1 up\nlink set h1 up\n")
        self.path = tmp_path / "s.grpc"
        self.address = f"unix:{self.path}"
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, bmv2.tool("simple_switch_grpc"), "--device-id", str(device_id),
             "--thrift-port", "9090", "--log-console", "-L", "info", "-i", "1@s1",
             "--notifications-addr", f"ipc://{tmp_path}/notify", "--no-p4", "--",
             "--grpc-server-addr", self.address, "--priority-queues", "8"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.log = switch_output(self.proc)

    def close(self):
        self.proc.kill()
        self.proc.wait()
        subprocess.run(["ip", "netns", "del", self.ns])


class RegisterCell:
    """A register cell to write (MODIFY), as Runtime.write takes the plane's items."""

    def __init__(self, name: str, index: int, value: int):
        self.name, self.index, self.value = name, index, value

    def entity(self):
        return ~p4rt.finsy.P4RegisterEntry(self.name, index=self.index, data=self.value)


@pytest.mark.parametrize("bad", [
    "set_queue_depth 100 1 8",                      # a priority past --priority-queues 8
    "set_queue_depth 64 1 -", "set_queue_depth 64 1 +3", "set_queue_depth -5 1",
    "set_queue_rate 100 1 99999999999999999999999",  # past 2^64
    "set_queue_rate 100", "set_queue_rate 100 1 7 extra", "set_queue_burst 100 1"])
def test_queue_config_refuses_a_line_it_cannot_take(tmp_path, bad):
    """simple_switch_grpc --queue-config (scripts/p4-patches/) stops the switch at a
    line it cannot take, naming the file and the line, before anything else starts:
    a priority past the eight queues --priority-queues gives each port, a number that
    is not a whole non-negative decimal below 2^64, a word too few or too many, a
    command it does not know."""
    exe = bmv2.tool("simple_switch_grpc")
    if not exe or not bmv2.queue_config_supported(exe):
        pytest.skip("no simple_switch_grpc with --queue-config (scripts/install-p4.sh --grpc builds it)")
    config = tmp_path / "queues"
    config.write_text(f"# the client's port\nset_queue_rate 812 1 7\n{bad}\n")
    r = subprocess.run([exe, "--no-p4", "--thrift-port", "0", "--", "--priority-queues", "8",
                        "--grpc-server-addr", f"unix:{tmp_path}/s.grpc", "--queue-config", str(config)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert f"{config}:3: not a queue setting this switch can take: {bad}" in r.stderr, r.stdout + r.stderr


@needs_root
def test_a_client_programs_a_switch_by_name(runtime_present, tmp_path):
    """The plane's own entries, groups and sessions, written by name, read back the
    same; a whole counter array in one Read; a reader with a lower election id reads
    and is refused writes. Registers: with scripts/p4-patches/ a cell written by the
    primary reads back, alone or in its whole array, and an index past the array is
    refused; without them the server refuses register reads (why the plane then
    reads them over Thrift)."""
    json_path = runtime_present
    sw = GrpcSwitch(tmp_path)
    ours = reader = None
    try:
        ours = p4rt.Runtime(sw.address, json_path.parent / bmv2.P4INFO_NAME, json_path,
                            device_id=sw.device_id, name="s1").connect()
        ours.push_pipeline()
        items = (bmv2.settings_entries(json_path, {"switch_id": 3, "xoff": 20000, "xon": 10000})
                 + bmv2.queue_entries(json_path, 1, 0, limit=32768)
                 + [bmv2.port_mac_entry(json_path, 1, "02:00:00:00:ff:01"),
                    bmv2.table_entry(json_path, "IncastIngress.l2_forward", "IncastIngress.set_egress",
                                     "02:00:00:00:00:01", 1),
                    bmv2.table_entry(json_path, "IncastIngress.classify_dscp", "IncastIngress.set_class", 8, 1),
                    p4rt.Group(1, (1,), rid=0), p4rt.Group(2, (1,), rid=1, node=1),
                    p4rt.Clone(bmv2.PAUSE_MC_SESSION, (1,), group=2), p4rt.Clone(bmv2.TELEMETRY_SESSION, (510,))])
        ours.write(items)
        assert ours.counts()["messages"] == {"StreamMessageRequest.arbitration": 1, "CapabilitiesRequest": 1,
                                             "SetForwardingPipelineConfigRequest": 1, "WriteRequest": 1}
        # What was written is what switch.p4rt.txt keeps, and reads back from it.
        assert [x.same() for x in ours.parse_writes("\n".join(ours.written))] == [x.same() for x in items]
        check_readback(ours, items)

        reader = p4rt.Runtime(sw.address, json_path.parent / bmv2.P4INFO_NAME, device_id=sw.device_id,
                              election_id=1, primary=False, name="reader").connect()
        check_readback(reader, items)
        cells = reader.read_counters([("IncastEgress.tx", None)])
        # The whole array (one cell a (port, class) queue), untouched yet, in one Read.
        queues = p4program.constants()["NQUEUES"]
        assert len(cells) == queues and cells == [(0, 0)] * queues
        assert reader.counts()["messages"]["ReadRequest"] == 3
        with pytest.raises(p4rt.P4RuntimeFailed, match="PERMISSION_DENIED"):
            reader.write([bmv2.table_entry(json_path, "IncastIngress.classify_dscp", "IncastIngress.set_class",
                                           16, 2)])
        if bmv2.queue_config_supported():
            ours.write([RegisterCell("occ_bytes", 9, 0x12345)])
            assert reader.read_registers([("occ_bytes", 9), ("occ_bytes", 8)]) == [0x12345, 0]
            whole = reader.read_registers([("occ_bytes", None)])
            assert len(whole) == queues and whole[9] == 0x12345 and sum(whole) == 0x12345
            assert ours.counts()["updates"]["register_entry"] == 1
            with pytest.raises(p4rt.P4RuntimeFailed, match="OUT_OF_RANGE"):
                reader.read_registers([("occ_bytes", queues)])
            with pytest.raises(p4rt.P4RuntimeFailed, match="PERMISSION_DENIED"):
                reader.write([RegisterCell("occ_bytes", 9, 0)])
        else:
            with pytest.raises(p4rt.P4RuntimeFailed, match="[Rr]egister"):
                reader._read([p4rt.finsy.P4RegisterEntry("occ_bytes", index=8)])
    finally:
        for client in (reader, ours):
            if client is not None:
                client.close()
        sw.close()


@needs_root
def test_a_controller_with_a_higher_election_id_takes_over_and_the_plane_reads_on(runtime_present, tmp_path):
    """Another controller bidding above the plane's election id (lab 9's) becomes the
    primary: its writes go through, the plane's client is told (arbitration.lost_primary,
    which the run's switch.p4rt-messages.json keeps), is refused writes and still reads;
    once the other leaves, the plane's client is the primary again."""
    json_path = runtime_present
    p4info = json_path.parent / bmv2.P4INFO_NAME
    sw = GrpcSwitch(tmp_path)
    ours = other = None
    try:
        ours = p4rt.Runtime(sw.address, p4info, json_path, device_id=sw.device_id, name="s1").connect()
        ours.push_pipeline()
        ours.write(bmv2.queue_entries(json_path, 1, 0, limit=16384))
        assert "arbitration" not in ours.counts()
        other = p4rt.Runtime(sw.address, p4info, device_id=sw.device_id, election_id=p4rt.ELECTION_ID + 10,
                             name="other").connect()
        theirs = bmv2.queue_entries(json_path, 2, 0, limit=262144)
        other.write(theirs)
        _until(lambda: ours.counts().get("arbitration") == {"lost_primary": 1})
        with pytest.raises(p4rt.P4RuntimeFailed, match="PERMISSION_DENIED"):
            ours.write(bmv2.queue_entries(json_path, 3, 0, limit=1))
        written = bmv2.queue_entries(json_path, 1, 0, limit=16384) + theirs
        entries = [x for x in ours.read_tables(bmv2.QUEUE_TABLES) if not x.default]
        assert sorted(x.same() for x in entries) == sorted(x.same() for x in written)
        assert ours.read_counters([("IncastIngress.drops", bmv2.queue_index(1, 0))]) == [(0, 0)]
        other.close()
        other = None
        _until(lambda: ours.counts()["arbitration"] == {"lost_primary": 1, "regained_primary": 1})
        ours.write(bmv2.queue_entries(json_path, 3, 0, limit=1))
    finally:
        for client in (other, ours):
            if client is not None:
                client.close()
        sw.close()


def _until(condition, timeout_s: float = 10.0) -> None:
    """Wait for what the switch sends on a client's stream (it comes when it comes)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the switch sent no arbitration update"
        time.sleep(0.05)


def check_readback(client, items):
    """The switch's tables, multicast groups and clone sessions are items: every entry
    and default action written, and no entry else."""
    tables = client.read_tables()
    written = [x for x in items if isinstance(x, p4rt.Entry)]
    assert sorted(x.same() for x in tables if not x.default) == sorted(x.same() for x in written if not x.default)
    defaults = {x.table: x.same() for x in tables if x.default}
    for x in written:
        if x.default:
            assert defaults[x.table] == x.same(), x
    replication = [x for x in items if not isinstance(x, p4rt.Entry)]
    assert sorted(x.same() for x in client.read_replication()) == sorted(x.same() for x in replication)


def _state_of(pid: int, deadline: float) -> str:
    """The token of the run whose process is pid (its state file in /run/incast)."""
    while time.monotonic() < deadline:
        token = resources.token_of(pid)
        if token:
            return token
        time.sleep(0.1)
    raise AssertionError(f"no run state for pid {pid}")


@needs_root
@pytest.mark.network
def test_a_run_is_programmed_over_p4runtime(runtime_present, tmp_path, no_leftovers):
    """incast run --switch bmv2 programs its switch over P4Runtime: during the run a
    second client (no arbitration, a lower election id) reads back from the switch
    exactly the entries, default actions, groups and sessions switch.p4rt.txt says the
    plane wrote, and sees the client port's counter grow; the run counts the messages
    it sent, by kind."""
    json_path = runtime_present
    out = tmp_path / "r"
    env = dict(os.environ)
    alone = bmv2.queue_config_supported()
    tripwire = tmp_path / "simple_switch_CLI.called"
    if alone:
        # P4Runtime alone: a simple_switch_CLI first on PATH that records any call
        # (the plane's only way to a Thrift session) and fails it.
        shim = tmp_path / "bin"
        shim.mkdir()
        (shim / "simple_switch_CLI").write_text(f'#!/bin/sh\necho "$@" >> {tripwire}\nexit 1\n')
        (shim / "simple_switch_CLI").chmod(0o755)
        env["PATH"] = f"{shim}:{env['PATH']}"
    proc = subprocess.Popen([sys.executable, "-m", "incast", "run", "--switch", "bmv2", "--senders", "4",
                             "--link-rate", "10Mbit", "--buffer", "32KiB", "--sru", "8KiB", "--blocks", "60",
                             "--warmup", "2", "--json", "--out", str(out)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    occupancy = []
    reader = None
    try:
        deadline = time.monotonic() + 300
        token = _state_of(proc.pid, deadline)
        written = tmp_path / ".r.incomplete" / "switch.p4rt.txt"
        while not written.is_file():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        time.sleep(0.2)         # written whole (switch.cli and it are written at once)
        reader = p4rt.Runtime(f"unix:/run/incast/{token}-s1.grpc", json_path.parent / bmv2.P4INFO_NAME,
                              device_id=0, election_id=1, primary=False, name="reader").connect()
        check_readback(reader, reader.parse_writes(written.read_text()))
        # The switch's ports send while the blocks run: its tx counters grow.
        first = sum(b for _, b in reader.read_counters([("IncastEgress.tx", None)]))
        grown = first
        while grown == first and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            grown = sum(b for _, b in reader.read_counters([("IncastEgress.tx", None)]))
        assert grown > first, (first, grown)
        if alone:
            # The queue registers, read by the second client while the blocks run:
            # the client port's queues fill (4 senders into 10 Mbit/s) within their
            # byte limit.
            while not any(occupancy) and proc.poll() is None and time.monotonic() < deadline:
                occupancy = reader.read_registers([("occ_bytes", None)])
            assert len(occupancy) == p4program.constants()["NQUEUES"], len(occupancy)
            assert 0 < max(occupancy) <= 32 * 1024, occupancy
        with pytest.raises(p4rt.P4RuntimeFailed, match="PERMISSION_DENIED"):
            reader.write([bmv2.table_entry(json_path, "IncastIngress.classify_dscp", "IncastIngress.set_class",
                                           63, 1)])
    finally:
        if reader is not None:
            reader.close()
        stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-2000:]
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["goodput_mbps"] > 0, summary
    run = Path(summary["run_dir"])
    assert "went over P4Runtime" in (run / "switch.cli").read_text()
    if alone:
        assert summary["switch_control"] == "p4runtime"
        assert not tripwire.exists(), tripwire.read_text()
        # The client's port (1) paced at 10 Mbit/s of full frames in every class queue
        # it uses, from the file.
        pps = bmv2.link_pps(10_000_000, 1500)
        lines = (run / "switch.cli").read_text().splitlines()
        assert f"set_queue_rate {pps} 1 {bmv2.PRIORITY_QUEUES - 1}" in lines, lines[:12]
        assert summary["goodput_mbps"] < 10, summary
    else:
        assert summary["switch_control"] == "p4runtime+thrift"
    counts = json.loads((run / "switch.p4rt-messages.json").read_text())
    total = counts["total"]
    assert total["messages"]["SetForwardingPipelineConfigRequest"] == 1
    assert total["messages"]["WriteRequest"] == 1
    assert total["messages"]["ReadRequest"] >= 2            # queue counters before and after each block set
    assert total["updates"]["table_entry (default action)"] == 2
    # group 1 (floods); PAUSE goes to its ports by a clone session that lists them
    assert total["updates"]["multicast_group_entry"] == 1 and total["updates"]["clone_session_entry"] == 2
    print(json.dumps(total, sort_keys=True))
