"""Inside a guest: run several points, one after another, in the guest booted once.

A guest's boot, its Python imports and its power-off cost a run of the linux plane in
virtual time more host time than its measured blocks (docs/results/virtual-time-phases.csv),
and they are the same for every point a guest runs. So the host boots one guest for a
batch of points (incast.run.in_guest.run_points_in_guest) and this module runs them:

  - the package is imported, and the kernel probed, once;
  - each point runs in a process forked for it, so it starts from the imported state and
    no Python state of one point reaches the next; its run builds its own namespaces,
    hosts, links, qdiscs and sysctls, and removes them, as any run does;
  - before each point, the guest's state outside a run's namespaces (network namespaces,
    the root namespace's links and sysctls, processes, mounts) is compared with what it
    was before the first point. A point that finds it changed is not run: it fails,
    naming what the point before it left, so no result stands on another's leftovers.
    Each run's summary records the check (``guest.inherited``: empty) and its place in
    the batch (``guest.batch_index``).

Lines for the host (which follows the guest's output as it is written)::

    point: begin N        point N starts (its run's own phase and block lines follow)
    point: end N STATUS   it ended; STATUS is the exit status of its process

    python -m incast.run.guest_points DIR    # DIR/NNN/scenario.toml -> DIR/NNN/run
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

from incast.errors import IncastError
from incast.machine.probe import probe
from incast.measure.results import single_threaded_arrow
from incast.run import experiment
from incast.run.phases import block_lines
from incast.scenario import build, load_file

SYSCTL_ROOT = Path("/proc/sys/net")
# Written by the kernel, not by a run: counters and values that move by themselves.
SYSCTL_MOVING = ("random", "nf_conntrack_count", "boot_id", "uuid", "tcp_fastopen_key",
                 "tcp_mem", "udp_mem", "fib_notify_on_flag_change", "hash")


def _sysctls() -> dict[str, str]:
    out = {}
    for path in SYSCTL_ROOT.rglob("*"):
        if any(m in path.name for m in SYSCTL_MOVING) or not path.is_file() or not os.access(path, os.R_OK):
            continue
        try:
            out[str(path.relative_to(SYSCTL_ROOT))] = path.read_text().strip()
        except OSError:     # write-only or refused
            continue
    return out


def _processes() -> list[str]:
    """The guest's user processes other than this one and its parents (kernel threads
    are children of kthreadd, PID 2)."""
    mine = {os.getpid()}
    pid = os.getppid()
    while pid > 1:
        mine.add(pid)
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) in mine or d.name == "1":
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:     # gone since
            continue
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat.rsplit(")", 1)[1].split()
        if rest[1] != "2" and rest[0] != "Z":
            out.append(comm)
    return sorted(out)


def guest_state() -> dict[str, object]:
    """What a point could leave behind outside its own namespaces."""
    return {
        "netns": sorted(p.name for p in Path("/run/netns").glob("*")),
        "links": sorted(p.name for p in Path("/sys/class/net").iterdir()),
        "processes": _processes(),
        "mounts": sorted(line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()),
        "sysctls": _sysctls(),
    }


def differences(before: dict, now: dict) -> list[str]:
    """One line per thing that differs, e.g. ``sysctls ipv4/tcp_rto_min_us: 200000 -> 200``."""
    out = []
    for name in before:
        a, b = before[name], now[name]
        if isinstance(a, dict):
            for k in sorted(set(a) | set(b)):
                if a.get(k) != b.get(k):
                    out.append(f"{name} {k}: {a.get(k)} -> {b.get(k)}")
        elif a != b:
            gone, new = sorted(set(a) - set(b)), sorted(set(b) - set(a))
            out.append(f"{name}: " + ", ".join([f"+{x}" for x in new] + [f"-{x}" for x in gone]))
    return out


def run_point(scenario_file: Path, out: Path, index: int) -> int:
    """In the forked process: run one point as `incast run FILE --out OUT --json -v` does."""
    def log(message):
        print(message, file=sys.stderr, flush=True)
    try:
        scenario = build(load_file(scenario_file))
        outcome = experiment.run(scenario, out, progress=block_lines(scenario), log=log)
    except IncastError as e:
        print(f"incast: {e.label}{e}", file=sys.stderr, flush=True)
        return e.exit_code
    except BaseException as e:      # noqa: BLE001 - one line, then the cause
        print(f"incast: run failed: {e}", file=sys.stderr, flush=True)
        traceback.print_exc()
        return 1
    summary = outcome.summary
    summary["guest"] = {"batch_index": index, "inherited": []}
    (outcome.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m incast.run.guest_points DIR", file=sys.stderr)
        return 2
    single_threaded_arrow()
    points = sorted(p for p in Path(argv[0]).iterdir() if (p / "scenario.toml").is_file())
    try:
        probe()     # the kernel's features, once: every point's run asks the same kernel
    except IncastError as e:
        print(f"incast: {e.label}{e}", file=sys.stderr, flush=True)
        return e.exit_code
    before = guest_state()
    print("phase: imported 0", file=sys.stderr, flush=True)
    failed = 0
    for index, point in enumerate(points):
        print(f"point: begin {index}", file=sys.stderr, flush=True)
        left = differences(before, guest_state())
        if left:
            print("incast: run failed: the guest is not as it was before its first point (what the points "
                  "before this one left: " + "; ".join(left[:8]) + ")", file=sys.stderr, flush=True)
            status = 1
        else:
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = run_point(point / "scenario.toml", point / "run", index)
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        failed += status != 0
        print(f"point: end {index} {status}", file=sys.stderr, flush=True)
    return 1 if failed == len(points) else 0


if __name__ == "__main__":
    sys.exit(main())
