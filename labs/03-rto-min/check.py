"""Checks lab 3's answers against the student's own sweep (incast lab check 3)."""
import json
from pathlib import Path

import pandas as pd

from incast.labs import close, run_dir


def check(answers: dict, lab) -> list[str]:
    problems: list[str] = []
    sweep = run_dir(answers, "sweep_dir", problems)
    if sweep is None:
        return problems
    t = pd.read_parquet(sweep / "sweep.parquet")
    if "rto_min" not in t or not {"200ms", "min"} <= set(t["rto_min"].astype(str)):
        problems.append("sweep_dir: the sweep must vary rto_min over at least 200ms and min")
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
    why = str(answers.get("why_the_floor", "")).lower()
    if len(why) < 20 or not any(w in why for w in ("jiff", "tick", "hz", "timer")):
        problems.append("why_the_floor: which clock does a stock kernel run TCP's retransmission timer on?")
    return problems
