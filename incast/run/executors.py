"""Where a sweep's points run: here, several at once (``local``), or on a Dask cluster
(``dask://HOST:PORT`` or a scheduler file). One small interface, one registry.

Every point on this machine's kernel runs as its own ``incast run SCENARIO.toml``
process: a point cannot disturb another's Python state, Ctrl-C reaches every run's
own teardown, and a worker needs nothing but this package. Points on a guest kernel
run in batches, each batch in one guest booted once (``python -m incast.run.in_guest``;
every point there in a process of its own, from the guest as it was before the first:
incast.run.guest_points), so a guest's boot and imports are paid once a batch. An
executor gets ``Task``s and yields each ``Done`` as it finishes, in whatever order
they finish.

Dask (not a job server of our own): the client submits one function call per point;
the worker runs the point in a temporary directory, packs the run directory as a
tar archive and returns it; the client unpacks it into the point store. Workers may
be unprivileged users on other machines (virtual-time runs need no root); they need
this checkout installed (scripts/setup.sh) and, for virtual time, the UML kernels
built (kernels/build.sh --uml) from the same inputs, which the point's key checks.
dask-jobqueue starts such workers on SLURM, PBS or SGE (see docs).
"""
from __future__ import annotations

import io
import json
import math
import os
import queue
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from incast.constants import POINTS_SCRATCH_PREFIX
from incast.errors import BadInput, RunFailed

from incast.measure.results import Claim, is_complete
from incast.run.points import locked

WORKER_WAIT_S = 120     # for the cluster's first worker, before any point is submitted
# Points a guest runs at most: its boot and imports (about 1 s of host time with UML)
# shared by up to this many, while a batch stays short enough to spread a sweep over
# every job and to lose little to a kill (what a batch had finished is kept).
BATCH_MAX = 10
BATCH_LINE = re.compile(r"incast-point: (\d+) (ok|failed: (.*))(?: [0-9.]+)?$")


@dataclass
class Task:
    index: int
    key: str
    label: str
    scenario_toml: str
    virtual: bool
    guest: str | None = None    # tasks with the same guest key may share a guest (in_guest.guest_key)


@dataclass
class Done:
    task: Task
    ok: bool
    error: str | None
    host_seconds: float
    log: str                    # the run's stderr (relayed with -v)
    where: str                  # "local" or the Dask worker's address


def _spawn(module_argv: list[str], stderr, env: dict) -> subprocess.Popen:
    """`python -m MODULE ARGS` as a child of the sweep. setpriv --pdeathsig: it gets
    SIGTERM (its teardown) when the sweep that started it dies, however it dies (SIGKILL
    included), instead of running on without it (setpriv, not a preexec_fn as
    incast.vm.guest.set_pdeathsig: these start from threads). Its messages go to a file,
    not a pipe, so a child whose sweep died can still write them while it tears down;
    its standard output is not read (its run directories are)."""
    return subprocess.Popen(["setpriv", "--pdeathsig", "TERM", sys.executable, "-m", *module_argv],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, env=env)


def _incast_run(scenario_file: Path, out: Path, env_extra: dict | None = None) -> tuple[int, str, float]:
    env = dict(os.environ, **(env_extra or {}))
    t = time.monotonic()
    with tempfile.TemporaryFile("w+") as stderr:
        # -v: the run says what it does; kept for the sweep's own -v and for errors.
        proc = _spawn(["incast", "run", str(scenario_file), "--out", str(out), "--json", "-v"], stderr, env)
        proc.wait()
        stderr.seek(0)
        return proc.returncode, stderr.read(), time.monotonic() - t


def _error_line(returncode: int, stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("incast:")]
    return lines[-1][len("incast:"):].strip() if lines else f"exit status {returncode}"


def batches(tasks: list[Task], jobs: int, most: int = BATCH_MAX) -> list[list[Task]]:
    """The units of work: each task on this machine's kernel alone; those sharing a guest
    key in batches of at most `most`, at least one a job, dealt out in turn (a figure's
    points differ in cost by their server counts)."""
    units, groups = [], {}
    for t in tasks:
        if t.guest is None:
            units.append([t])
        else:
            groups.setdefault(t.guest, []).append(t)
    for group in groups.values():
        k = max(min(jobs, len(group)), math.ceil(len(group) / most))
        units.extend(group[i::k] for i in range(k))
    return units


