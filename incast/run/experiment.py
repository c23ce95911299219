"""Run one scenario: build the network, run the workload, collect the tables.

The steps, in order (each waits for the previous one to report, never for time):
  1. probe the kernel and check the scenario's needs        (nothing created yet)
  2. create the run's world namespace and the Mininet network inside it (incast.run.lab)
  3. configure the hosts' TCP and NICs, and the switch queues
  4. start the servers (each prints READY) and the instruments the scenario asks for
     (incast.measure.instrument: counters, CPU, background traffic, flow control,
     telemetry, capture, the link monitor)
  5. per repetition: the client connects, runs its warm-up blocks and prints WARM;
     the instruments see the measured blocks begin; GO starts them; the instruments
     see them end
  6. stop the instruments, write their tables and the summary, rename the results directory
A scenario on a guest kernel runs the same steps inside it (incast.run.in_guest).
Whatever happens, the run's namespaces, links and processes are removed.
"""
from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import mininet.net
import pandas as pd
import pyarrow

from incast import clock as clocks
from incast import dataplane as dataplanes
from incast import workload as workloads
from incast.machine import netdev, resources
from incast.machine.probe import Features, probe
from incast.measure import calibration, fidelity
from incast.measure.instrument import Bench, Instruments, Readings, selected
from incast.measure.results import Outcome, ResultsDir, measured_seconds, one_line, summarize
from incast.network import hostconfig
from incast.registry import DATAPLANES, INSTRUMENTS
from incast.run import lab as labs
from incast.run.in_guest import run_in_guest
from incast.run.lines import Lines
from incast.run.phases import Phases
from incast.run.preflight import require
from incast.scenario import Scenario, to_toml
from incast.workload import Block, Hooks


def environment(features: Features, scenario: Scenario, tcp: hostconfig.TcpProfile) -> dict:
    versions = {"python": platform.python_version(), "mininet": mininet.net.VERSION,
                "pandas": pd.__version__, "bpftrace": features.bpftrace}
    try:
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
    if not DATAPLANES[scenario.dataplane].calibrated:
        return None
    c = calibration.cached()
    if c is None:
        return None
    try:
        return calibration.faithful_rate(c, scenario.topology.senders)
    except RuntimeError:
        return 0


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
        lab = labs.build(scenario, features, dp, res, results, log)
        phases.mark("build")
        blocks, flows, readings = _measure(scenario, features, dp, res, lab, results, progress, log, phases)
        phases.mark("stop")
    phases.mark("teardown")
    summary = _summary(scenario, lab, blocks, readings, tcp, auto_rate, results, calibrating, log,
                       features.clock)
    for name, table in {**readings.tables, "blocks.parquet": blocks, "flows.parquet": flows}.items():
        results.write_table(name, table)
    phases.mark("results")
    summary["phase_s"] = phases.rounded()
    results.write_json("summary.json", summary)
    final = results.finalize()
    log(one_line(summary))
    return Outcome(run_dir=final, summary=summary)


def _measure(scenario, features, dp, res, lab: labs.Lab, results, progress, log, phases):
    """Start the workload's servers and the instruments, run the repetitions, stop the
    instruments: (blocks, flows, what the instruments read)."""
    wl = workloads.get(scenario.workload.kind)(scenario, hostconfig.host_popen, Lines)
    wl.start_servers(lab.servers, lab.dscps)
    bench = Bench(scenario, features, dp, lab.net, lab.client, lab.servers, lab.dscps, lab.netns,
                  resources.netns_inode(res.world), results.path, hostconfig.host_popen, Lines, log)
    instruments = Instruments(selected(scenario, features), bench)
    instruments.start()
    phases.mark("start")
    reps = _Repetitions(bench, wl, instruments, progress, phases)
    for rep in range(scenario.workload.repetitions):
        reps.run(rep)
    readings = instruments.stop()
    return pd.DataFrame(reps.block_rows), pd.DataFrame(reps.flow_rows), readings


