"""An ablation of a figure: its full setting (its paper's testbed and its own settings),
its grid narrowed to some points, one or more settings changed on top, every point run
`--repeat` times, each its own seed. It prints each point's median [min-max] goodput and
timeouts a run beside the figure's kept result at the same points, made with the same
code or not (it says which): how the divergences' "one setting changed" are made.

    python -m incast.campaign.ablation sigcomm09-fig1 --at senders=47 --at rto_min=200us \\
        --set switch.buffer=128KiB --out results/fig1-buffer128

Points already in the point store are not run again, so the kept result's own runs are
the unchanged setting's (`--set` nothing). Writes the sweep (sweep.parquet, sweep.json
with the figure, the narrowed grid and the changed settings) to --out.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from incast.campaign import figure, kept, make
from incast.errors import BadInput, ScenarioError
from incast.run import sweep


class AblationError(BadInput):
    """Bad input (exit 2), as the CLI reports scenario errors."""


def pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        field, sep, value = item.partition("=")
        if not sep or not field or not value:
            raise AblationError(f"{what} {item!r}: give FIELD=VALUE")
        out[field] = value
    return out


def narrowed(grid: dict[str, list[str]], at: dict[str, str]) -> dict[str, list[str]]:
    """The figure's grid with each --at field's values replaced (comma-separated);
    a field the grid does not have is refused, naming those it has."""
    out = dict(grid)
    for field, values in at.items():
        if field not in grid:
            raise AblationError(f"--at {field}: the figure's grid has {', '.join(grid)}")
        out[field] = [v.strip() for v in values.split(",") if v.strip()]
    return out


def kept_table(name: str) -> pd.DataFrame | None:
    path = kept.KEPT_FIGURES_DIR / name / "sweep.parquet"
    return pd.read_parquet(path) if path.is_file() else None


def summarize(table: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per point: runs, goodput median [min-max], timeouts a run (min-max)."""
    g = table.groupby([figure.col(k) for k in keys], observed=True)
    return pd.DataFrame({
        "runs": g.size(),
        "goodput_median": g["goodput_mbps"].median().round(1),
        "goodput_min": g["goodput_mbps"].min().round(1),
        "goodput_max": g["goodput_mbps"].max().round(1),
        "timeouts_min": g["timeouts"].min(),
        "timeouts_max": g["timeouts"].max(),
        "faithful": g["fidelity_ok"].sum() if "fidelity_ok" in table else g.size(),
    })


def lines(ablated: pd.DataFrame, kept_runs: pd.DataFrame | None, keys: list[str], same_code: bool) -> list[str]:
    out = []
    for point, r in summarize(ablated, keys).iterrows():
        point = point if isinstance(point, tuple) else (point,)
        where = " ".join(f"{k}={v}" for k, v in zip(keys, point))
        line = (f"{where}: {r.goodput_median:.1f} [{r.goodput_min:.1f}-{r.goodput_max:.1f}] Mbit/s, "
                f"n={r.runs:.0f} ({r.faithful:.0f} faithful), timeouts {r.timeouts_min:.0f}-{r.timeouts_max:.0f} a run")
        if kept_runs is not None:
            k = kept_runs
            for key, v in zip(keys, point):
                k = k[k[figure.col(key)].astype(str) == str(v)]
            if len(k):
                g = k["goodput_mbps"]
                line += (f"; kept result {g.median():.1f} [{g.min():.1f}-{g.max():.1f}], n={len(k)}"
                         f"{'' if same_code else ' (earlier code)'}")
        out.append(line)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m incast.campaign.ablation",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("figure", help="a figure (incast figure list)")
    ap.add_argument("--at", action="append", default=[], metavar="FIELD=V1,V2",
                    help="narrow a grid field to these values (repeatable)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="a setting changed on top of the figure's (repeatable)")
    ap.add_argument("--repeat", type=int, default=6, help="runs a point, each its own seed (default 6)")
    ap.add_argument("--jobs", type=int, default=None, help="points at once (default: one per core)")
    ap.add_argument("--out", required=True, help="directory to create")
    a = ap.parse_args(argv)
    try:
        fig = figure.load(a.figure)
        data, overrides, grid, _ = figure.plan(fig, False)
        grid = narrowed(grid, pairs(a.at, "--at"))
        changed = pairs(a.set, "--set")
        points = sweep.expand(data, {**overrides, **changed}, sweep.parse_grid([], grid))
    except (BadInput, ScenarioError) as e:
        print(f"incast ablation: {e}", file=sys.stderr)
        return 2
    result = sweep.run_sweep(points, grid, a.repeat, Path(a.out), unique=False,
                             meta={"ablation_of": fig.name, "changed": changed, "base_overrides": overrides,
                                   **make.provenance(),
                                   "command": " ".join(["python -m incast.campaign.ablation", *sys.argv[1:]])},
                             progress=sweep.runs_bar, jobs=a.jobs, log=lambda m: print(m, file=sys.stderr))
    ablated = pd.read_parquet(result.final / "sweep.parquet")
    kept_runs = kept_table(fig.name)
    same = False
    if kept_runs is not None:
        meta = json.loads((kept.KEPT_FIGURES_DIR / fig.name / "sweep.json").read_text())
        planes = sorted(set(kept_runs["dataplane"].dropna())) if "dataplane" in kept_runs else ["linux"]
        same = not kept.stale_code(meta, planes)
    changes = ", ".join(f"{k}={v}" for k, v in changed.items()) or "nothing changed"
    print(f"{fig.name} with {changes} ({result.reused} of {result.runs} runs from the point store):")
    for line in lines(ablated, kept_runs, list(grid), same):
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