class LocalExecutor:
    """Points as child processes of this one, `jobs` units of work at a time (a point,
    or a batch of points sharing a guest)."""
    name = "local"

    def __init__(self, jobs: int, concurrent_real_time: bool = False, batch: int | None = None):
        if batch is not None and batch < 1:
            raise BadInput("--batch: at least 1")
        self.jobs, self.batch = jobs, batch or BATCH_MAX
        self.concurrent_real_time = concurrent_real_time

    def run(self, tasks: Iterable[Task], store) -> Iterator[Done]:
        tasks = list(tasks)
        if not tasks:
            return
        # Locked while this sweep lives: one a killed sweep left goes at the next sweep or
        # incast cleanup (points.Store.remove_stale).
        work = Path(tempfile.mkdtemp(prefix=POINTS_SCRATCH_PREFIX, dir=store.root))
        with locked(work):
            yield from self._run(tasks, store, work)

    def _run(self, tasks: list[Task], store, work: Path) -> Iterator[Done]:
        env = {}
        if self.jobs > 1 and self.concurrent_real_time:
            env["INCAST_CONCURRENT_RUNS"] = str(self.jobs - 1)   # the runs' fidelity says so
        finished: queue.Queue[Done] = queue.Queue()

        def installed(task: Task, out: Path, succeeded: bool) -> bool:
            ok = succeeded and is_complete(out)
            if ok:
                try:
                    store.install(task.key, out)
                except FileNotFoundError:
                    # another sweep starting (Store.remove_stale) installed it first
                    ok = store.get(task.key) is not None
            elif succeeded and not out.exists() and store.get(task.key) is not None:
                ok = True       # installed the same way before this sweep looked
            return ok

        def one(task: Task) -> None:
            f = work / f"{task.key}.toml"
            f.write_text(task.scenario_toml)
            out = store.scratch(task.key)
            rc, err, secs = _incast_run(f, out, env)
            ok = installed(task, out, rc == 0)
            finished.put(Done(task, ok, None if ok else _error_line(rc, err), secs, err, "local"))

        def batch(unit: list[Task]) -> None:
            outs = [store.scratch(t.key) for t in unit]
            argv = []
            for t, out in zip(unit, outs):
                f = work / f"{t.key}.toml"
                f.write_text(t.scenario_toml)
                argv += [str(f), str(out)]
            told, lines = set(), []

            def on_line(line: str):
                m = BATCH_LINE.match(line)
                if not m:
                    lines.append(line)
                    return
                i = int(m.group(1))
                ok = installed(unit[i], outs[i], m.group(2) == "ok")
                finished.put(Done(unit[i], ok, None if ok else (m.group(3) or "its results are incomplete"),
                                  _host_seconds(store, unit[i].key) if ok else 0.0, "\n".join(lines), "local"))
                lines.clear()       # what follows is the next point's
                told.add(i)
            rc, err = _in_guest_batch(argv, env, on_line)
            for i, task in enumerate(unit):
                if i not in told:
                    finished.put(Done(task, False, _error_line(rc, err), 0.0, err, "local"))

        def unit_of_work(unit: list[Task]) -> None:
            try:
                one(unit[0]) if unit[0].guest is None else batch(unit)
            except Exception as e:      # noqa: BLE001 - every task gets its Done, whatever failed
                for t in unit:
                    finished.put(Done(t, False, f"{type(e).__name__}: {e}", 0.0, "", "local"))
        units = batches(tasks, self.jobs, self.batch)
        try:
            with ThreadPoolExecutor(max_workers=self.jobs) as pool:
                futures = [pool.submit(unit_of_work, u) for u in units]
                seen = set()
                while len(seen) < len(tasks):
                    done = finished.get()
                    if done.task.index in seen:     # a batch that failed after telling some
                        continue
                    seen.add(done.task.index)
                    yield done
                for fut in futures:
                    fut.result()
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _host_seconds(store, key: str) -> float:
    """A point's host seconds, as its summary has them (its share of the guest's)."""
    d = store.get(key)
    if d is None:
        return 0.0
    try:
        return float(json.loads((Path(d) / "summary.json").read_text()).get("host_seconds", 0.0))
    except (OSError, ValueError):
        return 0.0


