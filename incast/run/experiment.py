"""Run one scenario: build the network, run the workload, collect the tables.

The steps, in order (each waits for the previous one to report, never for time):
  1. probe the kernel and check the scenario's needs        (nothing created yet)
  2. create the run's world namespace and the Mininet network inside it
  3. configure the hosts' TCP and NICs, and the switch queues
  4. start the servers (each prints READY) and, optionally, queue telemetry (READY)
  5. per repetition: the client connects, runs its warm-up blocks and prints WARM;
     counters are read; GO starts the measured blocks; counters are read again
  6. stop telemetry, write the tables and the summary, rename the results directory
Whatever happens, the run's namespaces, links and processes are removed.
"""
from __future__ import annotations

import functools
import json
import os
import platform
import re
import resource
import selectors
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from incast import clock as clocks
from incast import dataplane as dataplanes
from incast.measure import calibration, cpu, fidelity
from incast.network import hostconfig
from incast.machine import netdev
from incast.machine import resources
from incast.network import topology
from incast import workload as workloads
from incast.workload.background import BackgroundTraffic
from incast.measure.capture import ServerCapture
from incast.machine.probe import Features, probe, require
from incast.measure.results import ResultsDir, measured_seconds, one_line, summarize
from incast.scenario import Scenario, to_toml
from incast.workload import Block, Hooks
from incast.constants import HOSTS_DIR
from incast.errors import RunFailed

from incast.constants import REPO
STALL_TIMEOUT_S = 300   # no output from the client for this long: the run is wedged


def environment(features: Features, scenario: Scenario, tcp: hostconfig.TcpProfile) -> dict:
    import mininet.net
    versions = {"python": platform.python_version(), "mininet": mininet.net.VERSION,
                "pandas": pd.__version__, "bpftrace": features.bpftrace}
    try:
        import pyarrow
        versions["pyarrow"] = pyarrow.__version__
    except ImportError:
        pass
    versions["iproute2"] = netdev.version()
    return {
        "kernel": features.kernel, "hz": features.hz, "jiffy_us": features.jiffy_us,
        "clock": features.clock.name, "clocksource": features.clocksource,
        "rto_min_us": tcp.rto_min_us, "rto_floor_us": tcp.rto_floor_us, "hrtimer_rto": tcp.hrtimer,
        "dataplane": scenario.dataplane, "machine": platform.machine(),
        "cpus": len(os.sched_getaffinity(0)),
        "versions": versions, "features": features.as_dict(),
        "calibration": calibration.brief(),
    }


def calibrated_rate(scenario: Scenario) -> int | None:
    """bit/s this machine's cached calibration found faithful for the scenario's senders;
    None where there is none or it does not apply (calibration measures the linux data
    plane; bmv2 reports its own health)."""
    if not dataplanes.REGISTRY[scenario.dataplane].calibrated:
        return None
    c = calibration.cached()
    if c is None:
        return None
    try:
        return calibration.faithful_rate(c, scenario.topology.senders)
    except RuntimeError:
        return 0


@dataclass
class Outcome:
    run_dir: Path
    summary: dict


PHASE_LINE = re.compile(r"phase: (\w+) ([0-9.]+)$")
# A run's phases, in order; the host adds boot and imports (and exit) for a guest's run.
PHASES = ("setup", "build", "start", "warmup", "measured", "stop", "teardown", "results")


class Phases:
    """Seconds per phase of a run on its own clock (virtual in User-Mode Linux), and a
    line ``phase: NAME SECONDS`` at each boundary: a host following a guest's run
    stamps those lines with its own clock (host_phase_s)."""

    def __init__(self, log):
        self.log, self.t, self.seconds = log, time.monotonic(), dict.fromkeys(PHASES, 0.0)
        log("phase: started 0")

    def mark(self, name: str) -> None:
        """The phase `name` ends now (a phase that recurs, such as a repetition's
        warm-up, adds up)."""
        now = time.monotonic()
        self.seconds[name] += now - self.t
        self.t = now
        self.log(f"phase: {name} {self.seconds[name]:.3f}")

    def rounded(self) -> dict:
        return {k: round(v, 3) for k, v in self.seconds.items()}


