"""Packet tests of the switch, with Scapy frames, on two targets: p4src/incast.p4 on a
running simple_switch (bmv2), and the hardware switch rtl/src/incast_switch.sv in its
Verilator model (rtl), the same frames and the same assertions.

A scratch namespace holds the switch's ports (veth pairs: sN is the switch's port N,
hN the wire end the test sends into and reads from) and the telemetry port (510);
bmv2's also its hold loop (a veth pair from port 508 back to 509). The tests set the
switch's settings and its queues' by name (Rig.settings, Rig.queue: incast.p4's
configure and configure_queue); the rtl target writes them to its registers, and
takes the tests' other bmv2 commands in translation (RtlRig.cli): the same settings have
the same meaning, times become cycles of its 1 Gbit/s ports, a queue's rate its port's
shaper. What only one target has is asserted on that one: bmv2's hold loop.
Skipped, saying why, where bmv2 and p4c, or Verilator, are missing."""
import concurrent.futures
import os
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from conftest import needs_root, switch_output
from frame_checks import check_ecn_marks, check_report_frame, tshark_fields
from pool_cases import CASES as POOL_CASES
from pool_cases import admitted as pool_admitted

pytestmark = [needs_root, pytest.mark.network, pytest.mark.p4]

bmv2 = pytest.importorskip("incast.dataplane.bmv2")
from incast.machine.probe import MissingFeature  # noqa: E402
from incast.machine.resources import setns  # noqa: E402

NPORTS = 4
MACS = {n: f"02:00:00:00:00:{n:02x}" for n in range(1, NPORTS + 1)}
SWITCH_MACS = {n: f"02:00:00:00:ff:{n:02x}" for n in range(1, NPORTS + 1)}


def _require_bmv2():
    # INCAST_P4_PROGRAM: test another copy of the program (a lab student's, incast lab check).
    program = os.environ.get("INCAST_P4_PROGRAM")
    try:
        bmv2.bmv2_version()
        return bmv2.compile_program(Path(program)) if program else bmv2.compile_program()
    except MissingFeature as e:
        pytest.skip(str(e))


