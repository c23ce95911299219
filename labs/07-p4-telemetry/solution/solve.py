"""Lab 7's reference solution: the testbed's own postcards and sampling, the run of
step 4, and the microbursts found in it (by the rule check.py applies).

    python3 labs/07-p4-telemetry/solution/solve.py OUT_DIR   (writes OUT_DIR/answers.toml)
"""
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[3] / "p4src" / "incast.p4"
RUN = ["--switch", "bmv2", "--link-rate", "10Mbit", "--senders", "8", "--sru", "8KiB", "--buffer", "32KiB",
       "--rto-min", "200ms", "--cc", "reno", "--telemetry", "--telemetry-sample", "above:16KiB"]


def solve(out: Path, blocks: int = 20) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(SOURCE, out / "incast.p4")
    run = out / "bursts"
    subprocess.run([sys.executable, "-m", "incast", "run", *RUN, "--blocks", str(blocks), "--out", str(run)], check=True,
                   capture_output=True)
    from incast import labs
    bursts, port, sent = labs.get(7).module("check").bursts_of(run)   # the handout's rule
    return {"program": str(out / "incast.p4"), "run_dir": str(run), "bursts": int(len(bursts)),
            "longest_burst_ms": round(float(bursts["duration_us"].max()) / 1000, 3),
            "peak_bytes": int(bursts["peak_bytes"].max()),
            "postcard_share": round(float(bursts["records"].sum() / sent), 4),
            "why_above": "below the threshold the queue is quiet and nothing of interest happens, so the "
                         "postcards of packets that found it above are exactly the bursts"}


if __name__ == "__main__":
    from incast.labs import solution_main
    solution_main(solve)
