"""Lab 3's reference solution: the sweep, then the answers from it.

    python3 labs/03-rto-min/solution/solve.py OUT_DIR   (writes OUT_DIR/answers.toml)
"""
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd


def solve(out: Path, blocks: int = 10) -> dict:
    sweep = out / "lab3"
    subprocess.run([sys.executable, "-m", "incast", "sweep", "--senders", "16", "--link-rate", "100Mbit",
                    "--buffer", "32KiB", "--sru", "32KiB", "--blocks", str(blocks),
                    "--grid", "rto_min=200ms,20ms,1ms,min", "--out", str(sweep)], check=True, capture_output=True)
    t = pd.read_parquet(sweep / "sweep.parquet")
    by = t.groupby(t["rto_min"].astype(str))
    run = Path(t["run_dir"].dropna().iloc[0])
    return {"sweep_dir": str(sweep), "goodput_200ms": float(by["goodput_mbps"].mean()["200ms"]),
            "goodput_min": float(by["goodput_mbps"].mean()["min"]),
            "floor_us_min": int(by["rto_floor_us"].first()["min"]),
            "hz": json.loads((run / "environment.json").read_text())["hz"],
            "why_the_floor": "a stock kernel runs the retransmission timer on jiffies: nothing fires "
                             "sooner than a tick of 1/HZ s"}


if __name__ == "__main__":
    from incast.labs import solution_main
    solution_main(solve)
