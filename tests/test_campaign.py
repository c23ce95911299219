"""Campaigns: sweeps that never measure a point twice, resume after a kill, run virtual-
time points in parallel (here or on a Dask cluster) and leave no zombie behind."""
from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO, incast_cmd, needs_root
from incast import scenario as scn
from incast.registry import DATAPLANES
from incast.run import points
from incast.vm import guest

SMALL = ["--blocks", "3", "--sru", "32KiB", "--link-rate", "100Mbit"]


def uml_missing() -> str | None:
    if os.geteuid() != 0:
        return "builds network namespaces: run as root"
    if guest.kernel_dir("uml-stock") is None:
        return "the uml-stock kernel is not built for the current inputs: run kernels/build.sh --uml"
    return None


needs_uml = pytest.mark.skipif(uml_missing() is not None, reason=uml_missing() or "")


# --- keys ------------------------------------------------------------------------------
def test_a_point_key_names_the_scenario_the_seed_and_the_kernel():
    a = scn.build({}, {"senders": "4"})
    assert points.point_key(a) == points.point_key(scn.build({}, {"senders": "4"}))
    assert points.point_key(a) != points.point_key(scn.build({}, {"senders": "5"}))
    assert points.point_key(a) != points.point_key(scn.build({}, {"senders": "4", "seed": "2"}))
    assert points.point_key(a) != points.point_key(
        scn.build({}, {"senders": "4", "kernel": "stock", "clock": "virtual", "link_rate": "1Gbit"}))


def test_the_code_version_changes_with_the_code(tmp_path, monkeypatch):
    before = points.code_version()
    probe = REPO / "hosts" / "_version_probe.py"
    probe.write_text("# a change\n")
    try:
        points.code_version.cache_clear()
        assert points.code_version() != before
    finally:
        probe.unlink()
        points.code_version.cache_clear()
    assert points.code_version() == before


def test_a_change_to_the_rtl_switch_dates_rtl_points_only(monkeypatch):
    """The RTL switch's sources are outside the package: they date the points of runs on
    the rtl data plane (a changed model may forward differently), and no others."""
    linux = scn.build({}, {"senders": "4"})
    rtl = scn.build({}, {"senders": "4", "dataplane": "rtl"})
    before = points.point_key(linux), points.point_key(rtl)
    sv = REPO / "rtl" / "src" / "sync_fifo.sv"
    text = sv.read_bytes()
    try:
        sv.write_bytes(text + b"// a change\n")
        points.code_version.cache_clear()
        after = points.point_key(linux), points.point_key(rtl)
    finally:
        sv.write_bytes(text)
        points.code_version.cache_clear()
    assert after[0] == before[0] and after[1] != before[1]
    assert (points.point_key(linux), points.point_key(rtl)) == before


def _keys_after(path, change: bytes) -> dict[str, tuple[str, str]]:
    """Each plane's point key for the same scenario, before and after `change` is
    appended to `path` (put back after)."""
    scenarios = {p: scn.build({}, {"senders": "4", "dataplane": p}) for p in ("linux", "bmv2", "rtl")}
    before = {p: points.point_key(s) for p, s in scenarios.items()}
    text = path.read_bytes()
    try:
        path.write_bytes(text + change)
        points.code_version.cache_clear()
        after = {p: points.point_key(s) for p, s in scenarios.items()}
    finally:
        path.write_bytes(text)
        points.code_version.cache_clear()
    assert {p: points.point_key(s) for p, s in scenarios.items()} == before
    return {p: (before[p], after[p]) for p in scenarios}


@pytest.mark.parametrize("path, dated", [
    ("p4src/incast.p4", {"bmv2", "rtl"}),         # bmv2 runs it; rtl's telemetry is decoded by its layout
    ("incast/p4/layers.py", {"bmv2", "rtl"}),
    ("incast/dataplane/bmv2.py", {"bmv2"}),
    ("incast/dataplane/linux.py", {"linux"}),
    ("hosts/switch_pause.py", {"linux"}),
    ("incast/dataplane/rtl.py", {"rtl"}),
    ("incast/run/experiment.py", {"linux", "bmv2", "rtl"}),   # shared: every plane's runs execute it
])
def test_a_change_to_a_planes_own_code_dates_its_points_only(path, dated):
    """A file only some planes' runs execute (registry: DataPlaneEntry.code) dates their
    points and no others: a change to the P4 program leaves the linux plane's points
    current, a change to the linux plane's module the P4 switches'."""
    keys = _keys_after(REPO / path, b"\n")
    assert {p for p, (before, after) in keys.items() if before != after} == dated