class _Lines:
    """Line reader over a child's stdout with a stall detector. It reads the pipe itself:
    a buffered file object would hold lines that already arrived where select() cannot
    see them, and wait for more output that may never come."""

    def __init__(self, proc, what):
        self.proc, self.what = proc, what
        self.fd = proc.stdout.fileno()
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.fd, selectors.EVENT_READ)
        self.pending = b""

    def next(self) -> str:
        while b"\n" not in self.pending:
            if not self.sel.select(STALL_TIMEOUT_S):
                raise RunFailed(f"{self.what} produced nothing for {STALL_TIMEOUT_S} s")
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                self.proc.wait()
                err = self.proc.stderr.read().strip().splitlines() if self.proc.stderr else []
                raise RunFailed(f"{self.what} exited ({self.proc.returncode}): "
                                f"{err[-1] if err else 'no error output'}")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode(errors="replace").rstrip("\r")

    def expect(self, word: str) -> None:
        line = self.next()
        if line != word:
            raise RunFailed(f"{self.what}: expected {word}, got {line!r}")


def softnet_drops() -> int:
    """Packets the kernel dropped because a CPU's input backlog was full
    (net.core.netdev_max_backlog): a loss point outside the switch queues."""
    total = 0
    for line in open("/proc/net/softnet_stat"):
        total += int(line.split()[1], 16)
    return total


def _counter_rows(hosts, before: dict, after: dict, rep: int) -> list[dict]:
    rows = []
    for h in hosts:
        row = {"rep": rep, "host": h.name}
        for k in hostconfig.COUNTERS:
            row[k] = after[h.name].get(k, 0) - before[h.name].get(k, 0)
        rows.append(row)
    return rows


def _queue_delta(before: pd.DataFrame, after: pd.DataFrame, rep: int) -> pd.DataFrame:
    key = ["switch", "port", "queue"]
    delta = after.copy()
    b = before.set_index(key)
    a = after.set_index(key)
    for col in ("sent_packets", "sent_bytes", "drops", "marks", "overlimits"):
        delta[col] = (a[col] - b[col]).values
    delta.insert(0, "rep", rep)
    return delta


def watched_links(net, dp, scenario, world_inode: int) -> list[fidelity.WatchedLink]:
    """The links whose service the link monitor measures: the switch ports a qdisc
    paces (the data plane says which) and every host's NIC."""
    from incast.constants import WIRE_OVERHEAD
    from incast.constants import ETH_HLEN
    rate, frame = scenario.link.rate, scenario.link.mtu + ETH_HLEN
    links = [fidelity.WatchedLink(p.name, "switch", world_inode, p.ifindex, dataplanes.port_rate(p, scenario),
                                  WIRE_OVERHEAD, frame)
             for p in dp.paced_ports()]
    for h in net.hosts:
        intf = h.defaultIntf().name
        inode, index = resources.interface_index(h.netns_path, intf)
        links.append(fidelity.WatchedLink(intf, "nic", inode, index, rate, WIRE_OVERHEAD, frame))
    return links


def uml_memory_mb(scenario: Scenario) -> int:
    """Guest memory for a run in User-Mode Linux: a base for the runner, Python and the
    switch, and per host its processes and socket buffers (INCAST_UML_MEMORY_MB overrides)."""
    if os.environ.get("INCAST_UML_MEMORY_MB"):
        return int(os.environ["INCAST_UML_MEMORY_MB"])
    per_server = 12 if scenario.workload.server_process == "shared" else 48
    wanted = 1536 + per_server * (scenario.topology.senders + 1)
    # A ceiling, not a reservation: UML maps its memory as a sparse file and touches what
    # the guest uses (measured: 1.4 GB at 1020 servers); held below this machine's
    # memory all the same (a 2048-server run would ask for 26 GB).
    machine_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    return min(wanted, int(0.75 * machine_mb))


BLOCK_LINE = re.compile(r"block (\d+)/(\d+)$")


def block_lines(scenario):
    """Progress without a terminal for a bar: a line per block, as BLOCK_LINE reads
    them (a host following a guest's run)."""
    total, done = scenario.workload.blocks * scenario.workload.repetitions, 0

    def progress(n):
        nonlocal done
        done += n
        print(f"block {done}/{total}", file=sys.stderr, flush=True)
    return progress


