"""Checks lab 1's answers against the student's own run (incast lab check 1)."""
import json

import pandas as pd

from incast.report import explain
from incast.labs import close, run_dir


def check(answers: dict, lab) -> list[str]:
    problems: list[str] = []
    run = run_dir(answers, "run_dir", problems)
    if run is None:
        return problems
    summary = json.loads((run / "summary.json").read_text())
    if summary["senders"] < 8:
        problems.append(f"run_dir: the run had {summary['senders']} servers; incast needs many (the "
                        "handout uses 16)")
    if not (run / "capture").is_dir():
        problems.append("run_dir: the run has no packet capture: run it again with --capture")
        return problems
    if not close(answers.get("goodput_mbps"), summary["goodput_mbps"]):
        problems.append(f"goodput_mbps: {answers.get('goodput_mbps')} is not the run's; read goodput_mbps in "
                        f"{run}/summary.json")
    if summary.get("max_queue_bytes") is None:
        problems.append("max_queue_bytes: the run recorded no telemetry: run it again with --telemetry")
    elif not close(answers.get("max_queue_bytes"), summary["max_queue_bytes"], absolute=1):
        problems.append(f"max_queue_bytes: {answers.get('max_queue_bytes')} is not what the queue reached; "
                        "see max_queue_bytes in summary.json or the peak of queue.png")
    e = explain.explain(run)
    measured = e.timeouts[e.timeouts["measured"]]
    if answers.get("timeouts") != len(measured):
        problems.append(f"timeouts: {answers.get('timeouts')} is not what incast explain {run} counts over "
                        "the measured blocks (its first line)")
    if len(measured):
        common = measured["cause"].astype(str).value_counts()
        if answers.get("most_common_cause") not in set(common[common == common.max()].index):
            problems.append(f"most_common_cause: {answers.get('most_common_cause')!r} is not the most "
                            "frequent class in incast explain's breakdown")
    blocks = pd.read_parquet(run / "blocks.parquet")
    rep0 = e.blocks[e.blocks["rep"] == 0]
    slowest = rep0.loc[rep0["duration_ms"].idxmax()]
    if answers.get("slowest_block") != int(slowest["block"]):
        problems.append(f"slowest_block: block {answers.get('slowest_block')} is not the longest "
                        f"(sort blocks.parquet by duration_ms; {len(blocks)} blocks)")
    elif answers.get("slowest_block_decided_by_timeout") is not bool(slowest["decided_by_timeout"]):
        problems.append("slowest_block_decided_by_timeout: look at the block in explain.png: its colour "
                        "says whether its last server timed out")
    why = str(answers.get("why_one_window_costs_a_block", "")).lower()
    if len(why) < 20 or not any(w in why for w in ("wait", "slowest", "last", "barrier", "every")):
        problems.append("why_one_window_costs_a_block: say what the client waits for before it asks "
                        "for the next block")
    return problems
