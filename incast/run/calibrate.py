"""Calibration: the highest link rate this machine emulates faithfully.

An emulated link holds its rate only as long as the machine's timers and CPUs keep up,
and machines differ by an order of magnitude (a laptop, a cloud VM, a VM inside a
VM). Calibration finds out, for 1, 16 and 64 servers, the highest rate of a ladder at
which short runs of the testbed itself are faithful: every loaded link served at its
rate while backlogged (incast.fidelity), no packet lost outside the switch, and the
workload getting what the link carries:

* 1 server, reads of 200 ms of link time, a 64 KiB buffer: goodput >= 93% of the link
  (the payload limit is 94.1%; each read also waits for its request, 0.3-0.5 ms here,
  which in 50 ms reads alone would leave a margin of tenths of a percent);
* 16 and 64 servers, fixed 50 ms blocks through a buffer that holds them whole (no
  loss, so TCP keeps the port busy): goodput >= 90% of the link.

The highest ladder rate that passes twice, less one step of headroom (incast's bursts
and losses load the machine more than these trials), is the faithful rate. A rate
fails only if it fails twice: one stalled trial must not halve the rate of every run
that follows on this machine. A run with n senders uses the lowest faithful rate of
the counts up to n, so 16 and 64 are tried from where the smaller counts held down,
never above (each count's rate is "for up to this many senders").

It also reports the qdisc watchdog's lateness, the spacing of backlogged dequeues and
the CPU time per forwarded packet seen in those runs. The result is cached per machine
(kernel, CPU model, core count, and the link parameters it depends on) in
/var/cache/incast/calibration, so it runs once; ``incast calibrate --force`` redoes it.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from incast import scenario as scn
from incast.errors import MissingFeature
from incast.measure.calibration import (BUSY_SHARE, CACHE_DIR, LADDER_MBPS, NoFaithfulRate, cache_key,  # noqa: F401
                                        cache_path, cached, describe, faithful_rate, load_line, machine, made_busy,
                                        resolve_auto_rate)
from incast.measure.cpu import others_now
from incast.measure.fidelity import MIN_SERVICE_RATIO, monitor_binary
from incast.run.experiment import run
from incast.vm.guest import kernel_dir

SENDER_COUNTS = (1, 16, 64)
BLOCK_MS = 50           # link time of one block
ONE_SENDER_BLOCK_MS = 200
BLOCKS, WARMUP = 5, 1
ONE_SENDER_GOODPUT = 0.93
MANY_SENDER_GOODPUT = 0.90


def _trial_scenario(senders: int, mbps: int) -> scn.Scenario:
    block = int(mbps * 1e6 / 8 * BLOCK_MS / 1000)
    if senders == 1:
        data = {"link": {"rate": mbps * 1_000_000}, "switch": {"buffer": 64 * 1024},
                "workload": {"kind": "fixed-fragment",
                             "sru": int(mbps * 1e6 / 8 * ONE_SENDER_BLOCK_MS / 1000)}}
    else:
        # A buffer that holds a whole block: the port never drops, so it stays busy.
        data = {"link": {"rate": mbps * 1_000_000}, "switch": {"buffer": 2 * block},
                "workload": {"kind": "fixed-block", "block": max(block, senders * 1448)}}
    data["name"] = f"calibrate-n{senders}-{mbps}M"
    data["topology"] = {"senders": senders}
    data["workload"].update({"blocks": BLOCKS, "warmup": WARMUP})
    data["tcp"] = {"cc": "reno"}
    return scn.build(data)


def _trial(senders: int, mbps: int, workdir: Path) -> dict:
    s = _trial_scenario(senders, mbps)
    out = workdir / s.name
    t = time.monotonic()
    summary = run(s, out, calibrating=True).summary
    f = summary["fidelity"]
    need = ONE_SENDER_GOODPUT if senders == 1 else MANY_SENDER_GOODPUT
    share = summary["goodput_mbps"] / summary["link_mbps"]
    reasons = list(f["reasons"])
    if share < need:
        reasons.append(f"goodput {100 * share:.1f}% of the link (needs {100 * need:.0f}%)")
    links = pd.read_parquet(out / "links.parquet")
    busy = links[links["busy_packets"] >= 50]
    # Packets of the measured blocks (the monitor also saw the warm-up) and their time.
    packets = int(links.loc[links["role"] == "switch", "packets"].sum()) * BLOCKS // (BLOCKS + WARMUP)
    measured_s = BLOCKS * s.block_bytes() * 8 / (summary["goodput_mbps"] * 1e6)
    shutil.rmtree(out, ignore_errors=True)
    return {"senders": senders, "rate_mbps": mbps, "ok": not reasons, "reasons": reasons,
            "goodput_mbps": summary["goodput_mbps"], "min_service_ratio": f["min_service_ratio"],
            "timer_late_us_p99": f.get("timer_late_us_p99"),
            "gap_over_frame_us_p99": float((busy["gap_p99_us"] - busy["frame_us"]).max()) if len(busy) else None,
            "cpu_busy": f.get("cpu_busy"), "cpu_busy_max": f.get("cpu_busy_max"),
            "cpu_contended_max": f.get("cpu_contended_max"), "cpu_run": f.get("cpu_run"),
            "cpu_niced": f.get("cpu_niced"), "cpu_others": f.get("cpu_others"),
            "cpu_others_top": f.get("cpu_others_top"),
            "switch_packets": packets, "measured_s": round(measured_s, 4),
            "seconds": round(time.monotonic() - t, 2)}


def calibrate(log=lambda msg: None, force: bool = False) -> dict:
    """The machine's calibration: from the cache, or measured now (and cached). One made
    beside other work (calibration.made_busy) is measured again once the machine is
    quiet: a busy machine's rates would hold every later run down, or leave none."""
    if not force:
        c = cached()
        if c is not None and not (made_busy(c) and others_now() < BUSY_SHARE):
            return c
        if c is not None:
            log(f"calibrate: the cached calibration was made beside other work ({load_line(c['load'])}); "
                "the machine is quiet now: measuring again")
    if monitor_binary() is None:
        raise MissingFeature("calibration needs the link monitor: run scripts/build-bpf.sh")
    t0 = time.monotonic()
    trials, rates, highest = [], {}, {}
    with tempfile.TemporaryDirectory(prefix="incast-calibrate-") as tmp:
        def trial(n: int, i: int, again: str = "") -> bool:
            r = _trial(n, LADDER_MBPS[i], Path(tmp))
            trials.append(r)
            log(f"calibrate: {n} senders at {LADDER_MBPS[i]} Mbit/s{again}: "
                f"{'faithful' if r['ok'] else 'not faithful: ' + '; '.join(r['reasons'])}")
            return r["ok"]

        def holds(n: int, i: int) -> bool:
            # A rate fails only if it fails twice: one stalled trial must not halve the
            # rate of every run that follows on this machine.
            return trial(n, i) or trial(n, i, " again")

        # Ladder indexes: a larger index is a lower rate. Runs use the lowest faithful
        # rate of all counts up to theirs (faithful_rate), so a count is never tried
        # above what the smaller counts held: that would cost trials and change nothing.
        cap = 0
        for n in SENDER_COUNTS:
            if cap >= len(LADDER_MBPS):                     # nothing held before: nothing will be used
                lo, tested = len(LADDER_MBPS), True
            elif n == SENDER_COUNTS[0]:
                # Bisect (faithfulness falls with the rate): lo holds, hi does not.
                lo, hi = len(LADDER_MBPS), -1
                while lo - hi > 1:
                    mid = (lo + hi) // 2
                    lo, hi = (mid, hi) if holds(n, mid) else (lo, mid)
                tested = True
            else:
                lo, tested = cap, False                     # most likely where the last count held
            # The rate found must hold twice: a noisy pass one step too high would put
            # every later run at the edge.
            while lo < len(LADDER_MBPS):
                if (tested or holds(n, lo)) and trial(n, lo, " again"):
                    break
                lo, tested = lo + 1, False
            cap = max(cap, lo)
            # One step of headroom: incast's bursts and losses load the machine more
            # than these loss-free trials (measured: 16 servers at the highest passing
            # rate, 500 Mbit/s, left their NICs at 94% in the collapse scenario).
            highest[str(n)] = LADDER_MBPS[lo] * 1_000_000 if lo < len(LADDER_MBPS) else 0
            rates[str(n)] = LADDER_MBPS[lo + 1] * 1_000_000 if lo + 1 < len(LADDER_MBPS) else 0
    late = [t["timer_late_us_p99"] for t in trials if t["timer_late_us_p99"] is not None]
    gaps = [t["gap_over_frame_us_p99"] for t in trials if t["gap_over_frame_us_p99"] is not None]
    # The run's own CPU per packet: other work beside calibration is taken out.
    cpu = [t["cpu_run"] * t["measured_s"] * machine()["cpus"] / t["switch_packets"] * 1e6
           for t in trials if t["switch_packets"] and t.get("cpu_run") is not None]

    def median_of(key):
        v = [t[key] for t in trials if t.get(key) is not None]
        return round(float(np.median(v)), 3) if v else None
    result = {
        "key": cache_key(), "machine": machine(), "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "rates_bps": rates, "highest_passing_bps": highest, "seconds": round(time.monotonic() - t0, 1),
        "timer_late_us_p99": round(float(np.median(late)), 1) if late else None,
        "dequeue_lateness_us_p99": round(float(np.median(gaps)), 1) if gaps else None,
        "cpu_us_per_packet": round(float(np.median(cpu)), 1) if cpu else None,
        # The machine's other work while calibration ran (incast.measure.cpu): a rate
        # found beside a build holds beside it.
        "load": {"cpu_niced": median_of("cpu_niced"), "cpu_others": median_of("cpu_others"),
                 "cpu_busy": median_of("cpu_busy"), "cpu_run": median_of("cpu_run")},
        "criteria": {"min_service_ratio": MIN_SERVICE_RATIO,
                     "one_sender_goodput": ONE_SENDER_GOODPUT, "many_sender_goodput": MANY_SENDER_GOODPUT,
                     "block_ms": BLOCK_MS, "one_sender_block_ms": ONE_SENDER_BLOCK_MS,
                     "blocks": BLOCKS},
        "trials": trials,
    }
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = cache_path().with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(cache_path())
    return result


