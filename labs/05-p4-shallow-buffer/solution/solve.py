"""Lab 5's reference solution: the testbed's own admit() and release().

    python3 labs/05-p4-shallow-buffer/solution/solve.py OUT_DIR   (writes OUT_DIR/answers.toml)
"""
import shutil
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[3] / "p4src" / "incast.p4"


def solve(out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(SOURCE, out / "incast.p4")
    return {"program": str(out / "incast.p4"),
            "why_count_bytes_in_p4": "bmv2's queues count packets, but a switch buffer holds bytes: "
                                     "a 32 KB buffer holds 21 full frames or hundreds of ACKs"}


if __name__ == "__main__":
    from incast.labs import solution_main
    solution_main(solve)