def _in_guest_batch(argv: list[str], env_extra: dict, on_line) -> tuple[int, str]:
    """Run a batch of guest points (python -m incast.run.in_guest), handing each of its
    lines to on_line as it is written; (exit status, its stderr)."""
    env = dict(os.environ, **env_extra)
    with tempfile.NamedTemporaryFile("w+", prefix="incast-batch-", suffix=".log") as stderr:
        proc = _spawn(["incast.run.in_guest", *argv], stderr, env)
        text, partial = [], ""
        with open(stderr.name) as follow:
            while True:
                ended = proc.poll() is not None      # read after it ended: nothing is missed
                chunk = follow.read()
                if chunk:
                    *lines, partial = (partial + chunk).split("\n")
                    for line in lines:
                        text.append(line)
                        on_line(line)
                if ended:
                    break
                try:
                    proc.wait(timeout=0.5)          # the batch's lines are followed twice a second
                except subprocess.TimeoutExpired:
                    pass
        return proc.returncode, "\n".join(text + [partial])


def run_point_on_worker(scenario_toml: str) -> tuple[int, str, float, bytes]:
    """On a Dask worker: run one point in a temporary directory; (exit status, stderr,
    seconds, the run directory as a gzipped tar archive)."""
    with tempfile.TemporaryDirectory(prefix="incast-point-") as tmp:
        f = Path(tmp, "scenario.toml")
        f.write_text(scenario_toml)
        rc, err, secs = _incast_run(f, Path(tmp, "run"))
        blob = io.BytesIO()
        if rc == 0 and is_complete(Path(tmp, "run")):
            with tarfile.open(fileobj=blob, mode="w:gz") as tar:
                tar.add(Path(tmp, "run"), arcname=".")
        return rc, err, secs, blob.getvalue()


class DaskExecutor:
    """Points on a Dask cluster: ``dask://HOST:PORT`` (tcp), or a scheduler file."""
    name = "dask"

    def __init__(self, address: str):
        self.address = address

    def _client(self):
        try:
            from distributed import Client      # late: the optional dask extra, for this executor only
        except ImportError:
            raise BadInput("--executor dask: the distributed package is missing (scripts/setup.sh)") from None
        target = self.address.removeprefix("dask://")
        try:
            if Path(target).is_file():
                return Client(scheduler_file=target, timeout="30s")
            return Client(f"tcp://{target}", timeout="30s")
        except OSError as e:
            raise BadInput(f"--executor {self.address}: cannot reach the scheduler: {e}") from None

    def run(self, tasks: Iterable[Task], store) -> Iterator[Done]:
        tasks = list(tasks)
        if not tasks:
            return
        from distributed import as_completed as dask_completed    # late: the optional dask extra
        client = self._client()
        try:
            try:
                client.wait_for_workers(1, timeout=WORKER_WAIT_S)
            except TimeoutError:
                raise RunFailed(f"--executor {self.address}: no Dask worker joined in {WORKER_WAIT_S} s") from None
            futures = {client.submit(run_point_on_worker, t.scenario_toml, key=f"incast-{t.key}",
                                     pure=False): t for t in tasks}
            for fut in dask_completed(futures):
                task = futures[fut]
                who = client.who_has(fut).get(fut.key) or ("?",)
                try:
                    rc, err, secs, blob = fut.result()
                except Exception as e:      # the worker died or raised: this point failed
                    yield Done(task, False, f"on the cluster: {e}", 0.0, "", str(who[0]))
                    continue
                ok = rc == 0 and bool(blob)
                if ok:
                    claim = Claim(store.scratch(task.key))
                    _unpack(blob, claim.path)
                    store.install(task.key, claim.finalize())
                yield Done(task, ok, None if ok else _error_line(rc, err), secs, err, str(who[0]))
        finally:
            client.close()


def _unpack(blob: bytes, dest: Path) -> None:
    """A worker's run directory into dest: regular files and directories only, every
    one inside dest (what a worker sends is not trusted to name other places)."""
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        members = tar.getmembers()
        for m in members:
            if not (m.isfile() or m.isdir()) or m.name.startswith("/") or ".." in Path(m.name).parts:
                raise RunFailed(f"a worker's results hold {m.name!r}: not a file inside the run directory")
        tar.extractall(dest, members=members)


def executor(spec: str | None, jobs: int, concurrent_real_time: bool, batch: int | None = None):
    """The registry: ``local`` (default) or ``dask://...``/a scheduler file (one point a
    guest there)."""
    if not spec or spec == "local":
        return LocalExecutor(jobs, concurrent_real_time, batch)
    if spec.startswith("dask://") or spec.endswith(".json"):
        return DaskExecutor(spec)
    raise BadInput(f"--executor {spec!r}: expected local, dask://HOST:PORT or a Dask scheduler file (.json)")
