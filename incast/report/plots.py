"""Pictures: goodput vs senders for sweeps, queue occupancy over time for a run."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import tomllib

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from incast import scenario as scn  # noqa: E402
from incast.errors import ScenarioError  # noqa: E402
from incast.measure.results import ROW_FIELDS, complete_run  # noqa: E402


def plot_sweep_dir(sweep_dir: Path, grid: dict) -> Path | None:
    """goodput.png of a finished sweep directory (its table, its grid's axes)."""

    table = pd.read_parquet(Path(sweep_dir) / "sweep.parquet")
    if "goodput_mbps" not in table:
        return None
    meta = json.loads((Path(sweep_dir) / "sweep.json").read_text())
    first = scn.build(meta.get("base", {}), {**meta.get("overrides", {}),
                                             **{k: v[0] for k, v in grid.items()}})
    varied = {scn.DESCRIBE_PART.get(scn.resolve_field(n)) for n in grid} | {"senders"}
    return plot_sweep(table, Path(sweep_dir) / "goodput.png",
                      title=first.describe(omit=varied) + meta.get("auto_note", ""),
                      axes=[n.split(".")[-1] for n in grid])   # repeats become error bars


def plot_sweep(table: pd.DataFrame, out: Path, title: str = "", axes: list[str] | None = None) -> Path:
    """Goodput vs number of senders, one line per combination of the other grid axes
    (the style of SIGCOMM'09 Figure 1). `axes`: the grid's columns (default: every
    column that is not a summary field)."""
    ok = table[table["goodput_mbps"].notna()] if "goodput_mbps" in table else table.iloc[0:0]
    if axes is None:
        axes = [c for c in table.columns if c not in ROW_FIELDS]
    axes = [a for a in axes if a not in ("senders", "repeat")]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if not axes:
        groups = [((), ok)]
    elif len(axes) == 1:
        groups = ok.groupby(axes[0], dropna=False)
    else:
        groups = ok.groupby(axes, dropna=False)
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        label = ", ".join(f"{a}={_pretty(a, v, g)}" for a, v in zip(axes, key)) or "goodput"
        mean = g.groupby("senders")["goodput_mbps"].agg(["mean", "min", "max"]).sort_index()
        # Clipped at 0: the mean of equal runs can exceed them by a rounding (0.1 * 3 / 3).
        spread = [(mean["mean"] - mean["min"]).clip(lower=0), (mean["max"] - mean["mean"]).clip(lower=0)]
        line = ax.errorbar(mean.index, mean["mean"], yerr=spread, marker="o", capsize=3, label=label)
        bad = unfaithful_points(g)
        if len(bad):
            # Hollow: a point with a run the emulator could not keep faithful.
            color = line.lines[0].get_color()
            ax.plot(bad.index, mean.loc[bad.index, "mean"], "o", ms=9, mfc="white", mec=color, mew=1.5)
    bad_all = unfaithful_points(ok)
    if len(bad_all):
        reasons = sorted({r for rs in ok.loc[ok["fidelity_ok"] == False, "fidelity_reasons"]  # noqa: E712
                          for r in str(rs).split("; ") if r})
        why = reasons[0] + (f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else "")
        ax.plot([], [], "o", mfc="white", mec="black", label=f"hollow: not faithful: {why}"[:90])
    if len(ok):
        link = float(ok["link_mbps"].iloc[0])
        ax.axhline(link * 1448 / 1538, color="grey", ls=":", lw=1, label="payload limit")
        ax.set_ylim(0, link * 1.02)
    ax.set_xlabel("number of servers")
    ax.set_ylabel("goodput (Mbit/s)")
    # Wrapped: a title naming the rate and why it was chosen is longer than the axes.
    ax.set_title(textwrap.fill(title or "incast goodput", 80), fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def unfaithful_points(g: pd.DataFrame) -> pd.Series:
    """Per number of senders, whether any run there was not faithful (only those)."""
    if "fidelity_ok" not in g or not len(g):
        return pd.Series(dtype=bool)
    bad = g.groupby("senders")["fidelity_ok"].agg(lambda v: bool((v == False).any()))  # noqa: E712
    return bad[bad]


def _pretty(axis: str, value, group: pd.DataFrame) -> str:
    if axis == "rto_min" and "rto_floor_us" in group and str(value) == "min":
        floor = group["rto_floor_us"].dropna()
        if len(floor):
            return f"min (≥{floor.iloc[0] / 1000:g} ms)"
    return str(value)


def idle_gaps(enqueues_us: np.ndarray, blocks: pd.DataFrame, min_gap_us: float) -> list[tuple[float, float]]:
    """Spans inside blocks where nothing entered the bottleneck queue for min_gap_us:
    the servers are waiting for a retransmission timeout."""
    gaps = []
    for b in blocks.itertuples():
        t = enqueues_us[(enqueues_us >= b.start_us) & (enqueues_us <= b.end_us)]
        t = np.concatenate(([b.start_us], t, [b.end_us]))
        d = np.diff(t)
        for i in np.nonzero(d >= min_gap_us)[0]:
            gaps.append((float(t[i]), float(t[i + 1])))
    return gaps


def plot_queue(run_dir: Path, port: str | None = None, out: Path | None = None) -> Path:
    run_dir = Path(run_dir)
    tele_path = run_dir / "telemetry.parquet"
    if not tele_path.is_file():
        raise FileNotFoundError(f"{run_dir}: no telemetry.parquet (run with --telemetry)")
    summary = json.loads((run_dir / "summary.json").read_text())
    tele = pd.read_parquet(tele_path)
    blocks = pd.read_parquet(run_dir / "blocks.parquet")
    queues = pd.read_parquet(run_dir / "queues.parquet")
    port = port or summary["bottleneck_port"]
    if port not in set(tele["port"].astype(str)):
        known = ", ".join(sorted(set(tele["port"].astype(str))))
        raise ValueError(f"port {port!r} has no telemetry (ports: {known})")
    t = tele[(tele["port"] == port) & (tele["time_us"] >= 0)]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    ms = t["time_us"] / 1000
    occ = t[t["event"] != "drop"]
    for q, g in occ.groupby("queue"):
        ax.step(g["time_us"] / 1000, g["bytes"] / 1024, where="post", lw=0.7, label=f"queue {q}")
    limits = queues[queues["port"] == port].drop_duplicates("queue")
    for row in limits.itertuples():
        if row.limit_unit == "bytes":
            ax.axhline(row.limit / 1024, color="red", ls="--", lw=0.8,
                       label="buffer limit" if row.queue == limits["queue"].min() else None)
    drops = t[t["event"] == "drop"]
    if len(drops):
        top = max(occ["bytes"].max() if len(occ) else 0, limits["limit"].max()) / 1024
        ax.plot(drops["time_us"] / 1000, np.full(len(drops), top * 1.04), "rx", ms=4,
                label=f"drop ({len(drops)})")
    for end in blocks["end_us"] / 1000:
        ax.axvline(end, color="grey", lw=0.5, alpha=0.6)
    gap_us = max(1000.0, summary.get("rto_floor_us", 200000) / 4)
    enq = t.loc[t["event"] == "enqueue", "time_us"].to_numpy()
    for i, (a, b) in enumerate(idle_gaps(enq, blocks, gap_us)):
        ax.axvspan(a / 1000, b / 1000, color="orange", alpha=0.25,
                   label="idle: waiting for a timeout" if i == 0 else None)
    ax.set_xlim(0, float(blocks["end_us"].max()) / 1000 if len(blocks) else float(ms.max()))
    ax.set_xlabel("time since the first measured block (ms); grey lines: block ends")
    ax.set_ylabel("queue occupancy (KiB)")
    title = (f"{port}: {summary['senders']} senders at {summary['link_mbps']:g} Mbit/s, goodput "
             f"{summary['goodput_mbps']:.0f} Mbit/s, {summary['timeouts']} timeouts, {summary['drops']} drops")
    f = summary.get("fidelity")
    if f and not f["ok"]:
        title += "\nNOT FAITHFUL: " + "; ".join(f["reasons"])
    ax.set_title("\n".join(textwrap.fill(line, 90) for line in title.split("\n")), fontsize="medium", color="black" if not f or f["ok"] else "darkred")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(out) if out else run_dir / "queue.png"
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def cmd_telemetry(args) -> int:
    run_dir = complete_run(args.run_dir)
    try:
        out = plot_queue(run_dir, args.port, Path(args.out) if args.out else None)
    except (FileNotFoundError, ValueError) as e:
        raise ScenarioError(str(e)) from None
    print(out)
    return 0


def _scenario_name(run_dir: Path) -> str:
    try:
        return tomllib.loads((Path(run_dir) / "scenario.toml").read_text()).get("name", "")
    except (OSError, tomllib.TOMLDecodeError):
        return ""


def _labels(run_dirs: list[Path], labels: list[str] | None) -> list[str]:
    """One label per run: the given ones, else the directories' names."""
    labels = labels or [Path(d).name for d in run_dirs]
    if len(labels) != len(run_dirs):
        raise ValueError(f"{len(labels)} labels for {len(run_dirs)} runs")
    return labels


def _save(fig, out) -> Path:
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_compare(run_dirs: list[Path], fields: list[str], out: Path, labels: list[str] | None = None,
                 title: str | None = None) -> Path:
    """Bars of summary fields side by side for a few runs (e.g. the same scenario with
    no flow control, PAUSE and PFC: the incast's and an innocent flow's goodput). A
    field with a list value (background_mbps: one per flow) gives one bar per item."""
    labels = _labels(run_dirs, labels)
    summaries = [json.loads((complete_run(d) / "summary.json").read_text()) for d in run_dirs]

    def as_list(value):         # background_mbps is a list (one per flow), most fields are not
        return value if isinstance(value, list) else [value]

    series: dict[str, list] = {}
    for field in fields:
        if not any(field in s for s in summaries):
            raise ValueError(f"no run has the summary field {field!r}")
        values = [as_list(s.get(field)) for s in summaries]
        width = max(map(len, values))
        for i in range(width):
            series[field if width == 1 else f"{field}[{i}]"] = [v[i] if i < len(v) else None for v in values]
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(run_dirs) * max(1, len(series)) / 2, 3.6))
    x = np.arange(len(run_dirs))
    w = 0.8 / len(series)
    for k, (name, values) in enumerate(series.items()):
        vals = [np.nan if v is None else float(v) for v in values]
        bars = ax.bar(x + (k - (len(series) - 1) / 2) * w, vals, w, label=name)
        ax.bar_label(bars, fmt="%.0f", fontsize=8)
    unfaithful = [lab + " (not faithful)" if not s.get("fidelity", {}).get("ok", True) else lab
                  for lab, s in zip(labels, summaries)]
    ax.set_xticks(x, unfaithful)
    if all(name.split("[")[0].endswith("_mbps") for name in series):
        ax.set_ylabel("Mbit/s")
    ax.set_ylim(0, np.nanmax([float(v) for vs in series.values() for v in vs if v is not None] + [1]) * 1.2)
    ax.legend(fontsize=8, loc="upper left", ncols=len(series))
    title = title if title is not None else _scenario_name(run_dirs[0])
    ax.set_title("\n".join(textwrap.wrap(title, 70)), fontsize=9)
    return _save(fig, out)


