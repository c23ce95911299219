"""Who used the CPUs while a run measured: the run itself, or other work on the machine.

A machine that runs an experiment always runs something else too (an editor, a browser,
a build). What matters to a run is whether its own work could get a CPU when it
needed one, not whether the CPUs were busy: a compile under ``nice -n 19`` fills
both CPUs of a 2-core machine, yet every nice-0 thread of the emulation still gets
its CPU within a few microseconds (a nice-19 task weighs 15 against a nice-0 task's
1024), and links measured beside such a compile held their rates (service ratio
0.997 at 300 Mbit/s while the CPUs read 100% busy).

So two snapshots, taken as the measured blocks begin and end, give:

* ``cpu_busy``, ``cpu_busy_max``: all CPUs together, and the busiest one, whatever
  ran (as ``/proc/stat`` reports them);
* ``cpu_niced``: the share of all CPU time spent in niced user work (``/proc/stat``'s
  ``nice`` column: it includes processes that started and ended between the snapshots,
  such as a compiler's). The run's own processes all run at nice 0;
* ``cpu_contended_max``: the busiest CPU's share taken by work at normal priority (the
  run's, the kernel's, other processes' at nice <= 0): what competes with the
  emulation. This, not ``cpu_busy_max``, is what makes a CPU "saturated";
* ``cpu_run``: what is left of ``cpu_busy`` without those two: the run's own work
  (and the kernel's on its behalf);
* ``cpu_others``: the share of all CPU time used by other processes at normal priority
  (outside the run's namespaces and process tree), with the busiest of them by name in
  ``cpu_others_top``: the load a user can do something about. A process that started
  after the first snapshot counts whole; one that ended before the second counts in its
  parent's time for reaped children (``cutime``, ``cstime``), less what it had used
  before the first: a test suite beside the run whose guests and tools each live a few
  seconds takes the CPUs as surely as one long process does.

A hog at normal priority shows in ``cpu_contended_max`` and ``cpu_others`` and, where
it starves the emulation, in the links' service (incast.measure.fidelity); a niced
one shows in ``cpu_niced`` only.

Niceness weighs only within a scheduling group: with ``kernel.sched_autogroup_enabled``
(Debian's default) every session is a group of its own and groups share the CPUs
equally whatever their tasks' nice values, so a niced build started from another
terminal competes with the run as an equal. Whether it starved the emulation then
shows where it always does, in the links' service and the timers; ``sched_autogroup``
in the fidelity object says which case a run was in.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from incast.measure.instrument import Facts, Instrument, Readings

# /proc/stat's columns, in order.
USER, NICE, SYSTEM, IDLE, IOWAIT, IRQ, SOFTIRQ, STEAL = range(8)
KTHREADD = 2


def cpu_times() -> list[list[int]]:
    """Jiffies of each CPU from /proc/stat: user nice system idle iowait irq softirq steal."""
    with open("/proc/stat") as f:
        return [[int(x) for x in line.split()[1:9]] for line in f
                if line.startswith("cpu") and line[3].isdigit()]


@dataclass(frozen=True)
class Process:
    ticks: int          # utime + stime, in clock ticks
    nice: int
    comm: str
    ours: bool          # the run's: in one of its namespaces, in this process's tree, or a kernel thread
    reaped: int = 0     # cutime + cstime: its children's that it has waited for
    ppid: int = 0


def _stat(pid: str) -> tuple[int, int, int, str, int] | None:
    """(ppid, ticks, nice, comm, reaped children's ticks) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    comm = text[text.index("(") + 1:text.rindex(")")]
    rest = text[text.rindex(")") + 2:].split()
    # rest[0] is field 3 (state): ppid is field 4, utime 14, stime 15, cutime 16,
    # cstime 17, nice 19.
    return int(rest[1]), int(rest[11]) + int(rest[12]), int(rest[16]), comm, int(rest[13]) + int(rest[14])


def _netns(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def processes(own_netns: frozenset[int] = frozenset(), root: int | None = None) -> dict[int, Process]:
    """Every process on the machine with its CPU ticks so far and whether it is the
    run's. own_netns: the inodes of the run's network namespaces (its hosts'); root: the
    run's process (default: this one), whose descendants are the run's too."""
    raw = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            s = _stat(pid)
            if s is not None:
                raw[int(pid)] = s
    me = os.getpid() if root is None else root
    mine: dict[int, bool] = {}

    def in_tree(pid: int) -> bool:
        # This process's descendants (its runs' tools, the data plane's switch).
        seen = []
        while pid > 1 and pid not in mine:
            if pid == me:
                break
            seen.append(pid)
            pid = raw[pid][0] if pid in raw else 0
        answer = pid == me or mine.get(pid, False)
        for p in seen:
            mine[p] = answer
        return answer

    out = {}
    for pid, (ppid, ticks, nice, comm, reaped) in raw.items():
        kernel = pid == KTHREADD or ppid == KTHREADD
        ours = kernel or in_tree(pid) or (bool(own_netns) and _netns(str(pid)) in own_netns)
        out[pid] = Process(ticks, nice, comm, ours, reaped, ppid)
    return out


@dataclass
class Snapshot:
    cpus: list[list[int]]
    procs: dict[int, Process] = field(default_factory=dict)


def snapshot(own_netns: frozenset[int] = frozenset(), root: int | None = None) -> Snapshot:
    return Snapshot(cpu_times(), processes(own_netns, root))


def use(before: Snapshot | None, after: Snapshot | None) -> dict:
    """What the CPUs did between two snapshots (the module's docstring says what each
    field means)."""
    if before is None or after is None or not before.cpus or not after.cpus:
        return {}
    busy, contended, total_all, idle_all, steal_all, nice_all = [], [], 0, 0, 0, 0
    for b, a in zip(before.cpus, after.cpus):
        d = [x - y for x, y in zip(a, b)]
        total = sum(d) or 1
        idle = d[IDLE] + d[IOWAIT]
        busy.append(1 - idle / total)
        contended.append(1 - (idle + d[NICE]) / total)
        total_all += total
        idle_all += idle
        steal_all += d[STEAL]
        nice_all += d[NICE]
    total_all = max(total_all, 1)
    others = others_ticks(before.procs, after.procs)
    # /proc/stat counts in USER_HZ ticks, as /proc/<pid>/stat does.
    top = sorted(others.items(), key=lambda kv: -kv[1])[:3]
    busy_all = 1 - idle_all / total_all
    others_all = sum(others.values()) / total_all
    return {"cpu_busy": round(busy_all, 3), "cpu_busy_max": round(max(busy), 3),
            "cpu_contended_max": round(max(contended), 3), "cpu_niced": round(nice_all / total_all, 3),
            "cpu_others": round(others_all, 3),
            # The run's own share (with the kernel's work for it): what is left of the busy
            # time once niced work and other processes are taken out.
            "cpu_run": round(max(0.0, busy_all - nice_all / total_all - others_all), 3),
            "cpu_others_top": ", ".join(f"{name} {100 * t / total_all:.0f}%" for name, t in top
                                        if t / total_all >= 0.01),
            "cpu_steal": round(steal_all / total_all, 3), "sched_autogroup": autogroup_enabled()}


def others_ticks(before: dict[int, Process], after: dict[int, Process]) -> dict[str, int]:
    """Ticks other processes at normal priority used between two snapshots, by name:
    those alive at both; those born between them, whole; and those that ended between
    them, in the time their parent has waited for (less their ticks before the first)."""
    others: dict[str, int] = {}
    for pid, p in after.items():
        q = before.get(pid)
        if p.ours or (q is not None and q.ours) or p.nice > 0:
            continue
        used = p.ticks + p.reaped - (q.ticks + q.reaped if q is not None else 0)
        others[p.comm] = others.get(p.comm, 0) + used
    for pid, q in before.items():
        parent = after.get(q.ppid)
        if pid not in after and parent is not None and parent.comm in others and not q.ours:
            others[parent.comm] -= q.ticks      # its time before the first, in the parent's reaped time now
    return {comm: t for comm, t in others.items() if t > 0}


def others_now(seconds: float = 1.0) -> float:
    """The share of the CPUs other processes at normal priority take now (``cpu_others``
    over `seconds`; this process's tree is not "other")."""
    before = snapshot()
    time.sleep(seconds)         # a sampling interval, not a wait for an event
    return use(before, snapshot()).get("cpu_others", 0.0)


def autogroup_enabled() -> bool | None:
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            return f.read().strip() == "1"
    except OSError:
        return None


def describe_load(cpu: dict) -> str:
    """One line on the machine's other work, for a verdict's side."""
    parts = []
    if cpu.get("cpu_niced") is not None:
        parts.append(f"niced work {100 * cpu['cpu_niced']:.0f}% of the CPUs")
    if cpu.get("cpu_others") is not None:
        top = f" ({cpu['cpu_others_top']})" if cpu.get("cpu_others_top") else ""
        parts.append(f"other processes at normal priority {100 * cpu['cpu_others']:.0f}%{top}")
    if cpu.get("cpu_steal"):
        parts.append(f"stolen by the hypervisor {100 * cpu['cpu_steal']:.0f}%")
    return "; ".join(parts)


class CpuUse(Instrument):
    """CPU use from the first measured block of the first repetition to the last of
    the last (the fidelity object's cpu_* fields)."""

    def __init__(self, bench):
        super().__init__(bench)
        self.before: Snapshot | None = None
        self.after: Snapshot | None = None

    def measuring(self, rep: int) -> None:
        if self.before is None:
            self.before = snapshot(self.bench.netns)

    def measured(self, rep: int) -> None:
        self.after = snapshot(self.bench.netns)

    def stop(self) -> Readings:
        return Readings(facts=Facts(cpu=use(self.before, self.after)))
