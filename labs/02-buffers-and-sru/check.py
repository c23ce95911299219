"""Checks lab 2's answers against the student's own sweep (incast lab check 2)."""
import math

from incast.labs import onset_and_goodput, sentence, sweep_table

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
    t = sweep_table(answers, "buffer", ["32KiB", "128KiB"], problems)
    if t is None:
        return problems
    for label in ("32KiB", "128KiB"):
        onset_and_goodput(answers, t[t["buffer"].astype(str) == label], label, f"at {label}", problems)
    sentence(answers, "why_measured_is_not_below", ("drain", "rate", "leave", "serve", "send", "time"),
             "think of what the port does while the windows arrive", problems)
    return problems
