#!/usr/bin/env python3
"""Run a command inside a QEMU VM booted on one of the incast kernels.

The guest's root filesystem is the host's own, shared read-only over 9p (so every
program, the repository and /opt/incast/venv are there, at the same paths); /tmp,
/run, /var/tmp and /dev/shm are tmpfs. A second 9p share carries the command in and
the results out. guest-init.sh (beside this file) is the guest's PID 1: it mounts proc, sys,
devtmpfs, tracefs, debugfs, bpffs and cgroup2, runs the command, writes its output
and exit status to the results share, and powers the VM off.

As a module::

    from incast.vm import qemu
    r = qemu.run("sysctl net.ipv4.tcp_rto_hrtimer", kernel="hrtimer", timeout=300)
    r.returncode, r.output, r.results_dir   # the guest command's status and output

As a command (run as root; prints the guest command's output, exits with its status)::

    python3 -m incast.vm.qemu --kernel hrtimer [--results DIR] [--timeout S] -- CMD [ARG...]

``kernel`` is ``stock`` or ``hrtimer`` (the bzImage that kernels/build.sh built for
the current inputs) or the path of any bzImage with virtio, 9p and tmpfs built in.
KVM is used when /dev/kvm works, otherwise TCG (slower, with more timer jitter): a
KVM that opens but cannot run the guest (QEMU fails at once, or the console stays
silent) is noted and the VM is booted again under TCG. INCAST_VM_ACCEL=tcg|kvm forces
a choice.
QEMU is killed on every way out of run(): completion, timeout, exception, SIGINT,
SIGTERM, and (PR_SET_PDEATHSIG) the death of the calling process.
"""
from __future__ import annotations

import fcntl
import os
import shlex
import shutil
import sys
from pathlib import Path

from incast.vm.guest import (GUEST_INIT, VMError, VMResult, collect, command_main, command_parser,  # noqa: F401
                             find_kernel, kernel_dir, prepare, supervise)

QEMU = "qemu-system-x86_64"
VARIANTS = ("stock", "hrtimer")
KVM_SILENCE_S = 20          # a KVM guest that prints nothing for this long is not running
_kvm_broken = False


LABEL = "VM"
BUILD_HINT = "kernels/build.sh"


def qemu_binary() -> str | None:
    return shutil.which(QEMU)


def variant(kernel: str) -> str:
    """The kernels/ build a VM boots for a scenario's kernel: its own."""
    return kernel


def missing() -> str | None:
    """What this machine lacks to boot a VM, or None."""
    if qemu_binary() is None:
        return "--kernel needs qemu-system-x86_64 (Debian package qemu-system-x86)"
    return None


def run_scenario(command: str, kernel: str, scenarios, results_dir, cwd, on_line, log) -> VMResult:
    """Run an incast command (runs of the scenarios, one after another) in a VM on the
    real clock."""
    log(f"booting the {kernel} kernel")
    return run(command, kernel=kernel, results_dir=results_dir, timeout=3600 * len(scenarios), cwd=cwd, on_line=on_line)


def report(result: VMResult, log) -> None:
    """Nothing to add: the VM's time is the host's."""


def kvm_usable() -> bool:
    """True if /dev/kvm opens and can create a VM (a device node alone is not enough)."""
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if fcntl.ioctl(fd, 0xAE00) != 12:            # KVM_GET_API_VERSION
            return False
        vm = fcntl.ioctl(fd, 0xAE01, 0)              # KVM_CREATE_VM
        os.close(vm)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def qemu_command(kernel: Path, results_dir: Path, console: Path, *, cpus: int = 2,
                 memory_mb: int = 2048, accel: str = "tcg", append: str = "") -> list[str]:
    cmdline = " ".join([
        "console=ttyS0", "loglevel=4", "panic=-1", "oops=panic",
        "root=/dev/root", "rootfstype=9p",
        "rootflags=trans=virtio,version=9p2000.L,msize=262144,cache=loose", "ro",
        "init=/bin/bash", append, "--", str(GUEST_INIT),
    ])
    cmd = [qemu_binary() or QEMU, "-name", "incast-vm", "-nodefaults", "-no-user-config",
           "-machine", "q35", "-smp", str(cpus), "-m", str(memory_mb),
           "-display", "none", "-monitor", "none", "-no-reboot",
           "-serial", f"file:{console}",
           "-kernel", str(kernel), "-append", cmdline,
           "-fsdev", "local,id=rootfs,path=/,security_model=none,readonly=on,multidevs=remap",
           "-device", "virtio-9p-pci,fsdev=rootfs,mount_tag=/dev/root",
           "-fsdev", f"local,id=results,path={results_dir},security_model=none,multidevs=remap",
           "-device", "virtio-9p-pci,fsdev=results,mount_tag=results",
           "-device", "virtio-rng-pci"]
    if accel == "kvm":
        cmd += ["-accel", "kvm", "-cpu", "host"]
    else:
        cmd += ["-accel", "tcg,thread=multi", "-cpu", "max"]
    return cmd


