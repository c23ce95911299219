"""Shared fixtures. Tests that build networks need root; each run makes uniquely named
namespaces (incast-<token>) and the fixtures check that none is left behind."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

from incast.measure.results import single_threaded_arrow  # noqa: E402

single_threaded_arrow()     # this process reads many tables and must exit cleanly (see there)


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true",
                     help="also the long tier: every figure's quick grid and the real-time onset "
                          "searches (docs/tests.md says what each tier costs)")


def pytest_collection_modifyitems(config, items):
    """The long tier runs with --long only; the README's test command leaves it out."""
    if config.getoption("--long"):
        return
    skip = pytest.mark.skip(reason="long tier: scripts/test.sh --long")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    """Every test measures: the sweeps of this session keep their points in a store of
    the session's own (removed at its end), never in one an earlier run filled. Except
    the check of the kept results (check_runner): its fresh runs of today's code are the
    point store's, keyed by the code's bytes, so a suite run that changed no code
    measures them once."""
    import tempfile
    import uuid
    # Every process this session starts inherits it: how no_processes_left knows ours.
    os.environ["INCAST_TEST_SESSION"] = uuid.uuid4().hex
    from incast.run import points
    config._incast_check_points = points.default_store()
    if not os.environ.get("INCAST_TEST_KEEP_POINTS"):
        config._incast_points = tempfile.TemporaryDirectory(prefix="incast-test-points-")
        os.environ["INCAST_POINTS"] = config._incast_points.name


def pytest_unconfigure(config):
    tmp = getattr(config, "_incast_points", None)
    if tmp is not None:
        tmp.cleanup()


def incast_cmd(*args, check=False, timeout=900):
    """Run the CLI as users do (a fresh process), returning the CompletedProcess."""
    return subprocess.run([sys.executable, "-m", "incast", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=check)


def run_json(*args, **kw) -> dict:
    r = incast_cmd("run", *args, "--json", **kw)
    assert r.returncode == 0, f"incast run failed ({r.returncode}): {r.stderr.strip()[-2000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


class NotFaithful(AssertionError):
    """No run of a measurement was faithful: the machine, not the testbed, decided it.
    (An AssertionError, so a test that does not expect it fails.)"""


def measurer(base: dict[str, str], root, faithful_attempts: int = 0):
    """m(**flags) runs `incast run` with base overridden by flags (senders=8,
    rto_min="min" -> --senders 8 --rto-min min) and returns its summary. Each distinct
    set of flags runs once: claims that share a run share its result.
    faithful_attempts > 0: a run the testbed flags as not faithful (the machine
    stalled) is run again, up to that many times in all; a claim rests only on a
    faithful run, and the test fails naming the reasons if none was."""
    results = {}

    def m(**kw):
        key = tuple(sorted((f"--{k.replace('_', '-')}", str(v)) for k, v in kw.items()))
        if key not in results:
            flat = [x for kv in {**base, **dict(key)}.items() for x in kv]
            name = "_".join(f"{k[2:]}{v}" for k, v in key) or "base"
            attempts = []
            for attempt in range(max(1, faithful_attempts)):
                s = run_json(*flat, "--out", f"{root}/{name}" + (f".{attempt}" if attempt else ""))
                attempts.append(s)
                if not faithful_attempts or s["fidelity"]["ok"]:
                    break
            results[key] = attempts
        attempts = results[key]
        # Kept either way: a test that asks again for a run found not faithful gets the
        # same verdict, not the run made again into the directories of its attempts.
        if faithful_attempts and not attempts[-1]["fidelity"]["ok"]:
            faithful_or_fail(attempts, f"run {kw}")
        return attempts[-1]
    return m


def our_netns() -> set[str]:
    d = Path("/run/netns")
    return {p.name for p in d.iterdir() if p.name.startswith("incast-")} if d.is_dir() else set()


def our_state() -> set[str]:
    """Run state files and anything else runs leave in /run/incast."""
    d = Path("/run/incast")
    return {p.name for p in d.iterdir()} if d.is_dir() else set()


def faithful_rate_bps(senders: int) -> int:
    """The highest rate this machine emulates faithfully for `senders` servers
    (incast calibrate; measured once per machine and cached, again once a machine that
    was busy then is quiet)."""
    from incast.measure.calibration import NoFaithfulRate, load_line, made_busy
    from incast.run import calibrate
    c = calibrate.calibrate()
    try:
        return calibrate.faithful_rate(c, senders)
    except NoFaithfulRate as e:
        # A busy machine (other work at normal priority beside the calibration) is the
        # machine's state, not the testbed's: the test skips with it. A quiet one fails.
        if made_busy(c):
            pytest.skip(f"{e} ({load_line(c['load'])})")
        raise


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="builds network namespaces: run as root")


