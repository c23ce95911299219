"""What every guest kernel runner shares (incast.vm.qemu: a VM; incast.vm.uml: User-Mode
Linux in virtual time): finding a built kernel, the results directory protocol of
guest-init.sh, supervising the emulator process so that it never outlives the run, and
the result.

The results directory, written by the host before boot and by guest-init.sh inside:
  command.sh   the command (a bash script)           cwd          where to run it
  output.txt   its stdout and stderr                  exit-status  its status (written last)
  guest.txt    kernel release, command line, clocksource, start and end times
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from incast.errors import RunFailed

HERE = Path(__file__).resolve().parent
GUEST_INIT = HERE / "guest-init.sh"
import argparse
import sys

from incast.constants import KERNEL_BUILD_SH as BUILD_SH  # kernels/ builds what the guests boot


class VMError(RunFailed):
    """The guest could not be started, or it did not run the command to completion."""


@dataclass
class VMResult:
    returncode: int | None      # exit status of the guest command; None if it never finished
    output: str                 # its stdout and stderr
    console: str                # the guest's console (kernel log, init messages)
    results_dir: Path           # output.txt, exit-status, guest.txt, ...
    elapsed: float              # host seconds from the emulator's start to its exit
    timed_out: bool = False
    accel: str = "tcg"          # kvm, tcg, or uml
    kernel: Path = field(default_factory=Path)
    guest: dict = field(default_factory=dict)   # parsed guest.txt (kernel-release, ...)

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def guest_seconds(self) -> float | None:
        """Seconds the command took by the guest's own clock (virtual time under UML)."""
        try:
            return float(self.guest["end"]) - float(self.guest["start"])
        except (KeyError, ValueError):
            return None


def kernel_dir(*variants: str) -> Path | None:
    """The kernels/build.sh result directory for the current inputs, if every one of
    ``variants`` (of one family; default: the two VM kernels) is built there."""
    if not BUILD_SH.exists():
        return None
    args = [a for v in variants for a in ("--variant", v)]
    r = subprocess.run(["bash", str(BUILD_SH), *args, "--print-dir"], capture_output=True,
                       text=True)
    out = r.stdout.strip()
    return Path(out) if r.returncode == 0 and out else None


def find_kernel(kernel: str | os.PathLike, variants: tuple[str, ...], image: str,
                build_hint: str = "kernels/build.sh") -> Path:
    """Resolve a variant name (or a path) to its built image, or raise VMError."""
    if str(kernel) in variants:
        d = kernel_dir(str(kernel))
        if d is None or not (d / str(kernel) / image).is_file():
            raise VMError(f"kernel {kernel!r} is not built for the current inputs: run {build_hint}")
        return d / str(kernel) / image
    p = Path(kernel)
    if not p.is_file():
        raise VMError(f"no such kernel image: {p}")
    return p


def prepare(command: str | list[str], results_dir: str | os.PathLike | None,
            cwd: str | os.PathLike | None, env: dict[str, str] | None, results_env: str) -> Path:
    """Create (or empty of a previous run's reports) the results directory and write the
    command for guest-init.sh. ``results_env`` is where the guest sees the directory."""
    rdir = Path(results_dir) if results_dir else Path(tempfile.mkdtemp(prefix="incast-vm-"))
    rdir.mkdir(parents=True, exist_ok=True)
    for name in ("output.txt", "exit-status", "guest.txt", "console.log"):
        with contextlib.suppress(FileNotFoundError):
            (rdir / name).unlink()
    script = ["set -o pipefail", f"export RESULTS={results_env}"]
    for k, v in (env or {}).items():
        script.append(f"export {k}={shlex.quote(str(v))}")
    script.append(command if isinstance(command, str) else shlex.join(map(str, command)))
    (rdir / "command.sh").write_text("\n".join(script) + "\n")
    (rdir / "cwd").write_text(str(Path(cwd) if cwd else Path.cwd()) + "\n")
    return rdir


def set_pdeathsig() -> None:
    """In the emulator child: die with the parent (PR_SET_PDEATHSIG = 1)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


def kill(proc: subprocess.Popen) -> None:
    """Stop the emulator and everything it started (its own session)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            pass
    # UML's helper processes may outlive the main one: the whole session goes.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


class Signalled(BaseException):
    pass


