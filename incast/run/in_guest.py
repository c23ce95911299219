"""Runs inside a guest kernel: the same code, on the kernel and the clock the scenario
names.

The clock says which guest runs it (incast.vm.runner): a QEMU VM booted with the
stock or hrtimer kernel in real time, or User-Mode Linux built from the same source
in virtual time. The machine's root is shared read-only; the results come back
through the guest's writable directory and land like any run's, with the host's
wall time beside the guest's (possibly virtual) time, per phase (host_phase_s).

One guest can run several points, one after another (incast.run.guest_points): its
boot, imports and power-off are then paid once for the batch, and each run's
host_phase_s carries its share of its boot and imports (divided by the batch's size;
the power-off after the last point is charged to none). A sweep's executor batches the points that share a guest kernel
(incast.run.executors); ``python -m incast.run.in_guest SCENARIO OUT [SCENARIO OUT...]``
runs such a batch.
"""
from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from incast import clock as clocks
from incast import dataplane as dataplanes
from incast import vm
from incast.constants import REPO, VM_SCRATCH_PREFIX
from incast.errors import BadInput, IncastError, MissingFeature, RunFailed
from incast.measure.results import Claim, Outcome, single_threaded_arrow
from incast.run import preflight
from incast.run.points import locked
from incast.run.phases import BLOCK_LINE, PHASE_LINE, HostPhases
from incast.scenario import Scenario, build, load_file, to_toml
from incast.vm import guest

POINT_LINE = re.compile(r"point: (begin|end) (\d+)(?: (-?\d+))?$")


def guest_key(scenario: Scenario) -> str | None:
    """Points with the same key can share a guest (its runner and kernel); None for a
    run on this machine's kernel."""
    if scenario.kernel == "host":
        return None
    clock = clocks.named(scenario.clock)
    return f"{clock.name}:{vm.runner(clock).variant(scenario.kernel)}"


@dataclass
class PointResult:
    """One point of a batch: its outcome, or why it failed."""
    outcome: Outcome | None = None
    error: str | None = None
    lines: list[str] = field(default_factory=list)


def run_in_guest(scenario: Scenario, out: Path, log=lambda msg: None, unique_out: bool = False,
                 progress=None) -> Outcome:
    """Run the scenario inside its guest kernel; its results land at out (unique_out:
    or at out-2, out-3... if another run has it)."""
    claim = Claim(out, unique_out)
    result = run_points_in_guest([(scenario, claim)], log, progress)[0]
    if result.error:
        raise RunFailed(result.error)
    return result.outcome


