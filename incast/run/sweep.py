"""Sweeps: a grid of scenarios, one run each, gathered into one table and one plot.

``incast sweep base.toml --grid senders=1,2,4,8 --grid rto_min=200ms,min`` runs the
cross product. A sweep file may carry its grid itself::

    [sweep]
    senders = [1, 2, 4, 8, 16, 32]
    rto_min = ["200ms", "min"]

The sweep directory holds ``runs/<nnn>-<label>/`` (ordinary run directories),
``sweep.parquet`` (one row per run: the grid values, then the run's summary; rewritten
after every run, so an interrupted sweep keeps what it measured) and ``goodput.png``.
Like a run, it is written under ``.<name>.incomplete`` and renamed when done.

Every point is measured once: it is kept in the point store under its key (the
resolved scenario, the code's version, the kernel; incast.run.points) and a sweep
that meets it again, or a resumed one, takes it from there (``fresh=True`` measures
again). Points run as child processes, several at once where they are in virtual time
(incast.run.executors), or on a Dask cluster.
"""
from __future__ import annotations

import itertools
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from incast import scenario as scn
from incast.clock import named
from incast.measure.calibration import resolve_auto_rate
from incast.measure.results import Claim, flat_summary
from incast.run import executors
from incast.run import points as pts
from incast.run.in_guest import guest_key


def parse_grid(items: list[str], file_grid: dict | None = None) -> dict[str, list]:
    grid: dict[str, list] = {}
    for name, values in (file_grid or {}).items():
        if not isinstance(values, list) or not values:
            raise scn.ScenarioError(f"[sweep] {name}: expected a non-empty list of values")
        grid[name] = [str(v) if not isinstance(v, list) else "[" + ",".join(map(str, v)) + "]" for v in values]
    for item in items:
        if "=" not in item:
            raise scn.ScenarioError(f"--grid {item!r}: expected FIELD=V1,V2,...")
        name, values = item.split("=", 1)
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if not vals:
            raise scn.ScenarioError(f"--grid {name}: no values")
        grid[name.strip()] = vals
    if not grid:
        raise scn.ScenarioError("sweep: give at least one --grid FIELD=V1,V2,... (or a [sweep] table)")
    for name in grid:
        scn.resolve_field(name)   # unknown fields fail before anything runs
    return grid


def expand(data: dict, overrides: dict, grid: dict[str, list]) -> list[tuple[dict, scn.Scenario]]:
    """Every grid point as (its values, its validated scenario); all validated up front."""
    names = list(grid)
    points = []
    for combo in itertools.product(*(grid[n] for n in names)):
        values = dict(zip(names, combo))
        try:
            s = scn.build(data, {**overrides, **values})
        except scn.ScenarioError as e:
            point = ", ".join(f"{k}={v}" for k, v in values.items())
            raise scn.ScenarioError(f"sweep point {point}: {e}") from None
        points.append((values, s))
    return points


def _label(values: dict) -> str:
    text = "-".join(f"{k.split('.')[-1]}{v}" for k, v in values.items())
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)[:80]


def _resolve_auto(points, resolve, say) -> tuple[list, str]:
    """Give every point whose link.rate is "auto" one rate: the one faithful for the
    largest number of senders among them, so the sweep's curves share an axis."""
    auto = [s for _, s in points if s.link.rate == "auto"]
    if not auto:
        return points, ""
    most = max(s.topology.senders for s in auto)
    rate = resolve(auto[0], senders=most).link.rate
    say(f"link.rate auto: {rate / 1e6:g} Mbit/s (faithful on this machine up to {most} senders)")
    fixed = [(v, s if s.link.rate != "auto" else s.model_copy(
        update={"link": s.link.model_copy(update={"rate": rate})})) for v, s in points]
    return fixed, f" (auto rate, faithful here for {most} servers)"


def _repeated(points, repeats: int) -> list:
    """Each repetition is a run of its own (a fresh network), with its own seed."""
    if repeats < 1:
        raise scn.ScenarioError("--repeat: at least 1")
    return [({**values, "repeat": r}, s if r == 0 else s.model_copy(
                update={"workload": s.workload.model_copy(update={"seed": s.workload.seed + r})}))
            for values, s in points for r in range(repeats)]


@dataclass
class SweepOutcome:
    final: Path
    runs: int
    failures: int
    reused: int = 0


def default_jobs(points) -> int:
    """One point per core where every point is in virtual time (runs there cannot
    disturb each other's results); one at a time otherwise."""
    if points and all(not named(s.clock).cpu_can_saturate for _, s in points):
        return max(1, len(os.sched_getaffinity(0)))
    return 1


def check_jobs(points, jobs: int, force: bool) -> None:
    real = sum(named(s.clock).cpu_can_saturate for _, s in points)
    if jobs < 1:
        raise scn.ScenarioError("--jobs: at least 1")
    if jobs > 1 and real and not force:
        raise scn.ScenarioError(
            f"--jobs {jobs}: {real} point(s) run in real time, where runs side by side share the CPUs and "
            "timers that set their results; add --force-jobs to run them together anyway (each run's "
            "fidelity then records how many ran beside it)")