class _Repetitions:
    """Runs the workload's repetitions, the instruments told of their measured blocks."""

    def __init__(self, bench: Bench, wl, instruments: Instruments, progress, phases: Phases):
        self.bench, self.wl, self.instruments, self.progress, self.phases = bench, wl, instruments, progress, phases
        self.block_rows, self.flow_rows = [], []

    def run(self, rep: int) -> None:
        b = self.bench
        servers, block_bytes = b.servers, self.wl.block_bytes()

        def measuring():
            self.phases.mark("warmup")
            self.instruments.measuring(rep)
            if b.t0_ns is None:     # the time axis starts as the first measured block does
                b.t0_ns = time.monotonic_ns()

        def block(blk: Block):
            self.block_rows.append({
                "rep": rep, "block": blk.index, "start_us": (blk.start_ns - b.t0_ns) / 1000,
                "end_us": (blk.end_ns - b.t0_ns) / 1000, "duration_ms": (blk.end_ns - blk.start_ns) / 1e6,
                "bytes": block_bytes, "goodput_mbps": block_bytes * 8 / ((blk.end_ns - blk.start_ns) / 1e3),
                "last_server": servers[blk.last_server].name if blk.last_server >= 0 else ""})
            if self.progress:
                self.progress(1)

        def measured():
            self.phases.mark("measured")
            self.instruments.measured(rep)

        flows = self.wl.repetition(rep, b.client, servers, b.dscps, Hooks(measuring, block, measured))
        for f in flows:
            i = f.pop("server_index")
            self.flow_rows.append({"rep": rep, "server": servers[i].name, "client": b.client.name,
                                   "dscp": b.dscps[i], **f})


def _summary(scenario, lab: labs.Lab, blocks, readings: Readings, tcp, auto_rate, results, calibrating, log,
             clock) -> dict:
    tables = readings.tables
    counters, queues = INSTRUMENTS["counters"].tables
    telemetry = INSTRUMENTS["telemetry"].tables[0]
    summary = summarize(blocks, tables[counters], tables[queues], tables.get(telemetry),
                        readings.facts.telemetry_lost, scenario.link.rate,
                        scenario.topology.senders, lab.bottleneck.name)
    summary.update({"dataplane": scenario.dataplane, "cc": tcp.cc, "rto_min_us": tcp.rto_min_us,
                    "rto_floor_us": tcp.rto_floor_us, "bottleneck_port": lab.bottleneck.name,
                    "build_s": round(lab.build_s, 3), "repetitions": scenario.workload.repetitions,
                    "link_rate_auto": auto_rate, "run_dir": str(results.final)})
    if scenario.tcp.hosts:      # cc and rto_min above are the servers' role's
        summary["tcp_hosts"] = dict(scenario.tcp.hosts)
    summary.update(readings.summary)
    for line in readings.messages:
        log(line)
    summary["fidelity"] = _fidelity(scenario, blocks, readings, calibrating, log, clock)
    if not summary["fidelity"]["ok"]:
        log(fidelity.warning_line(summary["fidelity"]))
    return summary


def _fidelity(scenario, blocks, readings: Readings, calibrating: bool, log, clock: clocks.Clock) -> dict:
    """calibrating: a calibration trial; a clock without calibration (virtual) has no
    faithful rate to judge by."""
    uncalibrated = calibrating or not clock.calibrated
    faithful_bps = None if uncalibrated else calibrated_rate(scenario)
    if faithful_bps is None and not uncalibrated and DATAPLANES[scenario.dataplane].calibrated:
        log("warning: this machine is not calibrated, so the run cannot say whether its link rate "
            "is one the machine holds (incast calibrate: under a minute, once)")
    facts = readings.facts
    verdict = fidelity.assess(
        facts.link_rows, facts.watchdog, facts.cpu, readings.summary.get("backlog_drops", 0),
        facts.dataplane_warnings, facts.monitored, measured_ms=measured_seconds(blocks) * 1000,
        rate_bps=scenario.link.rate, faithful_bps=faithful_bps, senders=scenario.topology.senders, clock=clock)
    # A sweep run with --force-jobs: how many runs shared the machine with this one (their
    # load shows in this run's CPU and link measurements, which judge it).
    verdict["concurrent_runs"] = int(os.environ.get("INCAST_CONCURRENT_RUNS", "0"))
    return verdict
