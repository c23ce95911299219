"""Lab 8's reference solution: build the traced model, record the burst of step 2 and
read its first refusal (by the rule check.py applies).

    python3 labs/08-rtl-waveform/solution/solve.py OUT_DIR   (writes OUT_DIR/answers.toml)
"""
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def solve(out: Path) -> dict:
    from incast.dataplane.rtl import refusals
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(["make", "-C", str(REPO / "rtl" / "harness"), "NPORTS=4", "TRACE=1"], check=True,
                   capture_output=True)
    vcd = out / "burst.vcd"
    subprocess.run([str(REPO / "build" / "rtl" / "sim-p4-l1-c8-b12-t1" / "incast_switch_sim"), "--burst", "4",
                    "--limit", "6000", "--trace", str(vcd)], check=True, capture_output=True)
    first = refusals(vcd)[0]
    return {"vcd": str(vcd), "first_drop_cycle": first["cycle"], "queue_bytes": first["queue_bytes"],
            "frame_bytes": first["frame_bytes"], "ingress_port": first["ingress_port"],
            "why": "the queue held d_occ bytes and with the frame it would exceed its 6000-byte limit, "
                   "while the frame before still fit"}


if __name__ == "__main__":
    from incast.labs import solution_main
    solution_main(solve)
