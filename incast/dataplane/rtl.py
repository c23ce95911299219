"""The ``rtl`` data plane: the switch is rtl/src/incast_switch.sv, cycle by cycle.

Each switch is the hardware description's Verilator model, run by rtl/harness between
the switch's interfaces (veth ends) as bmv2 runs there: every frame that reaches a
port enters the model's port at link rate, and every frame the model sends leaves when
its last byte does. The model's clock follows CLOCK_MONOTONIC, one cycle per byte time
of the link (8 ns at 1 Gbit/s), and jumps over the time it has nothing to do. In
virtual time (`--clock virtual`: User-Mode Linux, where computing takes no time) that
makes it cycle-true however slowly it computes; in real time it falls behind whenever
it is busy (some 3·10^5 cycles a host second), so real time suits it only at low rates.

Where the queue is: in the model's buffer (per (port, class), byte-exact, what
incast.p4 decides in registers), paced by its ports. Its veth ends hold no qdisc.
PAUSE and PFC are sent and obeyed by the model's ports (a port stops within two
frames of a PAUSE received). Queue telemetry comes from its postcards, incast.p4's
format, read by the same collector as bmv2's.
"""
from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pandas as pd
from mininet.node import Switch

from incast import constants
from incast.constants import ETH_HLEN
from incast.dataplane import DataPlane, port_rate, switch_ports
from incast.dataplane.forwarding import next_hops
from incast.errors import MissingFeature
from incast.machine import netdev
from incast.measure.postcards import PostcardCollector
from incast.registry import DATAPLANES

BUILD_DIR = constants.BUILD_DIR / "rtl"
# Model sizes built on demand (a switch takes the smallest that has its ports), and
# the core's bytes a cycle each needs so that its ports, together, never wait for it.
SIZES = {4: 8, 8: 8, 16: 16, 24: 32, 32: 32, 48: 64}
LW = 1                                  # 1 Gbit/s-style ports: a byte a cycle
SWITCH_SOURCE = constants.RTL_DIR / "src" / "incast_switch.sv"
# The longest frame the model takes (bytes without FCS), from its source.
MAXLEN = int(re.search(r"parameter\s+int\s+MAXLEN\s*=\s*(\d+)", SWITCH_SOURCE.read_text()).group(1))
_LOCALPARAMS = re.compile(r"localparam\s+(?:int|logic\s*\[[^\]]*\])\s+((?:CFG|ADDR)_\w+\s*=[^;]+);")
_SV_NUMBER = re.compile(r"^(?:\d+'([hdb]))?([0-9a-fA-F_]+)$")


def address_map(source: Path = SWITCH_SOURCE) -> dict[str, int]:
    """The switch's management addresses, read from its RTL source so that the two cannot
    drift (as incast.p4.program reads the P4 program's): its configuration registers
    (`CFG_XOFF = 2`) and its regions' bases (`ADDR_OCC = 16'h4000`)."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*", "", source.read_text(), flags=re.S)
    found = {}
    for group in _LOCALPARAMS.findall(text):
        for item in group.split(","):
            name, value = (part.strip() for part in item.split("="))
            m = _SV_NUMBER.match(value)
            if not m:
                raise ValueError(f"{source.name}: {name} = {value!r} is not a number")
            found[name] = int(m.group(2).replace("_", ""), {"h": 16, "b": 2}.get(m.group(1), 10))
    return found


ADDRESSES = address_map()
# Index of each configuration register: CFG_XOFF -> CFG["xoff"] (the names of incast.p4's
# settings, its action configure's parameters, in the same order where their units agree).
CFG = {k[4:].lower(): v for k, v in ADDRESSES.items() if k.startswith("CFG_")}
# Bases of the regions a port, an entry, a code point or a queue indexes.
(PORT_MAC, MAC_TABLE, DSCP_MAP, LIMIT, XOFF_Q, XON_Q, OCC, DROPS, TX_PKTS, TX_BYTES, ECN, PORT_STATS,
 SWITCH_STATS) = (ADDRESSES[f"ADDR_{n}"] for n in (
     "PORT_MAC", "MAC_TABLE", "DSCP_MAP", "LIMIT", "XOFF_Q", "XON_Q", "OCC", "DROPS", "TX_PKTS", "TX_BYTES", "ECN",
     "PORT_STATS", "SWITCH_STATS"))
# PORT_STATS + 8 * port + (1 MAC Control in, 2 PAUSE in, 3 XON in, 4 XOFF out, 5 XON out);
# SWITCH_STATS + (1 cells used, 2 bytes buffered, 3 postcards, 4 lost, 7 most buffered).


def nmac(nports: int) -> int:
    """The model's forwarding entries (rtl/harness/Makefile's NMAC)."""
    return 2 * nports


def model_size(ports: int) -> int:
    for n in SIZES:
        if ports <= n:
            return n
    raise MissingFeature(f"the rtl switch is built for at most {max(SIZES)} ports, not {ports}")


def cell_bits(nports: int, buffer_bytes: int) -> int:
    """log2 of the buffer's cells: room for every port's buffer, a fifth more for the
    cells' last words that frames fill only in part."""
    cells = nports * buffer_bytes * 6 // 5 // SIZES[nports] + 1
    return max(10, (cells - 1).bit_length())


