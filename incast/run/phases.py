"""A run's phases and its progress, as lines a host can follow when the run is a
guest's."""
from __future__ import annotations

import re
import sys
import time

PHASE_LINE = re.compile(r"phase: (\w+) ([0-9.]+)$")
# A run's phases, in order; the host adds boot and imports (and exit) for a guest's run.
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


def block_lines(scenario):
    """Progress without a terminal for a bar: a line per block, as BLOCK_LINE reads
    them (a host following a guest's run)."""
    total, done = scenario.workload.blocks * scenario.workload.repetitions, 0

    def progress(n):
        nonlocal done
        done += n
        print(f"block {done}/{total}", file=sys.stderr, flush=True)
    return progress
