"""Checks lab 2's answers against the student's own sweep (incast lab check 2)."""
import math

import pandas as pd

from incast.labs import close, run_dir

FIRST_WINDOW = 10 * 1514      # bytes on the wire: 10 full segments
SRU = 32 * 1024


def predicted(buffer: int) -> int:
    """The fewest servers whose first windows exceed the buffer."""
    return math.floor(buffer / min(SRU, FIRST_WINDOW)) + 1


def check(answers: dict, lab) -> list[str]:
    problems: list[str] = []
    for label, size in (("32KiB", 32 * 1024), ("128KiB", 128 * 1024)):
        want = predicted(size)
        got = answers.get(f"predicted_onset_{label}")
        if not isinstance(got, int) or abs(got - want) > 1:
            problems.append(f"predicted_onset_{label}: {got} is not what the first windows give: how many "
                            f"windows of {FIRST_WINDOW} bytes fit in {size} bytes, plus one?")
    sweep = run_dir(answers, "sweep_dir", problems)
    if sweep is None:
        return problems
    t = pd.read_parquet(sweep / "sweep.parquet")
    if "buffer" not in t or not {"32KiB", "128KiB"} <= set(t["buffer"].astype(str)):
        problems.append("sweep_dir: the sweep must vary buffer over 32KiB and 128KiB (--grid buffer=32KiB,128KiB)")
        return problems
    for label in ("32KiB", "128KiB"):
        rows = t[t["buffer"].astype(str) == label].sort_values("senders")
        dropping = rows[rows["bottleneck_drops"] > 0]
        onset = int(dropping["senders"].iloc[0]) if len(dropping) else None
        if onset is None:
            problems.append(f"measured_onset_{label}: no run of your sweep dropped at {label}; add more senders")
        elif answers.get(f"measured_onset_{label}") != onset:
            problems.append(f"measured_onset_{label}: {answers.get(f'measured_onset_{label}')} is not the fewest "
                            f"servers with bottleneck_drops > 0 in your sweep at {label}")
        at16 = rows[rows["senders"] == 16]["goodput_mbps"]
        if not len(at16):
            problems.append("goodput_16_*: your sweep has no 16-server run")
        elif not close(answers.get(f"goodput_16_{label}"), float(at16.mean())):
            problems.append(f"goodput_16_{label}: {answers.get(f'goodput_16_{label}')} is not your sweep's "
                            f"goodput_mbps at 16 servers and {label}")
    why = str(answers.get("why_measured_is_not_below", "")).lower()
    if len(why) < 20 or not any(w in why for w in ("drain", "rate", "leave", "serve", "send", "time")):
        problems.append("why_measured_is_not_below: think of what the port does while the windows arrive")
    return problems
