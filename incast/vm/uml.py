#!/usr/bin/env python3
"""Run a command inside User-Mode Linux in virtual time (``time-travel=inf-cpu``).

UML runs the real kernel (TCP, qdiscs, bridges, namespaces) as a host process; with
``time-travel=inf-cpu`` its clock is virtual: the CPU is infinitely fast, and time
advances only when every guest task is idle, straight to the next timer. An emulated
1 Gbit/s link then holds its rate whatever the host machine, a 20 us timeout fires
after exactly 20 us, and a run with the same inputs gives the same times again to
within a few clock reads (where packets are dropped, such a shift can change which
one, and the rerun's trajectory, but not its statistics). The cost is host wall time:
every packet is still processed, on one host CPU.

The one CPU time a guest program is charged is its clock reads: each read in process
context moves time on (upstream: 256 ns), so that a program waiting in a loop for time
to pass sees it pass. bmv2 reads the clock many times per packet, and at 256 ns a read
it was a slow switch (copies of one PAUSE frame left its ports one every 4.1 us;
kernels/patches-um/0002). Guests here boot with CLOCK_READ_COST_NS instead.

The guest's root is the host's / over hostfs, read-only (the checkout and the venv are
at the same paths); /tmp, /run, /var/tmp are tmpfs; the results directory is a second,
writable hostfs mount. guest-init.sh (beside this file) is PID 1, as in the QEMU VMs.

As a module::

    from incast.vm import uml
    r = uml.run("sleep 1; uname -r", kernel="uml-hrtimer")
    r.returncode, r.output, r.elapsed (host s), r.guest_seconds (virtual s)

As a command (root; prints the guest command's output, exits with its status)::

    python3 -m incast.vm.uml --kernel uml-hrtimer [--memory MiB] [--timeout S] -- CMD...

``kernel`` is ``uml-stock`` or ``uml-hrtimer`` (kernels/build.sh --uml; ``stock`` and
``hrtimer`` name them too) or the path of a UML ``linux`` binary with hostfs and
time-travel. UML, and every helper process it forks, is killed on every way out of
run(): completion, timeout, exception, SIGINT, SIGTERM, and the caller's death.

Limits of ARCH=um (measured on Debian's 6.12): one CPU (no SMP); no BPF JIT, BPF
events, kprobes or perf events; the lean config (kernels/config/incast-uml.config)
leaves tracing out too, so a guest has no tracefs. A program that busy-polls stops
virtual time from advancing while it spins.
"""
from __future__ import annotations

import fcntl
import os
import shlex
import sys
import tempfile
from pathlib import Path

from incast.vm.guest import GUEST_INIT, VMResult, collect, command_main, command_parser, find_kernel, prepare, supervise

VARIANTS = ("uml-stock", "uml-hrtimer")
# Guest nanoseconds a clock read costs (time-travel-read-cost=, kernels/patches-um/0002).
# Measured with bmv2 and PAUSE (FAST'08's 8 servers, 32 KiB): at 256 ns and 100 Mbit/s,
# PAUSE reached the servers 8-90 us after the queue passed XOFF, 21-27 frames dropped;
# at 16 ns, 1-5 us and none at 100 Mbit/s, 25 dropped at 1 Gbit/s (the hosts'
# reactions, about 140 reads each, take turns on the one CPU); at 1 ns, within about
# 1 us and none at 1 Gbit/s. A loop that waits for the clock still sees it move: a
# tick of its 256 ns resolution every 256 reads.
CLOCK_READ_COST_NS = 1
BUILD_HINT = "kernels/build.sh --uml"


LABEL = "UML"


def variant(kernel: str) -> str:
    """``stock``/``hrtimer`` -> their UML builds; anything else unchanged."""
    return f"uml-{kernel}" if kernel in ("stock", "hrtimer") else kernel


def missing() -> str | None:
    """What this machine lacks to run User-Mode Linux (nothing beyond the kernel)."""
    return None


def memory_mb(scenario) -> int:
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


def run_scenario(command: str, kernel: str, scenarios, results_dir, cwd, on_line, log) -> VMResult:
    """Run an incast command (runs of the scenarios, one after another) in User-Mode
    Linux in virtual time."""
    # The guest's root is this machine's: the tools found on the caller's PATH
    # (bmv2 under /opt/p4, say) are found there too, after the guest's own PATH
    # (the system's ip, tc and sh first, whatever shims the caller's PATH has).
    command = f"export PATH=$PATH:{shlex.quote(os.environ.get('PATH', ''))}; {command}"
    log(f"starting the {kernel} kernel in virtual time")
    return run(command, kernel=kernel, results_dir=results_dir, timeout=6 * 3600 * len(scenarios), cwd=cwd,
               memory_mb=max(map(memory_mb, scenarios)), env={"PYTHONHASHSEED": "0"}, on_line=on_line)