def model_dir(nports: int, cell_aw: int) -> Path:
    return BUILD_DIR / f"sim-p{nports}-l{LW}-c{SIZES[nports]}-b{cell_aw}-t0"


def build_model(nports: int, cell_aw: int) -> Path:
    """The harness binary for this size, built once (a minute or more on two cores).

    One build at a time for a size: runs side by side (--jobs) that need a model not
    yet built would each start make in the same directory, whose recipe begins by
    removing its object files, so the one started first failed (and with it every run
    of its guest: a check's 18 fresh runs at 8 servers on the three switches, once)."""
    out = model_dir(nports, cell_aw)
    exe = out / "incast_switch_sim"
    # the model's inputs: the files that also date rtl points in the point store
    sources = [f for g in DATAPLANES["rtl"].sources for f in constants.SHARE.glob(g)]

    def built() -> bool:
        return exe.is_file() and exe.stat().st_mtime >= max(p.stat().st_mtime for p in sources)
    if built():
        return exe
    if shutil.which("verilator") is None:
        raise MissingFeature("verilator is not installed (scripts/setup.sh installs it): the rtl data plane "
                             "runs the switch's Verilator model")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)        # released when the file closes
        if built():                             # another run built it meanwhile
            return exe
        r = subprocess.run(["make", "-C", str(constants.RTL_DIR / "harness"), f"NPORTS={nports}", f"LW={LW}",
                            f"CW={SIZES[nports]}", f"CELL_AW={cell_aw}", f"OUT={out}"],
                           capture_output=True, text=True)
    if r.returncode or not exe.is_file():
        raise RuntimeError(f"building the rtl switch failed: {(r.stdout + r.stderr).strip()[-2000:]}")
    return exe


def period_ps(rate_bps: int) -> int:
    """A cycle: one byte time of the link."""
    return round(8e12 / rate_bps)


def us_mul(rate_bps: int) -> int:
    """Microseconds per cycle in the model's fixed point (32 fraction bits)."""
    return round(period_ps(rate_bps) * 2**32 / 1e6) + 1


