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
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from . import scenario as scn
from .results import Claim, flat_summary


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
    rate = resolve(auto[0], say, senders=most).link.rate
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


def run_sweep(points, grid: dict, repeats: int, out: Path, unique: bool, meta: dict,
              log=lambda msg: None, progress=lambda points: points) -> SweepOutcome:
    """Run every (values, scenario) point `repeats` times into a sweep directory at out
    (unique: or out-2, ... if another sweep has it). progress wraps the list of runs
    (a tqdm bar, say). One failed run does not lose the others."""
    from .experiment import resolve_auto_rate
    from .plots import plot_sweep
    _repeated(points, repeats)          # a bad --repeat fails before anything is claimed
    claim = Claim(out, unique=unique)   # an existing out is refused (exit 2)
    final, work = claim.final, claim.path
    (work / "runs").mkdir()
    (work / "sweep.json").write_text(json.dumps({"grid": grid, **meta}, indent=2))
    points, auto_note = _resolve_auto(points, resolve_auto_rate, log)
    rows = []
    bar = progress(_repeated(points, repeats))
    for i, (values, s) in enumerate(bar):
        if hasattr(bar, "set_description"):
            bar.set_description(s.describe())
        rows.append(_run_point(i, values, s, work, final, log, bar))
        pd.DataFrame(rows).to_parquet(work / "sweep.parquet", index=False)
    table = pd.DataFrame(rows)
    if "goodput_mbps" in table:
        varied = {scn.DESCRIBE_PART.get(scn.resolve_field(n)) for n in grid} | {"senders"}
        plot_sweep(table, work / "goodput.png", title=points[0][1].describe(omit=varied) + auto_note,
                   axes=[n.split(".")[-1] for n in grid])   # repeats become error bars
    claim.finalize()
    return SweepOutcome(final, len(rows), sum("error" in r for r in rows))


def _run_point(i: int, values: dict, s, work: Path, final: Path, log, bar) -> dict:
    from .experiment import run
    run_dir = work / "runs" / f"{i:03d}-{_label(values)}"
    row = {k.split(".")[-1]: v for k, v in values.items()}
    row["senders"] = s.topology.senders   # the x axis, numeric even when a run fails
    try:
        outcome = run(s, run_dir, log=log)
        row.update(flat_summary(outcome.summary))
        row["run_dir"] = str(final / "runs" / run_dir.name)   # where it is once the sweep is done
        if hasattr(bar, "set_postfix"):
            bar.set_postfix(goodput=f"{outcome.summary['goodput_mbps']:.0f}Mbps")
    except KeyboardInterrupt:
        raise
    except Exception as e:  # one bad point does not lose the others
        row["error"] = str(e)
        log(f"run {i} failed: {e}")
    return row