def needs_uml(variant: str):
    """Skip unless root and the UML kernel `variant` is built for the current inputs."""
    from incast.vm import guest
    reason = None
    if os.geteuid() != 0:
        reason = "User-Mode Linux runs as root here: run as root"
    elif guest.kernel_dir(variant) is None:
        reason = f"the {variant} kernel is not built for the current inputs: run kernels/build.sh --uml"
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def others_live(names: set[str]) -> set[str]:
    """Of these namespaces and run state files, those of a run alive in a process that
    is not this test session's: a second pytest session's or a user's experiment beside
    it, not this test's to count or to clean. A run's owner is in its state file
    (incast.machine.resources); this session's processes carry its INCAST_TEST_SESSION
    (pytest's own environment, as /proc shows it, was read before conftest set it)."""
    from incast.machine.resources import PREFIX, live_owner
    mark = f"INCAST_TEST_SESSION={os.environ.get('INCAST_TEST_SESSION', '')}".encode()
    theirs = set()
    for name in names:
        owner = live_owner(name[:len(PREFIX) + 8])
        if owner is None or owner == os.getpid():
            continue        # no owner on record, or it is gone, or it is this session: counted
        try:
            if mark not in Path(f"/proc/{owner}/environ").read_bytes().split(b"\0"):
                theirs.add(name)
        except OSError:
            continue        # it ended meanwhile: counted
    return theirs


@pytest.fixture
def no_leftovers():
    """Fails the test if it leaves namespaces or run state behind; cleans them anyway."""
    before_ns, before_state = our_netns(), our_state()
    yield
    left_ns, left_state = our_netns() - before_ns, our_state() - before_state
    left_ns -= others_live(left_ns)
    left_state -= others_live(left_state)
    if left_ns or left_state:
        incast_cmd("cleanup")
    assert not left_ns, f"namespaces left behind: {sorted(left_ns)}"
    assert not left_state, f"run state left behind: {sorted(left_state)}"


# The processes a run starts outside its namespaces' lifetime: a switch model each
# (bmv2, the RTL harness) and a UML guest's host processes (the kernel binary is
# named "linux"). One left running competes with every later real-time run.
# simple_switch_grpc is "simple_switch_g" (the bmv2 plane over P4Runtime).
RUN_PROCESSES = ("simple_switch", "simple_switch_g", "incast_switch_s", "linux")     # comm: 15 characters


def run_processes() -> dict[int, str]:
    """Those of this test session (not a user's experiment beside it), by pid."""
    mark = f"INCAST_TEST_SESSION={os.environ.get('INCAST_TEST_SESSION', '')}".encode()
    found = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                stat = (p / "stat").read_text()
                # "pid (comm) state ...": a zombie has exited, its parent has yet to reap it.
                comm, state = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2]
                if comm in RUN_PROCESSES and state != "Z" and mark in (p / "environ").read_bytes().split(b"\0"):
                    found[int(p.name)] = comm
            except OSError:
                continue
    return found


@pytest.fixture(scope="module", autouse=True)
def no_processes_left():
    """Fails a module that leaves a switch model or a UML guest of its own running
    (and stops it)."""
    before = run_processes()
    yield
    left = {pid: comm for pid, comm in run_processes().items() if pid not in before}
    for pid in left:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    assert not left, f"processes left running: {sorted(left.items())}"


def faithful_or_fail(runs: list[dict], what: str):
    """After a measurement's attempts, none faithful: a skip where the machine was busy
    in every one (the hypervisor took its CPUs, or other processes at normal priority
    took a share of them: the machine, not the testbed, decided the run), and says so,
    else NotFaithful naming each attempt's reasons."""
    from incast.measure.calibration import BUSY_SHARE
    reasons = [s["fidelity"]["reasons"] for s in runs]
    if reasons and all(any(r.startswith("the hypervisor took") for r in rs) for rs in reasons):
        pytest.skip(f"{what}: the hypervisor took this machine's CPUs in every attempt: {reasons}")
    others = [s["fidelity"].get("cpu_others") or 0 for s in runs]
    if runs and all(o >= BUSY_SHARE for o in others):
        pytest.skip(f"{what}: other processes took {', '.join(f'{100 * o:.0f}%' for o in others)} of this "
                    f"machine's CPUs in every attempt (busy, not the testbed): {reasons}")
    raise NotFaithful(f"{what} not faithful: {reasons}")


@pytest.fixture(scope="session")
def check_runner(pytestconfig):
    """Runs a kept result's check points (incast.campaign.check) through the machine's
    point store, one run per core (virtual time: runs side by side do not disturb each
    other's results)."""
    from incast.campaign import check
    from incast.run import points
    return check.sweep_runner(store=points.Store(pytestconfig._incast_check_points))


def switch_output(proc) -> list[bytes]:
    """bmv2's output lines (read on, so the switch never blocks on a full pipe), once it
    says its Thrift server started; fails with its last lines if it ends first."""
    import threading
    ready, log = threading.Event(), []

    def pump():
        for line in proc.stdout:
            log.append(line)
            if b"Thrift server was started" in line:
                ready.set()
        ready.set()
    threading.Thread(target=pump, daemon=True).start()
    assert ready.wait(60) and proc.poll() is None, b"".join(log[-20:]).decode()
    return log