# Virtual time holds any rate: where real time holds none, a run with link.rate "auto"
# runs there at the papers' rate instead, on the stock kernel (the host's TCP, the same
# jiffy timers).
VIRTUAL_FALLBACK = {"clock": "virtual", "kernel": "stock", "link_rate": "1Gbit"}


def virtual_fallback(scenarios, log=lambda msg: None) -> dict:
    """Overrides that move runs with link.rate "auto" to virtual time where this
    machine's calibration holds no real-time rate for some of them and the UML kernel is
    built ({} otherwise: the runs go ahead, or fail with NoFaithfulRate saying what to
    do)."""
    auto = [s for s in scenarios if s.link.rate == "auto" and s.kernel == "host"]
    c = cached()
    if not auto or c is None:
        return {}
    try:
        for s in auto:
            faithful_rate(c, s.topology.senders)
        return {}
    except NoFaithfulRate as e:
        if kernel_dir("uml-stock") is None:
            raise
        log(f"warning: {str(e).split(';')[0]}; running in virtual time at 1 Gbit/s instead "
            "(the UML kernel is built)")
        return dict(VIRTUAL_FALLBACK)


def ensure(scenario, log=lambda msg: None) -> None:
    """Calibrate this machine first where the scenario's link.rate is "auto" and it has
    no calibration yet (once; later runs read the cache)."""
    if scenario.link.rate == "auto" and scenario.kernel == "host" and cached() is None:
        log("warning: calibrating this machine first (once; see incast calibrate)")
        calibrate(log)
