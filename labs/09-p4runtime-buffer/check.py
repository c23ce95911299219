"""Checks lab 9: the run was on bmv2 programmed over P4Runtime, the student's client
took the switch over, and the block at which the deeper buffer took effect, and the
goodput and timeouts before and after it, are what the run's own tables show; the
queue's occupancy the client read over P4Runtime stayed within the old limit before
the change and went past it after."""
import json
import tomllib

import pandas as pd

from incast.dataplane import bmv2
from incast.labs import close, p4_missing, run_dir, sentence
from incast.report import explain

SIDE_BLOCKS = 3         # blocks each side of the change, at least: a comparison needs some
# What a register read may see above the most the telemetry reported: one frame (the
# largest link MTU with its header), as a report can be lost or a packet admitted
# between two reports.
READ_SLACK = 9018


def missing() -> list[str]:
    why = p4_missing()
    if not why and bmv2.runtime_missing():
        why.append(f"P4Runtime ({bmv2.runtime_missing()}; scripts/install-p4.sh builds simple_switch_grpc, "
                   "and finsy is in requirements.txt)")
    elif not why and not bmv2.queue_config_supported():
        why.append("register reads over P4Runtime (simple_switch_grpc built without scripts/p4-patches/: "
                   "run scripts/install-p4.sh --grpc again)")
    return why


def change_of(run) -> tuple[float | None, int, str, int]:
    """(when the client's queue first held more than its configured limit, in us on the
    blocks' time axis (None if it never did), the block that was going then (-1 if
    none), the port, that limit): the first sign of the deeper buffer."""
    summary = json.loads((run / "summary.json").read_text())
    port = summary["bottleneck_port"]
    queues = pd.read_parquet(run / "queues.parquet")
    old = int(queues[(queues["port"] == port) & (queues["queue"] == 0)]["limit"].iloc[0])
    tel = pd.read_parquet(run / "telemetry.parquet")
    deeper = tel[(tel["port"] == port) & (tel["bytes"] > old)]
    if not len(deeper):
        return None, -1, port, old
    t = float(deeper["time_us"].min())
    blocks = pd.read_parquet(run / "blocks.parquet")
    going = blocks[(blocks["rep"] == 0) & (blocks["start_us"] <= t)]
    return t, int(going["block"].max()) if len(going) else -1, port, old


def before_after(run, change_block: int) -> dict:
    """Goodput (the blocks' bytes over their summed durations) and timeouts (incast
    explain's, over the measured blocks) before and after the change block."""
    blocks = pd.read_parquet(run / "blocks.parquet")
    blocks = blocks[blocks["rep"] == 0]
    timeouts = explain.explain(run).timeouts
    timeouts = timeouts[timeouts["measured"] & (timeouts["rep"] == 0)]
    out = {}
    for side, keep in (("before", lambda b: b < change_block), ("after", lambda b: b > change_block)):
        these = blocks[keep(blocks["block"])]
        out[f"blocks_{side}"] = len(these)
        out[f"goodput_{side}_mbps"] = float(these["bytes"].sum() * 8 / (these["duration_ms"].sum() * 1000)) \
            if len(these) else 0.0
        out[f"timeouts_{side}"] = int(keep(timeouts["block"]).sum())
    return out


def most_held(run, port: str) -> int:
    """The most the client's queue held in the run, as its telemetry reported it."""
    tel = pd.read_parquet(run / "telemetry.parquet")
    return int(tel[tel["port"] == port]["bytes"].max())


def took_over(run) -> bool:
    """Whether the testbed's own P4Runtime client lost the primary role during the run."""
    counts = json.loads((run / "switch.p4rt-messages.json").read_text())
    return counts["total"].get("arbitration", {}).get("lost_primary", 0) > 0


