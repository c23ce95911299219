"""Checks lab 3's answers against the student's own sweep (incast lab check 3)."""
import json
from pathlib import Path

from incast.labs import close, sentence, sweep_table


def check(answers: dict, lab) -> list[str]:
    problems: list[str] = []
    t = sweep_table(answers, "rto_min", ["200ms", "min"], problems)
    if t is None:
        return problems
    by = t.groupby(t["rto_min"].astype(str))
    for label, key in (("200ms", "goodput_200ms"), ("min", "goodput_min")):
        if not close(answers.get(key), float(by["goodput_mbps"].mean()[label])):
            problems.append(f"{key}: {answers.get(key)} is not your sweep's goodput_mbps at rto_min {label}")
    floor = int(by["rto_floor_us"].first()["min"])
    if answers.get("floor_us_min") != floor:
        problems.append(f"floor_us_min: {answers.get('floor_us_min')} is not rto_floor_us of your rto_min=min run")
    run = Path(t["run_dir"].dropna().iloc[0])
    hz = json.loads((run / "environment.json").read_text())["hz"]
    if answers.get("hz") != hz:
        problems.append(f"hz: {answers.get('hz')} is not this kernel's (environment.json of any run)")
    sentence(answers, "why_the_floor", ("jiff", "tick", "hz", "timer"),
             "which clock does a stock kernel run TCP's retransmission timer on?", problems)
    return problems