class Rig:
    """bmv2 running incast.p4 on NPORTS veth ports in a scratch namespace. Programmed
    through P4Runtime alone where simple_switch_grpc has scripts/p4-patches/ (the
    plane's way): its table entries, groups and sessions written and its counters and
    registers read over P4Runtime, its queues' rates given in its --queue-config file,
    so the switch starts at the test's first packet or read, once the test has said
    them (a rate set later fails). Elsewhere simple_switch over Thrift."""
    target = "bmv2"
    runtime_only = False
    proc = None

    def __init__(self, json_path):
        self.json_path = json_path
        self.current = {}       # the settings given so far (configure takes them all at once)
        self.handles = {}       # Thrift: (table, queue index) -> its entry's handle
        self.queues = {}        # (port, class) -> its settings given so far
        self.runtime_only = bmv2.runtime_missing() is None and bmv2.queue_config_supported()
        self.runtime = None
        self.pending = {}       # P4Runtime, before the start: what to write then, by key
        self.written = set()    # P4Runtime: the keys of the entries the switch has
        self.queue_lines = []   # P4Runtime: the --queue-config file
        links = [(f"s{bmv2.HOLD_PORT}", f"s{bmv2.HOLD_RETURN_PORT}", "02:00:00:00:ff:fd")]
        self._wires(links)
        self.notify = f"/tmp/{self.ns}.notify"
        self.grpc = Path(f"/tmp/{self.ns}.grpc")
        self.queue_file = Path(f"/tmp/{self.ns}.queues")
        self.socks = {n: self.pool.submit(self._open, f"h{n}").result() for n in list(range(1, NPORTS + 1)) + [510]}
        if not self.runtime_only:
            self._launch()
            self._until_serving()
        self.base_config()

    def _launch(self):
        args = ["ip", "netns", "exec", self.ns,
                bmv2.tool("simple_switch_grpc" if self.runtime_only else "simple_switch"),
                "--thrift-port", "9090", "--log-console", "-L", "info"]
        for n in list(range(1, NPORTS + 1)) + [bmv2.HOLD_PORT, bmv2.HOLD_RETURN_PORT, 510]:
            args += ["-i", f"{n}@s{n}"]
        args += ["--notifications-addr", f"ipc://{self.notify}"]
        if self.runtime_only:
            self.queue_file.write_text("".join(f"{line}\n" for line in self.queue_lines))
            args += ["--no-p4", "--", "--grpc-server-addr", f"unix:{self.grpc}", "--queue-config",
                     str(self.queue_file)]
        else:
            args += [str(self.json_path), "--"]
        self.proc = subprocess.Popen(args + ["--priority-queues", "8"], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT)
        self.log = switch_output(self.proc)

    def _start(self):
        """P4Runtime: start the switch at the first packet or read, with the queues and
        entries given so far."""
        if not self.runtime_only or self.proc is not None:
            return
        from incast.dataplane import bmv2_runtime as p4rt
        self._launch()
        self.runtime = p4rt.Runtime(f"unix:{self.grpc}", self.json_path.parent / bmv2.P4INFO_NAME, self.json_path,
                                    name=self.ns).connect()
        self.runtime.push_pipeline()
        items, self.pending = list(self.pending.values()), {}
        self._write(items)

    @staticmethod
    def _key(item):
        if hasattr(item, "table"):
            return (item.table, item.default, tuple(sorted(item.match.items())))
        return (type(item).__name__, item.same()[1])

    def _write(self, items):
        """P4Runtime: entries, groups and sessions, kept until the start or written; an
        entry the switch has already is modified."""
        import dataclasses
        if self.proc is None:
            self.pending.update((self._key(x), x) for x in items)
            return
        items = [dataclasses.replace(x, modify=True) if self._key(x) in self.written and hasattr(x, "table")
                 and not x.default else x for x in items]
        self.runtime.write(items)
        self.written.update(self._key(x) for x in items)

    def _until_serving(self, deadline_s=60.0):
        """bmv2 logs "Thrift server was started" before it serves the simple_switch
        service (mirroring, queues): ask that service's clock until it answers, as
        bmv2.serving_session does for the data plane."""
        deadline = time.monotonic() + deadline_s
        while True:
            r = subprocess.run(["ip", "netns", "exec", self.ns, bmv2.tool("simple_switch_CLI"), "--thrift-port",
                                "9090"], input="get_time_elapsed\n", capture_output=True, text=True)
            if r.returncode == 0 and not any(m in r.stdout for m in bmv2.NOT_YET_SERVING):
                return
            assert self.proc.poll() is None and time.monotonic() < deadline, r.stdout[-500:]

    def _wires(self, extra_links):
        """The namespace and its veth pairs: the switch's ports, its telemetry port and
        extra_links (sw end, other end, MAC)."""
        self.ns = f"p4test-{uuid.uuid4().hex[:8]}"
        subprocess.run(["ip", "netns", "add", self.ns], check=True)
        self.pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, initializer=setns, initargs=(f"/run/netns/{self.ns}",))
        links = [(f"s{n}", f"h{n}", SWITCH_MACS[n]) for n in range(1, NPORTS + 1)]
        links.append(("s510", "h510", "02:00:00:00:ff:fe"))
        links += extra_links
        cmds = ["link set lo up"]   # Thrift listens on the namespace's loopback
        for sw, wire, mac in links:
            cmds += [f"link add {sw} address {mac} type veth peer name {wire}", f"link set {sw} up",
                     f"link set {wire} up", f"link set {sw} mtu 9500", f"link set {wire} mtu 9500"]
        subprocess.run(["ip", "-n", self.ns, "-batch", "-"], input="\n".join(cmds) + "\n", text=True, check=True)
        for sw, wire, _ in links:
            for dev in (sw, wire):
                subprocess.run(["ip", "netns", "exec", self.ns, "ethtool", "-K", dev, "tso", "off", "gso", "off",
                                "gro", "off", "tx", "off", "rx", "off"], capture_output=True)
            subprocess.run(["ip", "netns", "exec", self.ns, "sysctl", "-qw", f"net.ipv6.conf.{wire}.disable_ipv6=1",
                            f"net.ipv6.conf.{sw}.disable_ipv6=1"], capture_output=True)

    @staticmethod
    def _open(dev):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        s.bind((dev, 0))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        return s

    def base_config(self, limit=32768):
        if self.runtime_only:
            from incast.dataplane import bmv2_runtime as p4rt
            ports = tuple(range(1, NPORTS + 1))
            self._write([bmv2.table_entry(self.json_path, "IncastIngress.l2_forward", "IncastIngress.set_egress",
                                          MACS[n], n) for n in ports]
                        + [bmv2.port_mac_entry(self.json_path, n, SWITCH_MACS[n]) for n in ports]
                        + [p4rt.Group(1, ports, rid=0), p4rt.Clone(bmv2.PAUSE_MC_SESSION, ports, group=2),
                           p4rt.Clone(bmv2.TELEMETRY_SESSION, (510,))]
                        + [bmv2.table_entry(self.json_path, "IncastIngress.classify_dscp",
                                            "IncastIngress.set_class", dscp, c) for dscp, c in ((8, 1), (16, 2))])
            self.settings()
            for n in ports:
                for c in range(8):
                    self.queue(n, c, limit=limit)
            return
        cmds = []
        for n in range(1, NPORTS + 1):
            cmds.append(f"table_add IncastIngress.l2_forward IncastIngress.set_egress {MACS[n]} => {n}")
            cmds.append(self.port_mac_command(n, SWITCH_MACS[n]))
        ports = " ".join(str(n) for n in range(1, NPORTS + 1))
        cmds += ["mc_mgrp_create 1", f"mc_node_create 0 {ports}", "mc_node_associate 1 0",
                 "mc_mgrp_create 2", f"mc_node_create 1 {ports}", "mc_node_associate 2 1",
                 f"mirroring_add_mc {bmv2.PAUSE_MC_SESSION} 2", f"mirroring_add {bmv2.TELEMETRY_SESSION} 510",
                 "table_add IncastIngress.classify_dscp IncastIngress.set_class 8 => 1",
                 "table_add IncastIngress.classify_dscp IncastIngress.set_class 16 => 2"]
        self.cli(cmds)
        self.settings()
        for n in range(1, NPORTS + 1):
            for c in range(8):
                self.queue(n, c, limit=limit)

    def port_mac_command(self, port, mac):
        return bmv2.port_mac_command(self.json_path, port, mac)

    def settings(self, **kw):
        """Set these of the switch's settings (incast.p4's configure), the others as
        they were."""
        self.current.update(kw)
        if self.runtime_only:
            self._write(bmv2.settings_entries(self.json_path, self.current))
        else:
            self.cli(bmv2.settings_commands(self.json_path, self.current))

    def queue(self, port, cls, **kw):
        """Set these of a (port, class) queue's settings (limit, xoff, xon), the others
        as they were: its entries added, or changed where it has them."""
        current = self.queues.setdefault((port, cls), {})
        current.update(kw)
        if self.runtime_only:
            self._write(bmv2.queue_entries(self.json_path, port, cls, **current))
            return
        for cmd in bmv2.queue_commands(self.json_path, port, cls, **current):
            w = cmd.split()
            key = (w[1], int(w[3]))
            if key in self.handles:
                self.cli([" ".join(["table_modify", w[1], w[2], str(self.handles[key]), *w[5:]])])
            else:
                out = self.cli([cmd])
                self.handles[key] = int(out.split("handle")[-1].split()[0])

    def cli(self, cmds):
        """simple_switch_CLI commands; P4Runtime: only the queues' rates and depths,
        before the switch starts (its --queue-config)."""
        if self.runtime_only:
            for cmd in cmds:
                assert cmd.split()[0] in ("set_queue_rate", "set_queue_depth"), \
                    f"no Thrift command on a switch programmed through P4Runtime: {cmd}"
                assert self.proc is None, f"{cmd}: the queues are set when the switch starts, before any packet"
            self.queue_lines += cmds
            return ""
        r = subprocess.run(["ip", "netns", "exec", self.ns, bmv2.tool("simple_switch_CLI"), "--thrift-port", "9090"],
                           input="\n".join(cmds) + "\n", capture_output=True, text=True, check=True)
        bad = [ln for ln in r.stdout.splitlines() if "Error" in ln or "Invalid" in ln]
        assert not bad, bad
        return r.stdout

    def counter(self, name, index):
        """(packets, bytes) of a counter's cell."""
        if self.runtime_only:
            self._start()
            return self.runtime.read_counters([(name, index)])[0]
        return bmv2._parse_value([ln for ln in self.cli([f"counter_read {name} {index}"]).splitlines()
                                  if "[" in ln and "=" in ln][0])

    def register(self, name, index):
        if self.runtime_only:
            self._start()
            return self.runtime.read_registers([(name, index)])[0]
        return bmv2._parse_value([ln for ln in self.cli([f"register_read {name} {index}"]).splitlines()
                                  if "[" in ln and "=" in ln][0])[0]

    def send(self, port, frame: bytes):
        self._start()
        self.socks[port].send(frame)

    def receive(self, port, timeout=0.5, count=None):
        """Frames the switch sent out of port (not those the test itself sent)."""
        self._start()
        s = self.socks[port]
        got, end = [], time.monotonic() + timeout
        while time.monotonic() < end and (count is None or len(got) < count):
            s.settimeout(max(0.001, end - time.monotonic()))
            try:
                frame, addr = s.recvfrom(65535)
            except socket.timeout:
                break
            if addr[2] != socket.PACKET_OUTGOING:
                got.append(frame)
        return got

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def close(self):
        if self.runtime is not None:
            self.runtime.close()
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        for path in (self.notify, self.grpc, self.queue_file):
            Path(path).unlink(missing_ok=True)
        for s in self.socks.values():
            s.close()
        self.pool.shutdown()
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)


