"""Lab 2's reference solution: the sweep, then the answers from it.

    python3 labs/02-buffers-and-sru/solution/solve.py OUT_DIR   (writes OUT_DIR/answers.toml)
"""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pandas as pd

LAB = Path(__file__).resolve().parent.parent
SENDERS = "1,2,3,4,6,8,10,12,16"


def solve(out: Path, senders: str = SENDERS, blocks: int = 10) -> dict:
    spec = importlib.util.spec_from_file_location("lab2_check", LAB / "check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    sweep = out / "lab2"
    subprocess.run([sys.executable, "-m", "incast", "sweep", str(LAB.parent.parent / "scenarios/fast08-collapse.toml"),
                    "--link-rate", "100Mbit", "--rto-min", "20ms", "--sru", "32KiB", "--blocks", str(blocks),
                    "--grid", f"senders={senders}", "--grid", "buffer=32KiB,128KiB", "--out", str(sweep)],
                   check=True, capture_output=True)
    t = pd.read_parquet(sweep / "sweep.parquet")
    answers = {"sweep_dir": str(sweep), "predicted_onset_32KiB": check.predicted(32 * 1024),
               "predicted_onset_128KiB": check.predicted(128 * 1024)}
    for label in ("32KiB", "128KiB"):
        rows = t[t["buffer"].astype(str) == label].sort_values("senders")
        answers[f"measured_onset_{label}"] = int(rows[rows["bottleneck_drops"] > 0]["senders"].iloc[0])
        answers[f"goodput_16_{label}"] = float(rows[rows["senders"] == 16]["goodput_mbps"].mean())
    answers["why_measured_is_not_below"] = ("the port drains at the link rate while the windows arrive, so "
                                            "somewhat more than the buffer can be sent before it overflows")
    return answers


if __name__ == "__main__":
    from incast.labs import solution_main
    solution_main(solve)
