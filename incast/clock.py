"""Real time or virtual time: what the clock a run lives on allows and rules out.

Everything that differs between the two is a property of one ``Clock``, so the rest
of the code asks the clock (``clock.exact_timers``, ``clock.bpf``...) instead of
branching on its name:

* **real** — this machine's kernel, or a QEMU guest: timers wake late (tens of µs
  here), the CPUs are finite and can saturate, BPF sees every qdisc event, and a link
  rate is only faithful up to what ``incast calibrate`` measured.
* **virtual** — User-Mode Linux with ``time-travel=inf-cpu``: time stands still while
  the CPU works, so timers fire exactly when due and no rate is too fast; ARCH=um
  has no BPF, so queues are sampled rather than traced and links are not monitored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# The clocksource User-Mode Linux's time-travel mode registers.
TIME_TRAVEL_CLOCKSOURCE = "time-travel-clock"


@dataclass(frozen=True)
class Clock:
    name: Literal["real", "virtual"]
    exact_timers: bool       # timers fire when due: token buckets need no slack for lateness
    bpf: bool                # BPF programs on tracepoints: link monitor and per-event telemetry
    cpu_can_saturate: bool   # a busy CPU can slow the emulation (fidelity watches it)
    calibrated: bool         # link rates are judged against this machine's calibration
    simulated: bool          # time moves only when the guest is idle, not with the wall clock
    host_kernel: bool        # a run may use this machine's own kernel (else a guest's)
    guest_runner: str        # what runs a guest kernel on this clock (incast.vm.<name>)
    guest_build_hint: str    # how to build that kernel

    @property
    def telemetry(self) -> str:
        """How queue telemetry is taken: every event traced, or the queues sampled."""
        return "traced" if self.bpf else "sampled"


REAL = Clock("real", exact_timers=False, bpf=True, cpu_can_saturate=True, calibrated=True,
             simulated=False, host_kernel=True, guest_runner="qemu", guest_build_hint="kernels/build.sh")
VIRTUAL = Clock("virtual", exact_timers=True, bpf=False, cpu_can_saturate=False, calibrated=False,
                simulated=True, host_kernel=False, guest_runner="uml",
                guest_build_hint="kernels/build.sh --uml")
CLOCKS = {c.name: c for c in (REAL, VIRTUAL)}


def named(name: str) -> Clock:
    """The clock a scenario asks for (``scenario.clock``)."""
    return CLOCKS[name]


def of_clocksource(clocksource: str) -> Clock:
    """The clock this kernel runs on, from its current clocksource."""
    return VIRTUAL if clocksource == TIME_TRAVEL_CLOCKSOURCE else REAL
