"""Lab 6's reference solution: the testbed's own PAUSE decisions, and the headroom.

    python3 labs/06-p4-pause/solution/solve.py OUT_DIR   (writes OUT_DIR/answers.toml)
"""
import shutil
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[3] / "p4src" / "incast.p4"


def solve(out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(SOURCE, out / "incast.p4")
    return {"program": str(out / "incast.p4"),
            "headroom_bytes": 8 * 2 * 1514,
            "why_headroom": "frames already on the wire, and those a sender starts before the PAUSE "
                            "reaches it and it reacts, still arrive after the switch decides to pause"}


if __name__ == "__main__":
    from incast.labs import solution_main
    solution_main(solve)
