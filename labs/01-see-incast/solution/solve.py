"""Lab 1's reference solution: the handout's steps, then the answers from the run.

    python3 labs/01-see-incast/solution/solve.py OUT_DIR   (writes OUT_DIR/answers.toml)
"""
import json
import subprocess
import sys
from pathlib import Path

from incast.report import explain

RUN = ["--senders", "16", "--link-rate", "100Mbit", "--buffer", "32KiB", "--sru", "32KiB",
       "--rto-min", "20ms", "--blocks", "20", "--telemetry", "--capture"]


def solve(out: Path) -> dict:
    run = out / "lab1"
    subprocess.run([sys.executable, "-m", "incast", "run", *RUN, "--out", str(run)], check=True,
                   capture_output=True)
    subprocess.run([sys.executable, "-m", "incast", "explain", str(run)], check=True, capture_output=True)
    s = json.loads((run / "summary.json").read_text())
    e = explain.explain(run)
    measured = e.timeouts[e.timeouts["measured"]]
    rep0 = e.blocks[e.blocks["rep"] == 0]
    slowest = rep0.loc[rep0["duration_ms"].idxmax()]
    return {"run_dir": str(run), "goodput_mbps": s["goodput_mbps"], "max_queue_bytes": s["max_queue_bytes"],
            "timeouts": int(len(measured)),
            "most_common_cause": str(measured["cause"].astype(str).value_counts().idxmax()) if len(measured) else "",
            "slowest_block": int(slowest["block"]),
            "slowest_block_decided_by_timeout": bool(slowest["decided_by_timeout"]),
            "why_one_window_costs_a_block": "the client asks for the next block only when every server's "
                                            "fragment has arrived, so it waits for the slowest flow's RTO"}


if __name__ == "__main__":
    from incast.labs import solution_main
    solution_main(solve)
