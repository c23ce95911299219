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
import sys
import time
import tomllib
from pathlib import Path

import pandas as pd

from . import scenario as scn
from .results import Claim


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


def flat_summary(summary: dict) -> dict:
    """A run's summary as one table row: the fidelity object becomes fidelity_* columns."""
    row = {k: v for k, v in summary.items() if k != "fidelity"}
    f = summary.get("fidelity") or {}
    row["fidelity_ok"] = f.get("ok")
    row["fidelity_reasons"] = "; ".join(f.get("reasons", []))
    for k in ("min_service_ratio", "cpu_busy", "cpu_busy_max", "timer_late_us_p99"):
        row[f"fidelity_{k}"] = f.get(k)
    return row


def _resolve_auto(points, resolve, say) -> tuple[list, str]:
    """Give every point whose link.rate is "auto" one rate: the one faithful for the
    largest number of senders among them, so the sweep's curves share an axis."""
    auto = [s for _, s in points if s.link.rate == "auto"]
    if not auto:
        return points, ""
    most = max(s.topology.senders for s in auto)
    rate = resolve(auto[0], lambda m: say(m) if m.startswith("warning:") else None, senders=most).link.rate
    say(f"link.rate auto: {rate / 1e6:g} Mbit/s (faithful on this machine up to {most} senders)")
    fixed = [(v, s if s.link.rate != "auto" else s.model_copy(
        update={"link": s.link.model_copy(update={"rate": rate})})) for v, s in points]
    return fixed, f" (auto rate, faithful here for {most} servers)"


def cmd_sweep(args) -> int:
    from tqdm import tqdm

    from .cli import scenario_from_args
    from .experiment import resolve_auto_rate, run
    from .plots import plot_sweep

    data, overrides = scenario_from_args(args)
    file_grid = None
    if args.scenario_file:
        file_grid = tomllib.loads(Path(args.scenario_file).read_text()).get("sweep")
    grid = parse_grid(args.grid, file_grid)
    points = expand(data, overrides, grid)
    repeats = args.repeat
    if repeats < 1:
        raise scn.ScenarioError("--repeat: at least 1")
    final = Path(args.out) if args.out else Path("results") / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    # An existing --out is refused (exit 2); a default name is made unique (two sweeps in the same second); --out is the user's.
    claim = Claim(final, unique=not args.out)
    final, work = claim.final, claim.path
    (work / "runs").mkdir()
    (work / "sweep.json").write_text(json.dumps({"grid": grid, "base": data, "overrides": overrides}, indent=2))
    points, auto_note = _resolve_auto(points, resolve_auto_rate, lambda m: print(m, file=sys.stderr))
    # Each repetition is a run of its own (a fresh network), with its own seed.
    points = [({**values, "repeat": r}, s if r == 0 else s.model_copy(
                  update={"workload": s.workload.model_copy(update={"seed": s.workload.seed + r})}))
              for values, s in points for r in range(repeats)]
    rows, failures = [], 0
    def log(message):   # warnings always; the rest with -v
        if args.verbose or message.startswith("warning:"):
            tqdm.write(message, file=sys.stderr)
    t_start = time.monotonic()
    bar = tqdm(points, unit="run", file=sys.stderr, disable=not sys.stderr.isatty() and not args.verbose)
    for i, (values, s) in enumerate(bar):
        bar.set_description(s.describe())
        run_dir = work / "runs" / f"{i:03d}-{_label(values)}"
        row = {k.split(".")[-1]: v for k, v in values.items()}
        row["senders"] = s.topology.senders   # the x axis, numeric even when a run fails
        try:
            outcome = run(s, run_dir, log=log)
            row.update(flat_summary(outcome.summary))
            row["run_dir"] = str(final / "runs" / run_dir.name)
            bar.set_postfix(goodput=f"{outcome.summary['goodput_mbps']:.0f}Mbps")
        except KeyboardInterrupt:
            raise
        except Exception as e:  # one bad point does not lose the others
            failures += 1
            row["error"] = str(e)
            log(f"run {i} failed: {e}")
        rows.append(row)
        pd.DataFrame(rows).to_parquet(work / "sweep.parquet", index=False)
    table = pd.DataFrame(rows)
    if "goodput_mbps" in table:
        varied = {scn.DESCRIBE_PART.get(scn.resolve_field(n)) for n in grid} | {"senders"}
        plot_sweep(table, work / "goodput.png", title=points[0][1].describe(omit=varied) + auto_note,
                   axes=[n.split(".")[-1] for n in grid])   # repeats become error bars
    claim.finalize()
    # Paths inside the table now point at the final location.
    elapsed = time.monotonic() - t_start
    print(f"{len(rows) - failures}/{len(rows)} runs in {elapsed:.0f} s -> {final}/sweep.parquet, {final}/goodput.png")
    return 1 if failures else 0