class Control:
    """The harness's management socket: writes and reads of the model's registers."""

    def __init__(self, path: str, timeout: float = 60.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""
        self.lock = threading.Lock()

    # Commands sent before their answers are read. The harness writes an answer per
    # command, and a Unix socket counts each small write as a whole buffer: hundreds
    # of unread answers (a 48-port switch's configuration is about 500 writes) fill
    # its send buffer, and the harness then stops answering.
    BATCH = 64

    def _call(self, lines: list[str]) -> list[str]:
        out = []
        with self.lock:
            for i in range(0, len(lines), self.BATCH):
                batch = lines[i:i + self.BATCH]
                self.sock.sendall(("\n".join(batch) + "\n").encode())
                for _ in batch:
                    while b"\n" not in self.buf:
                        chunk = self.sock.recv(1 << 16)
                        if not chunk:
                            raise RuntimeError("the rtl switch closed its control socket")
                        self.buf += chunk
                    line, self.buf = self.buf.split(b"\n", 1)
                    out.append(line.decode())
        bad = [x for x in out if x == "error"]
        if bad:
            raise RuntimeError(f"the rtl switch refused {len(bad)} of {len(lines)} commands")
        return out

    def write(self, pairs: list[tuple[int, int]]) -> None:
        if pairs:
            self._call([f"w {a} {v & 0xFFFFFFFF}" for a, v in pairs])

    def read(self, addrs: list[int]) -> list[int]:
        return [int(x) for x in self._call([f"r {a}" for a in addrs])] if addrs else []

    def stats(self) -> dict:
        simulated, skipped, frames_in, frames_out = map(int, self._call(["stats"])[0].split())
        return {"cycles_simulated": simulated, "cycles_skipped": skipped, "frames_in": frames_in,
                "frames_out": frames_out}

    def close(self) -> None:
        self.sock.close()


class RtlSwitch(Switch):
    """A Mininet switch that is the Verilator model of rtl/src/incast_switch.sv.

    Port n of the switch is Mininet's port n (the model's port n - 1); its telemetry
    port is a veth whose other end (<name>-telc) the collector reads."""

    def __init__(self, name, exe=None, nports=4, rate=10**9, device_id=0, log_dir=None, **params):
        Switch.__init__(self, name, **params)
        self.exe, self.nports, self.rate, self.device_id = exe, nports, rate, device_id
        self.log_dir = Path(log_dir) if log_dir else None
        self.proc = None
        self.control: Control | None = None
        self.tel_intf = f"{name}-tel"
        self.collector_intf = f"{name}-telc"

    def start(self, controllers):
        netdev.add_veth(self.tel_intf, self.collector_intf)
        ports = [(self.ports[i], i.name) for i in self.intfList() if i.name != "lo"]
        if len(ports) > self.nports:
            raise RuntimeError(f"{self.name} has {len(ports)} ports, its model {self.nports}")
        links = [n for _, n in ports] + [self.tel_intf, self.collector_intf]
        netdev.set_up(links)
        netdev.offloads_off(links)
        self.sock_path = f"/run/incast/{os.environ.get('INCAST_RUN', 'incast')}-{self.name}.rtl"
        Path(self.sock_path).parent.mkdir(parents=True, exist_ok=True)
        args = [str(self.exe), "--period-ps", str(period_ps(self.rate)), "--control", self.sock_path,
                "--telemetry", self.tel_intf]
        for number, intf in sorted(ports):
            args += ["--port", f"{number - 1}={intf}"]
        log = open(self.log_dir / f"{self.name}.rtl.log", "wb") if self.log_dir else subprocess.DEVNULL
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log)
        line = self.proc.stdout.readline()
        if line.strip() != b"ready" or self.proc.poll() is not None:
            raise RuntimeError(f"the rtl switch {self.name} did not start (see {self.name}.rtl.log)")
        self.control = Control(self.sock_path)

    def stop(self, deleteIntfs=True):
        if self.control is not None:
            self.control.close()
            self.control = None
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        netdev.delete_link(self.tel_intf)
        super().stop(deleteIntfs)


