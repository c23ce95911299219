"""Lab 4's reference solution: the sweep, then the answers from it.

    python3 labs/04-qos-partitioning/solution/solve.py OUT_DIR   (writes OUT_DIR/answers.toml)
"""
import subprocess
import sys
import tomllib
from pathlib import Path

import pandas as pd

from incast.scenario import build

REPO = Path(__file__).resolve().parents[3]


def solve(out: Path, senders: str = "1,2,3,4,6,8,12,16", blocks: int = 10) -> dict:
    sweep = out / "lab4"
    subprocess.run([sys.executable, "-m", "incast", "sweep", str(REPO / "scenarios/fast08-collapse.toml"),
                    "--link-rate", "100Mbit", "--rto-min", "20ms", "--buffer", "64KiB", "--sru", "32KiB",
                    "--blocks", str(blocks), "--grid", f"senders={senders}", "--grid", "qos_queues=1,4",
                    "--out", str(sweep)], check=True, capture_output=True)
    t = pd.read_parquet(sweep / "sweep.parquet")
    answers = {"sweep_dir": str(sweep)}
    for q in ("1", "4"):
        rows = t[t["qos_queues"].astype(str) == q].sort_values("senders")
        s = build(tomllib.loads((Path(rows["run_dir"].iloc[0]) / "scenario.toml").read_text()))
        answers[f"class_limit_bytes_{q}q"] = s.switch.class_limits(s.link.mtu)[0]
        answers[f"measured_onset_{q}q"] = int(rows[rows["bottleneck_drops"] > 0]["senders"].iloc[0])
        answers[f"goodput_16_{q}q"] = float(rows[rows["senders"] == 16]["goodput_mbps"].mean())
    answers["would_spreading_classes_help"] = (
        "yes: each class queue has its own quarter of the buffer, so servers spread over four classes "
        "can use the whole buffer again, though each class still holds only a quarter")
    return answers


if __name__ == "__main__":
    from incast.labs import solution_main
    solution_main(solve)
