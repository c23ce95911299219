"""The ``bmv2`` data plane: each switch is a ``simple_switch`` running p4src/incast.p4.

Where the queue is. bmv2 keeps its egress queues itself (depth in packets, rate in
packets per second per priority queue). The P4 program decides admission against
byte limits of its own, so the buffer is exact in bytes; bmv2's depth is set above
that as a backstop. The switch's veth ports have no qdisc that could queue (they are
plain veth, noqueue), so bmv2's queue is the only one on the path through the switch.

Known limits of bmv2 that the design follows: rates are packets per second, set per
priority queue (so with traffic in several classes at once a port can exceed its
link rate); a refused packet is invisible to bmv2's own counters (incast.p4 counts
it); a queue cannot be held for PAUSE or PFC (bmv2 fixes a packet's departure time
when it enters the queue, so no later command can hold it). The program obeys PAUSE
and PFC at its ports with a hold loop instead: each switch has a veth pair from port
HOLD_PORT back to HOLD_RETURN_PORT, and a packet for a paused (port, class) goes round
it, paced at the link rate, until the pause ends, still counted in its port's buffer
(so PAUSE spreads from switch to switch). What the paused port's egress queue already
held still leaves. Hosts obey PAUSE through hosts/pause_agent.py (their kernel's plug,
where it can obey PAUSE itself: incast/network/flow_control.py).

How a switch is programmed. Where simple_switch_grpc is on PATH (and the P4Runtime
client library, finsy, is installed), each switch is a simple_switch_grpc started
without a program; the plane connects to it as its P4Runtime controller
(incast.dataplane.bmv2_runtime), pushes the pipeline, writes the tables' entries and
default actions, the multicast groups and the clone sessions, and reads the counters
and registers, all over P4Runtime. The egress queues' depth and rate, which P4Runtime
has no entity for, are given to the switch at start in a file (--queue-config), so the
switch is started only once the plane knows its ports (configure), and no Thrift
session is opened. Both need the patches scripts/install-p4.sh --grpc applies
(scripts/p4-patches/); a simple_switch_grpc without them (queue_config_supported)
starts with the network and gets its queues and register reads over its Thrift
session (simple_switch_CLI). Without simple_switch_grpc, or with
INCAST_BMV2_CONTROL=thrift, every command goes over Thrift. The run's switch_control
says which of the three it was.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import select
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd
from mininet.node import Switch

from incast.constants import ETH_HLEN, WIRE_OVERHEAD
from incast.dataplane import DataPlane, Port, port_rate, switch_ports
from incast.dataplane import bmv2_runtime as p4rt
from incast.dataplane.bmv2_runtime import Clone, Entry, Group
from incast.dataplane.forwarding import flood_ports, next_hops
from incast.errors import MissingFeature
from incast.machine import netdev
from incast.measure.postcards import PostcardCollector
from incast.network import flow_control
from incast.p4 import program as p4program

P4_SOURCE = p4program.SOURCE
from incast.constants import P4_BUILD_DIR as BUILD_DIR

MIN_VERSION = (1, 15, 1)          # per-priority queue depth/rate and the priority fix
PRIORITY_QUEUES = 8
TELEMETRY_PORT = 510
HOLD_PORT = p4program.constants()["HOLD_PORT"]
HOLD_RETURN_PORT = p4program.constants()["HOLD_RETURN_PORT"]
HOLD_SPEEDUP = 4
HOLD_MTU = 9000 + p4program.constants()["HOLD_TAG_BYTES"]   # 9000: link.mtu's largest
# Shared with the P4 program: read from its source (incast.p4program).
TELEMETRY_SESSION = p4program.constants()["TELEMETRY_SESSION"]
PAUSE_MC_SESSION = p4program.constants()["PAUSE_MC_SESSION"]
# The switch's settings: action configure's parameters, the default action of a table
# in ingress and one in egress; a queue's (configure_queue) are entries keyed by its
# index in two tables; a port's MAC an entry of port_config. Set by name (the P4 source's,
# as the P4Info has them), never by place.
SETTINGS = p4program.config_fields()
QUEUE_SETTINGS = p4program.action_params("configure_queue")
SETTINGS_TABLES = ("IncastIngress.switch_config", "IncastEgress.egress_switch_config")
QUEUE_TABLES = ("IncastIngress.queue_config", "IncastEgress.egress_queue_config")
PORT_TABLE = "IncastEgress.port_config"
THRIFT_BASE_PORT = 9090
P4INFO_NAME = "incast.p4info.txt"       # p4c's P4Info, beside the JSON (compile_program)
# A packet that waits longer than this between arriving at bmv2 and entering its egress
# queue is late: bmv2's input queue, not the P4 buffer, is holding traffic. A run in
# which more than LATE_SHARE of the packets are late says so.
LATE_US = 1000
LATE_SHARE = 0.05


def tool(name: str) -> str | None:
    return shutil.which(name)


def runtime_missing() -> str | None:
    """Why the switches are programmed over Thrift alone, or None: P4Runtime is used
    where simple_switch_grpc is on PATH and the client library is installed, unless
    INCAST_BMV2_CONTROL=thrift."""
    if os.environ.get("INCAST_BMV2_CONTROL", "") == "thrift":
        return "INCAST_BMV2_CONTROL=thrift"
    if not tool("simple_switch_grpc"):
        return "simple_switch_grpc is not on PATH"
    return p4rt.missing()


@functools.cache
def queue_config_supported(exe: str | None = None) -> bool:
    """Whether simple_switch_grpc takes its egress queues from a file at start
    (--queue-config; scripts/p4-patches/, whose PI patch serves register reads over
    P4Runtime too): then a switch is programmed through P4Runtime alone. --help lists
    the target's own options too."""
    exe = exe or tool("simple_switch_grpc")
    if not exe:
        return False
    r = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    return "--queue-config" in r.stdout + r.stderr