def test_every_planes_own_code_exists_and_no_other_plane_imports_it():
    """Each glob of a plane's own code names files, and no module shared by every plane
    imports one of them (it would then run in the other planes' runs too)."""
    own = {}
    for name, entry in DATAPLANES.items():
        for g in entry.code:
            files = list(REPO.glob(g))
            assert files, f"{name}: {g} names no file"
            for f in files:
                own.setdefault(f, set()).add(name)
    modules = {f: ".".join(f.relative_to(REPO).with_suffix("").parts) for f in own if f.suffix == ".py"}
    for f in points.shared_files():
        if f.suffix != ".py":
            continue
        text = f.read_text()
        for g, mod in modules.items():
            short = mod.rsplit(".", 1)
            imported = (f"import {mod}" in text or f"from {mod} import" in text
                        or f"from {short[0]} import {short[1]}" in text)
            assert not imported, f"{f.relative_to(REPO)} (shared) imports {mod} ({', '.join(sorted(own[g]))}'s own)"


# --- bad input -------------------------------------------------------------------------
def test_a_run_another_sweep_installed_first_is_done(tmp_path, monkeypatch):
    """A sweep starting installs what killed sweeps left complete (Store.remove_stale),
    and so may install a run of a live sweep that has just finished: that sweep takes it
    as done, not as a run that failed with exit status 0."""
    from incast.run import executors
    store = points.Store(tmp_path / "store")

    def run_then_another_sweep_starts(scenario_file, out, env=None):
        out.mkdir()
        (out / "summary.json").write_text("{}")
        points.Store(store.root).remove_stale()
        return 0, "", 0.1
    monkeypatch.setattr(executors, "_incast_run", run_then_another_sweep_starts)
    task = executors.Task(0, "k" * 20, "point", "", True)
    [done] = executors.LocalExecutor(1).run([task], store)
    assert done.ok and done.error is None and store.get(task.key) is not None


def test_jobs_on_real_time_points_is_refused_without_force(tmp_path):
    r = incast_cmd("sweep", "--grid", "senders=1,2", *SMALL, "--jobs", "2", "--out", tmp_path / "s")
    assert r.returncode == 2, r.stderr
    assert "real time" in r.stderr and "--force-jobs" in r.stderr
    assert not (tmp_path / "s").exists() and not list(tmp_path.glob(".s.incomplete"))


def test_an_unknown_executor_is_refused(tmp_path):
    r = incast_cmd("sweep", "--grid", "senders=1", *SMALL, "--executor", "slurm://x", "--out", tmp_path / "s")
    assert r.returncode == 2 and "--executor" in r.stderr, r.stderr


def test_resume_without_an_interrupted_sweep_is_refused(tmp_path):
    r = incast_cmd("sweep", "--resume", "--out", tmp_path / "nothing")
    assert r.returncode == 2 and "no interrupted sweep" in r.stderr, r.stderr


# --- reuse, resume, reaping (real time) ------------------------------------------------------


@pytest.mark.network
@needs_root
def test_a_rerun_sweep_reuses_every_point_and_fresh_measures_again(tmp_path, no_leftovers):
    first = incast_cmd("sweep", "--grid", "senders=1,2", *SMALL, "--out", tmp_path / "a")
    assert first.returncode == 0, first.stderr
    again = incast_cmd("sweep", "--grid", "senders=1,2", *SMALL, "--out", tmp_path / "b")
    assert again.returncode == 0, again.stderr
    assert "(2 from earlier runs)" in again.stdout, again.stdout
    a, b = pd.read_parquet(tmp_path / "a" / "sweep.parquet"), pd.read_parquet(tmp_path / "b" / "sweep.parquet")
    assert list(a["reused"]) == [False, False] and list(b["reused"]) == [True, True]
    assert list(a["point_key"]) == list(b["point_key"])
    assert list(a["goodput_mbps"]) == list(b["goodput_mbps"])
    for run_dir in b["run_dir"]:            # the sweep directory holds its runs whole
        assert (Path(run_dir) / "blocks.parquet").is_file()
    fresh = incast_cmd("sweep", "--grid", "senders=1,2", *SMALL, "--fresh", "--out", tmp_path / "c")
    assert fresh.returncode == 0, fresh.stderr
    assert list(pd.read_parquet(tmp_path / "c" / "sweep.parquet")["reused"]) == [False, False]