def run_in_guest(scenario: Scenario, out: Path, log=lambda msg: None, unique_out: bool = False,
                 progress=None) -> Outcome:
    """Run the scenario inside a guest kernel: a QEMU VM booted with the stock or hrtimer
    kernel (clock real), or User-Mode Linux built from the same source (clock virtual).
    The same code runs inside, on the machine's root shared read-only; the results come
    back through the guest's writable directory and land at out like any run's, with the
    host wall time beside the guest's (virtual) time, per phase (host_phase_s)."""
    import shutil
    import tempfile
    from incast.vm import guest, qemu, uml
    from incast.errors import MissingFeature
    from incast.measure.results import Claim
    clock = clocks.named(scenario.clock)
    runner = {"uml": uml, "qemu": qemu}[clock.guest_runner]
    variant = uml.variant(scenario.kernel) if runner is uml else scenario.kernel
    if runner is qemu and qemu.qemu_binary() is None:
        raise MissingFeature("--kernel needs qemu-system-x86_64 (Debian package qemu-system-x86)")
    if guest.kernel_dir(variant) is None:
        raise MissingFeature(f"the {variant} kernel is not built for the current inputs: run "
                             f"{clock.guest_build_hint}")
    dataplanes.get(scenario.dataplane).prepare_on_host(scenario)
    inner = scenario.model_copy(update={"kernel": "host", "clock": "real"})
    claim = Claim(out, unique_out)
    out = claim.final
    # -v: the guest's run says what it does, a line per block and one per phase, which
    # the host follows as they are written (a run of hundreds of servers takes an hour
    # of host time) and stamps with its own clock. The first line marks the guest's boot.
    command = f"echo 'phase: booted 0'; {sys.executable} -m incast run $RESULTS/scenario.toml " \
              "--out $RESULTS/run --json -v"
    host_phases = HostPhases()

    def on_line(line: str):
        if BLOCK_LINE.match(line):
            if progress:
                progress(1)
        elif PHASE_LINE.match(line):
            host_phases.stamp(PHASE_LINE.match(line).group(1))
        elif line and not line.startswith("{"):      # the last line is the summary
            log(line if line.startswith("warning:") else f"guest: {line}")
    if runner is uml:
        # The guest's root is this machine's: the tools found on the caller's PATH
        # (bmv2 under /opt/p4, say) are found there too, after the guest's own PATH
        # (the system's ip, tc and sh first, whatever shims the caller's PATH has).
        command = f"export PATH=$PATH:{shlex.quote(os.environ.get('PATH', ''))}; {command}"
    with tempfile.TemporaryDirectory(prefix=".incast-vm-", dir=out.parent) as tmp:
        Path(tmp, "scenario.toml").write_text(to_toml(inner))
        if runner is uml:
            log(f"starting the {variant} kernel in virtual time")
            r = uml.run(command, kernel=variant, results_dir=tmp, timeout=6 * 3600, cwd=REPO,
                        memory_mb=uml_memory_mb(scenario), env={"PYTHONHASHSEED": "0"}, on_line=on_line)
        else:
            log(f"booting the {variant} kernel")
            r = qemu.run(command, kernel=variant, results_dir=tmp, timeout=3600, cwd=REPO, on_line=on_line)
        if r.returncode != 0 or not Path(tmp, "run", "summary.json").is_file():
            lines = [ln for ln in (r.output or "").strip().splitlines() if ln.startswith("incast:")]
            why = lines[-1] if lines else ("timed out" if r.timed_out else f"exit status {r.returncode}")
            raise RunFailed(f"the run in the {variant} {'UML' if runner is uml else 'VM'} failed: {why}")
        for item in Path(tmp, "run").iterdir():
            shutil.move(str(item), str(claim.path / item.name))
    claim.finalize()
    summary = json.loads((out / "summary.json").read_text())
    summary.update({"kernel": scenario.kernel, "clock": scenario.clock, "run_dir": str(out),
                    "host_seconds": round(r.elapsed, 3), "guest_seconds": r.guest_seconds,
                    "host_phase_s": host_phases.seconds(r.elapsed)})
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "scenario.toml").write_text(to_toml(scenario))
    if runner is uml and r.guest_seconds is not None:   # the guest has said the rest
        log(f"virtual {r.guest_seconds:.2f} s in {r.elapsed:.0f} s of host time")
    return Outcome(run_dir=out, summary=summary)