def tool_version(exe: str) -> tuple[str, str]:
    """(the first version number a tool's --version prints, or "", all it printed).
    Both streams: simple_switch prints "1.15.5-unknown" on stdout, p4c-bm2-ss its name
    on stdout and "Version 1.2.3.7" on stderr (whatever else stderr carries is left out,
    and may differ inside a guest)."""
    r = subprocess.run([exe, "--version"], capture_output=True, text=True)
    out = (r.stdout + r.stderr).strip()
    m = re.search(r"\d+(\.\d+){2,3}", out)
    return (m.group(0) if m else ""), out


def bmv2_version() -> tuple[int, ...]:
    exe = tool("simple_switch")
    if not exe:
        raise MissingFeature("bmv2 is not installed: simple_switch is not on PATH "
                             "(scripts/install-p4.sh installs it; the Vagrant box has it)")
    number, out = tool_version(exe)
    if not number:
        raise MissingFeature(f"cannot tell bmv2's version from {out!r}")
    version = tuple(int(x) for x in number.split(".")[:3])
    if version < MIN_VERSION:
        raise MissingFeature(f"bmv2 {out} is too old: {'.'.join(map(str, MIN_VERSION))} or newer is needed "
                             "(per-priority queue depth and rate)")
    return version


def compile_program(program: Path = P4_SOURCE) -> Path:
    """p4c-bm2-ss output for p4src/incast.p4 (or another program: a lab's), built once
    per source and compiler."""
    p4c = tool("p4c-bm2-ss")
    source = program.read_bytes()
    if p4c:
        version = tool_version(p4c)[0]
        key = hashlib.sha256(source + version.encode()).hexdigest()[:16]
    else:
        key = None
    out_dir = BUILD_DIR / (key or "none")
    json_path = out_dir / "incast.json"
    if key and json_path.is_file():
        return json_path
    if not p4c:
        cached = sorted(BUILD_DIR.glob("*/incast.json"), key=lambda p: p.stat().st_mtime)
        src_hash = hashlib.sha256(source).hexdigest()
        for path in reversed(cached):
            stamp = path.parent / "source.sha256"
            if stamp.is_file() and stamp.read_text().strip() == src_hash:
                return path
        raise MissingFeature(f"p4c is not installed (p4c-bm2-ss not on PATH) and {program.name} "
                             "has not been compiled before")
    # A directory of this compile's own: runs side by side (--jobs) may compile the same
    # program at once, and the first to finish installs it.
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=BUILD_DIR))
    r = subprocess.run([p4c, "--std", "p4-16", "--arch", "v1model", "-o", str(tmp / "incast.json"),
                        "--p4runtime-files", str(tmp / P4INFO_NAME), str(program)],
                       capture_output=True, text=True)
    if r.returncode:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"p4c failed on {program}: {r.stderr.strip()[-2000:]}")
    (tmp / "source.sha256").write_text(hashlib.sha256(source).hexdigest() + "\n")
    if not json_path.is_file():                     # no other compile installed it meanwhile
        shutil.rmtree(out_dir, ignore_errors=True)  # what a killed compile left
        try:
            tmp.rename(out_dir)
        except OSError:                             # another compile installed it just now
            if not json_path.is_file():
                raise
    shutil.rmtree(tmp, ignore_errors=True)
    return json_path


