"""Checks lab 8: the first refusal the student read off their own waveform."""
import shutil
from pathlib import Path

from incast.labs import sentence


def missing() -> list[str]:
    return [] if shutil.which("verilator") else ["verilator (scripts/setup.sh installs it)"]


def check(answers: dict, lab) -> list[str]:
    from incast.dataplane.rtl import refusals
    problems: list[str] = []
    vcd = Path(str(answers.get("vcd", "")))
    if not answers.get("vcd") or not vcd.is_file():
        return [f"vcd: {answers.get('vcd')!r} is not a file; give the path of your waveform (step 2)"]
    try:
        drops = refusals(vcd)
    except (ValueError, OSError) as e:
        return [f"vcd: cannot read it as the switch's waveform: {e}"]
    if not drops:
        return ["vcd: the switch refused no frame in this waveform: record the burst of step 2"]
    first = drops[0]
    for key in ("first_drop_cycle", "queue_bytes", "frame_bytes", "ingress_port"):
        truth = first["cycle" if key == "first_drop_cycle" else key]
        if answers.get(key) != truth:
            where = {"first_drop_cycle": "`now` where `ps` is 3 and `admit_ok` 0 for the first time",
                     "queue_bytes": "`d_occ` in that cycle", "frame_bytes": "`flen` in that cycle",
                     "ingress_port": "`sel` + 1 in that cycle"}[key]
            problems.append(f"{key}: {answers.get(key)} is not {where}")
    sentence(answers, "why", ("limit", "room", "exceed", "more than", "full", "above"),
             "what would the queue hold with the frame, against what it may hold?", problems)
    return problems