class HostPhases:
    """The host's seconds per phase of a guest's run, from the moment each ``phase:``
    line reached the host (followed every 0.2 s: that is the resolution). ``boot`` ends
    when the guest's command starts, ``imports`` when the run inside begins; ``exit``
    is what follows its last phase (the guest shutting down)."""

    def __init__(self):
        self.t0 = time.monotonic()
        self.stamps: list[tuple[str, float]] = []

    def stamp(self, name: str) -> None:
        self.stamps.append(({"booted": "boot", "started": "imports"}.get(name, name), time.monotonic()))

    def seconds(self, elapsed: float) -> dict:
        out, last = {}, self.t0
        for name, t in self.stamps:
            out[name] = round(out.get(name, 0.0) + t - last, 2)
            last = t
        out["exit"] = round(max(0.0, self.t0 + elapsed - last), 2)
        return out


def run(scenario: Scenario, out: Path, progress=None, log=lambda msg: None,
        calibrating: bool = False, unique_out: bool = False) -> Outcome:
    """Run a validated scenario; write its results directory at out (unique_out: or
    at out-2, out-3... if another run has it). calibrating: a calibration trial (not
    judged against the calibration it is making)."""
    if scenario.kernel != "host":
        return run_in_guest(scenario, out, log, unique_out, progress)
    auto_rate = scenario.link.rate == "auto"
    phases = Phases(log)
    results = ResultsDir(out, unique=unique_out)     # the output location first: exit 2, nothing built
    try:
        scenario = calibration.resolve_auto_rate(scenario)
        features = probe()
        for note in require(features, scenario):
            log(note)
        # The servers' profile is the run's headline: their timeouts make the collapse.
        tcp = hostconfig.TcpProfile.of(scenario, features, "servers")
    except BaseException:
        results.claim.abandon()
        raise
    results.write_text("scenario.toml", to_toml(scenario))
    env = environment(features, scenario, tcp)
    results.write_json("environment.json", env)
    dp = dataplanes.get(scenario.dataplane)(scenario, features)
    dp.log_dir = results.path
    phases.mark("setup")
    with resources.Run() as res:
        lab = _build(scenario, features, tcp, dp, res, results, log)
        phases.mark("build")
        m = _measure(scenario, features, dp, res, lab, results, progress, log, phases)
        phases.mark("stop")
    phases.mark("teardown")
    summary = _summary(scenario, dp, lab, m, tcp, auto_rate, results, calibrating, log)
    _write_tables(results, m)
    phases.mark("results")
    summary["phase_s"] = phases.rounded()
    results.write_json("summary.json", summary)
    final = results.finalize()
    log(one_line(summary))
    return Outcome(run_dir=final, summary=summary)


@dataclass
class _Lab:
    """The built network."""
    net: object
    client: object
    servers: list
    dscps: list[int]
    bottleneck: object
    build_s: float
    netns: frozenset[int] = frozenset()     # inodes of the run's network namespaces


@dataclass
class _Measured:
    blocks: pd.DataFrame
    flows: pd.DataFrame
    counters: pd.DataFrame
    queues: pd.DataFrame
    backlog_drops: int
    cpu: dict
    pause: dict | None
    health: dict
    health_warnings: list[str]
    links: list
    monitored: dict
    telemetry: pd.DataFrame | None
    telemetry_lost: int | None
    telemetry_notes: list[str]      # what the recorder could not record, and how it sampled
    capture: dict | None = None     # capture.json: packets per server, kernel drops, clock
    background: pd.DataFrame | None = None   # one row per background flow and repetition


