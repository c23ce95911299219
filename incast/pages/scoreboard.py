"""The scoreboard: every claim of the papers' figures, judged on the kept results.

For each claim of each figure in figures/: the paper's words, the paper's number where
its text gives one, ours (bytes over time, its interval, runs) from the figure's kept result
(docs/figure-results/NAME/, as `incast figure NAME` wrote it), the verdict of this
checkout's judge, and, for a declared divergence, what the figure file says of its
mechanism, and the claim on the median of runs beside it. The counts head the page.

``python -m incast.pages.scoreboard`` writes docs/scoreboard.md; ``--check`` exits 1
where the page is not what the kept results and the judge give now (the test suite runs
it, so the page cannot drift from the results).
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from incast.campaign import figure, judge, kept, quote, statistic
from incast.constants import DOCS_DIR

PAGE = DOCS_DIR / "scoreboard.md"
VERDICTS = ("holds", "does not hold", "undecided", "not testable", "no kept result")

# How the numbers table names a metric that is not a rate (the metric's name otherwise).
METRIC_UNITS = {"rto_events_per_sender_per_100_blocks": " RTOs a server per 100 blocks (R)",
                "timeouts_per_block": " timeouts a block"}


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def rows() -> list[dict]:
    """One row per claim of every figure."""
    out = []
    for name in figure.known():
        fig = figure.load(name)
        result = kept.result(name)
        verdicts = judge.judge(fig, result[0]) if result else None
        pairs = statistic.compare(fig, result[0]) if result else None
        numbers = {(n.series, n.x): n.value for n in fig.paper_numbers}
        for i, c in enumerate(fig.claims):
            v = verdicts[i] if verdicts else {"verdict": "no kept result", "detail": ""}
            paper = numbers.get((c.series, c.at)) if c.at is not None else None
            meta = result[1] if result else {}
            why_stale = kept.stale(fig, meta) if result else ""
            out.append({"figure": name, "paper": fig.paper, "figure_title": fig.figure, "index": i,
                        "claim": c.text, "paper_number": paper, "verdict": v["verdict"],
                        "ours": v["detail"],
                        "divergence": quote.fill(fig, c.divergence, *(result or (None, None))),
                        "undecided": quote.fill(fig, c.undecided, *(result or (None, None))),
                        "last_look": bool(result) and judge.undecided_at_last_look(fig, result[0], c),
                        "kept": ("quick" if meta.get("quick") else "full") if result else None,
                        "kept_runs": len(result[0]) if result else 0, "stale": why_stale,
                        "median": pairs[i].verdicts[0] if pairs else None,
                        "pooled_wants_runs": bool(pairs) and wants_runs(pairs[i]),
                        "on_the_median": on_the_median(pairs[i]) if pairs else ""})
    return out


def wants_runs(pair: statistic.ClaimPair) -> bool:
    """Undecided on bytes over time only for want of runs: its point has fewer than the
    POOLED_MIN_RUNS the statistic decides from."""
    return pair.verdicts[1] == "undecided" and pair.point is not None and pair.point.runs < judge.POOLED_MIN_RUNS


def on_the_median(pair: statistic.ClaimPair) -> str:
    """The claim on the median of runs, beside the verdict: its verdict, and its value
    [interval] at the point that shows it (the one whose state differs from bytes over
    time's, else the one nearest the bound)."""
    p = pair.point
    if p is None:
        return pair.verdicts[0]
    return f"{pair.verdicts[0]}: {p.where} {p.cell(0)}, n={p.runs}"


NUMBER_VERDICTS = ("agrees", "differs", "undecided", "not testable", "no kept result")


def number_rows() -> list[dict]:
    """One row per number the papers state (a figure's paper_numbers), judged on its
    kept result (incast.campaign.judge.number_verdict)."""
    out = []
    for name in figure.known():
        fig = figure.load(name)
        result = kept.result(name)
        for i, n in enumerate(fig.paper_numbers):
            v = judge.number_verdict(fig, result[0], n) if result else \
                {"verdict": "no kept result", "ours": None, "lo": None, "hi": None, "runs": 0, "ratio": None,
                 "statistic": None}
            m = judge.number_verdict(fig, result[0], n, judge.MEDIAN) if result else None
            out.append({"figure": name, "paper": fig.paper, "index": i, "series": n.series, "x": n.x,
                        "x_name": fig.x, "metric": n.metric, "paper_number": n.value, "source": n.source,
                        "divergence": quote.fill(fig, n.divergence, *(result or (None, None))),
                        "undecided": quote.fill(fig, n.undecided, *(result or (None, None))),
                        "on_the_median": _number_on_the_median(v, m),
                        **{k: v[k] for k in ("verdict", "ours", "lo", "hi", "runs", "ratio", "statistic")}})
    return out


def _number_on_the_median(v: dict, m: dict | None) -> str:
    """The number on the median of runs beside its verdict on bytes over time (empty
    where the number is a count, judged on the median already)."""
    if m is None or v["statistic"] != judge.POOLED or m["ours"] is None:
        return ""
    return f"{m['verdict']}: {m['ours']:g} [{m['lo']:g}-{m['hi']:g}]"


def page() -> str:
    r = rows()
    numbers = number_rows()
    number_counts = Counter(x["verdict"] for x in numbers)
    counts = Counter(x["verdict"] for x in r)
    declared = sum(1 for x in r if x["divergence"])
    lines = ["# Scoreboard: the papers' claims and numbers, judged", "",
             "Made by `python -m incast.pages.scoreboard` from the figures' kept results "
             "(`docs/figure-results/`, written by `incast figure NAME`) and this checkout's judge "
             "([how a claim is judged](figures.md)); the test suite checks that it is current. "
             "A claim the testbed does not reproduce is a declared divergence in its figure file.", "",
             f"**{len(r)} claims:** " + ", ".join(f"{counts.get(v, 0)} {v}" for v in VERDICTS)
             + f"; {declared} declared divergences; "
             f"{len({x['figure'] for x in r if x['stale']})} figures' kept results are stale "
             "(made with settings the figure no longer has). Whether today's code still gives each kept "
             "result is checked by fresh runs where its claims are decided "
             "([kept results checked by what the code does](figures.md#kept-results-checked-by-what-the-code-does)).", "",
             "A goodput claim's verdict rests on the papers' own statistic, all the runs' bytes over their "
             "time, with its interval over runs, from 10 runs a point (a count that is not a rate, on the "
             "median of runs); the undecided for want of runs: "
             f"{sum(1 for x in r if x['pooled_wants_runs'])}. Beside it, the claim on the median of runs "
             "([median or bytes over time](figures.md#median-or-bytes-over-time)): "
             + ", ".join(f"{n} {v}" for v, n in Counter(x["median"] for x in r if x["median"]).most_common())
             + ".",
             "",
             "| figure | claim (the paper) | paper's number | ours: bytes over time [interval, runs] | verdict | "
             "on the median | kept result |", "|---|---|---|---|---|---|---|"]
    for x in r:
        number = f"{x['paper_number']:g} Mbit/s" if x["paper_number"] is not None else ""
        kept_what = f"{x['kept']}, {x['kept_runs']} runs" if x["kept"] else "none"
        if x["stale"]:
            kept_what += f"; stale: {x['stale']}"
        verdict = x["verdict"] + (" (declared divergence)" if x["divergence"] else "")
        if x["undecided"] and x["verdict"] == "undecided" and x["last_look"]:
            verdict += " at the last look (declared)"
        lines.append(f"| [`{x['figure']}`](figure-catalog.md#{x['figure']}) | {_cell(x['claim'])} | {number} | "
                     f"{_cell(x['ours'])} | {verdict} | {_cell(x['on_the_median'])} | {kept_what} |")
    lines += ["", "## The papers' numbers", "",
              "Every number a paper's text states about a result a figure runs, beside ours: a goodput's "
              "bytes over time over the point's faithful runs with its interval over runs (from 10 runs, as "
              "a claim's), a count that is not a rate on the median of runs with its interval, and a "
              "goodput on the median beside it. Ours agrees where that interval lies within a "
              "tenth of the link rate of the paper's number or within a factor of 1.5 of it, whichever is "
              "wider (a count that is not a rate: the factor alone), and differs where it lies wholly "
              "outside ([why this band](figures.md#the-papers-numbers)).", "",
              f"**{len(numbers)} numbers:** " + ", ".join(f"{number_counts.get(v, 0)} {v}" for v in NUMBER_VERDICTS)
              + f"; {sum(1 for x in numbers if x['divergence'])} declared divergences.", "",
              "| figure | curve | at | paper | ours: bytes over time (a count: median) [interval, runs] | ratio | "
              "verdict | on the median | the paper's words |",
              "|---|---|---|---|---|---|---|---|---|"]
    for x in numbers:
        unit = " Mbit/s" if x["metric"].endswith("_mbps") else METRIC_UNITS.get(x["metric"], f" ({x['metric']})")
        ours = (f"{x['ours']:g} [{x['lo']:g}-{x['hi']:g}, {x['runs']}]" if x["ours"] is not None else "")
        verdict = x["verdict"] + (" (declared divergence)" if x["divergence"] else "")
        if x["undecided"] and x["verdict"] == "undecided" and x["runs"] >= judge.REPEAT_STEPS[-1]:
            verdict += " at the last look (declared)"
        ratio = f"{x['ratio']:g}" if x["ratio"] is not None else ""
        lines.append(f"| [`{x['figure']}`](figure-catalog.md#{x['figure']}) | `{x['series']}` | "
                     f"{x['x_name']} {x['x']:g} | {x['paper_number']:g}{unit} | {ours} | {ratio} | {verdict} | "
                     f"{_cell(x['on_the_median'])} | {_cell(x['source'])} |")
    lines += ["", "## Declared divergences", ""]
    for x in r:
        if x["divergence"]:
            lines += [f"- **`{x['figure']}`**, \u201c{_cell(x['claim'])}\u201d: {_cell(x['divergence'])}"]
        if x["undecided"]:
            lines += [f"- **`{x['figure']}`**, \u201c{_cell(x['claim'])}\u201d, undecided at the judge's last "
                      f"look: {_cell(x['undecided'])}"]
    for x in numbers:
        if x["divergence"]:
            lines += [f"- **`{x['figure']}`**, the paper's {x['paper_number']:g} for `{x['series']}` at "
                      f"{x['x_name']} {x['x']:g}: {_cell(x['divergence'])}"]
        if x["undecided"]:
            lines += [f"- **`{x['figure']}`**, the paper's {x['paper_number']:g} for `{x['series']}` at "
                      f"{x['x_name']} {x['x']:g}, undecided at the judge's last look: {_cell(x['undecided'])}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m incast.pages.scoreboard", description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/scoreboard.md is not current")
    args = ap.parse_args(argv)
    text = page()
    if args.check:
        current = PAGE.read_text() if PAGE.is_file() else ""
        if current != text:
            print(f"{PAGE} is not current: python -m incast.pages.scoreboard", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {Path(PAGE)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
