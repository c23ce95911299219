"""Results directories and what is in them.

A run writes into ``.<name>.incomplete`` next to its final path and renames it when
everything is written, so an interrupted run never looks complete. Contents:

==================  ==================================================================
scenario.toml       the resolved scenario (canonical units) that ran
environment.json    kernel, HZ, effective RTO floor, features, versions
summary.json        the one-line summary (see SUMMARY_FIELDS), written last
blocks.parquet      one row per measured block
flows.parquet       one row per server connection: the sender's TCP_INFO at the end
counters.parquet    one row per host and repetition: TCP MIB counter deltas
queues.parquet      one row per switch queue and repetition: counter deltas + limit
telemetry.parquet   one row per packet event at the switch queues (see incast.telemetry)
switch.tc           the tc commands that built the switch queues (linux data plane)
==================  ==================================================================

Every table loads with one line: ``pd.read_parquet("RUN/blocks.parquet")``.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

SUMMARY_FIELDS = ["goodput_mbps", "link_mbps", "senders", "blocks", "block_ms_p50",
                  "block_ms_p99", "block_ms_max", "timeouts", "retransmits", "drops",
                  "max_queue_bytes", "telemetry_records", "telemetry_lost"]

# Linux counts a retransmission timeout under one of these, by the state the
# connection was in when it fired (tcp_retransmit_timer): TCPTimeouts only when it
# was in no recovery at all.
RTO_COUNTERS = ["TCPTimeouts", "TCPSackFailures", "TCPRenoFailures", "TCPSackRecoveryFail",
                "TCPRenoRecoveryFail", "TCPLossFailures"]


class ResultsExist(FileExistsError):
    pass


class ResultsDir:
    def __init__(self, final: Path):
        self.final = Path(final)
        if self.final.exists():
            raise ResultsExist(f"{self.final} exists; choose another --out")
        self.path = self.final.parent / f".{self.final.name}.incomplete"
        if self.path.exists():
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True)

    def write_text(self, name: str, text: str) -> None:
        (self.path / name).write_text(text)

    def write_json(self, name: str, obj) -> None:
        (self.path / name).write_text(json.dumps(obj, indent=2, default=_json_default) + "\n")

    def write_table(self, name: str, df: pd.DataFrame) -> None:
        df.to_parquet(self.path / name, index=False)

    def finalize(self) -> Path:
        os.replace(self.path, self.final)
        return self.final


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o)}")


def is_complete(run_dir: Path) -> bool:
    return (Path(run_dir) / "summary.json").is_file() and not Path(run_dir).name.endswith(".incomplete")


def measured_seconds(blocks: pd.DataFrame) -> float:
    """Wall time of the measured blocks: first start to last end, summed over repetitions."""
    spans = blocks.groupby("rep").agg(start=("start_us", "min"), end=("end_us", "max"))
    return float((spans["end"] - spans["start"]).sum()) / 1e6


def summarize(blocks: pd.DataFrame, counters: pd.DataFrame, queues: pd.DataFrame,
              telemetry: pd.DataFrame | None, telemetry_lost: int | None,
              link_rate: int, senders: int, bottleneck_port: str) -> dict:
    """The run's summary from its tables; the same code for every data plane."""
    seconds = measured_seconds(blocks)
    goodput = float(blocks["bytes"].sum()) * 8 / seconds / 1e6 if seconds > 0 else 0.0
    dur = blocks["duration_ms"]
    out = {
        "goodput_mbps": round(goodput, 3),
        "link_mbps": link_rate / 1e6,
        "senders": senders,
        "blocks": int(len(blocks)),
        "block_ms_p50": round(float(dur.quantile(0.5)), 3),
        "block_ms_p99": round(float(dur.quantile(0.99)), 3),
        "block_ms_max": round(float(dur.max()), 3),
        # Every retransmission timeout, whatever recovery state it ended.
        "timeouts": int(counters[[c for c in RTO_COUNTERS if c in counters]].sum().sum()) if len(counters) else 0,
        "retransmits": int(counters["RetransSegs"].sum()) if len(counters) else 0,
        "drops": int(queues["drops"].sum()) if len(queues) else 0,
        "bottleneck_drops": int(queues.loc[queues["port"] == bottleneck_port, "drops"].sum()) if len(queues) else 0,
        "max_queue_bytes": None,
        "telemetry_records": None,
        "telemetry_lost": telemetry_lost,
    }
    if telemetry is not None:
        out["telemetry_records"] = int(len(telemetry))
        occ = telemetry.loc[telemetry["event"] != "drop", "bytes"]
        out["max_queue_bytes"] = int(occ.max()) if len(occ) else 0
    return out


def one_line(summary: dict) -> str:
    s = summary
    line = (f"{s['senders']} senders: goodput {s['goodput_mbps']:.1f} Mbit/s "
            f"({100 * s['goodput_mbps'] / s['link_mbps']:.1f}% of {s['link_mbps']:g}), "
            f"block p50 {s['block_ms_p50']:.2f} ms p99 {s['block_ms_p99']:.2f} ms, "
            f"{s['timeouts']} timeouts, {s['retransmits']} retransmits, {s['drops']} drops")
    if s.get("telemetry_records") is not None:
        line += (f", queue max {s['max_queue_bytes']} B, {s['telemetry_records']} telemetry records"
                 f" ({s['telemetry_lost']} lost)")
    return line