@contextlib.contextmanager
def signals_raise():
    """Turn SIGTERM/SIGHUP into an exception while the emulator runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Signalled(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class LineFollower:
    """Hands each complete line the guest command has written to output.txt so far to
    ``on_line``, as it comes (a long guest run shows its progress on the host)."""

    def __init__(self, path: Path, on_line):
        self.path, self.on_line, self.offset, self.partial = path, on_line, 0, b""

    def __call__(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            self.on_line(line.decode(errors="replace"))


def supervise(cmd: list[str], rdir: Path, log_name: str, timeout: float,
              give_up=lambda waited: False, on_line=None,
              cpu: int | None = None) -> tuple[float, bool, bool, bytes]:
    """Run the emulator until it exits, ``timeout`` passes, or ``give_up(waited)`` says
    so; kill it (and its session) on every way out. ``on_line`` gets each line of the
    guest command's output while it runs; ``cpu``: the one CPU it (and every process it
    starts) may run on. Returns (elapsed, timed_out, gave_up, its own output)."""
    log_path = rdir / log_name
    follow = LineFollower(rdir / "output.txt", on_line) if on_line else lambda: None
    timed_out = gave_up = False
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        def before_exec():
            set_pdeathsig()
            if cpu is not None:
                os.sched_setaffinity(0, {cpu})
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True, preexec_fn=before_exec)
    try:
        with signals_raise():
            while proc.poll() is None:
                waited = time.monotonic() - t0
                if waited > timeout:
                    timed_out = True
                    break
                if give_up(waited):
                    gave_up = True
                    break
                follow()
                time.sleep(0.2)
    finally:
        kill(proc)
    follow()
    return time.monotonic() - t0, timed_out, gave_up, log_path.read_bytes()


def collect(rdir: Path, console: Path, elapsed: float, timed_out: bool, accel: str,
            image: Path, emulator_output: bytes, name: str, check: bool) -> VMResult:
    """The result of a finished guest, from the results directory."""
    status = rdir / "exit-status"
    rc = int(status.read_text().strip()) if status.is_file() else None
    guest = {}
    with contextlib.suppress(FileNotFoundError):
        for line in (rdir / "guest.txt").read_text().splitlines():
            k, _, v = line.partition(": ")
            guest[k] = v
    result = VMResult(returncode=rc, output=read(rdir / "output.txt"), console=read(console),
                      results_dir=rdir, elapsed=elapsed, timed_out=timed_out,
                      accel=accel, kernel=image, guest=guest)
    if rc is None and not timed_out and emulator_output:
        result.console += f"\n[{name}] " + emulator_output.decode(errors="replace")
    if check and rc != 0:
        why = "timed out" if timed_out else (f"exit status {rc}" if rc is not None else "no exit status")
        raise VMError(f"guest command {why}; console tail:\n{result.console[-3000:]}\n"
                      f"output tail:\n{result.output[-3000:]}")
    return result


def read(p: Path) -> str:
    try:
        return p.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def command_parser(description: str, example: str, kernel_default: str, kernel_help: str,
                   timeout: float, memory_mb: int):
    """The arguments both runners take as commands (``python3 -m incast.vm.qemu|uml``)."""
    ap = argparse.ArgumentParser(description=description, epilog=f"example: {example}")
    ap.add_argument("--kernel", default=kernel_default, help=kernel_help)
    ap.add_argument("--results", help="results directory (default: a new one under /tmp)")
    ap.add_argument("--timeout", type=float, default=timeout, help="host seconds before the guest is killed")
    ap.add_argument("--memory", type=int, default=memory_mb, help="guest memory, MiB")
    ap.add_argument("--append", default="", help="extra kernel command line")
    ap.add_argument("--console", action="store_true", help="also print the guest console")
    return ap


def command_main(ap, argv, name: str, emulator: str, run_guest, describe) -> int:
    """Parse, run ``run_guest(args, command)`` with the signals handled, print the guest
    command's output and ``describe(result)``; exit with the guest command's status
    (124 timed out, 125 the guest did not run it, 128+N a signal)."""
    ap.add_argument("command", nargs=argparse.REMAINDER, help="command to run in the guest")
    a = ap.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("no command given")
    command = cmd[0] if len(cmd) == 1 else cmd
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        r = run_guest(a, command)
    except VMError as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 125
    except Signalled as e:
        print(f"{name}: stopped by signal {e.args[0]}; {emulator} killed", file=sys.stderr)
        return 128 + e.args[0]
    except KeyboardInterrupt:
        print(f"{name}: interrupted; {emulator} killed", file=sys.stderr)
        return 130
    if a.console:
        sys.stderr.write(r.console)
    sys.stdout.write(r.output)
    print(f"{name}: {describe(r)}, results in {r.results_dir}" + (", TIMED OUT" if r.timed_out else ""),
          file=sys.stderr)
    if r.returncode is None:
        print(f"{name}: the guest command did not finish; console tail:\n" + r.console[-2000:],
              file=sys.stderr)
        return 124 if r.timed_out else 125
    return r.returncode
