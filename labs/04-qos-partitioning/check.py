"""Checks lab 4's answers against the student's own sweep (incast lab check 4)."""
import tomllib
from pathlib import Path

from incast.labs import onset_and_goodput, sentence, sweep_table
from incast.scenario import build


def check(answers: dict, lab) -> list[str]:
    problems: list[str] = []
    t = sweep_table(answers, "qos_queues", ["1", "4"], problems)
    if t is None:
        return problems
    for q in ("1", "4"):
        rows = t[t["qos_queues"].astype(str) == q].sort_values("senders")
        run = Path(rows["run_dir"].dropna().iloc[0])
        s = build(tomllib.loads((run / "scenario.toml").read_text()))
        limit = s.switch.class_limits(s.link.mtu)[0]
        if answers.get(f"class_limit_bytes_{q}q") != limit:
            problems.append(f"class_limit_bytes_{q}q: {answers.get(f'class_limit_bytes_{q}q')} is not the "
                            f"servers' class queue limit with {q} queue(s): see bfifo limit in {run}/switch.tc")
        onset_and_goodput(answers, rows, f"{q}q", f"with {q} queue(s)", problems)
    sentence(answers, "would_spreading_classes_help", ("share", "quarter", "each class", "own", "buffer", "limit"),
             "think of how much buffer each class queue has, and who else is in it", problems)
    return problems
