"""A run inside a guest kernel: the same code, on the kernel and the clock the scenario
names.

The clock says which guest runs it (incast.vm.runner): a QEMU VM booted with the
stock or hrtimer kernel in real time, or User-Mode Linux built from the same source
in virtual time. The machine's root is shared read-only; the results come back
through the guest's writable directory and land like any run's, with the host's
wall time beside the guest's (possibly virtual) time, per phase (host_phase_s).
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from incast import clock as clocks
from incast import dataplane as dataplanes
from incast import vm
from incast.constants import REPO, VM_SCRATCH_PREFIX
from incast.errors import MissingFeature, RunFailed
from incast.measure.results import Claim, Outcome
from incast.run import preflight
from incast.run.phases import BLOCK_LINE, PHASE_LINE, HostPhases
from incast.scenario import Scenario, to_toml
from incast.vm import guest


def run_in_guest(scenario: Scenario, out: Path, log=lambda msg: None, unique_out: bool = False,
                 progress=None) -> Outcome:
    """Run the scenario inside its guest kernel; its results land at out (unique_out:
    or at out-2, out-3... if another run has it)."""
    clock = clocks.named(scenario.clock)
    runner = vm.runner(clock)
    variant = runner.variant(scenario.kernel)
    why = preflight.host_missing(scenario)
    if why:
        raise MissingFeature("; ".join(why))
    dataplanes.get(scenario.dataplane).prepare_on_host(scenario)
    # Inside, the run is on the guest's own kernel, as a run on this machine's is.
    inner = scenario.model_copy(update={"kernel": "host", "clock": clocks.REAL.name})
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
    # SIGTERM and SIGHUP raise from here on, so the scratch directory goes with the run
    # whatever phase a kill finds it in; its lock tells a later sweep's Store.remove_stale
    # (or incast cleanup) that one left by SIGKILL is nobody's.
    with guest.signals_raise(), tempfile.TemporaryDirectory(prefix=VM_SCRATCH_PREFIX, dir=out.parent) as tmp:
        lock = os.open(Path(tmp, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(lock, fcntl.LOCK_EX)
        Path(tmp, "scenario.toml").write_text(to_toml(inner))
        r = runner.run_scenario(command, variant, scenario, tmp, REPO, on_line, log)
        if r.returncode != 0 or not Path(tmp, "run", "summary.json").is_file():
            lines = [ln for ln in (r.output or "").strip().splitlines() if ln.startswith("incast:")]
            why = lines[-1] if lines else ("timed out" if r.timed_out else f"exit status {r.returncode}")
            raise RunFailed(f"the run in the {variant} {runner.LABEL} failed: {why}")
        for item in Path(tmp, "run").iterdir():
            shutil.move(str(item), str(claim.path / item.name))
    claim.finalize()
    summary = json.loads((out / "summary.json").read_text())
    summary.update({"kernel": scenario.kernel, "clock": scenario.clock, "run_dir": str(out),
                    "host_seconds": round(r.elapsed, 3), "guest_seconds": r.guest_seconds,
                    "host_phase_s": host_phases.seconds(r.elapsed)})
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "scenario.toml").write_text(to_toml(scenario))
    runner.report(r, log)
    return Outcome(run_dir=out, summary=summary)
