"""Checks lab 4's answers against the student's own sweep (incast lab check 4)."""
import tomllib
from pathlib import Path

import pandas as pd

from incast.labs import close, run_dir
from incast.scenario import build


def check(answers: dict, lab) -> list[str]:
    problems: list[str] = []
    sweep = run_dir(answers, "sweep_dir", problems)
    if sweep is None:
        return problems
    t = pd.read_parquet(sweep / "sweep.parquet")
    if "qos_queues" not in t or not {"1", "4"} <= set(t["qos_queues"].astype(str)):
        problems.append("sweep_dir: the sweep must vary qos_queues over 1 and 4 (--grid qos_queues=1,4)")
        return problems
    for q in ("1", "4"):
        rows = t[t["qos_queues"].astype(str) == q].sort_values("senders")
        run = Path(rows["run_dir"].dropna().iloc[0])
        s = build(tomllib.loads((run / "scenario.toml").read_text()))
        limit = s.switch.class_limits(s.link.mtu)[0]
        if answers.get(f"class_limit_bytes_{q}q") != limit:
            problems.append(f"class_limit_bytes_{q}q: {answers.get(f'class_limit_bytes_{q}q')} is not the "
                            f"servers' class queue limit with {q} queue(s): see bfifo limit in {run}/switch.tc")
        dropping = rows[rows["bottleneck_drops"] > 0]
        onset = int(dropping["senders"].iloc[0]) if len(dropping) else None
        if onset is None:
            problems.append(f"measured_onset_{q}q: no run dropped with {q} queue(s); add more servers")
        elif answers.get(f"measured_onset_{q}q") != onset:
            problems.append(f"measured_onset_{q}q: {answers.get(f'measured_onset_{q}q')} is not the fewest "
                            f"servers with bottleneck_drops > 0 in your sweep with {q} queue(s)")
        at16 = rows[rows["senders"] == 16]["goodput_mbps"]
        if not len(at16):
            problems.append("goodput_16_*: your sweep has no 16-server run")
        elif not close(answers.get(f"goodput_16_{q}q"), float(at16.mean())):
            problems.append(f"goodput_16_{q}q: {answers.get(f'goodput_16_{q}q')} is not your sweep's goodput "
                            f"at 16 servers with {q} queue(s)")
    why = str(answers.get("would_spreading_classes_help", "")).lower()
    if len(why) < 20 or not any(w in why for w in ("share", "quarter", "each class", "own", "buffer", "limit")):
        problems.append("would_spreading_classes_help: think of how much buffer each class queue has, and "
                        "who else is in it")
    return problems