def run(command: str | list[str], kernel: str | os.PathLike = "stock", *,
        results_dir: str | os.PathLike | None = None, timeout: float = 900,
        cpus: int = 2, memory_mb: int = 2048, cwd: str | os.PathLike | None = None,
        env: dict[str, str] | None = None, append: str = "", accel: str | None = None,
        check: bool = False, on_line=None) -> VMResult:
    """Boot ``kernel``, run ``command`` (a shell string, or an argv list) as root in the
    guest, and return its status and output once the guest has powered off.

    ``results_dir`` (created if missing; a fresh temporary directory by default) is
    writable from the guest at /run/incast-vm/results, exported to the command as
    $RESULTS: put anything the caller should read there. ``env`` adds environment
    variables; ``cwd`` defaults to the caller's directory (the same path in the guest).
    On timeout QEMU is killed and ``timed_out`` is set (``returncode`` is None).
    With ``check``, a non-zero or missing status raises VMError. ``on_line`` gets each
    line of the command's output as it is written.
    """
    global _kvm_broken
    image = find_kernel(kernel, VARIANTS, "bzImage")
    if qemu_binary() is None:
        raise VMError(f"{QEMU} not found (Debian package qemu-system-x86)")
    auto = accel is None and not os.environ.get("INCAST_VM_ACCEL")
    accel = accel or os.environ.get("INCAST_VM_ACCEL") or (
        "kvm" if kvm_usable() and not _kvm_broken else "tcg")
    rdir = prepare(command, results_dir, cwd, env, "/run/incast-vm/results")
    console = rdir / "console.log"
    cmd = qemu_command(image, rdir, console, cpus=cpus, memory_mb=memory_mb, accel=accel,
                       append=append)
    (rdir / "qemu-command.txt").write_text(shlex.join(cmd) + "\n")

    def kvm_silent(waited: float) -> bool:
        return (auto and accel == "kvm" and waited > KVM_SILENCE_S
                and (not console.exists() or console.stat().st_size == 0))

    elapsed, timed_out, kvm_failed, qemu_out = supervise(cmd, rdir, "qemu-output.txt", timeout,
                                                         kvm_silent, on_line=on_line)
    if auto and accel == "kvm" and not (rdir / "exit-status").exists() and not timed_out \
            and (kvm_failed or elapsed < KVM_SILENCE_S):
        _kvm_broken = True      # KVM opens but does not run this guest: use TCG from now on
        return run(command, kernel, results_dir=rdir, timeout=timeout, cpus=cpus,
                   memory_mb=memory_mb, cwd=cwd, env=env, append=append, accel="tcg",
                   check=check, on_line=on_line)
    return collect(rdir, console, elapsed, timed_out, accel, image, qemu_out, "qemu", check)


def main(argv: list[str] | None = None) -> int:
    ap = command_parser(__doc__.split("\n\n")[0],
                        "python3 -m incast.vm.qemu --kernel hrtimer -- sysctl net.ipv4.tcp_rto_hrtimer",
                        "stock", "stock, hrtimer, or a bzImage path", 900, 2048)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--accel", choices=("kvm", "tcg"), help="default: kvm if /dev/kvm works")
    return command_main(
        ap, argv, "incast.vm.qemu", "QEMU",
        lambda a, command: run(command, a.kernel, results_dir=a.results, timeout=a.timeout, cpus=a.cpus,
                               memory_mb=a.memory, accel=a.accel, append=a.append),
        lambda r: f"{r.guest.get('kernel-release', '?')} ({r.accel}), {r.elapsed:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
