"""Where a sweep's points run: here, several at once (``local``), or on a Dask cluster
(``dask://HOST:PORT`` or a scheduler file). One small interface, one registry.

Every point runs as its own ``incast run SCENARIO.toml`` process: a point cannot
disturb another's Python state, Ctrl-C reaches every run's own teardown, and a
worker needs nothing but this package. An executor gets ``Task``s and yields each
``Done`` as it finishes, in whatever order they finish.

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
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from incast.errors import BadInput, RunFailed

WORKER_WAIT_S = 120     # for the cluster's first worker, before any point is submitted
from incast.measure.results import Claim, is_complete


@dataclass
class Task:
    index: int
    key: str
    label: str
    scenario_toml: str
    virtual: bool


@dataclass
class Done:
    task: Task
    ok: bool
    error: str | None
    host_seconds: float
    log: str                    # the run's stderr (relayed with -v)
    where: str                  # "local" or the Dask worker's address


def _incast_run(scenario_file: Path, out: Path, env_extra: dict | None = None) -> tuple[int, str, float]:
    env = dict(os.environ, **(env_extra or {}))
    t = time.monotonic()
    # -v: the run says what it does; kept for the sweep's own -v and for errors.
    # setpriv --pdeathsig: a run gets SIGTERM (its teardown) when the sweep that started it
    # dies, however it dies (SIGKILL included), instead of running on without it (setpriv,
    # not a preexec_fn as incast.vm.guest.set_pdeathsig: these runs start from threads).
    # Its messages go to a file, not a pipe, so a run whose sweep died can still write
    # them while it tears down; its JSON line is not read (the run directory is).
    with tempfile.TemporaryFile("w+") as stderr:
        r = subprocess.run(["setpriv", "--pdeathsig", "TERM", sys.executable, "-m", "incast", "run",
                            str(scenario_file), "--out", str(out), "--json", "-v"],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
        stderr.seek(0)
        return r.returncode, stderr.read(), time.monotonic() - t


def _error_line(returncode: int, stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("incast:")]
    return lines[-1][len("incast:"):].strip() if lines else f"exit status {returncode}"


class LocalExecutor:
    """Points as child processes of this one, `jobs` at a time."""
    name = "local"

    def __init__(self, jobs: int, concurrent_real_time: bool = False):
        self.jobs = jobs
        self.concurrent_real_time = concurrent_real_time

    def run(self, tasks: Iterable[Task], store) -> Iterator[Done]:
        tasks = list(tasks)
        if not tasks:
            return
        work = Path(tempfile.mkdtemp(prefix=".incast-points-", dir=store.root))
        env = {}
        if self.jobs > 1 and self.concurrent_real_time:
            env["INCAST_CONCURRENT_RUNS"] = str(self.jobs - 1)   # the runs' fidelity says so

        def one(task: Task) -> Done:
            f = work / f"{task.key}.toml"
            f.write_text(task.scenario_toml)
            out = store.scratch(task.key)
            rc, err, secs = _incast_run(f, out, env)
            ok = rc == 0 and is_complete(out)
            if ok:
                try:
                    store.install(task.key, out)
                except FileNotFoundError:
                    # another sweep starting (Store.remove_stale) installed it first
                    ok = store.get(task.key) is not None
            elif rc == 0 and not out.exists() and store.get(task.key) is not None:
                ok = True       # installed the same way before this sweep looked
            return Done(task, ok, None if ok else _error_line(rc, err), secs, err, "local")
        try:
            with ThreadPoolExecutor(max_workers=self.jobs) as pool:
                futures = [pool.submit(one, t) for t in tasks]
                for fut in as_completed(futures):
                    yield fut.result()
        finally:
            for f in work.glob("*.toml"):
                f.unlink()
            work.rmdir()


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
            from distributed import Client
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
        from distributed import as_completed as dask_completed
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


def executor(spec: str | None, jobs: int, concurrent_real_time: bool):
    """The registry: ``local`` (default) or ``dask://...``/a scheduler file."""
    if not spec or spec == "local":
        return LocalExecutor(jobs, concurrent_real_time)
    if spec.startswith("dask://") or spec.endswith(".json"):
        return DaskExecutor(spec)
    raise BadInput(f"--executor {spec!r}: expected local, dask://HOST:PORT or a Dask scheduler file (.json)")
