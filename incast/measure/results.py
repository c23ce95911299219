"""Results directories and what is in them.

A run writes into ``.<name>.incomplete`` next to its final path and renames it when
everything is written, so an interrupted run never looks complete. Contents:

==================  ==================================================================
scenario.toml       the resolved scenario (canonical units) that ran
environment.json    kernel, HZ, effective RTO floor, features, versions
summary.json        the one-line summary (see SUMMARY_FIELDS), written last
blocks.parquet      one row per measured block
flows.parquet       one row per server connection: the sender's TCP_INFO at the end
switch.*            how the data plane built the switches (its artifacts(): switch.tc, ...)
==================  ==================================================================

and the tables of every instrument the run measured with, each named by its entry in
``incast.registry.INSTRUMENTS`` (counters.parquet and queues.parquet: TCP MIB and
switch queue counter deltas; telemetry.parquet, pause_ports.parquet, links.parquet,
background.parquet, capture/ where the scenario asks for them). A new table is a new
instrument and its registry line: nothing here changes.

Every table loads with one line: ``pd.read_parquet("RUN/blocks.parquet")``.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow

from incast.constants import RTO_COUNTER
from incast.errors import OutputUnusable, ResultsExist, ScenarioError

# The fields every summary.json has (PAUSE and data-plane health fields join them where
# they apply), and the columns a sweep row adds: the summary's fidelity object
# flattened, the repetition and a failed run's error. Whatever else a sweep row holds is
# a grid axis.
SUMMARY_FIELDS = ["goodput_mbps", "link_mbps", "senders", "blocks", "block_ms_p50",
                  "block_ms_p99", "block_ms_max", "timeouts", "retransmits", "drops",
                  "bottleneck_drops", "max_queue_bytes", "telemetry_records", "telemetry_lost",
                  "dataplane", "cc", "rto_min_us", "rto_floor_us", "bottleneck_port", "build_s",
                  "repetitions", "backlog_drops", "link_rate_auto", "run_dir"]
FIDELITY_COLUMNS = ["min_service_ratio", "cpu_busy", "cpu_busy_max", "cpu_contended_max", "cpu_niced",
                    "cpu_others", "timer_late_us_p99"]
ROW_FIELDS = (SUMMARY_FIELDS + ["fidelity_ok", "fidelity_reasons"]
              + [f"fidelity_{k}" for k in FIDELITY_COLUMNS] + ["repeat", "error"]
              # what a sweep adds of each point: its key, whether it came from the store, its
              # host time, the Dask worker that ran it
              + ["point_key", "reused", "point_host_s", "worker", "run_dir"])


def single_threaded_arrow() -> None:
    """Arrow's thread pools, one thread each. A process that read parquet with Arrow's
    default pools sometimes aborts as the interpreter exits ("terminate called without
    an active exception", exit status 134: apache/arrow issues 34314 and 50482; measured
    here: 4 of 30 reads of one small table, on a loaded machine, and none of 30 with
    single-threaded pools). Our tables are small: one thread reads them as fast."""
    pyarrow.set_cpu_count(1)
    pyarrow.set_io_thread_count(1)


def flat_summary(summary: dict) -> dict:
    """A run's summary as one table row: the fidelity object becomes fidelity_* columns."""
    row = {k: v for k, v in summary.items() if k != "fidelity"}
    f = summary.get("fidelity") or {}
    row["fidelity_ok"] = f.get("ok")
    row["fidelity_reasons"] = "; ".join(f.get("reasons", []))
    for k in FIDELITY_COLUMNS:
        row[f"fidelity_{k}"] = f.get(k)
    return row



class Claim:
    """Exclusive use of a results location while it is being written.

    The work goes into ``.<name>.incomplete`` next to the final path, holding an
    exclusive lock (flock) on its ``.lock`` file for as long as the writer lives. A
    second writer aiming at the same place finds the lock held and, with unique=True
    (default names, which two runs started in the same second share), takes the next
    name (``<name>-2``, ...), else stops with ResultsExist. A work directory whose lock
    nobody holds was left by a killed run and is reused. The lock dies with its process,
    so no stale claim survives a SIGKILL."""

    def __init__(self, final: Path, unique: bool = False):
        final = Path(final)
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutputUnusable(f"{final}: cannot create {final.parent}: {e.strerror}") from None
        for n in range(1, 1000):
            candidate = final if n == 1 else final.with_name(f"{final.name}-{n}")
            if not candidate.exists():
                work = candidate.parent / f".{candidate.name}.incomplete"
                lock = self._lock(work)
                if lock is not None:
                    if not candidate.exists():
                        self.final, self.path, self._lock_fd = candidate, work, lock
                        return
                    os.close(lock)
            if not unique:
                raise ResultsExist(f"{final} exists or another run is writing it; choose another --out")
        raise ResultsExist(f"{final}: 999 runs with this name; choose another --out")

    @staticmethod
    def _lock(work: Path) -> int | None:
        """The lock fd if this process now owns work (emptied), else None."""
        try:
            work.mkdir()
        except FileExistsError:
            pass
        except OSError as e:
            raise OutputUnusable(f"{work.parent}: cannot write: {e.strerror}") from None
        try:
            fd = os.open(work / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:       # another claimant removed a stale work dir just now
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        if not (work / ".lock").exists() or os.stat(work / ".lock").st_ino != os.fstat(fd).st_ino:
            os.close(fd)                # locked a file that was replaced meanwhile
            return None
        for child in work.iterdir():    # what a killed run left
            if child.name != ".lock":
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        return fd

    def finalize(self) -> Path:
        # Renamed first: a claimant that opens the lock from now on finds no work dir.
        os.replace(self.path, self.final)
        (self.final / ".lock").unlink()
        self.release()
        return self.final

    def abandon(self) -> None:
        """Nothing was written that is worth keeping: remove the work directory."""
        shutil.rmtree(self.path, ignore_errors=True)
        self.release()

    def release(self) -> None:
        if getattr(self, "_lock_fd", None) is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    __del__ = release


@dataclass
class Outcome:
    """A finished run: where its results are, and its summary."""
    run_dir: Path
    summary: dict


class ResultsDir:
    def __init__(self, final: Path, unique: bool = False):
        self.claim = Claim(final, unique)

    @property
    def final(self) -> Path:
        return self.claim.final

    @property
    def path(self) -> Path:
        """Where the results are written until finalize()."""
        return self.claim.path

    def write_text(self, name: str, text: str) -> None:
        (self.path / name).write_text(text)

    def write_json(self, name: str, obj) -> None:
        (self.path / name).write_text(json.dumps(obj, indent=2, default=_json_default) + "\n")

    def write_table(self, name: str, df: pd.DataFrame) -> None:
        df.to_parquet(self.path / name, index=False)

    def finalize(self) -> Path:
        return self.claim.finalize()


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


def complete_run(run_dir) -> Path:
    """run_dir as a Path, or a scenario error (exit 2) if no run finished there."""
    if not (Path(run_dir) / "summary.json").is_file():
        raise ScenarioError(f"{run_dir}: not a complete run directory (no summary.json)")
    return Path(run_dir)


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
        "timeouts": int(counters[RTO_COUNTER].sum()) if len(counters) and RTO_COUNTER in counters else 0,
        "retransmits": int(counters["RetransSegs"].sum()) if len(counters) else 0,
        "drops": int(queues["drops"].sum()) if len(queues) else 0,
        "bottleneck_drops": int(queues.loc[queues["port"] == bottleneck_port, "drops"].sum()) if len(queues) else 0,
        "ecn_marks": int(queues["marks"].sum()) if "marks" in queues else None,
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