def report(result: VMResult, log) -> None:
    if result.guest_seconds is not None:   # the guest has said the rest
        log(f"virtual {result.guest_seconds:.2f} s in {result.elapsed:.0f} s of host time")


def uml_command(image: Path, rdir: Path, *, memory_mb: int, append: str = "") -> list[str]:
    # umid and uml_dir keep UML's control directory (mconsole socket, pid file) inside
    # the results directory, so a killed guest leaves nothing under ~/.uml.
    return [str(image), f"mem={memory_mb}M", "root=/dev/root", "rootfstype=hostfs", "rootflags=/",
            "ro", "time-travel=inf-cpu", f"time-travel-read-cost={CLOCK_READ_COST_NS}",
            f"umid=incast-{os.getpid()}", f"uml_dir={rdir}/",
            "con0=null,fd:1", "con=null", "ssl=null", "panic=-1", "loglevel=4",
            f"incast.results={rdir}", *append.split(), "init=/bin/bash", "--", str(GUEST_INIT)]


# Where guests claim their CPU (one lock file per CPU, shared by every user).
CPU_LOCKS = Path(tempfile.gettempdir()) / "incast-uml-cpus"


def claim_cpu():
    """(cpu, lock): a CPU of this process's for one guest, free of other guests where
    one is (its lock held until lock.close()), else shared. User-Mode Linux runs as a
    handful of host processes that hand the CPU to each other at every system call and
    page fault of the guest; spread over several CPUs, each hand-off waits for a CPU to
    wake up. Measured, a 47-server network built in virtual time on this 2-CPU machine:
    62 s of host time unpinned, 17 s on one CPU (and 25 s unpinned beside a compile that
    kept both CPUs awake). (None, None) with a single CPU."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None, None
    try:
        CPU_LOCKS.mkdir(exist_ok=True)
        if CPU_LOCKS.stat().st_uid == os.geteuid():
            CPU_LOCKS.chmod(0o1777)
    except OSError:
        pass
    start = os.getpid() % len(allowed)
    for cpu in allowed[start:] + allowed[:start]:
        try:
            fd = os.open(CPU_LOCKS / f"cpu{cpu}.lock", os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:
            continue
        lock = os.fdopen(fd, "r+")
        try:
            if os.fstat(fd).st_uid == os.geteuid():
                os.fchmod(fd, 0o666)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return cpu, lock
        except OSError:
            lock.close()
    return allowed[start], None        # every CPU has a guest: share one


def run(command: str | list[str], kernel: str | os.PathLike = "uml-stock", *,
        results_dir: str | os.PathLike | None = None, timeout: float = 3600,
        memory_mb: int = 3072, cwd: str | os.PathLike | None = None,
        env: dict[str, str] | None = None, append: str = "", check: bool = False,
        on_line=None) -> VMResult:
    """Boot the UML ``kernel`` in virtual time, run ``command`` as root in it, and return
    its status and output once it has powered off. ``results_dir`` (a fresh temporary
    directory by default) is writable from the guest as $RESULTS. ``timeout`` is in host
    seconds; on timeout UML is killed and ``timed_out`` is set. ``on_line`` gets each
    line of the command's output as it is written."""
    image = find_kernel(variant(str(kernel)), VARIANTS, "linux", BUILD_HINT)
    rdir = prepare(command, results_dir, cwd, env, "/run/incast-vm/results")
    rdir = rdir.resolve()
    cmd = uml_command(image, rdir, memory_mb=memory_mb, append=append)
    (rdir / "uml-command.txt").write_text(shlex.join(cmd) + "\n")
    cpu, lock = claim_cpu()
    try:
        elapsed, timed_out, _, out = supervise(cmd, rdir, "console.log", timeout, on_line=on_line, cpu=cpu)
    finally:
        if lock is not None:
            lock.close()
    return collect(rdir, rdir / "console.log", elapsed, timed_out, "uml", image, out, "uml", check)


def main(argv: list[str] | None = None) -> int:
    ap = command_parser(__doc__.split("\n\n")[0],
                        "python3 -m incast.vm.uml --kernel uml-hrtimer -- sysctl net.ipv4.tcp_rto_hrtimer",
                        "uml-stock", "uml-stock, uml-hrtimer, or a UML linux binary", 3600, 3072)

    def describe(r: VMResult) -> str:
        virtual = f"{r.guest_seconds:.3f} s" if r.guest_seconds is not None else "?"
        return f"{r.guest.get('kernel-release', '?')}, host {r.elapsed:.1f} s, virtual {virtual}"

    return command_main(
        ap, argv, "incast.vm.uml", "UML",
        lambda a, command: run(command, a.kernel, results_dir=a.results, timeout=a.timeout,
                               memory_mb=a.memory, append=a.append),
        describe)


if __name__ == "__main__":
    sys.exit(main())
