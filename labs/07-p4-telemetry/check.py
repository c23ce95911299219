"""Checks lab 7: the student's postcards and above-threshold sampling pass the packet
tests, and the microbursts they found match what their run's postcards show."""
import json
import tomllib

import pandas as pd

from incast.labs import close, p4_missing, p4_packet_tests, p4_program, run_dir, sentence
from incast.measure.telemetry import microbursts

TESTS = "telemetry_carries_the_packets_queue_values or telemetry_above_a_threshold"
FRAME_WIRE_BYTES = 1538     # a full frame on the wire: 1514 + preamble, FCS, gap


def missing() -> list[str]:
    return p4_missing()


def bursts_of(run) -> tuple[pd.DataFrame, str, int]:
    """The bottleneck port's microbursts in a run (the handout's rule), its name and
    the packets it sent."""
    summary = json.loads((run / "summary.json").read_text())
    port = summary["bottleneck_port"]
    gap_us = 2 * FRAME_WIRE_BYTES * 8 / summary["link_mbps"]
    table = pd.read_parquet(run / "telemetry.parquet")
    queues = pd.read_parquet(run / "queues.parquet")
    return microbursts(table, port, gap_us), port, int(queues[queues["port"] == port]["sent_packets"].sum())


def check(answers: dict, lab) -> list[str]:
    problems: list[str] = []
    program, found = p4_program(answers, 7, "hdr.tel.hop_latency = meta.deq_timedelta")
    problems += found
    if program is not None:
        problems += p4_packet_tests(program, TESTS)
    sentence(answers, "why_above", ("quiet", "below", "only", "empty", "nothing", "idle", "burst"),
             "what happens at the port while its queue is under the threshold?", problems)
    run = run_dir(answers, "run_dir", problems)
    if run is None:
        return problems
    scenario = tomllib.loads((run / "scenario.toml").read_text())
    if scenario.get("dataplane") != "bmv2" or not str(scenario.get("telemetry", {}).get("sample", "")).startswith("above:"):
        problems.append("run_dir: the run must be on bmv2 with --telemetry --telemetry-sample above:16KiB (step 4)")
        return problems
    if not (run / "telemetry.parquet").is_file():
        problems.append("run_dir: the run recorded no telemetry: run it again with --telemetry")
        return problems
    bursts, port, sent = bursts_of(run)
    if not len(bursts):
        problems.append(f"run_dir: no postcard came from {port}: did the queue ever pass 16 KiB? (more servers)")
        return problems
    if answers.get("bursts") != len(bursts):
        problems.append(f"bursts: {answers.get('bursts')} is not how many stretches {port}'s rows make when "
                        "split at gaps over 2460.8 us")
    longest = float(bursts["duration_us"].max()) / 1000
    if not close(answers.get("longest_burst_ms"), longest, rel=0.02, absolute=0.01):
        problems.append(f"longest_burst_ms: {answers.get('longest_burst_ms')} is not the longest burst "
                        "(first row to last, in ms)")
    if not close(answers.get("peak_bytes"), float(bursts["peak_bytes"].max()), absolute=1):
        problems.append(f"peak_bytes: {answers.get('peak_bytes')} is not the largest `bytes` of {port}'s rows")
    share = bursts["records"].sum() / sent if sent else 0.0
    if not close(answers.get("postcard_share"), share, rel=0.02, absolute=0.001):
        problems.append(f"postcard_share: {answers.get('postcard_share')} is not {port}'s enqueue rows over its "
                        "sent_packets")
    return problems