def check(answers: dict, lab) -> list[str]:
    problems: list[str] = []
    sentence(answers, "why_peak_before", ("limit", "drop", "admi"),
             "what does the switch do with a packet that would take the queue past its limit?", problems)
    sentence(answers, "why_higher_election_id", ("primary", "highest", "master", "arbitration"),
             "which client's writes does a P4Runtime switch accept?", problems)
    run = run_dir(answers, "run_dir", problems)
    if run is None:
        return problems
    scenario = tomllib.loads((run / "scenario.toml").read_text())
    if scenario.get("dataplane") != "bmv2" or not (run / "switch.p4rt-messages.json").is_file():
        problems.append("run_dir: the run must be on bmv2 with its switch programmed over P4Runtime "
                        "(--switch bmv2, with simple_switch_grpc on PATH and INCAST_BMV2_CONTROL unset)")
        return problems
    if not (run / "telemetry.parquet").is_file() or not (run / "capture").is_dir():
        problems.append("run_dir: the run needs --telemetry (the queue's bytes say when your change took "
                        "effect) and --capture (incast explain finds the timeouts): run it again with both")
        return problems
    if scenario.get("workload", {}).get("repetitions", 1) != 1:
        problems.append("run_dir: make one repetition (each starts a new connection; the change is in one)")
        return problems
    if not took_over(run):
        problems.append("run_dir: the testbed's P4Runtime client stayed the switch's primary all run "
                        "(switch.p4rt-messages.json): your client never took over; bid an election id "
                        "above the testbed's (10) while the run goes")
    t, block, port, old = change_of(run)
    if t is None:
        problems.append(f"change_block: {port}'s queue never held more than its {old} bytes: the deeper "
                        "buffer never took effect (did your client modify both queue_config entries of "
                        "that queue, while the run was going?)")
        return problems
    peaks = (answers.get("occupancy_peak_before_bytes"), answers.get("occupancy_peak_after_bytes"))
    if not all(type(v) is int and v >= 0 for v in peaks):
        problems.append("occupancy_peak_before_bytes, occupancy_peak_after_bytes: the most occ_bytes your "
                        "client read for the queue before and after the change (whole bytes)")
    elif not old // 2 < peaks[0] <= old:
        problems.append(f"occupancy_peak_before_bytes: {peaks[0]} is not the peak of a queue limited to "
                        f"{old} bytes that fills to its limit in every collapsing block (a read every "
                        "50 ms finds it above half of it; 0 means the client never saw it hold anything: "
                        "read occ_bytes at the queue's index, port * 8 + class)")
    elif not old < peaks[1] <= most_held(run, port) + READ_SLACK:
        problems.append(f"occupancy_peak_after_bytes: {peaks[1]} is not above the old limit ({old} bytes) "
                        f"and within the most the queue held ({most_held(run, port)} bytes, "
                        "telemetry.parquet): did your client read the queue after the change?")
    if answers.get("change_block") != block:
        problems.append(f"change_block: {answers.get('change_block')} is not the block (blocks.parquet) "
                        f"going on when {port}'s queue first held more than {old} bytes (telemetry.parquet)")
    sides = before_after(run, block)
    if min(sides["blocks_before"], sides["blocks_after"]) < SIDE_BLOCKS:
        problems.append(f"run_dir: the change came at block {block}: {sides['blocks_before']} measured blocks "
                        f"before it and {sides['blocks_after']} after; make it half-way (--after-bytes)")
        return problems
    for side in ("before", "after"):
        key = f"goodput_{side}_mbps"
        if not close(answers.get(key), sides[key]):
            problems.append(f"{key}: {answers.get(key)} is not the goodput of the blocks {side} block {block} "
                            "(their bytes x 8 over the sum of their durations)")
        key = f"timeouts_{side}"
        if answers.get(key) != sides[key]:
            problems.append(f"{key}: {answers.get(key)} is not how many timeouts incast explain finds in the "
                            f"measured blocks {side} block {block} (timeouts.parquet, column block)")
    return problems