class RtlRig(Rig):
    """The hardware switch's Verilator model (rtl/harness) on the same wires, its ports
    1 Gbit/s (8 ns cycles). It takes the bmv2 commands the tests give, translated."""
    target = "rtl"
    CYCLES_PER_US = 125
    # incast.p4's counters and registers: (the model's address, per queue | port | switch)
    COUNTERS = {"IncastEgress.tx": (0x8000, "q"), "IncastIngress.drops": (0x6000, "q"),
                "IncastIngress.ecn_marks": (0xA000, "q"), "IncastIngress.mac_control_rx": (0xB001, "p"),
                "IncastIngress.pause_rx": (0xB002, "p"), "IncastIngress.xon_rx": (0xB003, "p")}
    REGISTERS = {"occ_bytes": (0x4000, "q"), "congested": (0xB007, "p"), "congested_ports": (0xD000, "s"),
                 "congested_queues": (0xD008, "s"), "queue_congested": (0xC000, "q"),
                 "pool_used": (0xD002, "s"), "pool_max_bytes": (0xD007, "s")}

    def __init__(self, exe):
        from incast.dataplane import rtl
        self.rtl = rtl
        self._wires([])
        self.sock_path = f"/tmp/{self.ns}.rtl"
        args = ["ip", "netns", "exec", self.ns, str(exe), "--control", self.sock_path, "--telemetry", "s510",
                "--period-ps", "8000"]
        for n in range(1, NPORTS + 1):
            args += ["--port", f"{n - 1}=s{n}"]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert self.proc.stdout.readline().strip() == b"ready", self.proc.stderr.read().decode()
        self.control = rtl.Control(self.sock_path)
        self.macs = 0
        self.socks = {n: self.pool.submit(self._open, f"h{n}").result() for n in list(range(1, NPORTS + 1)) + [510]}
        self.base_config()

    def _index(self, kind, index):
        # incast.p4 numbers queues port * 8 + class with ports from 1; the model from 0.
        return {"q": index - 8, "p": 8 * (index - 1), "s": index}[kind]

    def port_mac_command(self, port, mac):
        return f"port_mac {port} {bmv2.mac_int(mac)}"

    def settings(self, **kw):
        """The settings by name, into the model's configuration registers (the P4
        program's microseconds are its cycles; bmv2's input queue, late_us, it has not)."""
        rtl, writes = self.rtl, []
        unknown = set(kw) - set(bmv2.SETTINGS)
        assert not unknown, unknown
        for name, value in kw.items():
            if name in ("pause_us", "refresh_us"):
                writes.append((rtl.CFG[name.replace("_us", "_cycles")], value * self.CYCLES_PER_US))
            elif name == "quantum_us1024":
                writes.append((rtl.CFG["quantum"], value * self.CYCLES_PER_US // 1024))
            elif name != "late_us":
                writes.append((rtl.CFG[name], value))
        self.control.write(writes)

    def queue(self, port, cls, **kw):
        rtl = self.rtl
        base = {"limit": rtl.LIMIT, "xoff": rtl.XOFF_Q, "xon": rtl.XON_Q}
        self.control.write([(base[k] + bmv2.queue_index(port, cls) - 8, v) for k, v in kw.items()])

    def cli(self, cmds):
        rtl, writes = self.rtl, []
        for cmd in cmds:
            w = cmd.split()
            if w[0] == "port_mac":
                port, mac = int(w[1]) - 1, int(w[2])
                writes += [(rtl.PORT_MAC + 4 * port, mac & 0xFFFFFFFF), (rtl.PORT_MAC + 4 * port + 1, mac >> 32)]
            elif w[0] == "set_queue_rate":
                pps, port = int(w[1]), int(w[2])
                if port <= NPORTS:            # a rate per port: its shaper, cycles between frames
                    writes.append((rtl.PORT_MAC + 4 * (port - 1) + 2, round(1e6 * self.CYCLES_PER_US / pps)))
            elif w[0] == "table_add" and w[1] == "IncastIngress.l2_forward":
                mac, port = bmv2.mac_int(w[3]), int(w[5]) - 1
                writes += [(rtl.MAC_TABLE + 2 * self.macs, mac & 0xFFFFFFFF),
                           (rtl.MAC_TABLE + 2 * self.macs + 1, (mac >> 32) | port << 16 | 1 << 31)]
                self.macs += 1
            elif w[0] == "table_add" and w[1] == "IncastIngress.classify_dscp":
                writes.append((rtl.DSCP_MAP + int(w[3]), 0x100 | int(w[5])))
            elif w[0].startswith(("mc_", "mirroring_")):
                pass                          # floods go to every other port; postcards to 510
            else:
                raise AssertionError(f"the rtl target has no equivalent of {cmd!r}")
        self.control.write(writes)
        return ""

    def counter(self, name, index):
        base, kind = self.COUNTERS[name]
        return self.control.read([base + self._index(kind, index)])[0], 0

    def register(self, name, index):
        base, kind = self.REGISTERS[name]
        return self.control.read([base + self._index(kind, index)])[0]

    def close(self):
        self.control.close()
        self.proc.terminate()
        self.proc.wait()
        for s in self.socks.values():
            s.close()
        self.pool.shutdown()
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)


def _require_rtl():
    from incast.dataplane import rtl
    try:
        return rtl.build_model(NPORTS, 13)
    except MissingFeature as e:
        pytest.skip(str(e))


@pytest.fixture(params=["bmv2", "rtl"])
def rig(request):
    if request.param == "rtl" and os.environ.get("INCAST_P4_PROGRAM"):
        pytest.skip("a P4 program under test (INCAST_P4_PROGRAM) runs on bmv2 only")
    r = Rig(_require_bmv2()) if request.param == "bmv2" else RtlRig(_require_rtl())
    try:
        yield r
    finally:
        r.close()


def udp(src, dst, dscp=0, size=100, ecn=0):
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.compat import raw
    pkt = Ether(src=MACS[src], dst=MACS[dst]) / IP(src=f"10.0.0.{src}", dst=f"10.0.0.{dst}", tos=dscp << 2 | ecn) / \
        UDP(sport=1000 + src, dport=2000) / (b"x" * size)
    return raw(pkt)


def test_forwards_to_the_learned_port_only(rig):
    rig.send(1, udp(1, 3))
    assert len(rig.receive(3, count=1)) == 1
    assert rig.receive(2, timeout=0.2) == [] and rig.receive(4, timeout=0.2) == []


def test_classifies_dscp_into_class_queues(rig):
    for dscp, cls in ((0, 0), (8, 1), (16, 2), (46, 0)):
        before = rig.counter("IncastEgress.tx", 3 * 8 + cls)[0]
        rig.send(1, udp(1, 3, dscp=dscp))
        assert len(rig.receive(3, count=1)) == 1
        assert rig.counter("IncastEgress.tx", 3 * 8 + cls)[0] == before + 1, (dscp, cls)


def test_ecn_marks_capable_packets_above_k_with_a_valid_checksum(rig):
    """K = 3000 bytes: a frame that finds more than K in its class queue leaves marked
    CE if it is ECN-capable, unchanged if not; the switch recomputes the IPv4 checksum
    of what it marked and counts the marks."""
    from scapy.layers.l2 import Ether
    k = 3000
    rig.settings(ecn_k=k)
    rig.cli(["set_queue_rate 50 2 7"])
    frames = [udp(1, 2, size=1000, ecn=2 if i % 3 else 0) for i in range(12)]   # 1042 B, every 3rd not ECT
    for f in frames:
        rig.send(1, f)
    got = [Ether(f) for f in rig.receive(2, timeout=1.5, count=12)]
    # every frame before it still queued (50 pps: none has left)
    marked = check_ecn_marks(frames, got, k, ahead=lambda i: i)
    assert marked == 6 and rig.counter("IncastIngress.ecn_marks", 2 * 8)[0] == marked


def test_byte_limit_admission_and_drop_counter(rig):
    frame = udp(1, 2, size=1000)                 # 1042-byte frames
    limit = 5000                                 # room for 4 of them
    rig.queue(2, 0, limit=limit)
    rig.cli(["set_queue_rate 50 2 7"])
    for _ in range(20):
        rig.send(1, frame)
    got = rig.receive(2, timeout=1.5)
    drops = rig.counter("IncastIngress.drops", 2 * 8)[0]
    assert drops > 0
    assert len(got) + drops == 20
    assert rig.register("occ_bytes", 2 * 8) == 0   # everything admitted has left
    assert len(got) >= limit // len(frame)


def test_a_shared_pool_caps_a_lone_queue_at_its_dynamic_threshold(rig):
    """A 20000-byte pool with alpha 1: a lone busy queue may hold at most the free pool
    (alpha x (pool - used)), so it stops near half the pool, below its own cap of 50000; the pool counts every admitted byte and gives them all back."""
    frame = udp(1, 2, size=1000)                 # 1042-byte frames
    rig.queue(2, 0, limit=50000)
    rig.settings(pool_bytes=20000, pool_alpha16=16)
    rig.cli(["set_queue_rate 20 2 7"])
    for _ in range(30):
        rig.send(1, frame)
    got = rig.receive(2, timeout=2.5)
    drops = rig.counter("IncastIngress.drops", 2 * 8)[0]
    most = rig.register("pool_max_bytes", 0)
    # A frame is admitted while q + 1042 <= 20000 - q (q: the queue, and the pool, before
    # it): the 10th (9378 + 1042 <= 10622) is, the 11th is not: 10 frames, 10420 bytes.
    assert most == 10 * len(frame), most
    assert len(got) + drops == 30 and drops > 0
    assert rig.register("pool_used", 0) == 0 and rig.register("occ_bytes", 2 * 8) == 0


def test_a_shared_pool_divides_between_busy_queues(rig):
    """Two busy queues under alpha 2 share the pool: each may hold 2 x the free pool,
    so together they stop where q = 2 (P - 2q), q = 2P/5 each, far below either
    queue's own cap (50000), and the pool never holds more than its size."""
    frame = udp(1, 2, size=1000)
    other = udp(1, 3, size=1000)
    pool = 30000
    rig.queue(2, 0, limit=50000)
    rig.queue(3, 0, limit=50000)
    rig.settings(pool_bytes=pool, pool_alpha16=32)
    rig.cli(["set_queue_rate 10 2 7", "set_queue_rate 10 3 7"])
    for _ in range(30):
        rig.send(1, frame)
        rig.send(1, other)
    got = rig.receive(2, timeout=2.5) + rig.receive(3, timeout=0.5)
    most = rig.register("pool_max_bytes", 0)
    # Both queues at 2P/5 = 12000 bytes, less what a whole frame leaves unused.
    assert 4 * pool / 5 - 4 * len(frame) <= most <= 4 * pool / 5, most
    drops = [rig.counter("IncastIngress.drops", n * 8)[0] for n in (2, 3)]
    assert min(drops) > 0 and len(got) + sum(drops) == 60, (len(got), drops)
    assert rig.register("pool_used", 0) == 0


def numbered(src: int, dst: int, seq: int, dscp: int, length: int) -> bytes:
    """A UDP frame of `length` bytes (Ethernet header included) carrying its number."""
    from scapy.compat import raw
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    head = Ether(src=MACS[src], dst=MACS[dst]) / IP(src=f"10.0.0.{src}", dst=f"10.0.0.{dst}", tos=dscp << 2) / \
        UDP(sport=1000 + src, dport=2000)
    body = seq.to_bytes(4, "big")
    return raw(head / (body + b"x" * (length - len(raw(head)) - len(body))))


@pytest.mark.parametrize("case", POOL_CASES, ids=[c.name for c in POOL_CASES])
def test_a_shared_pool_admits_what_the_pool_rule_admits(rig, case):
    """tests/pool_cases.py's arrivals (its ports 1-3 are ports 2-4 here, fed from port 1),
    every queue they go to held by a PAUSE while they arrive: the switch admits exactly
    the frames the rule admits, as the linux data plane does (tests/test_shared_pool.py);
    the pool counts them, and gives every byte back once they have left."""
    from scapy.compat import raw
    from scapy.contrib.mac_control import MACControlPause
    from scapy.layers.l2 import Ether
    from incast.scenario import build
    caps = build({}, {"dataplane": "bmv2", **case.overrides}).switch.class_limits(1500)
    ports = sorted({p + 1 for p, _, _ in case.arrivals})
    obey(rig)                                                   # a quantum: 1 ms
    for p in ports:
        for c, cap in enumerate(caps):
            rig.queue(p, c, limit=cap)
    rig.settings(pool_bytes=case.size, pool_alpha16=case.alpha16)
    for p in ports:                                             # held for 1.5 s
        received(rig, raw(Ether(dst="01:80:c2:00:00:01", src=MACS[p]) / MACControlPause(pause_time=1500)), p,
                 "IncastIngress.pause_rx")
    for seq, (p, c, n) in enumerate(case.arrivals):
        rig.send(1, numbered(1, p + 1, seq, 8 * c, n))
    got = {}
    for p in ports:
        for f in rig.receive(p, timeout=4.0):
            got[int.from_bytes(f[42:46], "big")] = p
    want, most = pool_admitted(case, caps)
    assert sorted(got) == [i for i, ok in enumerate(want) if ok]
    assert all(got[i] == case.arrivals[i][0] + 1 for i in got)
    drops = sum(rig.counter("IncastIngress.drops", p * 8 + c)[0] for p in ports for c in range(len(caps)))
    assert drops == len(case.arrivals) - len(got)
    assert rig.register("pool_max_bytes", 0) == most and rig.register("pool_used", 0) == 0


def test_pause_at_xoff_and_xon_byte_exact(rig):
    from scapy.compat import raw
    from scapy.contrib.mac_control import MACControlPause
    from scapy.layers.l2 import Ether
    frame = udp(1, 2, size=1000)
    rig.settings(pause_on=1, xoff=3000, xon=1500, quanta=4660, pause_us=1000000, refresh_us=1000)
    rig.cli(["set_queue_rate 100 2 7"])
    for _ in range(6):
        rig.send(1, frame)
    seen = {n: rig.receive(n, timeout=1.5 if n == 1 else 0.2) for n in (1, 3, 4)}
    for n, pauses in seen.items():   # every host port but the congested one (2)
        expected_xoff = raw(Ether(dst="01:80:c2:00:00:01", src=SWITCH_MACS[n]) / MACControlPause(pause_time=4660))
        expected_xon = raw(Ether(dst="01:80:c2:00:00:01", src=SWITCH_MACS[n]) / MACControlPause(pause_time=0))
        assert expected_xoff in pauses, (n, [p.hex() for p in pauses])
        assert expected_xon in pauses, n
        assert pauses.index(expected_xoff) < pauses.index(expected_xon)
        assert all(len(p) == 60 for p in pauses)
    got = rig.receive(2, timeout=0.5)
    assert len(got) == 6 and all(g == frame for g in got)   # no PAUSE toward the congested port


def test_xon_waits_for_the_congested_port(rig):
    """Traffic leaving an idle port (the client's ACKs toward a server) must not end
    a pause that a congested port started: XON is per congested port."""
    rig.settings(pause_on=1, xoff=3000, xon=1500, quanta=4660, pause_us=1000000, refresh_us=1000)
    rig.cli(["set_queue_rate 1 2 7"])   # port 2 drains one frame a second
    for _ in range(4):
        rig.send(1, udp(1, 2, size=1000))
    first = rig.receive(4, timeout=0.3)
    assert [len(f) for f in first] == [60] and first[0][16:18] == b"\x12\x34", [f.hex() for f in first]
    rig.send(1, udp(1, 3, size=1000))   # leaves port 3 at once, its queue empty
    assert len([f for f in rig.receive(3, timeout=0.3) if f[12:14] == b"\x08\x00"]) == 1
    assert rig.receive(4, timeout=0.3) == []   # no quanta 0 while port 2 is still full
    assert rig.register("congested_ports", 0) == 1 and rig.register("congested", 2) == 1


def test_pfc_pauses_only_the_congested_class(rig):
    """PFC: class 1's queue at port 2 passes its own XOFF; every other port gets a PFC
    frame naming class 1 alone, and quanta 0 for it at XON. Class 0 filling the same
    port further (below its own XOFF) pauses nothing."""
    from scapy.compat import raw
    from scapy.contrib.mac_control import MACControlClassBasedFlowControl
    from scapy.layers.l2 import Ether
    rig.settings(pause_on=1, pfc=1, quanta=4660, pause_us=1000000, refresh_us=1000)
    rig.cli(["set_queue_rate 100 2 6", "set_queue_rate 100 2 7"])
    for port in range(1, NPORTS + 1):   # class 1 at port 2: XOFF 3000 B, XON 1500 B; the rest far
        for cls in range(8):
            xoff, xon = (3000, 1500) if (port, cls) == (2, 1) else (30000, 15000)
            rig.queue(port, cls, xoff=xoff, xon=xon)
    for _ in range(6):   # class 0: 6000 B at port 2, above class 1's XOFF but not its own
        rig.send(1, udp(1, 2, size=1000))
    assert [f for f in rig.receive(3, timeout=0.3) if f[12:14] == b"\x88\x08"] == []
    rig.receive(2, timeout=0.5)
    for _ in range(6):
        rig.send(1, udp(1, 2, dscp=8, size=1000))
    seen = {n: rig.receive(n, timeout=1.5 if n == 1 else 0.2) for n in (1, 3, 4)}
    for n, frames in seen.items():
        pfc = [f for f in frames if f[12:14] == b"\x88\x08"]
        hold = raw(Ether(dst="01:80:c2:00:00:01", src=SWITCH_MACS[n]) /
                   MACControlClassBasedFlowControl(c1_enabled=1, c1_pause_time=4660))
        release = raw(Ether(dst="01:80:c2:00:00:01", src=SWITCH_MACS[n]) /
                      MACControlClassBasedFlowControl(c1_enabled=1, c1_pause_time=0))
        assert pfc == [hold, release], (n, [f.hex() for f in pfc])
        assert all(len(f) == 60 for f in pfc)
    got = rig.receive(2, timeout=0.5)
    assert [f[12:14] for f in got] == [b"\x08\x00"] * 6   # none toward the congested port
    assert rig.register("congested_queues", 1) == 0 and rig.register("queue_congested", 2 * 8 + 1) == 0


def test_pause_and_pfc_are_never_forwarded(rig):
    from scapy.compat import raw
    from scapy.contrib.mac_control import MACControlClassBasedFlowControl, MACControlPause
    from scapy.layers.l2 import Ether
    pause = raw(Ether(dst="01:80:c2:00:00:01", src=MACS[1]) / MACControlPause(pause_time=100))
    pfc = raw(Ether(dst="01:80:c2:00:00:01", src=MACS[1]) / MACControlClassBasedFlowControl(c0_enabled=1, c0_pause_time=5))
    to_host = raw(Ether(dst=MACS[3], src=MACS[1], type=0x8808) / MACControlPause(pause_time=100))
    for frame in (pause, pfc, to_host):
        rig.send(1, frame)
    for port in (2, 3, 4):
        assert rig.receive(port, timeout=0.3) == []
    assert rig.counter("IncastIngress.mac_control_rx", 1)[0] == 3


def obey(rig, quantum_ms=1):
    """The switch obeys PAUSE and PFC, a quantum lasting quantum_ms; its hold loop
    paced at 1000 frames a second (a round of it: 1 ms)."""
    rig.settings(obey=1, quantum_us1024=quantum_ms * 1024000)
    rig.cli([f"set_queue_rate 1000 {bmv2.HOLD_PORT} {p}" for p in range(8)])


def received(rig, frame, port, counter):
    """Send a PAUSE/PFC frame into port and wait until the switch has counted it: the
    switch reads each port in its own thread, so a frame sent next into another port
    could otherwise reach the pipeline first."""
    before = rig.counter(counter, port)[0]
    rig.send(port, frame)
    deadline = time.monotonic() + 5
    while rig.counter(counter, port)[0] == before:
        assert time.monotonic() < deadline, f"the switch never counted the frame in {counter}"


def test_a_paused_port_holds_its_frames_in_order_until_the_pause_ends(rig):
    """A PAUSE received at port 2 holds what is admitted for port 2 (in the hold loop,
    counted in its buffer) for the quanta it names; port 3 flows on; when the pause
    expires the frames leave in the order they came."""
    from scapy.compat import raw
    from scapy.contrib.mac_control import MACControlPause
    from scapy.layers.l2 import Ether
    obey(rig)
    t0 = time.monotonic()
    received(rig, raw(Ether(dst="01:80:c2:00:00:01", src=MACS[2]) / MACControlPause(pause_time=2000)), 2,
             "IncastIngress.pause_rx")
    frames = [udp(1, 2, size=100 + i) for i in range(3)]
    for f in frames:
        rig.send(1, f)
    rig.send(1, udp(1, 3))
    assert len(rig.receive(3, timeout=0.2)) == 1          # another port: not paused
    assert rig.receive(2, timeout=0.15) == []              # held
    assert rig.register("occ_bytes", 2 * 8) == sum(len(f) for f in frames)
    got = rig.receive(2, timeout=5, count=3)
    assert got == frames and time.monotonic() - t0 > 1.9, (len(got), time.monotonic() - t0)   # 2 s
    assert rig.register("occ_bytes", 2 * 8) == 0
    if rig.target == "bmv2":   # its hold loop: where the frames waited, and for how long
        assert rig.counter("IncastIngress.held", 2 * 8)[0] == 3
        assert rig.register("hold_head", 2 * 8) == rig.register("hold_tail", 2 * 8) == 3   # the loop is empty
        assert rig.register("rx_held_us", 2 * 8) + rig.register("rx_until", 2 * 8) \
            - rig.register("rx_mark", 2 * 8) == 2_000_000


def test_quanta_zero_ends_a_pause_at_once(rig):
    from scapy.compat import raw
    from scapy.contrib.mac_control import MACControlPause
    from scapy.layers.l2 import Ether
    obey(rig)
    pause = lambda q: raw(Ether(dst="01:80:c2:00:00:01", src=MACS[2]) / MACControlPause(pause_time=q))  # noqa: E731
    received(rig, pause(65535), 2, "IncastIngress.pause_rx")     # 65 s
    rig.send(1, udp(1, 2))
    assert rig.receive(2, timeout=0.2) == []
    received(rig, pause(0), 2, "IncastIngress.xon_rx")
    assert rig.receive(2, timeout=0.5) == [udp(1, 2)]


def test_pfc_received_holds_only_the_class_it_names(rig):
    from scapy.compat import raw
    from scapy.contrib.mac_control import MACControlClassBasedFlowControl
    from scapy.layers.l2 import Ether
    obey(rig)
    pfc = lambda q: raw(Ether(dst="01:80:c2:00:00:01", src=MACS[2]) /  # noqa: E731
                        MACControlClassBasedFlowControl(c1_enabled=1, c1_pause_time=q))
    received(rig, pfc(65535), 2, "IncastIngress.pause_rx")
    rig.send(1, udp(1, 2, dscp=8))                         # class 1: held
    rig.send(1, udp(1, 2))                                 # class 0: flows
    assert rig.receive(2, timeout=0.3) == [udp(1, 2)]
    if rig.target == "bmv2":   # the held frame is in its hold loop
        assert rig.register("hold_tail", 2 * 8 + 1) - rig.register("hold_head", 2 * 8 + 1) == 1
    received(rig, pfc(0), 2, "IncastIngress.xon_rx")
    assert rig.receive(2, timeout=0.5) == [udp(1, 2, dscp=8)]


def test_telemetry_carries_the_packets_queue_values(rig):
    """Each postcard is an INT telemetry report (v2.0) over UDP to the collector, with a
    valid IPv4 header, lengths that count what follows, and the packet's queue state."""
    from scapy.layers.inet import IP
    from scapy.layers.l2 import Ether
    rig.settings(tel_mode=1)
    rig.cli(["set_queue_rate 200 3 6"])
    for _ in range(5):
        rig.send(1, udp(1, 3, dscp=8, size=500))
    frames = rig.receive(510, timeout=1.0, count=5)
    assert len(frames) == 5
    groups, recs = zip(*[check_report_frame(f) for f in frames])
    assert [g.seq for g in groups] == list(range(groups[0].seq, groups[0].seq + 5))
    for r in recs:
        assert r.rep_type == 1 and r.in_type == 3 and r.md_len == 17 and r.tracked_flow == 1
        assert r.ingress_port == 1 and r.egress_port == 3 and r.queue == 1 and r.dropped == 0
        assert r.pkt_len == 542 and r.saddr == 0x0A000001 and r.daddr == 0x0A000003
        # (no tighter bound: bmv2 reads its clock once for egress_ts and again for the
        # hop latency, and a thread preempted between the two reads makes the latency
        # the longer one; simple_switch.cpp, egress_thread)
        assert r.egress_ts >= r.ingress_ts
        assert r.queue_occupancy == r.occ_enq_bytes
        assert r[Ether][IP].src == "10.0.0.1"                                 # the packet's own headers follow
    # The queue built up: later packets saw more bytes ahead of them at enqueue, and waited longer.
    assert recs[-1].hop_latency > recs[0].hop_latency
    assert recs[-1].occ_enq_bytes > recs[0].occ_enq_bytes or recs[-1].enq_qdepth > recs[0].enq_qdepth
    assert max(r.occ_enq_bytes for r in recs) <= 5 * 542


def test_telemetry_reports_read_alike_by_scapy_the_collector_and_tshark(rig, tmp_path):
    """The switch's own reports, written to a pcap: the collector's bulk decoder and tshark
    with the testbed's dissector read the same values as the Scapy layers."""
    from scapy.layers.l2 import Ether
    from incast.measure.postcards import TELEMETRY_FRAME
    from incast.p4.layers import IntReport, TelemetryReport, decode_records
    rig.settings(tel_mode=1)
    for i in range(4):
        rig.send(1, udp(1, 3, dscp=8, size=300 + 100 * i))
    frames = rig.receive(510, timeout=1.0, count=4)
    assert len(frames) == 4
    cols = decode_records(b"".join(f.ljust(TELEMETRY_FRAME, b"\0")[:TELEMETRY_FRAME] for f in frames), TELEMETRY_FRAME)
    names = ["seq", "node_id", "ingress_port", "egress_port", "queue", "hop_latency", "ingress_ts", "egress_ts",
             "occ_enq_bytes", "occ_deq_bytes", "pkt_len"]
    scapy_rows = [[getattr(Ether(f)[TelemetryReport] if n in ("seq", "node_id") else Ether(f)[IntReport], n)
                   for n in names] for f in frames]
    assert [[int(cols[n][i]) for n in names] for i in range(4)] == scapy_rows
    rows = tshark_fields(frames, names, tmp_path)
    if rows is None:
        pytest.skip("tshark is not installed (scripts/setup.sh installs it)")
    assert [[int(v) for v in row] for row in rows] == scapy_rows


def test_telemetry_above_a_threshold_records_only_the_burst(rig):
    """Sampling above:SIZE: a postcard for each packet that found its class queue at or
    above SIZE bytes, none for those that found it lower."""
    from scapy.layers.l2 import Ether
    from incast.p4.layers import IntReport
    threshold = 1500                             # the third 542-byte frame reaches it
    rig.settings(tel_mode=4, tel_threshold=threshold)
    rig.cli(["set_queue_rate 20 3 6"])
    for _ in range(6):                           # 50 ms per frame out: the queue only grows
        rig.send(1, udp(1, 3, dscp=8, size=500))
    recs = [Ether(f)[IntReport] for f in rig.receive(510, timeout=1.0)]
    assert 3 <= len(recs) <= 4, [r.occ_enq_bytes for r in recs]   # 4 if one frame left early
    assert all(r.occ_enq_bytes >= threshold for r in recs), [r.occ_enq_bytes for r in recs]
    assert all(r.egress_ts > r.ingress_ts for r in recs)     # each waited its turn
    left_behind = [r.occ_deq_bytes for r in recs]             # the queue drains as they leave
    assert left_behind == sorted(left_behind, reverse=True) and left_behind[-1] == 0, left_behind
    assert len(rig.receive(3, timeout=0.5)) == 6          # sampling chooses postcards, not packets


def test_garbage_never_crashes_or_wedges_the_switch(rig):
    junk = [b"\x00", b"\xff" * 13, os.urandom(60), os.urandom(1500),
            udp(1, 3)[:20], udp(1, 3)[:34],                  # truncated inside IPv4
            bytes.fromhex("0180c2000001") + bytes(6) + b"\x88\x08",   # MAC Control, no opcode
            udp(1, 3, size=8000)]                            # oversized (jumbo) frame
    for frame in junk * 5:
        try:
            rig.send(1, frame)
        except OSError:
            pass   # the kernel refuses some of these itself
    assert rig.alive()
    rig.receive(3, timeout=0.3)
    rig.send(1, udp(1, 3))
    assert len(rig.receive(3, count=1)) == 1