def run_points_in_guest(points: list[tuple[Scenario, Claim]], log=lambda msg: None, progress=None,
                        on_point=lambda index, result: None) -> list[PointResult]:
    """Run every (scenario, claimed results location) in one guest booted once, in
    order; each point's results land at its claim as soon as it ends (on_point is told),
    a failed point does not stop the others."""
    if not points:
        return []
    keys = {guest_key(s) for s, _ in points}
    if len(keys) != 1 or None in keys:
        raise BadInput(f"points of one guest must share a guest kernel and clock; got {sorted(map(str, keys))}")
    first = points[0][0]
    clock = clocks.named(first.clock)
    runner = vm.runner(clock)
    variant = runner.variant(first.kernel)
    for s, _ in points:
        why = preflight.host_missing(s)
        if why:
            raise MissingFeature("; ".join(why))
        dataplanes.get(s.dataplane).prepare_on_host(s)
    # -v: each run says what it does, a line per block and one per phase, which the host
    # follows as they are written (a run of hundreds of servers takes an hour of host
    # time) and stamps with its own clock. The first line marks the guest's boot.
    command = f"echo 'phase: booted 0'; {sys.executable} -m incast.run.guest_points $RESULTS/points"
    phases = HostPhases()
    results = [PointResult() for _ in points]
    current = [-1]

    def on_line(line: str):
        m = POINT_LINE.match(line)
        if m:
            index = int(m.group(2))
            if m.group(1) == "begin":
                current[0] = index
                phases.begin_point(index)
            else:
                phases.end_point(index)
                finish(index, int(m.group(3)))
                current[0] = -1
        elif BLOCK_LINE.match(line):
            if progress:
                progress(1)
        elif PHASE_LINE.match(line):
            phases.stamp(PHASE_LINE.match(line).group(1))
        elif line and not line.startswith("{"):
            if current[0] >= 0:
                results[current[0]].lines.append(line)
            log(line if line.startswith("warning:") else f"guest: {line}")

    def finish(index: int, status: int):
        scenario, claim = points[index]
        made = Path(tmp, "points", f"{index:04d}", "run")
        result = results[index]
        if status != 0 or not (made / "summary.json").is_file():
            failed = [ln for ln in result.lines if ln.startswith("incast:")]
            result.error = (f"the run in the {variant} {runner.LABEL} failed: "
                            f"{failed[-1] if failed else f'exit status {status}'}")
            claim.abandon()
            on_point(index, result)
            return
        summary = json.loads((made / "summary.json").read_text())
        # The guest's boot and imports are shared by its points; its power-off, after the
        # last point, is charged to none (the batch's own seconds are in summary.guest).
        host_phase_s = {**{k: round(v / len(points), 2) for k, v in phases.shared_seconds().items()},
                        **phases.point_seconds(index)}
        summary.update({"kernel": scenario.kernel, "clock": scenario.clock, "run_dir": str(claim.final),
                        "host_seconds": round(sum(host_phase_s.values()), 3),
                        "guest_seconds": round(sum(summary.get("phase_s", {}).values()), 6),
                        "host_phase_s": host_phase_s})
        summary.setdefault("guest", {})["batch_size"] = len(points)
        (made / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        (made / "scenario.toml").write_text(to_toml(scenario))
        for item in made.iterdir():
            shutil.move(str(item), str(claim.path / item.name))
        claim.finalize()
        result.outcome = Outcome(run_dir=claim.final, summary=summary)
        on_point(index, result)

    # SIGTERM and SIGHUP raise from here on, so the scratch directory goes with the run
    # whatever phase a kill finds it in; its lock tells a later sweep's Store.remove_stale
    # (or incast cleanup) that one left by SIGKILL is nobody's.
    with guest.signals_raise(), \
            tempfile.TemporaryDirectory(prefix=VM_SCRATCH_PREFIX, dir=points[0][1].final.parent) as tmp, \
            locked(Path(tmp)):
        for index, (scenario, _) in enumerate(points):
            d = Path(tmp, "points", f"{index:04d}")
            d.mkdir(parents=True)
            # Inside, the run is on the guest's own kernel, as a run on this machine's is.
            inner = scenario.model_copy(update={"kernel": "host", "clock": clocks.REAL.name})
            (d / "scenario.toml").write_text(to_toml(inner))
        r = runner.run_scenario(command, variant, [s for s, _ in points], tmp, REPO, on_line, log)
        for index, result in enumerate(results):
            if result.outcome is None and result.error is None:     # never reached its end line
                why = [ln for ln in (r.output or "").strip().splitlines() if ln.startswith("incast:")]
                result.error = (f"the run in the {variant} {runner.LABEL} failed: "
                                f"{why[-1] if why else ('timed out' if r.timed_out else f'exit status {r.returncode}')}")
                points[index][1].abandon()
                on_point(index, result)
    runner.report(r, log)
    return results


def main(argv: list[str] | None = None) -> int:
    """A batch for a sweep's executor: SCENARIO OUT pairs; a line per point on stderr as
    it ends (``incast-point: INDEX ok SECONDS`` or ``incast-point: INDEX failed: WHY``)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or len(argv) % 2:
        print("usage: python -m incast.run.in_guest SCENARIO OUT [SCENARIO OUT...]", file=sys.stderr)
        return 2
    single_threaded_arrow()

    def log(message):
        print(message, file=sys.stderr, flush=True)

    def on_point(index, result):
        if result.error:
            print(f"incast-point: {index} failed: {result.error}", file=sys.stderr, flush=True)
        else:
            print(f"incast-point: {index} ok {result.outcome.summary.get('host_seconds', 0)}",
                  file=sys.stderr, flush=True)
    try:
        points = [(build(load_file(argv[i])), Claim(Path(argv[i + 1]))) for i in range(0, len(argv), 2)]
        results = run_points_in_guest(points, log, on_point=on_point)
    except IncastError as e:
        print(f"incast: {e.label}{e}", file=sys.stderr, flush=True)
        return e.exit_code
    return 0 if any(r.outcome for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