class Bmv2Switch(Switch):
    """A Mininet switch that is a simple_switch process running incast.p4.

    Port n of the switch is Mininet's port n; port 510 is the telemetry port, a veth
    whose other end (<name>-telc) the collector reads; ports 508 and 509 are the two
    ends of its hold loop (<name>-hold, <name>-holdr), where packets for a paused port
    wait."""

    def __init__(self, name, json_path=None, device_id=0, log_dir=None, p4runtime=False, **params):
        Switch.__init__(self, name, **params)
        # P4Runtime alone: the queues from a file at start, registers over P4Runtime.
        self.runtime_only = p4runtime and queue_config_supported()
        self.json_path = json_path
        self.device_id = device_id
        self.thrift_port = THRIFT_BASE_PORT + device_id
        self.log_dir = Path(log_dir) if log_dir else None
        self.proc = None
        self.session: CliSession | None = None
        # P4Runtime: simple_switch_grpc, its server on a Unix socket named for the run
        # and the switch (as its notification socket): no port to choose, and only
        # root may connect. Each switch of a run has its own device id.
        self.p4runtime = p4runtime
        self.runtime: p4rt.Runtime | None = None
        self.grpc_path = f"/run/incast/{os.environ.get('INCAST_RUN', 'incast')}-{name}.grpc"
        self.grpc_address = f"unix:{self.grpc_path}"
        self.tel_intf = f"{name}-tel"
        self.collector_intf = f"{name}-telc"
        self.hold_intf = f"{name}-hold"
        self.hold_return_intf = f"{name}-holdr"

    def start(self, controllers):
        """The switch's extra ports, and its process, unless it is to be programmed
        through P4Runtime alone: then the plane starts it (launch) once it knows the
        queues to give it."""
        netdev.add_veth(self.tel_intf, self.collector_intf)
        netdev.add_veth(self.hold_intf, self.hold_return_intf)
        ports = [(self.ports[i], i.name) for i in self.intfList() if i.name != "lo"]
        links = [n for _, n in ports] + [self.tel_intf, self.collector_intf, self.hold_intf, self.hold_return_intf]
        # A frame in the hold loop carries a tag in front: room for it above the largest
        # link.mtu (a packet socket refuses a frame longer than the MTU and its header).
        netdev.batch("ip", [f"link set dev {n} mtu {HOLD_MTU}" for n in (self.hold_intf, self.hold_return_intf)])
        netdev.set_up(links)
        netdev.offloads_off(links)
        if not self.runtime_only:
            self.launch()

    def launch(self, queue_lines: list[str] | None = None) -> None:
        """Start the switch process; with P4Runtime, connect to it as its primary and
        push the program. queue_lines: set_queue_depth and set_queue_rate lines, its
        --queue-config file (runtime_only)."""
        ports = [(self.ports[i], i.name) for i in self.intfList() if i.name != "lo"]
        args = [tool("simple_switch_grpc" if self.p4runtime else "simple_switch"), "--device-id",
                str(self.device_id), "--thrift-port", str(self.thrift_port), "--log-console", "-L", "info"]
        for number, intf in sorted(ports):
            args += ["-i", f"{number}@{intf}"]
        # bmv2's nanomsg notification socket is a file: one per switch of this run.
        self.notify = f"/run/incast/{os.environ.get('INCAST_RUN', 'incast')}-{self.name}.notify"
        args += ["-i", f"{HOLD_PORT}@{self.hold_intf}", "-i", f"{HOLD_RETURN_PORT}@{self.hold_return_intf}",
                 "-i", f"{TELEMETRY_PORT}@{self.tel_intf}", "--notifications-addr", f"ipc://{self.notify}"]
        if self.p4runtime:      # the program comes over P4Runtime
            Path(self.grpc_path).unlink(missing_ok=True)
            args += ["--no-p4", "--", "--grpc-server-addr", self.grpc_address]
            if queue_lines is not None:
                self.queue_path = Path(f"{self.grpc_path[:-len('.grpc')]}.queues")
                self.queue_path.write_text("\n".join(queue_lines) + "\n")
                args += ["--queue-config", str(self.queue_path)]
        else:
            args += [str(self.json_path), "--"]
        args += ["--priority-queues", str(PRIORITY_QUEUES)]
        log = open(self.log_dir / f"{self.name}.bmv2.log", "wb") if self.log_dir else subprocess.DEVNULL
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        ready, started, tail = threading.Event(), threading.Event(), []

        def pump():
            for line in self.proc.stdout:
                if log is not subprocess.DEVNULL:
                    log.write(line)
                    log.flush()
                tail[:] = tail[-9:] + [line]
                if b"Thrift server was started" in line:
                    started.set()
                    ready.set()
            ready.set()         # it ended first: e.g. a --queue-config line it refused
        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(60) or not started.is_set() or self.proc.poll() is not None:
            raise RuntimeError(f"simple_switch for {self.name} did not start (see {self.name}.bmv2.log): "
                               + b"".join(tail).decode(errors="replace").strip()[-500:])
        if self.p4runtime:
            # Connected as the primary for the switch's whole life; the program first,
            # before the Thrift session asks for the simple_switch service.
            self.runtime = p4rt.Runtime(self.grpc_address, self.json_path.parent / P4INFO_NAME, self.json_path,
                                        device_id=self.device_id, name=self.name).connect()
            self.runtime.push_pipeline()
        if not self.runtime_only:
            self.session = serving_session(self.name, self.thrift_port, lambda: self.proc.poll() is None)

    def stop(self, deleteIntfs=True):
        if self.runtime is not None:
            self.runtime.close()        # its counts stay readable
        if self.session is not None:
            self.session.close()
            self.session = None
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        netdev.delete_link(self.tel_intf)
        netdev.delete_link(self.hold_intf)
        Path(getattr(self, "notify", "/nonexistent")).unlink(missing_ok=True)
        if self.p4runtime:
            Path(self.grpc_path).unlink(missing_ok=True)
            Path(getattr(self, "queue_path", "/nonexistent")).unlink(missing_ok=True)
        super().stop(deleteIntfs)

    def cli(self, commands: list[str]) -> str:
        """Run simple_switch_CLI commands (Thrift, on this namespace's loopback) in this
        switch's CLI session, started at the first call (the configuration, before any
        traffic) and kept until the switch stops. Never for a switch programmed through
        P4Runtime alone."""
        if self.runtime_only:
            raise RuntimeError(f"{self.name} is programmed through P4Runtime alone: no Thrift command "
                               f"({commands[0] if commands else ''})")
        if self.session is None:
            self.session = CliSession(self.name, self.thrift_port)
        out = self.session.run(commands)
        errors = [ln for ln in out.splitlines() if "Error" in ln or "Invalid" in ln]
        if errors:
            raise RuntimeError(f"simple_switch_CLI on {self.name}: {errors[0]}")
        return out


# What simple_switch_CLI prints when the switch's Thrift server is not yet serving all it
# will: the socket not yet bound, or the simple_switch service not yet added.
NOT_YET_SERVING = ("Could not connect to thrift client", "Unknown service: simple_switch")


def serving_session(switch: str, thrift_port: int, alive, deadline_s: float = 60.0) -> "CliSession":
    """A CLI session to a switch whose Thrift server answers its simple_switch service.

    Why: bmv2 logs "Thrift server was started" before its server thread has bound the
    port, and adds the simple_switch service (queues, mirroring, clock) only after that
    line (bmv2 1.15.5: src/bm_runtime/server.cpp start_server, then
    targets/simple_switch/main.cpp add_service). A first command of that service sent in
    between fails with "TMultiplexedProcessor: Unknown service: simple_switch" and the
    CLI exits: 3 of 40 bmv2 runs of three-switches-200ms at 16-47 servers, 2 of 30 in a
    rerun, before any traffic. The service's clock query, which changes nothing, is
    asked in a fresh session until it answers."""
    deadline = time.monotonic() + deadline_s
    while True:
        session = None
        try:
            session = CliSession(switch, thrift_port)
            session.run(["get_time_elapsed"])
            return session
        except RuntimeError as e:
            if session is not None:
                session.close()
            if not any(m in str(e) for m in NOT_YET_SERVING) or not alive() or time.monotonic() > deadline:
                raise