class RtlDataPlane(DataPlane):
    name = "rtl"
    pause_ports: pd.DataFrame | None = None

    @classmethod
    def host_missing(cls, scenario) -> str | None:
        if scenario.link.mtu + ETH_HLEN > MAXLEN:
            return (f"the rtl switch takes frames of at most {MAXLEN} bytes: link.mtu {scenario.link.mtu} "
                    f"is more than its {MAXLEN - ETH_HLEN}")
        nports = model_size(scenario.topology.senders + 1)
        if not model_dir(nports, cell_bits(nports, cls._buffer(scenario))).joinpath("incast_switch_sim").is_file() \
                and shutil.which("verilator") is None:
            return ("verilator is not installed (scripts/setup.sh installs it): the rtl data plane runs the "
                    "switch's Verilator model")
        return None

    @classmethod
    def require(cls, features, scenario) -> list[str]:
        if cls.host_missing(scenario):
            raise MissingFeature(cls.host_missing(scenario))
        return []

    @staticmethod
    def _buffer(scenario) -> int:
        return sum(scenario.switch.class_limits(scenario.link.mtu))

    @classmethod
    def prepare_on_host(cls, scenario) -> None:
        nports = model_size(scenario.topology.senders + 1)
        build_model(nports, cell_bits(nports, cls._buffer(scenario)))   # the guest runs what the host built

    def __init__(self, scenario, features):
        super().__init__(scenario, features)
        self.nports = model_size(scenario.topology.senders + 1)
        self.exe = build_model(self.nports, cell_bits(self.nports, self._buffer(scenario)))
        self.switches: list[RtlSwitch] = []
        self.writes: list[tuple[str, int, int]] = []

    def switch_class(self):
        dp = self

        class _Switch(RtlSwitch):
            def __init__(self, name, **params):
                dp.switches.append(self)
                super().__init__(name, exe=dp.exe, nports=dp.nports, rate=dp.scenario.link.rate,
                                 device_id=len(dp.switches) - 1, log_dir=dp.log_dir, **params)
        return _Switch

    def registers(self, sw: RtlSwitch, net, toward: dict[str, int]) -> list[tuple[int, int]]:
        """The switch's register writes; `toward` (host -> port number) is its share of
        dataplane.forwarding's table."""
        s = self.scenario
        mtu = s.link.mtu
        limits = s.switch.class_limits(mtu)
        host_ports = [p for p in self.ports if p.switch == sw.name]
        w: list[tuple[int, int]] = []
        for p in host_ports:
            i = p.number - 1
            mac = mac_int(sw.intf(p.name).MAC())
            w += [(PORT_MAC + 4 * i, mac & 0xFFFFFFFF), (PORT_MAC + 4 * i + 1, mac >> 32)]
            for c in range(8):
                w.append((LIMIT + 8 * i + c, limits[c] if c < len(limits) else 0))
        entries = [(h.MAC(), toward[h.name]) for h in net.hosts if h.name in toward]
        if len(entries) > nmac(self.nports):
            raise RuntimeError(f"{len(entries)} hosts: more than the rtl switch's {nmac(self.nports)} forwarding "
                               "entries (the rest would be flooded)")
        for e, (mac, number) in enumerate(entries):
            m = mac_int(mac)
            w += [(MAC_TABLE + 2 * e, m & 0xFFFFFFFF), (MAC_TABLE + 2 * e + 1, (m >> 32) | (number - 1) << 16 | 1 << 31)]
        for dscp, c in enumerate(s.switch.qos.dscp_table()):
            if c:
                w.append((DSCP_MAP + dscp, 0x100 | c))
        xoff, xon = s.switch.port_pause_thresholds(mtu, s.topology.senders)
        if s.switch.pause.enabled and s.switch.pause.pfc:
            for p in host_ports:
                for c, (cx, cy) in enumerate(s.switch.class_pause_thresholds(mtu, s.topology.senders)):
                    w += [(XOFF_Q + 8 * (p.number - 1) + c, cx), (XON_Q + 8 * (p.number - 1) + c, cy)]
        quanta = s.switch.pause.quanta
        pause_cycles = quanta * 512 // (8 * LW)           # a quantum: 512 bit times
        mode, param = s.telemetry.sample_mode() if s.telemetry.enabled else (0, 0)
        cfg = {"switch_id": sw.device_id, "pause_on": int(s.switch.pause.enabled), "xoff": xoff, "xon": xon,
               "quanta": quanta, "pause_cycles": pause_cycles, "refresh_cycles": pause_cycles // 2,
               "tel_mode": mode, "tel_n": param if mode == 2 else 1,
               "tel_threshold": param if mode == 4 else 0, "tel_delta": param if mode == 3 else 0,
               "ecn_k": s.switch.ecn or 0, "pfc": int(s.switch.pause.pfc), "obey": int(s.switch.pause.enabled),
               "us_mul": us_mul(s.link.rate),
               # the shared buffer (0: none), alpha in sixteenths, as incast.p4's
               "pool_bytes": s.switch.pool.size if s.switch.pool else 0,
               "pool_alpha16": round(s.switch.pool.alpha * 16) if s.switch.pool else 16}
        w += [(CFG[k], v) for k, v in cfg.items()]
        return w

    def configure(self, net, topo) -> None:
        self.ports = switch_ports(net)
        every = netdev.qdiscs_by_dev()
        netdev.batch("tc", [f"qdisc replace dev {p.name} root noqueue" for p in self.ports
                            if {q["kind"] for q in every.get(p.name, [])} - {"noqueue"}])
        toward = next_hops(self.ports, topo.hosts(sort=False))
        self.writes = []
        for sw in self.switches:
            regs = self.registers(sw, net, toward[sw.name])
            sw.control.write(regs)
            self.writes += [(sw.name, a, v) for a, v in regs]

    def queue_counters(self) -> pd.DataFrame:
        limits = self.scenario.switch.class_limits(self.scenario.link.mtu)
        rows = []
        for sw in self.switches:
            ports = [p for p in self.ports if p.switch == sw.name]
            addrs = [base + 8 * (p.number - 1) + c for p in ports for c in range(len(limits))
                     for base in (TX_PKTS, TX_BYTES, DROPS, OCC, ECN)]
            values = iter(sw.control.read(addrs))
            for p in ports:
                for c, limit in enumerate(limits):
                    tx, tx_bytes, drops, occ, marks = (next(values) for _ in range(5))
                    rows.append({"switch": sw.name, "port": p.name, "peer": p.peer, "queue": c,
                                 "sent_packets": tx, "sent_bytes": tx_bytes, "drops": drops, "marks": marks,
                                 "overlimits": 0, "backlog_bytes": occ, "backlog_packets": -1,
                                 "limit": limit, "limit_unit": "bytes"})
        return pd.DataFrame(rows)

    def pause_counters(self) -> dict:
        out = {"pause_frames_sent": 0, "xon_frames_sent": 0, "mac_control_rx": 0}
        for sw in self.switches:
            numbers = [p.number for p in self.ports if p.switch == sw.name]
            values = sw.control.read([PORT_STATS + 8 * (n - 1) + k for n in numbers for k in (4, 5, 1)])
            out["pause_frames_sent"] += sum(values[0::3])
            out["xon_frames_sent"] += sum(values[1::3])
            out["mac_control_rx"] += sum(values[2::3])
        return out

    def stop_flow_control(self) -> pd.DataFrame | None:
        """Per switch port: PAUSE/PFC frames sent and received."""
        if not self.scenario.switch.pause.enabled or not self.switches:
            return None
        rows = []
        for sw in self.switches:
            ports = [p for p in self.ports if p.switch == sw.name]
            values = iter(sw.control.read([PORT_STATS + 8 * (p.number - 1) + k for p in ports for k in (4, 5, 2, 3)]))
            for p in ports:
                rows.append({"switch": sw.name, "port": p.name, "peer": p.peer, "pause_sent": next(values),
                             "xon_sent": next(values), "pause_received": next(values),
                             "xon_received": next(values)})
        self.pause_ports = pd.DataFrame(rows)
        return self.pause_ports

    def health(self, sent_packets: int) -> tuple[dict, list[str]]:
        """How the model ran: cycles simulated and skipped, the bytes its buffer still
        counts once it has drained (not 0: a leak), postcards it could not queue."""
        out = {"switch_cycles_simulated": 0, "switch_cycles_skipped": 0, "switch_buffer_end_bytes": 0,
               "switch_postcards_lost": 0}
        for sw in self.switches:
            st = sw.control.stats()
            out["switch_cycles_simulated"] += st["cycles_simulated"]
            out["switch_cycles_skipped"] += st["cycles_skipped"]
            out["switch_buffer_end_bytes"] += self._buffer_once_drained(sw)
            lost, most = sw.control.read([SWITCH_STATS + 4, SWITCH_STATS + 7])
            out["switch_postcards_lost"] += lost
            if self.scenario.switch.pool is not None:
                out["switch_pool_max_bytes"] = max(out.get("switch_pool_max_bytes", 0), most)
        warnings = []
        if out["switch_buffer_end_bytes"]:
            warnings.append(f"warning: the rtl switch's buffer still counts {out['switch_buffer_end_bytes']} "
                            "bytes after draining")
        return out, warnings

    def _buffer_once_drained(self, sw) -> int:
        s = self.scenario
        ports = [p for p in self.ports if p.switch == sw.name]
        slowest = min(port_rate(p, s) for p in ports)
        deadline = time.monotonic() + 2 * self._buffer(s) * len(ports) * 8 / slowest + 0.05
        while True:
            held = sw.control.read([SWITCH_STATS + 2])[0]
            if held == 0 or time.monotonic() > deadline:
                return held
            time.sleep(0.005)

    def paced_ports(self):
        return []      # the model paces its own ports

    def artifacts(self) -> dict[str, str]:
        if not self.writes:
            return {}
        lines = [f"# {name}: w ADDRESS VALUE on its control socket (rtl/harness/harness.cpp)"
                 for name in dict.fromkeys(n for n, _, _ in self.writes)]
        lines += [f"{name} w {hex(a)} {v}" for name, a, v in self.writes]
        return {"switch.rtl": "\n".join(lines) + "\n"}

    def telemetry(self, run_dir, host_of_ip: dict[str, str], world_inode: int):
        return PostcardCollector(run_dir, self.switches, self.ports, host_of_ip)   # bmv2's postcards


