"""`incast report RUN_DIR|SWEEP_DIR`: an interactive HTML page of a run or a sweep.

Each page is one self-contained file: plotly.js is inlined, so it opens offline from
disk and fetches nothing.

A run's page (default ``RUN_DIR/report.html``) shows

- the fidelity verdict first: ok or not, the reasons, the numbers, each link's service;
- the summary's numbers;
- the occupancy of every switch port's class queues over the whole run, warm-up
  included (telemetry.parquet), with drops and the retransmission timeouts marked;
  zoom with the mouse down to single packets (hover gives the time to the µs);
- each measured block's duration with its timeouts and their causes: from
  timeouts.parquet where ``incast explain`` wrote it, else computed from ``capture/``
  for the page only (nothing is written), else a note saying how to get them;
- drops, ECN marks and PAUSE/PFC activity (queues.parquet, the telemetry's drop
  events, the summary's flow-control fields, pause_ports.parquet);
- the scenario that ran (scenario.toml) and the environment.

**Large traces.** A queue trace of at most ``MAX_POINTS`` events is drawn whole. A
longer one is reduced to an envelope: its time span is cut into ``MAX_POINTS // 2``
equal bins and each bin keeps two real events, its lowest and its highest occupancy
(with their own times), in time order. So a peak, however short (one packet), is
drawn at its full height and at its time, and so is every moment the queue emptied;
what a reduced trace loses is the order of events inside one bin (the page names each
reduced trace, how many events it had and the bin width). The parquet table keeps
every event.

A sweep's page (default ``SWEEP_DIR/report.html``) draws goodput against the number of
senders, one line (the mean) per combination of the other grid axes, grouped as
``plots.plot_sweep`` groups them, and one marker per run: hollow where the run was not
faithful. Hovering names the run; clicking opens its own page, which is written too
(``runs/NNN-.../report.html``, linked relatively, so the sweep directory can move); a
table below links every run.
"""
from __future__ import annotations

import json
import os
import re
import tomllib
import urllib.parse
from dataclasses import dataclass
from html import escape
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.offline import get_plotlyjs

from incast import scenario as scn
from incast.errors import BadInput, OutputUnusable
from incast.measure.capture import CAPTURE_DIR
from incast.report import explain
from incast.report.explain import CAUSES, COLORS

REPORT = "report.html"
MAX_POINTS = 20_000         # per trace: above this a trace is drawn as its envelope
MAX_SHADED_BLOCKS = 300     # more block spans than this would slow the page, not inform
MAX_TIMEOUT_ROWS = 500      # the table of timeouts; the graph has them all
# TCP payload of a full frame over its bytes on the wire (as plots.plot_sweep draws it).
PAYLOAD_SHARE = 1448 / 1538
# Summary fields about flow control (PAUSE, PFC, the watchdog, a pause storm).
FLOW_CONTROL_WORDS = ("pause", "xon", "xoff", "watchdog", "storm", "held", "mac_control")
SUMMARY_ROWS = [
    ("goodput_mbps", "goodput (Mbit/s)"), ("link_mbps", "link rate (Mbit/s)"),
    ("link_rate_auto", "link rate chosen by calibration"), ("senders", "senders"),
    ("blocks", "measured blocks"), ("repetitions", "repetitions"),
    ("block_ms_p50", "block p50 (ms)"), ("block_ms_p99", "block p99 (ms)"), ("block_ms_max", "block max (ms)"),
    ("timeouts", "retransmission timeouts (kernel counters, all hosts)"),
    ("retransmits", "retransmitted segments"), ("drops", "switch drops (all queues, measured blocks)"),
    ("bottleneck_drops", "drops at the bottleneck port"), ("bottleneck_port", "bottleneck port"),
    ("ecn_marks", "ECN marks"), ("max_queue_bytes", "largest class queue (bytes, telemetry)"),
    ("telemetry_records", "telemetry records"), ("telemetry_lost", "telemetry records lost"),
    ("backlog_drops", "drops at full CPU input backlogs (outside the switch)"),
    ("capture_dropped", "packets the capture lost"), ("background_mbps", "background flows (Mbit/s)"),
    ("cc", "congestion control"), ("rto_min_us", "RTOmin (µs)"), ("rto_floor_us", "effective RTO floor (µs)"),
    ("dataplane", "data plane"), ("build_s", "network build (s)"),
]
# matplotlib's tab10, so that plotly's colours name the same causes as explain.png's.
TAB10 = {"tab:blue": "#1f77b4", "tab:orange": "#ff7f0e", "tab:green": "#2ca02c", "tab:red": "#d62728",
         "tab:purple": "#9467bd", "tab:brown": "#8c564b", "tab:pink": "#e377c2", "tab:gray": "#7f7f7f",
         "tab:olive": "#bcbd22", "tab:cyan": "#17becf"}
STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; margin-bottom: .2em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
.sub { color: #555; margin-top: 0; }
.verdict { border-radius: 6px; padding: .8em 1.2em; margin: 1em 0; border: 2px solid; }
.verdict.ok { background: #e9f7ec; border-color: #2ca02c; }
.verdict.bad { background: #fdecea; border-color: #d62728; }
.verdict.unknown { background: #f3f3f3; border-color: #999; }
.verdict .word { font-size: 1.4em; font-weight: bold; }
table { border-collapse: collapse; font-size: .9em; margin: .5em 0; }
td, th { border: 1px solid #ddd; padding: .2em .6em; text-align: right; white-space: nowrap; }
th { background: #f5f5f5; } td.k, th.k { text-align: left; }
pre { background: #f7f7f7; padding: .8em; overflow-x: auto; font-size: .85em; }
.note { color: #555; font-size: .9em; }
"""


# --- what a directory is ------------------------------------------------------------

def directory_kind(path: Path) -> str:
    """"run" or "sweep", else BadInput naming what is missing."""
    path = Path(path)
    if (path / "sweep.parquet").is_file() and (path / "runs").is_dir():
        return "sweep"
    if (path / "summary.json").is_file():
        return "run"
    if not path.is_dir():
        raise BadInput(f"{path}: no such directory (expected a run or a sweep directory)")
    raise BadInput(f"{path}: neither a complete run directory (no summary.json) "
                   "nor a sweep directory (no sweep.parquet and runs/)")


# --- reducing a trace for display ---------------------------------------------------

@dataclass
class Trace:
    """Points to draw: times (µs) and values, and how they were reduced."""
    t_us: np.ndarray
    values: np.ndarray
    events: int                 # points before any reduction
    bin_us: float | None        # the envelope's bin width; None: drawn whole

    @property
    def reduced(self) -> bool:
        return self.bin_us is not None


def envelope(t_us, values, max_points: int = MAX_POINTS) -> Trace:
    """The trace whole if it has at most max_points points; else, per each of
    max_points // 2 equal time bins, its lowest and its highest point (real points,
    in time order), so no peak and no empty queue is hidden."""
    t_us = np.asarray(t_us, dtype=float)
    values = np.asarray(values)
    order = np.argsort(t_us, kind="stable")
    t_us, values = t_us[order], values[order]
    n = len(t_us)
    if n <= max_points:
        return Trace(t_us, values, n, None)
    bins = max(1, max_points // 2)
    width = (t_us[-1] - t_us[0]) / bins
    if width > 0:
        in_bin = np.minimum(((t_us - t_us[0]) / width).astype(np.int64), bins - 1)
    else:
        in_bin = np.zeros(n, dtype=np.int64)
    by_value = np.lexsort((values, in_bin))       # bin by bin, lowest value first (stable)
    sorted_bins = in_bin[by_value]
    firsts = np.flatnonzero(np.r_[True, sorted_bins[1:] != sorted_bins[:-1]])
    lasts = np.r_[firsts[1:], n] - 1
    keep = np.unique(np.r_[by_value[firsts], by_value[lasts]])   # sorted: time order
    return Trace(t_us[keep], values[keep], n, float(width))


# --- small helpers ------------------------------------------------------------------

def _plotly():
    return go, get_plotlyjs


def _natural(text: str) -> list:
    """Sort key that puts s1-eth2 before s1-eth10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", str(text))]


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "—"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}"
    if isinstance(value, (float, np.floating)):
        return f"{float(value):,.6g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def _key_value_table(rows: list[tuple[str, object]]) -> str:
    body = "".join(f"<tr><td class=k>{escape(k)}</td><td>{escape(_fmt(v))}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _frame_table(df: pd.DataFrame) -> str:
    return df.to_html(index=False, escape=True, na_rep="—", border=0,
                      float_format=lambda x: f"{x:,.6g}")


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _read_table(path: Path) -> pd.DataFrame | None:
    return pd.read_parquet(path) if path.is_file() else None


def _describe(scenario_toml: Path) -> str:
    """The scenario's one-line description, or "" where it no longer builds."""
    try:
        return scn.build(tomllib.loads(scenario_toml.read_text())).describe()
    except (OSError, ValueError, tomllib.TOMLDecodeError):
        return ""


def _figure_html(fig, div_id: str, post_script: str | None = None) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, post_script=post_script,
                       config={"displaylogo": False, "responsive": True, "scrollZoom": False})


def _page(title: str, body: str) -> str:
    _, get_plotlyjs = _plotly()
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{STYLE}</style>"
            # Inlined, not linked: the page must work offline and from any directory.
            f"<script type=\"text/javascript\">{get_plotlyjs()}</script>"
            f"</head><body>\n{body}\n</body></html>\n")


def _write(out: Path, text: str) -> Path:
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as e:
        raise OutputUnusable(f"{out}: cannot write: {e.strerror}") from None
    return out


# --- a run: fidelity ----------------------------------------------------------------

def fidelity_section(summary: dict, links: pd.DataFrame | None) -> str:
    f = summary.get("fidelity")
    if not f:
        verdict = ("unknown", "Fidelity not judged", "this run's summary has no fidelity verdict")
    elif f.get("ok"):
        verdict = ("ok", "Faithful", "the emulator, not the machine, set these results")
    else:
        verdict = ("bad", "NOT FAITHFUL", "; ".join(f.get("reasons", [])))
    css, word, why = verdict
    numbers = [(k, v) for k, v in (f or {}).items() if k not in ("ok", "reasons")]
    out = [f"<section id=\"fidelity\" class=\"verdict {css}\"><div class=word>{escape(word)}</div>",
           f"<div class=why>{escape(why)}</div>"]
    if numbers:
        out.append(f"<details><summary>the numbers</summary>{_key_value_table(numbers)}</details>")
    if links is not None and len(links):
        out.append("<details><summary>each link's service while backlogged (links.parquet)</summary>"
                   f"{_frame_table(links)}</details>")
    out.append("</section>")
    return "".join(out)


def summary_section(summary: dict) -> str:
    rows = [(label, summary[k]) for k, label in SUMMARY_ROWS if k in summary and summary[k] is not None]
    notes = "".join(f"<p class=note>{escape(n)}</p>" for n in summary.get("telemetry_notes", []))
    return f"<section id=\"summary\"><h2>Summary</h2>{_key_value_table(rows)}{notes}</section>"


# --- a run: queue occupancy ---------------------------------------------------------

@dataclass
class QueueTrace:
    switch: str
    port: str
    queue: int
    peer: str
    occupancy: Trace            # class queue bytes after each enqueue and dequeue
    drops: Trace                # the class queue's bytes at each drop

    @property
    def name(self) -> str:
        toward = f" → {self.peer}" if self.peer else ""
        return f"{self.port} q{self.queue}{toward}"


def queue_traces(tele: pd.DataFrame, queues: pd.DataFrame | None, max_points: int) -> list[QueueTrace]:
    """One per switch port and class queue, ports in natural order."""
    peers = {}
    if queues is not None and "peer" in queues:
        peers = dict(zip(queues["port"].astype(str), queues["peer"].astype(str)))
    out = []
    tele = tele.assign(switch=tele["switch"].astype(str), port=tele["port"].astype(str),
                       event=tele["event"].astype(str))
    for (switch, port, queue), g in tele.groupby(["switch", "port", "queue"], sort=False):
        occ, drops = g[g["event"] != "drop"], g[g["event"] == "drop"]
        out.append(QueueTrace(switch, port, int(queue), peers.get(port, ""),
                              envelope(occ["time_us"], occ["bytes"], max_points),
                              envelope(drops["time_us"], drops["bytes"], max_points)))
    return sorted(out, key=lambda q: (_natural(q.switch), _natural(q.port), q.queue))


def queue_figure(traces: list[QueueTrace], summary: dict, blocks: pd.DataFrame,
                 queues: pd.DataFrame | None, timeouts: pd.DataFrame | None):
    go, _ = _plotly()
    fig = go.Figure()
    # Shown at first: the bottleneck and any port that dropped; the rest one click away.
    shown = {summary.get("bottleneck_port")} | {q.port for q in traces if q.drops.events}
    for q in traces:
        visible = True if q.port in shown else "legendonly"
        meta = {"switch": q.switch, "port": q.port, "queue": q.queue, "events": q.occupancy.events,
                "bin_us": q.occupancy.bin_us}
        fig.add_trace(go.Scatter(
            x=q.occupancy.t_us / 1000, y=q.occupancy.values, mode="lines", line_shape="hv", line_width=1,
            name=q.name + (" (envelope)" if q.occupancy.reduced else ""), legendgroup=q.name,
            visible=visible, meta=meta,
            hovertemplate="%{x:.3f} ms<br>%{y} bytes<extra>" + escape(q.name) + "</extra>"))
        if q.drops.events:
            fig.add_trace(go.Scatter(
                x=q.drops.t_us / 1000, y=q.drops.values, mode="markers", name=f"{q.name}: drops",
                legendgroup=q.name, visible=visible, marker=dict(symbol="x", size=6, color="#d62728"),
                meta={**meta, "events": q.drops.events, "bin_us": q.drops.bin_us, "drops": True},
                hovertemplate="drop at %{x:.3f} ms<br>queue %{y} bytes<extra>" + escape(q.name) + "</extra>"))
    if timeouts is not None and len(timeouts):
        fig.add_trace(go.Scatter(
            x=timeouts["time_us"] / 1000, y=np.zeros(len(timeouts)), mode="markers",
            name=f"timeouts ({len(timeouts)})", marker=dict(symbol="triangle-up", size=10, color="black"),
            text=[_timeout_text(t) for t in timeouts.itertuples()], meta={"timeouts": True},
            hovertemplate="%{x:.3f} ms: %{text}<extra>timeout</extra>"))
    _shade_run(fig, summary, blocks, traces)
    _limit_lines(fig, queues, {q.port for q in traces if q.port in shown})
    fig.update_layout(template="plotly_white", height=560, hovermode="closest", dragmode="zoom",
                      xaxis_title="time since the first measured block (ms; warm-up is negative)",
                      yaxis_title="class queue occupancy (bytes)", legend_title_text="port, class queue",
                      margin=dict(t=30))
    return fig


def _timeout_text(t) -> str:
    where = f"rep {t.rep} block {t.block}" if t.block >= 0 else "outside the measured blocks"
    decided = ", decided the block" if getattr(t, "decided_block", False) else ""
    return (f"{t.server}: {str(t.cause).replace('_', ' ')} (DART {t.dart}, waited {t.wait_us / 1000:.1f} ms)"
            f", {where}{decided}")


def _shade_run(fig, summary: dict, blocks: pd.DataFrame, traces: list[QueueTrace]) -> None:
    """Warm-up, the measured blocks (alternate shades) and a pause storm's window."""
    starts = [q.occupancy.t_us[0] for q in traces if q.occupancy.events]
    if starts and min(starts) < 0:
        fig.add_vrect(x0=min(starts) / 1000, x1=0, fillcolor="#999", opacity=0.08, line_width=0,
                      annotation_text="warm-up", annotation_position="top left")
    if len(blocks) <= MAX_SHADED_BLOCKS:
        for i, b in enumerate(blocks.itertuples()):
            fig.add_vrect(x0=b.start_us / 1000, x1=b.end_us / 1000, line_width=0,
                          fillcolor="#1f77b4" if i % 2 == 0 else "#17becf", opacity=0.06)
    if "storm_start_us" in summary and "storm_end_us" in summary:
        fig.add_vrect(x0=summary["storm_start_us"] / 1000, x1=summary["storm_end_us"] / 1000,
                      fillcolor="#d62728", opacity=0.12, line_width=0, annotation_text="pause storm")


def _limit_lines(fig, queues: pd.DataFrame | None, ports: set[str]) -> None:
    """The buffer's byte limit of the queues shown at first, one dashed line per value."""
    if queues is None or "limit" not in queues:
        return
    q = queues[queues["port"].astype(str).isin(ports) & (queues.get("limit_unit") == "bytes")]
    for limit in sorted(set(q["limit"].astype(int))):
        fig.add_hline(y=limit, line_dash="dash", line_color="#d62728", line_width=1,
                      annotation_text=f"buffer limit {limit:,} B", annotation_position="top right")


def reduction_note(traces: list[QueueTrace], max_points: int) -> str:
    reduced = [q for q in traces if q.occupancy.reduced]
    how = (f"Traces of up to {max_points:,} events are drawn whole: zoom (drag a box, double-click to "
           "reset) down to single packets; hover gives each event's time to the µs. ")
    if not reduced:
        return f"<p class=note>{escape(how)}Every trace here is drawn whole.</p>"
    items = "".join(f"<li>{escape(q.name)}: {q.occupancy.events:,} events, drawn as "
                    f"{len(q.occupancy.t_us):,} points, bins of {q.occupancy.bin_us:,.1f} µs</li>" for q in reduced)
    return (f"<p class=note>{escape(how)}A longer trace is drawn as its envelope: its time span is cut into "
            f"{max_points // 2:,} equal bins and each bin keeps its lowest and its highest occupancy, two "
            "real events with their own times, so no peak (not even one packet's) and no empty moment "
            "is hidden; only the order of events inside a bin is lost. Reduced here:</p>"
            f"<ul class=note>{items}</ul>")


def queue_section(run_dir: Path, summary: dict, blocks: pd.DataFrame, queues: pd.DataFrame | None,
                  timeouts: pd.DataFrame | None, max_points: int) -> str:
    head = "<section id=\"queues\"><h2>Queue occupancy at the switch ports</h2>"
    tele = _read_table(run_dir / "telemetry.parquet")
    if tele is None:
        return head + ("<p class=note>No telemetry in this run: run it again with <code>--telemetry</code> "
                       "to see its queues.</p></section>")
    traces = queue_traces(tele, queues, max_points)
    fig = queue_figure(traces, summary, blocks, queues, timeouts)
    return (head + "<p class=note>Each class queue's bytes after every enqueue and dequeue over the whole run; "
            "× marks a drop; ▲ a retransmission timeout; shaded: warm-up and the measured blocks. "
            "Click a legend entry to show or hide a port.</p>"
            + reduction_note(traces, max_points) + _figure_html(fig, "queue-graph") + "</section>")


# --- a run: blocks and their timeouts -----------------------------------------------

def load_timeouts(run_dir: Path) -> tuple[pd.DataFrame | None, str]:
    """The run's timeouts (timeouts.parquet's columns) and where they came from."""
    path = run_dir / "timeouts.parquet"
    if path.is_file():
        return pd.read_parquet(path), "Timeouts and causes from timeouts.parquet (incast explain)."
    if (run_dir / CAPTURE_DIR).is_dir():
        try:
            found = explain.explain(run_dir).timeouts
        except (BadInput, OSError) as e:
            return None, f"The capture could not be explained: {e}"
        return found, (f"Timeouts and causes computed from the capture for this page; "
                       f"incast explain {run_dir} writes them to timeouts.parquet (and explain.png).")
    return None, ("No timeouts shown: this run has no packet capture. Run it with --capture, then "
                  "incast explain RUN_DIR, to see each block's timeouts and their causes.")


def block_rows(blocks: pd.DataFrame, timeouts: pd.DataFrame | None) -> pd.DataFrame:
    """blocks.parquet with each block's timeouts, whether one decided it, the cause
    shown (the deciding timeout's, else the last one's, as incast explain shows it),
    its category and a hover text."""
    rows = blocks.reset_index(drop=True).copy()
    rows["timeouts"], rows["decided"], rows["cause"], rows["detail"] = 0, False, "", ""
    if timeouts is not None and len(timeouts):
        measured = timeouts[timeouts["block"] >= 0].sort_values("time_us")
        per_block = {key: g for key, g in measured.groupby(["rep", "block"])}
        for i, b in rows.iterrows():
            mine = per_block.get((b["rep"], b["block"]))
            if mine is None:
                continue
            deciding = mine[mine["decided_block"]]
            rows.at[i, "timeouts"] = len(mine)
            rows.at[i, "decided"] = bool(len(deciding))
            rows.at[i, "cause"] = str((deciding if len(deciding) else mine)["cause"].iloc[-1])
            rows.at[i, "detail"] = "<br>".join(escape(_timeout_text(t)) for t in mine.itertuples())
    rows["category"] = [_category(r, timeouts is not None) for r in rows.itertuples()]
    return rows


def _category(row, explained: bool) -> str:
    if not explained:
        return "block"
    if row.decided:
        return f"decided by a timeout: {row.cause.replace('_', ' ')}"
    return "timeouts, none decided it" if row.timeouts else "no timeout"


def _category_color(category: str) -> str:
    for cause in CAUSES:
        if category.endswith(cause.replace("_", " ")):
            return TAB10[COLORS[cause]]
    return {"timeouts, none decided it": "#aec7e8"}.get(category, TAB10[COLORS[""]])


def block_figure(rows: pd.DataFrame):
    go, _ = _plotly()
    fig = go.Figure()
    position = pd.Series(range(len(rows)), index=rows.index)
    for category, g in rows.groupby("category", sort=False):
        hover = [f"rep {r.rep} block {r.block}: {r.duration_ms:.2f} ms, {r.timeouts} timeouts"
                 + (f"<br>{r.detail}" if r.detail else "") for r in g.itertuples()]
        fig.add_trace(go.Bar(x=position[g.index], y=g["duration_ms"], name=category,
                             marker_color=_category_color(category), text=g["timeouts"].where(g["timeouts"] > 0, ""),
                             textposition="outside", hovertext=hover, hoverinfo="text",
                             meta={"blocks": len(g), "timeouts": [int(k) for k in g["timeouts"]]}))
    fig.update_layout(template="plotly_white", height=420, barmode="overlay", bargap=0.15,
                      xaxis_title="measured block, in order (number above a bar: its timeouts)",
                      yaxis_title="block duration (ms)", legend_title_text="the block", margin=dict(t=30))
    return fig


def timeouts_table(timeouts: pd.DataFrame) -> str:
    measured = timeouts[timeouts["block"] >= 0].sort_values("time_us")
    if not len(measured):
        return "<p class=note>No timeout during the measured blocks.</p>"
    counts = measured["cause"].astype(str).value_counts()
    summary = ", ".join(f"{counts[c]} {c.replace('_', ' ')}" for c in counts.index)
    shown = measured.head(MAX_TIMEOUT_ROWS)
    table = pd.DataFrame({"rep": shown["rep"], "block": shown["block"], "server": shown["server"],
                          "time (ms)": shown["time_us"] / 1000, "cause": shown["cause"].astype(str),
                          "DART": shown["dart"], "sends before": shown["sends_before"],
                          "waited (ms)": shown["wait_us"] / 1000, "decided the block": shown["decided_block"]})
    more = (f"<p class=note>The first {MAX_TIMEOUT_ROWS} of {len(measured)}; the graphs show all.</p>"
            if len(measured) > MAX_TIMEOUT_ROWS else "")
    return (f"<p>{len(measured)} timeouts during the measured blocks: {escape(summary)}.</p>"
            f"<details><summary>every timeout</summary>{_frame_table(table)}{more}</details>")


def blocks_section(blocks: pd.DataFrame, timeouts: pd.DataFrame | None, source: str) -> str:
    rows = block_rows(blocks, timeouts)
    fig = block_figure(rows)
    table = timeouts_table(timeouts) if timeouts is not None else ""
    return ("<section id=\"blocks\"><h2>Blocks and their timeouts</h2>"
            f"<p class=note>{escape(source)} A block is decided by a timeout when its last server to "
            "finish timed out during it.</p>" + _figure_html(fig, "block-graph") + table + "</section>")


# --- a run: drops, marks, PAUSE -----------------------------------------------------

def _inside_blocks(t_us: np.ndarray, blocks: pd.DataFrame) -> np.ndarray:
    b = blocks.sort_values("start_us")
    starts, ends = b["start_us"].to_numpy(), b["end_us"].to_numpy()
    i = np.searchsorted(starts, t_us, side="right") - 1
    return (i >= 0) & (t_us <= ends[np.clip(i, 0, None)]) if len(starts) else np.zeros(len(t_us), bool)


def losses_table(queues: pd.DataFrame, tele: pd.DataFrame | None, blocks: pd.DataFrame) -> pd.DataFrame:
    """Per switch queue: its counters summed over repetitions, and the drop events the
    telemetry recorded (whole run, and inside the measured blocks)."""
    keys = [k for k in ("switch", "port", "peer", "queue") if k in queues]
    sums = [c for c in ("sent_packets", "sent_bytes", "drops", "marks", "overlimits") if c in queues]
    table = queues.groupby(keys, sort=False)[sums].sum().reset_index()
    if "limit" in queues:
        limits = queues.drop_duplicates(keys)[keys + [c for c in ("limit", "limit_unit") if c in queues]]
        table = table.merge(limits, on=keys, how="left")
    if tele is not None:
        drops = tele[tele["event"].astype(str) == "drop"]
        drops = drops.assign(port=drops["port"].astype(str), measured=_inside_blocks(drops["time_us"].to_numpy(), blocks))
        counted = drops.groupby(["port", "queue"]).agg(drop_events=("measured", "size"),
                                                       drop_events_in_blocks=("measured", "sum")).reset_index()
        table = table.assign(port=table["port"].astype(str)).merge(counted, on=["port", "queue"], how="left")
        table[["drop_events", "drop_events_in_blocks"]] = table[["drop_events", "drop_events_in_blocks"]].fillna(0).astype(int)
    order = sorted(range(len(table)), key=lambda i: (_natural(table["port"].iloc[i]), table["queue"].iloc[i]))
    return table.iloc[order]


def losses_section(run_dir: Path, summary: dict, queues: pd.DataFrame | None, blocks: pd.DataFrame) -> str:
    out = ["<section id=\"losses\"><h2>Drops, ECN marks and PAUSE/PFC</h2>"]
    if queues is not None and len(queues):
        tele = None
        if (run_dir / "telemetry.parquet").is_file():
            tele = pd.read_parquet(run_dir / "telemetry.parquet", columns=["time_us", "port", "queue", "event"])
        out.append("<p class=note>Per switch queue: counters over the measured blocks (queues.parquet), "
                   "and the drop events the telemetry recorded over the whole run and inside the blocks.</p>")
        out.append(_frame_table(losses_table(queues, tele, blocks)))
    flow = [(k, v) for k, v in summary.items() if any(w in k for w in FLOW_CONTROL_WORDS)]
    if flow:
        out.append(f"<h3>Flow control</h3>{_key_value_table(flow)}")
    else:
        out.append("<p class=note>No PAUSE or PFC in this run.</p>")
    pause_ports = _read_table(run_dir / "pause_ports.parquet")
    if pause_ports is not None:
        out.append(f"<h3>Per port (pause_ports.parquet)</h3>{_frame_table(pause_ports)}")
    out.append("</section>")
    return "".join(out)


# --- a run: the page ----------------------------------------------------------------

def run_page(run_dir: Path, max_points: int = MAX_POINTS) -> str:
    run_dir = Path(run_dir)
    summary = _read_json(run_dir / "summary.json")
    blocks = _read_table(run_dir / "blocks.parquet")
    if blocks is None:
        raise BadInput(f"{run_dir}: no blocks.parquet (a run of this testbed has one)")
    queues = _read_table(run_dir / "queues.parquet")
    timeouts, source = load_timeouts(run_dir)
    scenario = (run_dir / "scenario.toml").read_text() if (run_dir / "scenario.toml").is_file() else ""
    environment = _read_json(run_dir / "environment.json")
    body = [f"<h1>incast run {escape(run_dir.name)}</h1>",
            f"<p class=sub>{escape(_describe(run_dir / 'scenario.toml'))} — {escape(str(run_dir.resolve()))}</p>",
            fidelity_section(summary, _read_table(run_dir / "links.parquet")),
            summary_section(summary),
            queue_section(run_dir, summary, blocks, queues, timeouts, max_points),
            blocks_section(blocks, timeouts, source),
            losses_section(run_dir, summary, queues, blocks),
            f"<section id=\"scenario\"><h2>Scenario (scenario.toml)</h2><pre>{escape(scenario)}</pre></section>",
            "<details><summary>environment.json</summary>"
            f"<pre>{escape(json.dumps(environment, indent=2))}</pre></details>"]
    return _page(f"incast run {run_dir.name}", "\n".join(body))


def write_run_report(run_dir: Path, out: Path | None = None, max_points: int = MAX_POINTS) -> Path:
    run_dir = Path(run_dir)
    if directory_kind(run_dir) != "run":
        raise BadInput(f"{run_dir}: a sweep directory, not a run directory")
    return _write(Path(out) if out else run_dir / REPORT, run_page(run_dir, max_points))


# --- a sweep ------------------------------------------------------------------------

def sweep_run_dir(sweep_dir: Path, row: pd.Series) -> Path | None:
    """A row's run directory: under this sweep's runs/ (the table's path may name where
    the sweep was written before it moved), else the path as written."""
    written = row.get("run_dir")
    if not isinstance(written, str) or not written:
        return None
    here = sweep_dir / "runs" / Path(written).name
    for candidate in (here, Path(written)):
        if (candidate / "summary.json").is_file():
            return candidate
    return None


def _link(target: Path, page: Path) -> str:
    rel = os.path.relpath(target.resolve(), page.resolve().parent)
    return urllib.parse.quote(Path(rel).as_posix())


def _grid_axes(table: pd.DataFrame, meta: dict) -> list[str]:
    """The grid axes a line stands for (as plots.plot_sweep_dir names them)."""
    axes = [n.split(".")[-1] for n in meta.get("grid", {})]
    return [a for a in axes if a not in ("senders", "repeat") and a in table]


def _groups(ok: pd.DataFrame, axes: list[str]):
    if not axes:
        return [((), ok)]
    return ok.groupby(axes if len(axes) > 1 else axes[0], dropna=False, sort=False)


def _faithful(value) -> bool:
    return not bool(value == False)  # noqa: E712 -- None/NaN (not judged) counts as faithful


def _run_hover(row: pd.Series, name: str) -> str:
    verdict = ("faithful" if _faithful(row.get("fidelity_ok"))
               else f"NOT FAITHFUL: {row.get('fidelity_reasons', '')}")
    return (f"{escape(name)}<br>{row['senders']} senders: {row['goodput_mbps']:.1f} Mbit/s<br>"
            f"{_fmt(row.get('timeouts'))} timeouts, {_fmt(row.get('drops'))} drops<br>{escape(verdict)}"
            "<br>click: the run's report")


def sweep_figure(table: pd.DataFrame, axes: list[str], links: dict, names: dict, title: str):
    go, _ = _plotly()
    fig = go.Figure()
    ok = table[table["goodput_mbps"].notna()] if "goodput_mbps" in table else table.iloc[0:0]
    for n, (key, g) in enumerate(_groups(ok, axes)):
        key = key if isinstance(key, tuple) else (key,)
        label = ", ".join(f"{a}={v}" for a, v in zip(axes, key)) or "goodput"
        color = qualitative.Plotly[n % len(qualitative.Plotly)]
        mean = g.groupby("senders")["goodput_mbps"].mean().sort_index()
        fig.add_trace(go.Scatter(x=mean.index, y=mean.values, mode="lines", name=label, legendgroup=label,
                                 line_color=color, hoverinfo="skip", meta={"role": "mean", "group": label}))
        g = g.sort_values("senders", kind="stable")
        hollow = [not _faithful(v) for v in g.get("fidelity_ok", pd.Series(True, index=g.index))]
        fig.add_trace(go.Scatter(
            x=g["senders"], y=g["goodput_mbps"], mode="markers", name=f"{label}: runs", legendgroup=label,
            showlegend=False, customdata=[links.get(i, "") for i in g.index],
            marker=dict(size=11, color=color, symbol=["circle-open" if h else "circle" for h in hollow],
                        line=dict(color=color, width=2)),
            hovertext=[_run_hover(r, names.get(i, "")) for i, r in g.iterrows()], hoverinfo="text",
            meta={"role": "runs", "group": label, "rows": [int(i) for i in g.index], "hollow": hollow}))
    if len(ok):
        link = float(ok["link_mbps"].iloc[0])
        fig.add_hline(y=link * PAYLOAD_SHARE, line_dash="dot", line_color="grey",
                      annotation_text="payload limit", annotation_position="bottom right")
        fig.update_yaxes(range=[0, link * 1.05])
    fig.update_layout(template="plotly_white", height=520, title=title, hovermode="closest",
                      xaxis_title="number of servers", yaxis_title="goodput (Mbit/s)")
    if len(ok):     # the grid's sender counts, not plotly's fractional ticks
        fig.update_xaxes(tickmode="array", tickvals=sorted(ok["senders"].unique()))
    return fig


# A click on a run's marker opens that run's report.
OPEN_RUN_ON_CLICK = """
document.getElementById('{plot_id}').on('plotly_click', function (event) {
  var link = event.points.length ? event.points[0].customdata : '';
  if (link) { window.location.href = link; }
});
"""


def _sweep_title(sweep_dir: Path, meta: dict) -> str:
    grid = meta.get("grid", {})
    try:
        first = scn.build(meta.get("base", {}), {**meta.get("overrides", {}), **{k: v[0] for k, v in grid.items()}})
        varied = {scn.DESCRIBE_PART.get(scn.resolve_field(n)) for n in grid} | {"senders"}
        return first.describe(omit=varied) + meta.get("auto_note", "")
    except (ValueError, KeyError, IndexError):
        return sweep_dir.name


def runs_table(table: pd.DataFrame, axes: list[str], links: dict, names: dict) -> str:
    head = ["#", *axes, "senders", "goodput (Mbit/s)", "timeouts", "drops", "faithful", "report"]
    rows = []
    for i, r in table.iterrows():
        if isinstance(r.get("error"), str) and r.get("error"):
            report, faithful = f"failed: {escape(r['error'])}", "—"
        else:
            report = (f"<a href=\"{escape(links[i])}\">{escape(names.get(i, 'report'))}</a>"
                      if i in links else "no run directory")
            faithful = "yes" if _faithful(r.get("fidelity_ok")) else f"no: {escape(str(r.get('fidelity_reasons')))}"
        cells = [str(i), *(escape(_fmt(r.get(a))) for a in axes), escape(_fmt(r.get("senders"))),
                 escape(_fmt(r.get("goodput_mbps"))), escape(_fmt(r.get("timeouts"))), escape(_fmt(r.get("drops"))),
                 faithful, report]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    header = "".join(f"<th>{escape(h)}</th>" for h in head)
    return f"<table id=\"runs\"><tr>{header}</tr>{''.join(rows)}</table>"


def write_sweep_report(sweep_dir: Path, out: Path | None = None,
                       max_points: int = MAX_POINTS) -> tuple[Path, list[Path]]:
    """The sweep's page and every run's own; returns (the sweep page, the run pages)."""
    sweep_dir = Path(sweep_dir)
    if directory_kind(sweep_dir) != "sweep":
        raise BadInput(f"{sweep_dir}: not a sweep directory (no sweep.parquet and runs/)")
    out = Path(out) if out else sweep_dir / REPORT
    table = pd.read_parquet(sweep_dir / "sweep.parquet").reset_index(drop=True)
    meta = _read_json(sweep_dir / "sweep.json")
    axes = _grid_axes(table, meta)
    links, names, pages = {}, {}, []
    for i, row in table.iterrows():
        run = sweep_run_dir(sweep_dir, row)
        if run is not None:
            pages.append(write_run_report(run, run / REPORT, max_points))
            links[i], names[i] = _link(pages[-1], out), run.name
    title = _sweep_title(sweep_dir, meta)
    fig = sweep_figure(table, axes, links, names, title)
    unfaithful = sorted({r for rs in table.get("fidelity_reasons", pd.Series(dtype=str)).dropna()
                         for r in str(rs).split("; ") if r})
    hollow = (f"<p class=note>Hollow: a run that was not faithful ({escape('; '.join(unfaithful))}).</p>"
              if unfaithful else "<p class=note>Every run was faithful (no hollow marker).</p>")
    body = (f"<h1>incast sweep {escape(sweep_dir.name)}</h1>"
            f"<p class=sub>{escape(title)} — {escape(str(sweep_dir.resolve()))}</p>"
            "<section id=\"sweep\"><h2>Goodput against the number of servers</h2>"
            "<p class=note>One line (the mean) per combination of the other grid axes, one marker per run: "
            "hover names the run, a click opens its report.</p>" + hollow
            + _figure_html(fig, "sweep-graph", OPEN_RUN_ON_CLICK) + "</section>"
            f"<section><h2>Runs</h2>{runs_table(table, axes, links, names)}</section>")
    return _write(out, _page(f"incast sweep {sweep_dir.name}", body)), pages


def cmd_report(args) -> int:
    path = Path(args.path)
    out = Path(args.out) if args.out else None
    if directory_kind(path) == "sweep":
        page, runs = write_sweep_report(path, out)
        print(f"{page} (and {len(runs)} run reports: runs/*/{REPORT})")
    else:
        print(write_run_report(path, out))
    return 0