def _build(scenario, features, tcp, dp, res, results, log) -> _Lab:
    # Imported late: Mininet is heavy and only needed once a network is built.
    from mininet.log import setLogLevel
    from mininet.net import Mininet

    from incast.network.link import BatchedHost, DeferredIntf, VethBatch
    setLogLevel("error")
    wanted = sorted({t.cc for _, t in scenario.tcp.all_settings()} - set(features.cc_allowed))
    if wanted:
        # Namespaces may only pick algorithms the init namespace allows.
        res.set_global_sysctl("net.ipv4.tcp_allowed_congestion_control",
                              " ".join(features.cc_allowed + wanted))
    # The kernel keeps one ARP table for all namespaces, and past gc_thresh3 entries it
    # refuses new neighbours ("No route to host"). The client has every server for a
    # neighbour and each server the client: a thousand servers pass the default 1024.
    hosts = len(scenario.topology.hosts())
    for level, need in (("gc_thresh1", 2 * hosts), ("gc_thresh2", 3 * hosts), ("gc_thresh3", 4 * hosts)):
        res.raise_global_sysctl(f"net.ipv4.neigh.default.{level}", need)
    # Every frame a veth carries passes a CPU's input backlog, one per CPU for all
    # namespaces. When a thousand servers send at the same instant (virtual time, one
    # CPU) they queue there before the switch sees them, and past netdev_max_backlog
    # (1000) the kernel drops outside the switch (measured: 20 frames at 1020 servers).
    # Room for every host's largest NIC burst (a frame plus NIC_SLACK_FRAMES_MAX) and one more.
    res.raise_global_sysctl("net.core.netdev_max_backlog",
                            (hostconfig.NIC_SLACK_FRAMES_MAX + 2) * hosts)
    res.create_world()
    # Mininet keeps pipes to every host's shell: hundreds of hosts pass 1024 files.
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    t_build = time.monotonic()
    topo = topology.load(scenario.topology.kind, scenario.topology.senders, **scenario.topology.params())
    veths = VethBatch()
    res.create_host_netns(topo.hosts())
    log(f"build: {len(topo.hosts())} host namespaces made")
    net = Mininet(topo=topo, switch=dp.switch_class(), controller=None,
                  host=functools.partial(BatchedHost, netns_of=res.host_netns),
                  link=veths.link_class(), intf=DeferredIntf, build=False, waitConnected=False)
    try:
        net.build()
        veths.create()
    finally:    # every node shell Mininet started, even if the build failed half-way
        res.track(*(getattr(n, "shell", None) for n in net.hosts + net.switches))
    log(f"build: {len(net.links)} links made")
    net.start()
    log("build: switches started")
    client = net.get(topo.client)
    servers = [net.get(s) for s in topo.servers]
    applied = hostconfig.configure_hosts(net.hosts, servers, scenario, features)
    log("build: hosts configured")
    results.write_json("tcp_hosts.json", applied)
    dp.configure(net, topo)
    log("build: data plane configured")
    for name, text in dp.artifacts().items():
        results.write_text(name, text)
    build_s = time.monotonic() - t_build
    log(f"network of {len(net.hosts)} hosts built in {build_s:.1f} s ({res.token})")
    qos = scenario.switch.qos
    dscps = [qos.class_dscp()[qos.class_of_sender(i)] for i in range(len(servers))]
    netns = frozenset(os.stat(h.netns_path).st_ino for h in net.hosts) | {resources.netns_inode(res.world)}
    return _Lab(net, client, servers, dscps, dp.bottleneck(client.name), build_s, netns)