class CliSession:
    """One simple_switch_CLI kept open: commands in on its stdin, answers read up to the
    prompt it prints before reading each next line.

    Why not one CLI per call: starting one (a Python interpreter that loads Thrift)
    stalls bmv2 in virtual time. With a flow still running across two switches, the
    counter reads at the start and end of the measurement made packets wait 273-325 us
    between bmv2's receive and its egress queue, and the frames that piled up meanwhile
    overflowed a paused switch's queue (20-44 drops a run, flagged not faithful). With
    no reads during the traffic the longest wait was 2-6 us."""

    PROMPT = b"RuntimeCmd: "
    TIMEOUT_S = 120.0

    def __init__(self, switch: str, thrift_port: int):
        self.switch = switch
        # Unbuffered: each answer must reach the pipe before the CLI waits for input.
        self.proc = subprocess.Popen([tool("simple_switch_CLI"), "--thrift-port", str(thrift_port)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        # Served only when nothing else wants the CPU: a read while packets flow then
        # waits for bmv2 instead of bmv2 for it (at normal priority the reads still
        # kept bmv2's ingress waiting up to 96-130 us in some runs; at nice 19, 24 us;
        # idle, 2-3 us, as without reads).
        try:
            os.sched_setscheduler(self.proc.pid, os.SCHED_IDLE, os.sched_param(0))
        except (AttributeError, PermissionError, OSError):
            pass
        self.pending = b""
        try:
            self._answers(1)    # its banner, up to the first prompt
        except RuntimeError:
            self.close()
            raise

    def run(self, commands: list[str]) -> str:
        # An empty line would repeat the previous command (cmd.Cmd): send none.
        commands = [c for c in (c.strip() for c in commands) if c]
        if not commands:
            return ""
        try:
            self.proc.stdin.write(("\n".join(commands) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise RuntimeError(f"simple_switch_CLI on {self.switch} exited: {self.pending.decode()[-500:]}")
        return self._answers(len(commands))

    def _answers(self, n: int) -> str:
        """Everything printed up to the n-th prompt from here."""
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + self.TIMEOUT_S
        while self.pending.count(self.PROMPT) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise RuntimeError(f"simple_switch_CLI on {self.switch} did not answer in {self.TIMEOUT_S:g} s")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self.proc.wait()
                raise RuntimeError(f"simple_switch_CLI on {self.switch} failed (exit status "
                                   f"{self.proc.returncode}): {self.pending.decode()[-500:].strip()}")
            self.pending += chunk
        parts = self.pending.split(self.PROMPT)
        self.pending = self.PROMPT.join(parts[n:])
        return b"\n".join(parts[:n]).decode()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()      # EOF ends its command loop
                self.proc.wait(timeout=10)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


def queue_index(port: int, cls: int) -> int:
    """Index of (port, class) in the program's per-queue registers and counters (its
    meta.qidx: port * 8 + class)."""
    return port * 8 + cls


@functools.cache
def _program_json(json_path: Path) -> dict:
    return json.loads(Path(json_path).read_text())


def _table(json_path: Path, table: str) -> dict:
    for pipeline in _program_json(json_path)["pipelines"]:
        for t in pipeline["tables"]:
            if t["name"] == table:
                return t
    raise LookupError(f"{Path(json_path).name} has no table {table}")


@functools.cache
def table_action(json_path: Path, table: str) -> str:
    """The name bmv2 gives the one action of a table of the compiled program (its
    Thrift commands name actions as its JSON does, and P4Runtime as its P4Info does:
    p4c gives both the same name)."""
    t = _table(json_path, table)
    if len(t["actions"]) != 1:
        raise LookupError(f"{table} has {len(t['actions'])} actions, not one")
    return t["actions"][0]


@functools.cache
def table_key(json_path: Path, table: str) -> str:
    """The name of the one match field of a table (the P4 expression it matches,
    e.g. meta.qidx: the P4Info's name of the field too)."""
    keys = [k["name"] for k in _table(json_path, table)["key"]]
    if len(keys) != 1:
        raise LookupError(f"{table} has {len(keys)} match fields, not one")
    return keys[0]


@functools.cache
def action_param(json_path: Path, action: str) -> str:
    """The name of the one parameter of an action."""
    for a in _program_json(json_path)["actions"]:
        if a["name"] == action:
            if len(a["runtime_data"]) != 1:
                raise LookupError(f"{action} has {len(a['runtime_data'])} parameters, not one")
            return a["runtime_data"][0]["name"]
    raise LookupError(f"{Path(json_path).name} has no action {action}")


def _action_args(action: str, params, settings: dict[str, int]) -> dict[str, int]:
    """An action's parameters by name in its order, from settings (one not given: 0)."""
    unknown = sorted(set(settings) - set(params))
    if unknown:
        raise ValueError(f"incast.p4's {action} has no setting {', '.join(unknown)} "
                         f"(it has {', '.join(params)})")
    return {name: int(settings.get(name, 0)) for name in params}


def settings_entries(json_path: Path, settings: dict[str, int]) -> list[Entry]:
    """The switch's settings (by name; a setting not given is 0) as the default action
    of both its settings tables."""
    args = _action_args("configure", SETTINGS, settings)
    return [Entry(t, table_action(json_path, t), args, default=True) for t in SETTINGS_TABLES]


def settings_commands(json_path: Path, settings: dict[str, int]) -> list[str]:
    return [e.cli() for e in settings_entries(json_path, settings)]


def queue_entries(json_path: Path, port: int, cls: int, **settings: int) -> list[Entry]:
    """A (port, class) queue's settings (limit, xoff, xon: bytes; one not given is 0) as
    its entry in both queue tables."""
    args = _action_args("configure_queue", QUEUE_SETTINGS, settings)
    return [Entry(t, table_action(json_path, t), args, match={table_key(json_path, t): queue_index(port, cls)})
            for t in QUEUE_TABLES]


def queue_commands(json_path: Path, port: int, cls: int, **settings: int) -> list[str]:
    return [e.cli() for e in queue_entries(json_path, port, cls, **settings)]


def port_mac_entry(json_path: Path, port: int, mac: str) -> Entry:
    """The source address of the PAUSE and PFC frames port sends."""
    return table_entry(json_path, PORT_TABLE, table_action(json_path, PORT_TABLE), port, mac_int(mac))


def port_mac_command(json_path: Path, port: int, mac: str) -> str:
    return port_mac_entry(json_path, port, mac).cli()


def table_entry(json_path: Path, table: str, action: str, key, value) -> Entry:
    """An entry of a table with one match field whose action has one parameter."""
    return Entry(table, action, {action_param(json_path, action): value}, match={table_key(json_path, table): key})


def link_pps(rate_bps: int, mtu: int) -> int:
    """bmv2 paces queues in packets per second: full-size frames at the link rate."""
    return max(1, int(rate_bps / (8 * (mtu + ETH_HLEN + WIRE_OVERHEAD))))


def mac_int(mac: str) -> int:
    return int(mac.replace(":", ""), 16)


class Bmv2DataPlane(DataPlane):
    name = "bmv2"
    pause_ports: pd.DataFrame | None = None     # stop_flow_control's report: one row per port

    @classmethod
    def host_missing(cls, scenario) -> str | None:
        try:
            bmv2_version()
        except MissingFeature as e:
            return str(e)
        if not tool("simple_switch_CLI") and not (runtime_missing() is None and queue_config_supported()):
            return "simple_switch_CLI is not on PATH (it comes with bmv2)"
        return None

    @classmethod
    def require(cls, features, scenario) -> list[str]:
        if cls.host_missing(scenario):
            raise MissingFeature(cls.host_missing(scenario))
        return []       # telemetry comes from the P4 pipeline: nothing more to need

    @classmethod
    def prepare_on_host(cls, scenario) -> None:
        compile_program()       # the guest finds the compiled program under build/p4

    def __init__(self, scenario, features):
        super().__init__(scenario, features)
        self.version = bmv2_version()
        self.json_path = compile_program()
        self.switches = []
        self.cli_script = ""
        self.p4rt_script = ""
        self.intended: dict[str, list] = {}     # switch -> its Entry, Group and Clone
        # P4Runtime where the machine has it, and the compile its P4Info.
        self.runtime_missing = runtime_missing()
        if self.runtime_missing is None and not (self.json_path.parent / P4INFO_NAME).is_file():
            self.runtime_missing = f"no {P4INFO_NAME} beside {self.json_path}"

    def switch_class(self):
        dp = self

        class _Switch(Bmv2Switch):
            def __init__(self, name, **params):
                dp.switches.append(self)
                super().__init__(name, json_path=dp.json_path, device_id=len(dp.switches) - 1,
                                 log_dir=dp.log_dir, p4runtime=dp.runtime_missing is None, **params)
        return _Switch

    def commands(self, sw: Bmv2Switch, net, client: str, toward: dict[str, int], flood: set[int]) -> list:
        """The switch's control-plane commands; `toward` (host -> port) and `flood` (its
        flood ports) are its share of dataplane.forwarding's tables. Each is a
        simple_switch_CLI line (the queues: its --queue-config file, or over Thrift) or
        an Entry, Group or Clone (bmv2_runtime: written over P4Runtime, or rendered as
        CLI lines)."""
        s = self.scenario
        mtu = s.link.mtu
        limits = s.switch.class_limits(mtu)
        host_ports = [p for p in self.ports if p.switch == sw.name]
        numbers = [p.number for p in host_ports]
        cmds = []
        # PFC: each class queue against its own XOFF/XON (as the linux plane's).
        pfc = s.switch.pause.enabled and s.switch.pause.pfc
        class_pause = s.switch.class_pause_thresholds(mtu, s.topology.senders) if pfc else []
        for p in host_ports:
            # bmv2 paces in packets per second. Toward the client go full-size data
            # frames; toward the servers go ACKs, requests and PAUSE frames, which a
            # real link of this rate carries at its small-frame packet rate.
            # A trunk carries the far servers' data one way: full frames both ways.
            frame_mtu = mtu if p.peer == client or p.trunk else 64 - ETH_HLEN
            pps = link_pps(port_rate(p, s), frame_mtu)
            for c, limit in enumerate(limits):
                prio = PRIORITY_QUEUES - 1 - c
                backstop = limit // 60 + 8   # more packets than the byte limit can ever admit
                cmds.append(f"set_queue_depth {backstop} {p.number} {prio}")
                cmds.append(f"set_queue_rate {pps} {p.number} {prio}")
                xoff_xon = dict(zip(("xoff", "xon"), class_pause[c])) if pfc else {}
                cmds += queue_entries(self.json_path, p.number, c, limit=limit, **xoff_xon)
        # The hold loop: paced at four times the fastest port, so that after a pause,
        # when a held packet may leave only as the oldest of its queue and the others
        # go round again, the loop still delivers faster than the port sends; deep
        # enough for every port's buffer.
        hold_pps = HOLD_SPEEDUP * link_pps(max([port_rate(p, s) for p in host_ports] or [s.link.rate]), mtu)
        for prio in range(PRIORITY_QUEUES):
            cmds.append(f"set_queue_depth 16384 {TELEMETRY_PORT} {prio}")
            cmds += [f"set_queue_depth 16384 {HOLD_PORT} {prio}", f"set_queue_rate {hold_pps} {HOLD_PORT} {prio}"]
        for h in net.hosts:
            if h.name in toward:
                cmds.append(table_entry(self.json_path, "IncastIngress.l2_forward", "IncastIngress.set_egress",
                                        h.MAC(), toward[h.name]))
        # Group 1 floods (ARP) over the spanning tree. PAUSE and XON frames go to every
        # port (hosts and trunks: switches pause each other) through a clone session:
        # over P4Runtime it lists the ports itself; Thrift's mirroring_add_mc names a
        # multicast group, group 2.
        cmds.append(Group(1, tuple(sorted(flood)), rid=0, node=0))
        if not sw.p4runtime:
            cmds.append(Group(2, tuple(numbers), rid=1, node=1))
        cmds.append(Clone(PAUSE_MC_SESSION, tuple(numbers), group=2))
        for dscp, c in enumerate(s.switch.qos.dscp_table()):
            if c:
                cmds.append(table_entry(self.json_path, "IncastIngress.classify_dscp", "IncastIngress.set_class",
                                        dscp, c))
        xoff, xon = s.switch.port_pause_thresholds(mtu, s.topology.senders)
        quanta = s.switch.pause.quanta
        pause_us = int(quanta * 512 / s.link.rate * 1e6)
        mode, param = s.telemetry.sample_mode() if s.telemetry.enabled else (0, 0)
        cfg = {"switch_id": sw.device_id, "pause_on": int(s.switch.pause.enabled), "xoff": xoff, "xon": xon,
               "quanta": quanta, "pause_us": pause_us, "refresh_us": pause_us // 2,
               "tel_mode": mode, "tel_n": param if mode == 2 else 1,
               "tel_threshold": param if mode == 4 else 0, "tel_delta": param if mode == 3 else 0,
               "late_us": LATE_US, "ecn_k": s.switch.ecn or 0, "pfc": int(s.switch.pause.pfc),
               # A switch that sends PAUSE obeys it: one quantum is 512 bit times.
               "obey": int(s.switch.pause.enabled), "quantum_us1024": round(512 / s.link.rate * 1e6 * 1024),
               # The shared buffer (0: none), alpha in sixteenths.
               "pool_bytes": s.switch.pool.size if s.switch.pool else 0,
               "pool_alpha16": round(s.switch.pool.alpha * 16) if s.switch.pool else 0}
        cmds += settings_entries(self.json_path, cfg)
        cmds.append(Clone(TELEMETRY_SESSION, (TELEMETRY_PORT,)))
        for p in host_ports:
            cmds.append(port_mac_entry(self.json_path, p.number, sw.intf(p.name).MAC()))
        return cmds

    def configure(self, net, topo) -> None:
        self.ports = switch_ports(net)
        # bmv2's queue must be the only one between the hosts: no qdisc may hold
        # packets on the switch's veth ends (two buffers in series).
        every = netdev.qdiscs_by_dev()
        netdev.batch("tc", [f"qdisc replace dev {p.name} root noqueue" for p in self.ports
                            if {q["kind"] for q in every.get(p.name, [])} - {"noqueue"}])
        scripts = []
        client = getattr(topo, "client", None)
        toward, flood = next_hops(self.ports, topo.hosts(sort=False)), flood_ports(self.ports)
        written = []
        for sw in self.switches:
            items = self.commands(sw, net, client, toward[sw.name], flood[sw.name])
            self.intended[sw.name] = [c for c in items if not isinstance(c, str)]
            if sw.p4runtime:        # the queues in its --queue-config file or over Thrift, the rest over P4Runtime
                cmds = [c for c in items if isinstance(c, str)]
                queues = ": its --queue-config file (the queues)" if sw.runtime_only else \
                    f" (thrift port {sw.thrift_port}): the queues"
                head = (f"# {sw.name}{queues}; its tables, multicast groups and clone sessions went over "
                        "P4Runtime (switch.p4rt.txt)")
                if sw.runtime_only:
                    sw.launch(cmds)
            else:
                cmds = [line for c in items for line in p4rt.cli_lines(c)]
                head = f"# {sw.name} (thrift port {sw.thrift_port})"
            if sw.runtime is not None:
                sw.runtime.write(self.intended[sw.name])
                written.append(f"# switch {sw.name}: P4Runtime {sw.grpc_address}, device id {sw.device_id}\n"
                               + "\n".join(sw.runtime.written))
            if not sw.runtime_only:
                sw.cli(cmds)
            scripts.append(head + "\n" + "\n".join(cmds))
        self.cli_script = "\n".join(scripts) + "\n"
        self.p4rt_script = "\n".join(written) + "\n" if written else ""
        self._count_p4rt()

    def _read(self, sw, names_idx: list[tuple[str, str, int]]) -> list[tuple[int, int]]:
        """(packets, bytes) of each counter ("c", name, index), (value, 0) of each
        register ("r", name, index), in order: over P4Runtime where the switch has it
        (a Read for the counters, one for the registers), except the registers of a
        switch that is not runtime_only, which, as every read without P4Runtime, go
        over its Thrift session."""
        if sw.runtime_only and sw.runtime is None:
            raise RuntimeError(f"{sw.name} was never started (the network's configuration failed before it)")
        values = [None] * len(names_idx)
        counters = [k for k, (kind, _, _) in enumerate(names_idx) if kind == "c" and sw.runtime is not None]
        registers = [k for k, (kind, _, _) in enumerate(names_idx) if kind == "r" and sw.runtime_only]
        if counters:
            got = sw.runtime.read_counters([names_idx[k][1:] for k in counters])
            for k, v in zip(counters, got):
                values[k] = v
        if registers:
            got = sw.runtime.read_registers([names_idx[k][1:] for k in registers])
            for k, v in zip(registers, got):
                values[k] = (v, 0)
        if counters or registers:
            self._count_p4rt()
        thrift = [k for k in range(len(names_idx)) if values[k] is None]
        if thrift:
            out = sw.cli([f"{'counter_read' if names_idx[k][0] == 'c' else 'register_read'} "
                          f"{names_idx[k][1]} {names_idx[k][2]}" for k in thrift])
            lines = [ln for ln in out.splitlines() if "=" in ln and "[" in ln]
            for k, line in zip(thrift, lines, strict=True):
                values[k] = _parse_value(line)
        return values

    def queue_counters(self) -> pd.DataFrame:
        limits = self.scenario.switch.class_limits(self.scenario.link.mtu)
        rows = []
        for sw in self.switches:
            ports = [p for p in self.ports if p.switch == sw.name]
            reads = []
            for p in ports:
                for c in range(len(limits)):
                    i = queue_index(p.number, c)
                    reads += [("c", "IncastEgress.tx", i), ("c", "IncastIngress.drops", i),
                              ("r", "occ_bytes", i), ("c", "IncastIngress.ecn_marks", i)]
            values = self._read(sw, reads)
            k = 0
            for p in ports:
                for c, limit in enumerate(limits):
                    tx, drops, occ, marks = values[k], values[k + 1], values[k + 2], values[k + 3]
                    k += 4
                    rows.append({"switch": sw.name, "port": p.name, "peer": p.peer, "queue": c,
                                 "sent_packets": tx[0], "sent_bytes": tx[1], "drops": drops[0],
                                 "marks": marks[0],
                                 "overlimits": 0, "backlog_bytes": occ[0], "backlog_packets": -1,
                                 "limit": limit, "limit_unit": "bytes"})
        return pd.DataFrame(rows)

    def artifacts(self) -> dict[str, str]:
        """switch.cli: the Thrift commands (all, or with P4Runtime the queues': their
        --queue-config file where the switch is programmed through P4Runtime alone); with
        P4Runtime, switch.p4rt.txt: each switch's WriteRequests in protobuf text format
        (ids annotated with their P4Info names)."""
        out = {"switch.cli": self.cli_script} if self.cli_script else {}
        if self.p4rt_script:
            out["switch.p4rt.txt"] = self.p4rt_script
        return out

    def _count_p4rt(self) -> None:
        """The P4Runtime messages the run has sent so far, by kind, in all and per
        switch: the run's switch.p4rt-messages.json, written again after each batch
        (a run's switches are not stopped one by one but ended with its namespace, so
        the last batch's is the run's count)."""
        switches = {sw.name: sw.runtime.counts() for sw in self.switches if sw.runtime is not None}
        if not switches or self.log_dir is None:
            return
        total = {}
        for counts in switches.values():
            for part, kinds in counts.items():
                for kind, n in kinds.items():
                    total.setdefault(part, {}).setdefault(kind, 0)
                    total[part][kind] += n
        (Path(self.log_dir) / "switch.p4rt-messages.json").write_text(json.dumps(
            {"total": total, "switches": switches}, indent=2, sort_keys=True) + "\n")

    def pause_counters(self) -> dict:
        """PAUSE activity of the switches: XOFF events (each pauses every other host
        port), XON events, and the frames sent (PAUSE and quanta 0)."""
        out = {"pause_xoff_events": 0, "pause_xon_events": 0, "pause_frames_sent": 0,
               "xon_frames_sent": 0, "mac_control_rx": 0}
        names = {"IncastIngress.pause_tx": "pause_xoff_events", "IncastEgress.xon_tx": "pause_xon_events",
                 "IncastEgress.pause_port_tx": "pause_frames_sent", "IncastEgress.xon_port_tx": "xon_frames_sent",
                 "IncastIngress.mac_control_rx": "mac_control_rx"}
        for sw in self.switches:
            numbers = [p.number for p in self.ports if p.switch == sw.name]
            reads = [("c", n, i) for n in names for i in numbers]
            for (_, name, _), value in zip(reads, self._read(sw, reads)):
                out[names[name]] += value[0]
        ports = self.pause_ports
        if ports is not None and len(ports):     # what the switches obeyed (stop_flow_control)
            out.update({"switch_pause_frames_received": int(ports["pause_received"].sum()),
                        "switch_held_ms": round(float(ports["held_ms"].sum()), 3),
                        "switch_held_packets": int(ports["held_packets"].sum()),
                        "switch_sent_while_paused": int(ports["sent_while_paused"].sum())})
        return out

    def stop_flow_control(self) -> pd.DataFrame | None:
        """Per switch port: PAUSE/PFC frames sent and received, how long its peer held it
        (held_ms: the pauses received, summed over its class queues, as the linux data
        plane reports), the packets that waited in the hold loop meanwhile, and those
        that left while it was paused (sent_while_paused: what its egress queue held
        when the pause came, which bmv2 cannot stop)."""
        if not self.scenario.switch.pause.enabled or not self.switches:
            return None
        classes = len(self.scenario.switch.class_limits(self.scenario.link.mtu))
        rows = []
        for sw in self.switches:
            ports = [p for p in self.ports if p.switch == sw.name]
            self._hold_loops_drained(sw, ports, classes)
            reads = []
            for p in ports:
                reads += [("c", "IncastEgress.pause_port_tx", p.number), ("c", "IncastEgress.xon_port_tx", p.number),
                          ("c", "IncastIngress.pause_rx", p.number), ("c", "IncastIngress.xon_rx", p.number)]
                for c in range(classes):
                    q = queue_index(p.number, c)
                    reads += [("r", "rx_held_us", q), ("r", "rx_mark", q), ("r", "rx_until", q),
                              ("c", "IncastIngress.held", q), ("c", "IncastEgress.sent_while_paused", q),
                              ("r", "hold_head", q), ("r", "hold_tail", q)]
            values = iter(v for v, _ in self._read(sw, reads))
            for p in ports:
                row = {"switch": sw.name, "port": p.name, "peer": p.peer, "pause_sent": next(values),
                       "xon_sent": next(values), "pause_received": next(values), "xon_received": next(values)}
                held_us = held_packets = leaked = left = 0
                for _ in range(classes):
                    acc, mark, until = next(values), next(values), next(values)
                    held_us += acc + max(0, until - mark)   # the last pause has ended by now
                    held_packets += next(values)
                    leaked += next(values)
                    head, tail = next(values), next(values)
                    left += (tail - head) % 2**32
                rows.append({**row, "held_ms": round(held_us / 1000, 3), "held_packets": held_packets,
                             "sent_while_paused": leaked, "held_at_end": left})
        self.pause_ports = pd.DataFrame(rows)
        return self.pause_ports

    def _hold_loops_drained(self, sw, ports, classes: int) -> None:
        """Wait until sw's hold loops are empty, or until the longest pause could have
        ended twice: a pause its peer sent just before the traffic stopped still holds
        packets in the loop (they leave at its end, or at the peer's XON); one that
        never leaves (a place in the line lost) is then held_at_end."""
        s = self.scenario
        reads = [("r", name, queue_index(p.number, c)) for p in ports for c in range(classes)
                 for name in ("hold_head", "hold_tail")]
        deadline = time.monotonic() + 2 * s.switch.pause.quanta * 512 / s.link.rate + 0.05
        while True:
            values = [v for v, _ in self._read(sw, reads)]
            if values[0::2] == values[1::2] or time.monotonic() > deadline:
                return
            time.sleep(0.005)

    def health(self, sent_packets: int) -> tuple[dict, list[str]]:
        """Whether bmv2 kept up: the longest wait of a packet before its egress queue
        (bmv2's input queue and ingress pipeline) and how many waited over LATE_US; and
        the bytes its buffer still counts once the run is over (switch_buffer_end_bytes:
        not 0 only while frames are still on their way out, or if an occupancy update
        between ingress and egress was lost, which would leak buffer for good)."""
        out = {"switch_ingress_wait_max_us": 0, "switch_ingress_late_packets": 0, "switch_buffer_end_bytes": 0,
               # How the switches were programmed: over P4Runtime (simple_switch_grpc) or,
               # where it is missing or INCAST_BMV2_CONTROL=thrift, simple_switch_CLI alone;
               # p4runtime: P4Runtime alone (the queues from a file at start);
               # p4runtime+thrift: queues and register reads over Thrift, the rest over
               # P4Runtime (a simple_switch_grpc without scripts/p4-patches/).
               "switch_control": ("p4runtime" if all(sw.runtime_only for sw in self.switches) else
                                  "p4runtime+thrift" if all(sw.p4runtime for sw in self.switches) else "thrift")}
        for sw in self.switches:
            (wait, _), (late, _) = self._read(
                sw, [("r", "IncastEgress.ingress_wait_max_us", 0), ("c", "IncastEgress.ingress_late", 0)])
            out["switch_ingress_wait_max_us"] = max(out["switch_ingress_wait_max_us"], wait)
            out["switch_ingress_late_packets"] += late
            out["switch_buffer_end_bytes"] += self._buffer_once_drained(sw)
            if self.scenario.switch.pool is not None:
                (most, _), (left, _) = self._read(sw, [("r", "pool_max_bytes", 0), ("r", "pool_used", 0)])
                out["switch_pool_max_bytes"] = max(out.get("switch_pool_max_bytes", 0), most)
                out["switch_pool_end_bytes"] = out.get("switch_pool_end_bytes", 0) + left
        warnings = []
        if out["switch_ingress_late_packets"] > LATE_SHARE * sent_packets:
            warnings.append(
                f"warning: the switch fell behind: {out['switch_ingress_late_packets']} packets waited over "
                f"{LATE_US / 1000:g} ms before its ingress (longest {out['switch_ingress_wait_max_us'] / 1000:.1f} "
                "ms), in a queue no buffer limit or PAUSE reaches; a lower link rate or fewer servers keep "
                "the switch's own buffer in charge")
        lag = flow_control.headroom_us(self.scenario)
        if lag is not None and out["switch_ingress_wait_max_us"] > lag:
            warnings.append(
                f"warning: PAUSE could not keep this switch lossless: a packet waited "
                f"{out['switch_ingress_wait_max_us'] / 1000:.1f} ms before its ingress, and the buffer above "
                f"XOFF holds only {lag / 1000:.1f} ms of every sender at the link rate; frames that arrive "
                "while the switch has not yet seen its queue pass XOFF are dropped by the emulator's lag, "
                "not by the switch (a lower link rate, fewer servers, or --clock virtual)")
        return out, warnings

    def _buffer_once_drained(self, sw) -> int:
        """The bytes the program's buffer counts at sw once its queues had time to
        drain. Right after the last block the client's port may still be sending the
        servers' last frames (measured at 10 Mbit/s: 198-396 bytes, ACK-sized frames,
        gone half a second later), so the registers are read until they are all 0 or
        until the slowest port could have sent its whole buffer twice."""
        s = self.scenario
        limits = s.switch.class_limits(s.link.mtu)
        room = sum(limits) * (1 if s.switch.buffer is not None else s.link.mtu + ETH_HLEN)
        ports = [p for p in self.ports if p.switch == sw.name]
        reads = [("r", "occ_bytes", queue_index(p.number, c)) for p in ports for c in range(len(limits))]
        slowest = min(port_rate(p, s) for p in ports)
        deadline = time.monotonic() + 2 * room * 8 / slowest + 0.05
        while True:
            held = sum(v for v, _ in self._read(sw, reads))
            if held == 0 or time.monotonic() > deadline:
                return held
            time.sleep(0.005)

    def paced_ports(self) -> list[Port]:
        # bmv2 paces its own queues; the switch's veth ends hold no qdisc. Its health()
        # says whether it kept up.
        return []

    def telemetry(self, run_dir, host_of_ip: dict[str, str], world_inode: int):
        return PostcardCollector(run_dir, self.switches, self.ports, host_of_ip)


def _parse_value(line: str) -> tuple[int, int]:
    """(packets, bytes) of a counter_read line, (value, 0) of a register_read line."""
    m = re.search(r"\((\d+) bytes, (\d+) packets\)", line)
    if m:
        return int(m.group(2)), int(m.group(1))
    return int(line.split("=", 1)[1].strip()), 0