def _complete_points(store: Path) -> set[str]:
    """Keys of the measurements complete in the store, installed (KEY) or not yet
    (.KEY.XXXX.new: finished, its sweep killed before it could install it)."""
    if not store.is_dir():
        return set()
    return {p.name.split(".")[1] if p.name.startswith(".") else p.name for p in store.iterdir()
            if (p / "summary.json").is_file()}


@pytest.mark.network
@needs_root
def test_a_killed_sweep_resumes_without_measuring_a_finished_point_again(tmp_path, no_leftovers):
    store = Path(os.environ["INCAST_POINTS"]) / "killed"
    env = dict(os.environ, INCAST_POINTS=str(store))
    out = tmp_path / "sw"
    proc = subprocess.Popen([sys.executable, "-m", "incast", "sweep", "--grid", "senders=1,2,3,4", *SMALL,
                             "--out", str(out)], cwd=REPO, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    # Killed as soon as two points are in the store (the third is likely running).
    while len(_complete_points(store)) < 2:
        assert proc.poll() is None, f"the sweep ended before it was killed: {proc.stderr.read()}"
        assert time.monotonic() < deadline, "no point finished in 300 s"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = _complete_points(store)
    assert not out.exists() and (tmp_path / ".sw.incomplete").is_dir()
    incast_cmd("cleanup", check=True)       # what the killed point's run left
    r = subprocess.run([sys.executable, "-m", "incast", "sweep", "--resume", "--out", str(out)], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    table = pd.read_parquet(out / "sweep.parquet")
    assert list(table["senders"]) == [1, 2, 3, 4] and table["goodput_mbps"].notna().all()
    reused = set(table.loc[table["reused"], "point_key"])
    assert finished <= reused, (finished, reused)           # nothing finished was measured again
    assert set(table.loc[~table["reused"], "point_key"]).isdisjoint(finished)


def _children(pid: int) -> dict[int, str]:
    """pid -> state of every process whose parent is pid (/proc/PID/stat)."""
    out = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out[int(stat.split("/")[2])] = fields[0]
    return out


def _registered_runs() -> set[int]:
    pids = set()
    for f in Path("/run/incast").glob("incast-*.json"):
        try:
            pids.add(json.loads(f.read_text())["pid"])
        except (OSError, ValueError, KeyError):
            continue            # removed, or not a run's state
    return pids


@pytest.mark.network
@needs_root
def test_a_sweep_killed_alone_takes_its_runs_with_it(tmp_path, no_leftovers):
    """SIGKILL to the sweep's process only (not its group, as a scheduler or `kill PID`
    does): the point it was running is torn down, not left running without it."""
    store = tmp_path / "store"
    proc = subprocess.Popen([sys.executable, "-m", "incast", "sweep", "--grid", "senders=2", *SMALL,
                             "--blocks", "100000", "--out", str(tmp_path / "sw")], cwd=REPO,
                            env=dict(os.environ, INCAST_POINTS=str(store)), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        # The point's run, once it has registered what it builds (its state file, which
        # names it): its teardown has work to do. (The sweep's other children, git or a
        # probe, come and go.)
        while not (runs := _registered_runs() & set(_children(proc.pid))):
            assert proc.poll() is None, f"the sweep ended before it was killed: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "the sweep's run registered nothing in 120 s"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 60
        while any(Path(f"/proc/{pid}").exists() for pid in runs):
            assert time.monotonic() < deadline, f"runs {runs} still alive 60 s after their sweep died"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # no_leftovers: no namespace, link or process of the run is left


def _zombie_children() -> int:
    return sum(state == "Z" for state in _children(os.getpid()).values())


@pytest.mark.network
@needs_root
def test_no_zombie_outlives_its_run_across_a_sweep(tmp_path, no_leftovers):
    """In-process runs (Mininet's node shells were never waited for: 439 zombies in a
    20-run sweep) and a sweep's point processes alike."""
    from incast.run import sweep
    from incast.run.experiment import run
    before = _zombie_children()
    for n in (2, 4):
        run(scn.build({}, {"senders": str(n), "blocks": "2", "sru": "32KiB", "link_rate": "100Mbit"}),
            tmp_path / f"run{n}")
        assert _zombie_children() == before, f"zombies after a {n}-server run"
    grid = {"senders": ["1", "3"]}
    pts = sweep.expand({}, {"blocks": "2", "sru": "32KiB", "link_rate": "100Mbit"}, grid)
    result = sweep.run_sweep(pts, grid, 1, tmp_path / "sw", unique=False, meta={},
                             store=points.Store(tmp_path / "store"))
    assert result.failures == 0
    assert _zombie_children() == before


# --- parallel points and a Dask cluster (virtual time) ----------------------------------------
VIRTUAL = ["--clock", "virtual", "--kernel", "stock", "--link-rate", "1Gbit", "--buffer", "1MiB",
           "--sru", "32KiB", "--blocks", "10", "--warmup", "2", "--seed", "7"]


@pytest.mark.network
@needs_uml
def test_parallel_points_give_the_results_of_serial_ones(tmp_path, no_leftovers):
    """Lossless virtual-time points are deterministic (test_virtual_time): run two at
    once, every block takes the time it takes when they run one after another. (--batch 1:
    a guest each point, in both; a point run after another in one guest is not the same
    run bit for bit, tests/test_guest_batch.py.)"""
    serial = incast_cmd("sweep", "--grid", "senders=2,4", *VIRTUAL, "--jobs", "1", "--batch", "1",
                        "--out", tmp_path / "j1")
    assert serial.returncode == 0, serial.stderr
    parallel = incast_cmd("sweep", "--grid", "senders=2,4", *VIRTUAL, "--jobs", "2", "--batch", "1", "--fresh",
                          "--out", tmp_path / "j2")
    assert parallel.returncode == 0, parallel.stderr
    t1, t2 = pd.read_parquet(tmp_path / "j1" / "sweep.parquet"), pd.read_parquet(tmp_path / "j2" / "sweep.parquet")
    assert not t2["reused"].any() and (t1["drops"] == 0).all() and (t2["drops"] == 0).all()
    for r1, r2 in zip(t1["run_dir"], t2["run_dir"]):
        b1 = pd.read_parquet(Path(r1) / "blocks.parquet")["duration_ms"]
        b2 = pd.read_parquet(Path(r2) / "blocks.parquet")["duration_ms"]
        assert len(b1) == len(b2) == 10
        assert (b1 - b2).abs().max() <= 0.002, (b1 - b2).abs().max()


def _dask_bin() -> str | None:
    d = Path(sys.executable).parent / "dask"
    return str(d) if d.exists() else shutil.which("dask")


@pytest.mark.network
@needs_uml
@pytest.mark.skipif(_dask_bin() is None, reason="the dask command is missing (scripts/setup.sh installs it)")
def test_a_sweep_runs_on_a_dask_cluster_of_unprivileged_workers(tmp_path, no_leftovers):
    """A real scheduler and two workers on this machine, the workers as nobody (uid
    65534: virtual-time runs need no root); the results land in the sweep directory."""
    import tempfile
    cluster = Path(tempfile.mkdtemp(prefix="incast-dask-"))     # readable by the workers (tmp_path is not)
    cluster.chmod(0o755)
    home = cluster / "home"
    home.mkdir()
    os.chown(home, 65534, 65534)
    sched_file = cluster / "scheduler.json"
    # The workers import the package as nobody, which may not read this checkout (one under
    # /root, mode 0700, as on a fresh machine): they get a copy of it where they can.
    src = cluster / "src"
    shutil.copytree(REPO, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", "results", "docs", "rtl", "lib", "__pycache__", ".pytest_cache", "*.egg-info", "tests"))
    env = dict(os.environ, HOME=str(home), DASK_DISTRIBUTED__WORKER__DAEMON="False", PYTHONPATH=str(src))
    procs = [subprocess.Popen([_dask_bin(), "scheduler", "--host", "127.0.0.1", "--port", "0",
                               "--no-dashboard", "--scheduler-file", str(sched_file)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)]
    try:
        deadline = time.monotonic() + 60
        while not sched_file.is_file():
            assert time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.1)
        os.chmod(sched_file, 0o644)
        for i in range(2):
            procs.append(subprocess.Popen(
                ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", _dask_bin(), "worker",
                 "--scheduler-file", str(sched_file), "--nthreads", "1", "--no-dashboard",
                 "--name", f"w{i}", "--local-directory", str(home)],
                env=env, cwd=home, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True))
        from distributed import Client
        with Client(scheduler_file=str(sched_file), timeout="30s") as client:
            client.wait_for_workers(2, timeout=120)      # both joined, as nobody
        # --fresh: the session's store may hold these points from another test already
        r = incast_cmd("sweep", "--grid", "senders=1,2", *VIRTUAL, "--executor", str(sched_file), "--fresh",
                       "--out", tmp_path / "sw")
        assert r.returncode == 0, r.stderr[-3000:]
        table = pd.read_parquet(tmp_path / "sw" / "sweep.parquet")
        assert table["goodput_mbps"].notna().all() and not table["reused"].any()
        assert table["worker"].str.startswith("tcp://").all(), table["worker"]
        for run_dir in table["run_dir"]:
            s = json.loads((Path(run_dir) / "summary.json").read_text())
            assert s["clock"] == "virtual" and s["fidelity"]["ok"], s["fidelity"]
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        shutil.rmtree(cluster, ignore_errors=True)


def test_a_sweeps_progress_is_lines_where_no_terminal_redraws_them():
    """In a log or CI a figure's runs still say how far they are: a line a refresh,
    never a carriage return."""
    import io
    from incast.run import sweep as sweep_mod
    out = io.StringIO()
    bar = sweep_mod.runs_bar(list(range(4)), stream=out, every_s=0)
    for _ in range(4):
        bar.update(1)
    bar.close()
    text = out.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert len(lines) >= 2 and "4/4" in lines[-1], lines


@pytest.mark.parametrize("prefix", ["VM_SCRATCH_PREFIX", "POINTS_SCRATCH_PREFIX"])
def test_a_scratch_directory_a_killed_run_left_is_removed_and_one_in_use_is_not(tmp_path, prefix):
    """A guest run's scratch directory, and a local executor's, in the point store hold a
    lock while their run or sweep lives: one whose lock nobody holds (SIGKILL) goes at
    the next sweep or incast cleanup; one locked, or still being made (no lock yet),
    stays."""
    from incast import constants
    store = points.Store(tmp_path / "store")
    left, live, new = (store.root / f"{getattr(constants, prefix)}{n}" for n in ("left", "live", "new"))
    for d in (left, live, new):
        d.mkdir()
        (d / "scenario.toml").write_text("")
    (left / ".lock").touch()
    with points.locked(live):
        assert store.remove_stale() == 1
        assert not left.exists() and live.is_dir() and new.is_dir()
    assert store.remove_stale() == 1 and not live.exists()


@needs_uml
def test_sigterm_takes_a_guest_runs_scratch_directory_with_it(tmp_path, no_leftovers):
    """SIGTERM to a run in virtual time, whatever it is doing once its scratch directory
    exists, removes that directory as the run ends (a killed campaign leaves nothing in
    the point store)."""
    # Up to three tries: a try whose run had already ended when the signal was sent (its
    # summary written before it; the poll below caught the scratch directory as it went)
    # shows nothing and is made again. A run that ends well after the signal fails.
    for attempt in range(3):
        work = tmp_path / f"try{attempt}"
        work.mkdir()
        out = work / "r"
        with open(work / "stderr.txt", "w") as err:
            proc = subprocess.Popen([sys.executable, "-m", "incast", "run", "--senders", "2", *SMALL, "--blocks", "20",
                                     "--clock", "virtual", "--kernel", "stock", "--out", str(out)],
                                    cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 120
        while not list(work.glob(".incast-vm-*/points/*/scenario.toml")):      # the run is in its guest phase
            assert proc.poll() is None, f"the run ended first: {(work / 'stderr.txt').read_text()}"
            assert time.monotonic() < deadline, "no scratch directory in 120 s"
            time.sleep(0.05)
        signalled_at = time.time()
        os.killpg(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=60)
        summary = out / "summary.json"
        if rc == 0 and summary.is_file() and summary.stat().st_mtime < signalled_at:
            continue            # it had ended before the signal came
        assert rc != 0, (f"the run went on after SIGTERM ({summary.stat().st_mtime - signalled_at:+.3f} s) "
                         f"and ended well: {(work / 'stderr.txt').read_text()[-2000:]}")
        break
    else:
        pytest.fail("three runs in a row ended before the signal reached them")
    assert not list(work.glob(".incast-vm-*")), sorted(p.name for p in work.iterdir())