def mac_int(mac: str) -> int:
    return int(mac.replace(":", ""), 16)


# ------------------------------------------------------------------ waveforms
# The pipeline's states (incast_switch.sv's pstate_t): a frame is admitted or refused
# in S_DEC2.
S_DEC2 = 3


def read_vcd(path, names: set[str], scope: str = "incast_switch") -> list[dict[str, int]]:
    """The values of `names` (signals of the switch's own scope) at every time of a VCD
    the harness wrote (incast_switch_sim --trace), in order: one dict a time step."""
    ids: dict[str, str] = {}
    stack: list[str] = []
    values: dict[str, int] = {}
    steps: list[dict[str, int]] = []
    with open(path) as f:
        for line in f:
            w = line.split()
            if not w:
                continue
            if w[0] == "$scope":
                stack.append(w[2])
            elif w[0] == "$upscope":
                stack.pop()
            elif w[0] == "$var" and stack and stack[-1] == scope and w[4] in names:
                ids[w[3]] = w[4]
            elif w[0] == "$enddefinitions":
                break
        for line in f:
            c = line[:1]
            if c == "#":
                if values:
                    steps.append(dict(values))
            elif c == "b":
                bits, ident = line[1:].split()
                if ident in ids:
                    values[ids[ident]] = int(bits.replace("x", "0").replace("z", "0"), 2)
            elif c in "01xz" and line[1:].strip() in ids:
                values[ids[line[1:].strip()]] = 1 if c == "1" else 0
    if values:
        steps.append(dict(values))
    missing = names - set(ids.values())
    if missing:
        raise ValueError(f"{path}: no signal {', '.join(sorted(missing))} in scope {scope}")
    return steps


def refusals(path) -> list[dict[str, int]]:
    """Every frame the switch refused in a waveform: the cycle (`now`), its ingress and
    egress ports (numbered from 1), its bytes and the bytes its queue held."""
    steps = read_vcd(path, {"now", "ps", "d_hit", "admit_ok", "d_occ", "flen", "sel", "d_port"})
    out, seen = [], set()
    for v in steps:
        if v["ps"] == S_DEC2 and v["d_hit"] and not v["admit_ok"] and v["now"] not in seen:
            seen.add(v["now"])
            out.append({"cycle": v["now"], "ingress_port": v["sel"] + 1, "egress_port": v["d_port"] + 1,
                        "frame_bytes": v["flen"], "queue_bytes": v["d_occ"]})
    return out