def _measure(scenario, features, dp, res, lab: _Lab, results, progress, log, phases) -> _Measured:
    """Start the workload's servers and what measures alongside, run the repetitions,
    stop everything that measured."""
    wl = workloads.get(scenario.workload.kind)(scenario, hostconfig.host_popen, _Lines)
    wl.start_servers(lab.servers, lab.dscps)
    background = None
    if scenario.background:
        background = BackgroundTraffic(scenario, hostconfig.host_popen, _Lines)
        background.start(lab.net)
    agents = _start_pause_agents(lab, scenario, features)
    dp.start_flow_control(results.path)
    world_inode = resources.netns_inode(res.world)
    tracer = None
    if scenario.telemetry.enabled:
        tracer = dp.telemetry(results.path, {h.IP(): h.name for h in lab.net.hosts}, world_inode)
        tracer.start()
    capture = None
    if scenario.telemetry.capture:
        capture = ServerCapture(results.path, hostconfig.host_popen)
        capture.start(lab.servers)
    links = watched_links(lab.net, dp, scenario, world_inode)
    monitor = None
    if fidelity.monitor_binary() is not None and features.clock.bpf:   # BPF: not on ARCH=um
        monitor = fidelity.LinkMonitor(links, skip_first=fidelity.skip_first(dp.port_burst_frames))
        monitor.start()
    phases.mark("start")
    reps = _Repetitions(scenario, dp, lab, wl, progress, background,
                        on_t0=lambda: _storm_begins(agents, scenario), phases=phases)
    for rep in range(scenario.workload.repetitions):
        reps.run(rep)
    if background:
        background.stop()
    pause_ports = dp.stop_flow_control()
    if pause_ports is not None:
        results.write_table("pause_ports.parquet", pause_ports)
    pause = _stop_pause_agents(agents, dp) if agents else None
    for edge in ("storm_start", "storm_end"):   # on the blocks' time axis
        if pause and f"{edge}_ns" in pause and reps.t0_ns is not None:
            pause[f"{edge}_us"] = round((pause.pop(f"{edge}_ns") - reps.t0_ns) / 1000, 1)
    health, health_warnings = dp.health(sum(int(q["sent_packets"].sum()) for q in reps.queue_frames))
    monitored = monitor.stop() if monitor else {}
    captured = capture.stop(reps.t0_ns) if capture else None
    telemetry_table, lost, notes = None, None, []
    if tracer:
        tres = tracer.stop(reps.t0_ns)
        telemetry_table, lost, notes = tres.table, tres.lost, tres.notes
        for note in tres.notes:
            log(note)
    return _Measured(pd.DataFrame(reps.block_rows), pd.DataFrame(reps.flow_rows),
                     pd.DataFrame(reps.counter_rows), pd.concat(reps.queue_frames, ignore_index=True),
                     reps.backlog_drops, cpu.use(reps.cpu_before, reps.cpu_after), pause,
                     health, health_warnings, links, monitored, telemetry_table, lost, notes, captured,
                     pd.DataFrame(background.rows) if background else None)


class _Repetitions:
    """Runs the workload's repetitions, measuring around their measured blocks."""

    def __init__(self, scenario, dp, lab: _Lab, wl, progress, background=None, on_t0=None, phases=None):
        self.scenario, self.dp, self.lab, self.wl, self.progress = scenario, dp, lab, wl, progress
        self.phases = phases
        self.background = background
        self.on_t0 = on_t0      # called as the first measured block begins
        self.block_rows, self.flow_rows, self.counter_rows, self.queue_frames = [], [], [], []
        self.t0_ns = None
        self.backlog_drops = 0
        self.cpu_before = self.cpu_after = None

    def run(self, rep: int) -> None:
        hosts, servers, block_bytes = self.lab.net.hosts, self.lab.servers, self.wl.block_bytes()
        before = {}

        def measuring():
            if self.phases:
                self.phases.mark("warmup")
            before["counters"] = hostconfig.read_counters(hosts)
            before["queues"] = self.dp.queue_counters()
            before["softnet"] = softnet_drops()
            if self.t0_ns is None:
                self.t0_ns = time.monotonic_ns()
                self.cpu_before = cpu.snapshot(self.lab.netns)
                if self.on_t0:
                    self.on_t0()
            if self.background:
                self.background.measuring(rep)

        def block(b: Block):
            self.block_rows.append({
                "rep": rep, "block": b.index, "start_us": (b.start_ns - self.t0_ns) / 1000,
                "end_us": (b.end_ns - self.t0_ns) / 1000, "duration_ms": (b.end_ns - b.start_ns) / 1e6,
                "bytes": block_bytes, "goodput_mbps": block_bytes * 8 / ((b.end_ns - b.start_ns) / 1e3),
                "last_server": servers[b.last_server].name if b.last_server >= 0 else ""})
            if self.progress:
                self.progress(1)

        def measured():
            if self.phases:
                self.phases.mark("measured")
            self.cpu_after = cpu.snapshot(self.lab.netns)
            if self.background:
                self.background.measured(rep)
            after = hostconfig.read_counters(hosts)
            self.queue_frames.append(_queue_delta(before["queues"], self.dp.queue_counters(), rep))
            self.backlog_drops += softnet_drops() - before["softnet"]
            self.counter_rows += _counter_rows(hosts, before["counters"], after, rep)

        flows = self.wl.repetition(rep, self.lab.client, servers, self.lab.dscps,
                                   Hooks(measuring, block, measured))
        for f in flows:
            i = f.pop("server_index")
            self.flow_rows.append({"rep": rep, "server": servers[i].name, "client": self.lab.client.name,
                                   "dscp": self.lab.dscps[i], **f})