def run_sweep(points, grid: dict, repeats: int, out: Path, unique: bool, meta: dict,
              log=lambda msg: None, progress=lambda runs: runs, jobs: int | None = None,
              executor: str | None = None, force_jobs: bool = False, fresh: bool = False,
              store=None, batch: int | None = None) -> SweepOutcome:
    """Run every (values, scenario) point `repeats` times into a sweep directory at out
    (unique: or out-2, ... if another sweep has it). progress wraps the list of runs
    and is moved as each finishes (a tqdm bar, say). One failed run does not lose the
    others; a point already in the store is not measured again (fresh: it is). batch:
    points a guest runs at most (incast.run.executors.BATCH_MAX)."""
    runs = _repeated(points, repeats)   # a bad --repeat fails before anything is claimed
    jobs = jobs or default_jobs(runs)
    check_jobs(runs, jobs, force_jobs)
    ex = executors.executor(executor, jobs, force_jobs, batch)
    store = store or pts.Store()
    store.remove_stale()
    claim = Claim(out, unique=unique)   # an existing out is refused (exit 2)
    final, work = claim.final, claim.path
    (work / "runs").mkdir()
    (work / "sweep.json").write_text(json.dumps({"grid": grid, "repeat": repeats, **meta}, indent=2))
    runs, auto_note = _resolve_auto(runs, resolve_auto_rate, log)
    if auto_note:       # the plot's title says which rate "auto" became
        (work / "sweep.json").write_text(json.dumps({"grid": grid, "repeat": repeats, **meta,
                                                     "auto_note": auto_note}, indent=2))
    rows: dict[int, dict] = {}
    tasks = []
    bar = progress(runs)
    for i, (values, s) in enumerate(runs):
        key = pts.point_key(s)
        if not fresh and store.get(key) is not None:
            rows[i] = _row(i, values, s, key, store, work, final, reused=True)
            _advance(bar, rows[i])
        else:
            tasks.append(executors.Task(i, key, f"{i:03d}-{_label(values)}", scn.to_toml(s),
                                        not named(s.clock).cpu_can_saturate, guest_key(s)))
    reused = len(rows)
    if reused:
        log(f"{reused} of {len(runs)} runs already measured (point store {store.root}); "
            f"{len(tasks)} to run")
    _write_table(rows, work)
    for done in ex.run(tasks, store):
        i = done.task.index
        values, s = runs[i]
        if done.ok:
            rows[i] = _row(i, values, s, done.task.key, store, work, final, reused=False)
            rows[i]["point_host_s"] = round(done.host_seconds, 2)
            if executor and executor != "local":
                rows[i]["worker"] = done.where
        else:
            rows[i] = {**_values_row(values, s), "point_key": done.task.key, "error": done.error}
            log(f"run {i} failed: {done.error}")
        for line in done.log.splitlines():
            if line and not line.startswith("{"):
                log(f"run {i}: {line}" if not line.startswith("warning:") else line)
        _advance(bar, rows[i])
        _write_table(rows, work)
    if hasattr(bar, "close"):
        bar.close()
    table = _write_table(rows, work)
    claim.finalize()
    return SweepOutcome(final, len(table), int(table["error"].notna().sum()) if "error" in table else 0, reused)


def _values_row(values: dict, s) -> dict:
    row = {k.split(".")[-1]: v for k, v in values.items()}
    row["senders"] = s.topology.senders   # the x axis, numeric even when a run fails
    return row


def _row(i: int, values: dict, s, key: str, store, work: Path, final: Path, reused: bool) -> dict:
    name = f"{i:03d}-{_label(values)}"
    store.copy_into(key, work / "runs" / name)
    summary = json.loads((work / "runs" / name / "summary.json").read_text())
    row = _values_row(values, s)
    row.update(flat_summary(summary))
    row["run_dir"] = str(final / "runs" / name)   # where it is once the sweep is done
    row["point_key"], row["reused"] = key, reused
    return row


def _advance(bar, row: dict) -> None:
    if hasattr(bar, "update"):
        if "goodput_mbps" in row and hasattr(bar, "set_postfix"):
            bar.set_postfix(goodput=f"{row['goodput_mbps']:.0f}Mbps")
        bar.update(1)


def _write_table(rows: dict, work: Path) -> pd.DataFrame:
    """sweep.parquet in grid order, rewritten after every run (atomically: a reader or a
    kill never sees half a table)."""
    table = pd.DataFrame([rows[i] for i in sorted(rows)])
    tmp = work / ".sweep.parquet.tmp"
    table.to_parquet(tmp, index=False)
    tmp.replace(work / "sweep.parquet")
    return table


def resume_args(out: Path) -> dict:
    """What an interrupted sweep at out was started with (its sweep.json), so that
    ``--resume --out OUT`` continues it without repeating its arguments."""
    work = Path(out).parent / f".{Path(out).name}.incomplete"
    try:
        return json.loads((work / "sweep.json").read_text())
    except (OSError, ValueError):
        raise scn.ScenarioError(f"--resume: no interrupted sweep at {out} (no {work}/sweep.json)") from None


class _Lines:
    """A stream for tqdm where no terminal redraws a line: each refresh a line of its own."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        text = text.replace("\r", "").strip()
        if text:
            self.stream.write(text + "\n")

    def flush(self) -> None:
        self.stream.flush()


def runs_bar(runs, stream=None, every_s: float = 30.0):
    """A progress bar over a sweep's runs: redrawn in place on a terminal; elsewhere (a
    log file, CI) a line at most every `every_s` seconds, so an hour-long figure says
    how far it is."""
    stream = stream or sys.stderr
    if stream.isatty():
        return tqdm(total=len(runs), unit="run", file=stream)
    return tqdm(total=len(runs), unit="run", file=_Lines(stream), mininterval=every_s, ascii=True,
                dynamic_ncols=False, ncols=100)
