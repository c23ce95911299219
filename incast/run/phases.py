"""A run's phases and its progress, as lines a host can follow when the run is a
guest's."""
from __future__ import annotations

import re
import sys
import time

PHASE_LINE = re.compile(r"phase: (\w+) ([0-9.]+)$")
# A run's phases, in order; the host adds boot, imports and fork for a guest's run.
PHASES = ("setup", "build", "start", "warmup", "measured", "stop", "teardown", "results")
BLOCK_LINE = re.compile(r"block (\d+)/(\d+)$")


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


class HostPhases:
    """The host's seconds per phase of a guest's runs, from the moment each ``phase:``
    line reached the host (followed every 0.2 s: that is the resolution).

    The guest's own phases, paid once for all the points it runs: ``boot`` ends when
    the guest's command starts, ``imports`` when the package is imported (and the kernel
    probed); what follows the last point (the guest powering off) is no point's. A
    point's phases run from its ``begin`` to its ``end``: ``fork`` until its run starts
    (the guest's state checked, its process forked), then the run's own (setup, build,
    ... results, which also takes what follows its last line)."""

    def __init__(self):
        self.t0 = time.monotonic()
        self.shared: dict[str, float] = {}
        self.points: dict[int, dict[str, float]] = {}
        self.last, self.point = self.t0, None

    def _add(self, into: dict, name: str, now: float) -> None:
        into[name] = into.get(name, 0.0) + now - self.last
        self.last = now

    def stamp(self, name: str) -> None:
        now = time.monotonic()
        if self.point is None:
            self._add(self.shared, {"booted": "boot", "imported": "imports"}.get(name, name), now)
        else:
            self._add(self.points[self.point], "fork" if name == "started" else name, now)

    def begin_point(self, index: int) -> None:
        self._add(self.shared, "imports", time.monotonic())     # between points: the guest's own
        self.point = index
        self.points[index] = {}

    def end_point(self, index: int) -> None:
        self._add(self.points[index], "results" if self.points[index] else "fork", time.monotonic())
        self.point = None

    def shared_seconds(self) -> dict[str, float]:
        """boot, imports: the host seconds every point of the guest shares."""
        return {k: self.shared.get(k, 0.0) for k in ("boot", "imports")}

    def point_seconds(self, index: int) -> dict[str, float]:
        return {k: round(v, 2) for k, v in self.points.get(index, {}).items()}


def block_lines(scenario):
    """Progress without a terminal for a bar: a line per block, as BLOCK_LINE reads
    them (a host following a guest's run)."""
    total, done = scenario.workload.blocks * scenario.workload.repetitions, 0

    def progress(n):
        nonlocal done
        done += n
        print(f"block {done}/{total}", file=sys.stderr, flush=True)
    return progress