def _start_pause_agents(lab: _Lab, scenario, features) -> list:
    """veth ignores PAUSE: with PAUSE on, each host runs an agent that stops its NIC."""
    if not scenario.switch.pause.enabled:
        return []
    agents = []
    classes = _host_classes(scenario, lab)
    storm = scenario.switch.pause.storm
    for h in lab.net.hosts:
        args = hostconfig.pause_agent_args(h.defaultIntf().name, scenario, features)
        args += ["--classes", ",".join(map(str, sorted(classes[h.name])))]
        if storm and storm.host == h.name:
            args += ["--storm-after-us", str(storm.after), "--storm-us", str(storm.duration),
                     "--quanta", str(scenario.switch.pause.quanta)]
        agents.append((h, hostconfig.host_popen(h, [sys.executable, str(HOSTS_DIR / "pause_agent.py"), *args],
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    for h, a in agents:
        _Lines(a, f"PAUSE agent on {h.name}").expect("READY")
    return agents


def _storm_begins(agents, scenario) -> None:
    """Tell the storming host's agent that the measured blocks begin (its storm starts
    switch.pause.storm.after later)."""
    storm = scenario.switch.pause.storm
    for h, a in agents:
        if storm and h.name == storm.host:
            a.send_signal(signal.SIGUSR1)


def _host_classes(scenario, lab: _Lab) -> dict[str, set[int]]:
    """The traffic classes each host sends data in (the servers' DSCPs, background
    flows'); a host that sends only ACKs and requests sends them in class 0."""
    table = scenario.switch.qos.dscp_table()
    classes: dict[str, set[int]] = {h.name: set() for h in lab.net.hosts}
    for server, dscp in zip(lab.servers, lab.dscps):
        classes[server.name].add(table[dscp])
    for f in scenario.background:
        classes[f.src].add(table[f.dscp])
    return {name: c or {0} for name, c in classes.items()}


def _stop_pause_agents(agents, dp) -> dict:
    pause = {"paused_ms": 0.0, "pause_frames_received": 0, "pause_token_frames": 0, "reaction_us": []}
    for h, a in agents:
        a.terminate()
        out, err = a.communicate(timeout=30)
        if not out.strip():
            raise RunFailed(f"PAUSE agent on {h.name} failed: {err.strip()[-1500:] or 'no output'}")
        stats = json.loads(out.strip().splitlines()[-1])
        pause["paused_ms"] += stats["paused_ms"]
        pause["pause_frames_received"] += stats["pause_frames"] + stats["resume_frames"]
        pause["reaction_us"] += stats["reaction_us"]
        pause["pause_token_frames"] += stats["drains"]
        if "storm_frames" in stats:     # times as monotonic ns: the summary makes them relative
            pause.update({k: stats[k] for k in ("storm_frames", "storm_start_ns", "storm_end_ns") if k in stats})
    pause.update(dp.pause_counters())
    return pause


def _summary(scenario, dp, lab: _Lab, m: _Measured, tcp, auto_rate, results, calibrating, log) -> dict:
    summary = summarize(m.blocks, m.counters, m.queues, m.telemetry, m.telemetry_lost, scenario.link.rate,
                        scenario.topology.senders, lab.bottleneck.name)
    summary.update({"dataplane": scenario.dataplane, "cc": tcp.cc, "rto_min_us": tcp.rto_min_us,
                    "rto_floor_us": tcp.rto_floor_us, "bottleneck_port": lab.bottleneck.name,
                    "build_s": round(lab.build_s, 3), "repetitions": scenario.workload.repetitions,
                    "backlog_drops": m.backlog_drops, "link_rate_auto": auto_rate,
                    "run_dir": str(results.final)})
    if m.capture is not None:
        dropped = [h["dropped_by_kernel"] for h in m.capture["hosts"].values()]
        summary["capture_dropped"] = None if None in dropped else sum(dropped)
        if summary["capture_dropped"]:
            log(f"warning: the capture lost {summary['capture_dropped']} packets (tcpdump's kernel drops): "
                "incast explain will say so")
    if m.background is not None and len(m.background):
        summary["background_mbps"] = [round(float(g), 3) for g in
                                      m.background.groupby("flow")["goodput_mbps"].mean()]
    if scenario.tcp.hosts:      # cc and rto_min above are the servers' role's
        summary["tcp_hosts"] = dict(scenario.tcp.hosts)
    if m.telemetry_notes:
        summary["telemetry_notes"] = m.telemetry_notes
    if m.pause is not None:
        summary.update(_pause_summary(scenario, dict(m.pause)))
        room, needed = summary["pause_headroom_bytes"], summary["pause_headroom_needed_bytes"]
        if room is not None and needed > room:
            log(f"warning: PAUSE cannot keep this buffer lossless: {room} B above XOFF, but "
                f"{needed} B can still arrive after it ({scenario.topology.senders} senders, each "
                "with the frames on their way and what it sends during the slowest reaction this run "
                "measured); give switch.buffer more room or switch.pause.xoff less")
    summary.update(m.health)
    for warning in m.health_warnings:
        log(warning)
    if m.backlog_drops:
        log(f"warning: {m.backlog_drops} packets dropped by full CPU input backlogs, not by the "
            "switch (raise net.core.netdev_max_backlog)")
    summary["fidelity"] = _fidelity(scenario, m, calibrating, log, dp.features.clock)
    if not summary["fidelity"]["ok"]:
        log(fidelity.warning_line(summary["fidelity"]))
    return summary


def _pause_summary(scenario, pause: dict) -> dict:
    reactions = pause.pop("reaction_us")
    worst = float(max(reactions)) if reactions else 0.0
    return {"pause_frames": pause["pause_frames_sent"] + pause["xon_frames_sent"],
            # The buffer above XOFF against what can still arrive once a port passes it,
            # with the slowest reaction this run measured (a warning where it cannot hold it).
            "pause_headroom_bytes": scenario.pause_headroom_bytes(),
            "pause_headroom_needed_bytes": scenario.pause_headroom_needed(worst),
            "paused_ms": round(pause["paused_ms"], 3),
            "pause_reaction_us_p50": float(np.median(reactions)) if reactions else None,
            "pause_reaction_us_p99": float(np.percentile(reactions, 99)) if reactions else None,
            **dict(zip(("pause_xoff_bytes", "pause_xon_bytes"), scenario.switch.port_pause_thresholds(
                scenario.link.mtu, scenario.topology.senders))),
            **pause}


def _fidelity(scenario, m: _Measured, calibrating: bool, log, clock) -> dict:
    """calibrating: a calibration trial; a clock without calibration (virtual) has no
    faithful rate to judge by."""
    uncalibrated = calibrating or not clock.calibrated
    faithful_bps = None if uncalibrated else calibrated_rate(scenario)
    if faithful_bps is None and not uncalibrated and dataplanes.REGISTRY[scenario.dataplane].calibrated:
        log("warning: this machine is not calibrated, so the run cannot say whether its link rate "
            "is one the machine holds (incast calibrate: under a minute, once)")
    rows = fidelity.link_rows(m.links, m.monitored) if m.monitored else []
    verdict = fidelity.assess(
        rows, m.monitored.get("watchdog"), m.cpu, m.backlog_drops, m.health_warnings, bool(m.monitored),
        measured_ms=measured_seconds(m.blocks) * 1000, rate_bps=scenario.link.rate,
        faithful_bps=faithful_bps, senders=scenario.topology.senders, clock=clock)
    # A sweep run with --force-jobs: how many runs shared the machine with this one (their
    # load shows in this run's CPU and link measurements, which judge it).
    verdict["concurrent_runs"] = int(os.environ.get("INCAST_CONCURRENT_RUNS", "0"))
    return verdict


def _write_tables(results, m: _Measured) -> None:
    if m.monitored:
        results.write_table("links.parquet", pd.DataFrame(fidelity.link_rows(m.links, m.monitored)))
    results.write_table("blocks.parquet", m.blocks)
    results.write_table("counters.parquet", m.counters)
    results.write_table("queues.parquet", m.queues)
    results.write_table("flows.parquet", m.flows)
    if m.telemetry is not None:
        results.write_table("telemetry.parquet", m.telemetry)
    if m.background is not None:
        results.write_table("background.parquet", m.background)