def plot_block_times(run_dirs: list[Path], out: Path, labels: list[str] | None = None,
                     title: str | None = None) -> Path:
    """Each run's block durations against the time the block started, one panel per
    run: where the stalls are (a timeout's block stands out; a pause storm's window,
    from the summary's storm_start_us/storm_end_us, is shaded)."""
    labels = _labels(run_dirs, labels)
    runs = [complete_run(d) for d in run_dirs]
    fig, axes = plt.subplots(len(runs), 1, sharex=True, squeeze=False, figsize=(7, 1.2 + 1.5 * len(runs)))
    top = 0.0
    for ax, run, label in zip(axes[:, 0], runs, labels):
        summary = json.loads((run / "summary.json").read_text())
        if not (run / "blocks.parquet").is_file():
            raise ValueError(f"{run}: no blocks.parquet (a run of this testbed has one)")
        blocks = pd.read_parquet(run / "blocks.parquet")
        b = blocks[blocks["rep"] == blocks["rep"].min()]
        ax.bar(b["start_us"] / 1e3, b["duration_ms"], width=b["duration_ms"], align="edge",
               color="tab:blue", edgecolor="white", linewidth=0.3)
        if "storm_start_us" in summary:
            ax.axvspan(summary["storm_start_us"] / 1e3, summary["storm_end_us"] / 1e3, color="tab:red",
                       alpha=0.15, label="pause storm")
            ax.legend(fontsize=8, loc="upper right")
        longest = b["duration_ms"].max()
        top = max(top, longest)
        faithful = "" if summary.get("fidelity", {}).get("ok", True) else ", not faithful"
        ax.set_title(f"{label}: {summary.get('goodput_mbps', float('nan')):.1f} Mbit/s, "
                     f"longest block {longest:.1f} ms{faithful}", fontsize=9, loc="left")
        ax.set_ylabel("block (ms)")
    for ax in axes[:, 0]:
        ax.set_ylim(0, top * 1.15)
    axes[-1, 0].set_xlabel("time since the first measured block (ms)")
    title = title if title is not None else _scenario_name(run_dirs[0])
    if title:
        fig.suptitle("\n".join(textwrap.wrap(title, 90)), fontsize=10)
    return _save(fig, out)


def cmd_compare(args) -> int:
    try:
        if args.blocks:
            if args.field:
                raise ValueError("--blocks draws block times; it takes no --field")
            out = plot_block_times([Path(d) for d in args.run_dirs], Path(args.out), args.label or None, args.title)
        else:
            out = plot_compare([Path(d) for d in args.run_dirs], args.field or ["goodput_mbps"], Path(args.out),
                               args.label or None, args.title)
    except ValueError as e:
        raise ScenarioError(str(e)) from None
    print(out)
    return 0
