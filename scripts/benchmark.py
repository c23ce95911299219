#!/usr/bin/env python3
"""Benchmarks of the testbed itself. Prints numbers; asserts nothing.

  1. one sender: goodput as a fraction of the link (the payload limit is 94.1%)
  2. topology build time and success at 32, 64 and 128 senders
  3. telemetry cost: goodput with and without it, records and records lost
  4. wall time of the README sweep (scenarios/sigcomm09-fig1.toml) and its curves
  5. packets per second bmv2 sustains with incast.p4, with and without telemetry
  6. calibration: the faithful rate for 1, 16 and 64 senders, and how long finding it takes
  7. virtual time, where the host's time goes: host seconds per phase of one run at
     each of --senders-list (SIGCOMM'09 Figure 1's setting), per virtual second and
     per packet the switch forwarded
  8. SIGCOMM'09 Figure 1 whole (incast figure sigcomm09-fig1) with --jobs N: wall time
  9. the RTL switch's model: simulated cycles and frames per host second, at 4, 16 and
     48 ports, every port but one sending 1500-byte frames to the last (an incast)
 10. virtual time, a point's host seconds per phase when each point boots its own guest
     (--batch 1) and when one guest runs ten points (the default), at each of --senders-list

Usage (as root, after scripts/setup.sh):
    /opt/incast/venv/bin/python scripts/benchmark.py [--skip-sweep] [--only one|scale|telemetry|sweep|bmv2|calibrate|phases|batch|figure1|rtl|pause]
It drives the `incast` command as a user would.
"""
import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))   # this checkout's incast, installed or not


def incast(*args):
    t = time.monotonic()
    r = subprocess.run(["incast", *map(str, args)], cwd=REPO, capture_output=True, text=True)
    wall = time.monotonic() - t
    if r.returncode:
        return None, wall, r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
    return json.loads(r.stdout.strip().splitlines()[-1]) if "--json" in args else r.stdout, wall, ""


def run(tmp: Path, name: str, *args):
    return incast("run", *args, "--json", "--out", tmp / name)


def one_sender(tmp, reps=3):
    print("== 1. one sender at 1 Gbit/s and at the faithful rate (payload limit 94.1%)")
    for rate in ("1Gbit", "auto"):
        _one_sender(tmp, reps, rate)


def _one_sender(tmp, reps, rate):
    fracs = []
    for i in range(reps):
        s, wall, err = run(tmp, f"one{rate}{i}", "--senders", 1, "--blocks", 60, "--cc", "reno",
                           "--link-rate", rate)
        if s is None:
            print(f"  run {i}: FAILED {err}")
            continue
        frac = s["goodput_mbps"] / s["link_mbps"]
        fracs.append(frac)
        f = s["fidelity"]
        print(f"  {s['link_mbps']:g} Mbit/s run {i}: {s['goodput_mbps']:.1f} Mbit/s = {100 * frac:.2f}% of link, "
              f"{s['drops']} drops, {s['timeouts']} timeouts, fidelity {'ok' if f['ok'] else 'NOT ok'} "
              f"(min service {f['min_service_ratio']}, timer late p99 {f.get('timer_late_us_p99')} us)")
    if fracs:
        print(f"  mean {100 * statistics.mean(fracs):.2f}%  min {100 * min(fracs):.2f}%")


def build_scale(tmp):
    print("== 2. topology build and a short run at scale")
    for n in (32, 64, 128):
        s, wall, err = run(tmp, f"scale{n}", "--senders", n, "--blocks", 3, "--warmup", 1,
                           "--sru", "32KiB", "--rto-min", "min")
        if s is None:
            print(f"  {n:3d} senders: FAILED after {wall:.1f} s: {err}")
        else:
            print(f"  {n:3d} senders: build {s['build_s']:.1f} s, whole run {wall:.1f} s, "
                  f"goodput {s['goodput_mbps']:.0f} Mbit/s, ok")


def telemetry_cost(tmp, reps=3):
    print("== 3. telemetry cost")
    for n, blocks in ((1, 60), (16, 20)):
        for tele in (False, True):
            good, recs, lost = [], [], []
            for i in range(reps):
                extra = ["--telemetry"] if tele else []
                s, _, err = run(tmp, f"tele{n}{tele}{i}", "--senders", n, "--blocks", blocks,
                                "--cc", "reno", *extra)
                if s is None:
                    print(f"  {n} senders telemetry={tele}: FAILED {err}")
                    continue
                good.append(s["goodput_mbps"])
                recs.append(s["telemetry_records"] or 0)
                lost.append(s["telemetry_lost"] or 0)
            if good:
                print(f"  {n:2d} senders, telemetry {'on ' if tele else 'off'}: goodput "
                      f"{statistics.mean(good):7.1f} Mbit/s (runs: {', '.join(f'{g:.0f}' for g in good)})"
                      + (f", records {statistics.mean(recs):.0f}/run, lost {sum(lost)}" if tele else ""))


def bmv2_pps(tmp):
    print("== 5. bmv2 with incast.p4: one sender at rising link rates (where goodput stops "
          "following the link, bmv2 is the bottleneck)")
    for tele in (False, True):
        for rate in (100, 200, 400, 800):
            extra = ["--telemetry"] if tele else []
            s, _, err = run(tmp, f"bmv2{tele}{rate}", "--switch", "bmv2", "--senders", 1, "--blocks", 20,
                            "--sru", "1MiB", "--buffer", "256KiB", "--link-rate", f"{rate}Mbit", *extra)
            if s is None:
                print(f"  {rate:4d} Mbit/s, telemetry {'on ' if tele else 'off'}: FAILED {err}")
                continue
            data_pps = s["goodput_mbps"] * 1e6 / (8 * 1448)
            # Each data segment crosses the switch, and (delayed ACKs) half as many ACKs.
            print(f"  {rate:4d} Mbit/s, telemetry {'on ' if tele else 'off'}: goodput {s['goodput_mbps']:6.1f} "
                  f"Mbit/s = {data_pps / 1000:.1f} kpps data, ~{1.5 * data_pps / 1000:.1f} kpps through bmv2"
                  + (f", {s['telemetry_records']} records, {s['telemetry_lost']} lost" if tele else ""))


def readme_sweep(tmp):
    print("== 4. the README sweep (scenarios/sigcomm09-fig1.toml)")
    out = tmp / "fig1"
    _, wall, err = incast("sweep", "scenarios/sigcomm09-fig1.toml", "--fresh", "--out", out)
    if err:
        print(f"  FAILED: {err}")
        return
    print(f"  wall time {wall:.0f} s -> {out}/goodput.png")
    import pandas as pd
    t = pd.read_parquet(out / "sweep.parquet")
    pivot = t.pivot_table(index="senders", columns="rto_min", values="goodput_mbps")
    print(f"  link {t['link_mbps'].iloc[0]:g} Mbit/s")
    print(pivot.round(0).to_string())
    print(f"  fidelity ok: {int(t['fidelity_ok'].sum())}/{len(t)}; min service ratio "
          f"{t['fidelity_min_service_ratio'].min():.3f}; busiest CPU up to {t['fidelity_cpu_busy_max'].max():.2f}")


def calibration(tmp):
    print("== 6. calibration (incast calibrate --force)")
    t = time.monotonic()
    r = subprocess.run(["incast", "calibrate", "--force", "--json"], cwd=REPO, capture_output=True, text=True)
    wall = time.monotonic() - t
    if r.returncode:
        print(f"  FAILED: {r.stderr.strip()[-300:]}")
        return
    c = json.loads(r.stdout)
    for n, rate in c["rates_bps"].items():
        print(f"  {n:>2} senders: faithful {int(rate) / 1e6:g} Mbit/s "
              f"(highest passing {int(c['highest_passing_bps'][n]) / 1e6:g})")
    print(f"  {len(c['trials'])} runs in {wall:.0f} s; qdisc timer late p99 {c['timer_late_us_p99']} us, "
          f"backlogged dequeues late p99 {c['dequeue_lateness_us_p99']} us, {c['cpu_us_per_packet']} us CPU/packet")


# One point of SIGCOMM'09 Figure 1 as `incast figure sigcomm09-fig1` runs it.
FIG1_POINT = ["scenarios/sigcomm09-fig1.toml", "--clock", "virtual", "--kernel", "hrtimer", "--link-rate", "1Gbit",
              "--blocks", "20", "--rto-min", "200us", "--delayed-ack", "off", "--initcwnd", "3"]


def virtual_phases(tmp, senders_list, server_process="shared", record=None):
    print(f"== 7. virtual time: host seconds per phase (Figure 1's setting, 200 us RTOmin, 20 blocks, "
          f"server_process {server_process})")
    import pandas as pd
    rows = []
    for n in senders_list:
        extra = ["--set", f"workload.server_process={server_process}"]
        s, wall, err = run(tmp, f"phases{n}", *FIG1_POINT, "--senders", n, *extra)
        if s is None:
            print(f"  {n} senders: FAILED {err}")
            continue
        packets = int(pd.read_parquet(Path(s["run_dir"]) / "queues.parquet")["sent_packets"].sum())
        row = {"senders": n, **s["host_phase_s"], "host_s": s["host_seconds"], "virtual_s": s["guest_seconds"],
               "host_s_per_virtual_s": round(s["host_seconds"] / s["guest_seconds"], 1),
               "host_us_per_packet": round(1e6 * s["host_seconds"] / max(packets, 1), 1),
               "goodput_mbps": s["goodput_mbps"]}
        rows.append(row)
    if rows:
        print(pd.DataFrame(rows).set_index("senders").to_string())
    if rows and record:
        record_phases(rows, record)


def batch_phases(tmp, senders_list, record=None, batch_size=10, alone=4):
    """A point's host seconds per phase when each point boots its own guest (--batch 1,
    as every run did before batches) and when a guest runs `batch_size` points; the
    median over the runs (one job: the guests do not share the machine)."""
    print(f"== 10. virtual time: a point's host seconds per phase, a guest each point vs {batch_size} points a guest "
          "(Figure 1's setting, 200 us RTOmin, 20 blocks)")
    import pandas as pd
    rows = []
    for n in senders_list:
        for batch, repeat in ((1, alone), (batch_size, batch_size)):
            out = tmp / f"batch{n}-{batch}"
            _, wall, err = incast("sweep", *FIG1_POINT, "--set", "workload.server_process=shared",
                                  "--grid", f"senders={n}", "--repeat", repeat, "--batch", batch, "--jobs", 1,
                                  "--fresh", "--out", out)
            if err:
                print(f"  {n} senders, batch {batch}: FAILED {err}")
                continue
            runs = pd.read_parquet(out / "sweep.parquet")
            phases = pd.DataFrame([json.loads((Path(d) / "summary.json").read_text())["host_phase_s"]
                                   for d in runs["run_dir"]])
            row = {"senders": n, "batch": batch, "runs": len(runs),
                   "host_s": round(float(runs["host_seconds"].median()), 2),
                   "wall_s_per_run": round(wall / len(runs), 2), **phases.median().round(2).to_dict()}
            rows.append(row)
            print(f"  {n:>4} senders, batch {batch:>2}: {row['host_s']} host s a run ({row['wall_s_per_run']} s of "
                  f"wall time a run with the sweep's own), phases " +
                  ", ".join(f"{k} {v}" for k, v in phases.median().round(2).items()))
    if rows and record:
        keep(rows, record)


FLOW_CONTROL_POINT = ["scenarios/fast08-collapse.toml", "--testbed", "fast08-procurve", "--clock", "virtual",
                      "--kernel", "stock", "--link-rate", "1Gbit", "--set", "workload.server_process=shared",
                      "--set", "workload.blocks=20"]


def pause_cost(tmp, senders_list, record=None, repeat=3):
    """What PAUSE costs a run in host time: FAST'08's flow-control point (fast08-procurve,
    20 blocks) without PAUSE; with PAUSE as runs have it by default (the switches told
    each XOFF/XON crossing by the kernel, the hosts' kernel obeying PAUSE in their NIC's
    plug); with the hosts obeying through their agent instead (switch.pause.hosts=agent,
    as before the kernel could); and with the switches reading their queues on a grid (a
    quarter of a frame's time, as they did before the kernel could tell them); the
    median over `repeat` runs, a guest for the runs of each row, one job."""
    print("== 11. virtual time: a PAUSE run's host seconds against the same run without PAUSE "
          "(FAST'08 flow control, 20 blocks)")
    import pandas as pd
    rows = []
    for n in senders_list:
        base = None
        for label, extra in (("off", ["--set", "switch.pause.enabled=false"]),
                             ("told", ["--set", "switch.pause.enabled=true"]),
                             ("agent", ["--set", "switch.pause.enabled=true", "--set", "switch.pause.hosts=agent"]),
                             ("grid", ["--set", "switch.pause.enabled=true", "--set", "switch.pause.interval=3us"])):
            out = tmp / f"pause{n}-{label}"
            _, wall, err = incast("sweep", *FLOW_CONTROL_POINT, *extra, "--grid", f"senders={n}",
                                  "--repeat", repeat, "--batch", repeat, "--jobs", 1, "--fresh", "--out", out)
            if err:
                print(f"  {n} senders, PAUSE {label}: FAILED {err}")
                continue
            runs = pd.read_parquet(out / "sweep.parquet")
            host = float(runs["host_seconds"].median())
            base = host if label == "off" else base
            row = {"senders": n, "pause": label, "runs": len(runs), "host_s": round(host, 2),
                   "times_without_pause": round(host / base, 2) if base else None,
                   "goodput_mbps": round(float(runs["goodput_mbps"].median()), 1),
                   "drops": int(runs["drops"].median()), "timeouts": int(runs["timeouts"].median()),
                   "switch_reads": int(runs["switch_pause_polls"].median()) if "switch_pause_polls" in runs else None,
                   "pause_frames": int(runs["pause_frames"].median()) if "pause_frames" in runs else None,
                   "hosts_obeyed_by": (runs["host_pause_obeyed_by"].iloc[0]
                                       if "host_pause_obeyed_by" in runs else None)}
            rows.append(row)
            print(f"  {n:>3} senders, PAUSE {label:>5}: {row['host_s']} host s a run "
                  f"({row['times_without_pause']} times without PAUSE), {row['goodput_mbps']} Mbit/s, "
                  f"{row['drops']} drops, {row['pause_frames']} PAUSE frames, {row['switch_reads']} reads of the queues, "
                  f"hosts obeyed by {row['hosts_obeyed_by']}")
    if rows and record:
        keep(rows, record)


def record_phases(rows, path):
    """Step 7's table as the documentation draws it: one row per sender count."""
    keep([{"senders": r["senders"], "host_s": r["host_s"], "build_s": r["build"],
           "measured_s": r["measured"], "stop_s": r["stop"],
           "host_s_per_virtual_s": r["host_s_per_virtual_s"],
           "host_us_per_packet": r["host_us_per_packet"]} for r in rows], path)


def keep(rows, path):
    """Keep a step's table as the documentation draws it (docs/results/,
    incast.pages.doc_tables), each row with this command and the commit the code was at."""
    import pandas as pd
    from incast.errors import BadInput
    from incast.pages.doc_tables import code_commit
    try:
        commit = code_commit()
    except BadInput as e:
        print(f"  not recorded in {path}: {e}")
        return
    argv, skip = [], False
    for a in sys.argv[1:]:          # the command less where it was recorded
        if not skip and not a.startswith("--record"):
            argv.append(a)
        skip = a == "--record"
    table = pd.DataFrame(rows)
    table["command"], table["commit"] = "scripts/benchmark.py " + " ".join(argv), commit
    table.to_csv(path, index=False, float_format="%.1f")
    print(f"  recorded in {path}; python -m incast.pages.doc_tables redraws the pages")


def figure1(tmp, jobs):
    print(f"== 8. SIGCOMM'09 Figure 1 whole, --jobs {jobs} (--fresh: nothing reused)")
    out = tmp / "figure1"
    _, wall, err = incast("figure", "sigcomm09-fig1", "--jobs", jobs, "--fresh", "--out", out)
    print(f"  FAILED: {err}" if err else f"  wall time {wall:.0f} s -> {out}/figure.png")


def rtl_speed(tmp, sizes=(4, 16, 48), cycles=1_000_000, record=None):
    """The Verilator model's own speed, no I/O: what a virtual-time run pays per
    simulated cycle (1 Gbit/s ports: 125 million cycles a second of link time). Each
    size is built with a buffer for 64 KiB a port, as SIGCOMM'09 Figure 1's testbed
    (the three-switches figures) runs it."""
    print("== 9. the RTL switch's model: cycles and frames per host second")
    from incast.dataplane import rtl
    rows = []
    for n in sizes:
        try:
            exe = rtl.build_model(n, rtl.cell_bits(n, 64 * 1024))
        except Exception as e:   # noqa: BLE001 (a benchmark reports, never stops)
            print(f"  {n} ports: not built: {e}")
            continue
        r = subprocess.run([str(exe), "--bench", str(cycles)], capture_output=True, text=True)
        if r.returncode:
            print(f"  {n} ports: FAILED: {r.stderr.strip()[-200:]}")
            continue
        b = json.loads(r.stdout)
        print(f"  {n} ports: {b['cycles_per_s']:.0f} cycles/s ({b['cycles_per_s'] / 125e6 * 1e3:.2f} ms of "
              f"1 Gbit/s link time per host second), {b['frames_in_per_s']:.0f} frames in/s, "
              f"{b['frames_out_per_s']:.0f} frames out/s")
        rows.append({"ports": n, "cw": rtl.SIZES[n], "cycles": b["cycles"], "cycles_per_s": b["cycles_per_s"],
                     "frames_in_per_s": b["frames_in_per_s"]})
    if rows and record:
        keep(rows, record)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--only", choices=["one", "scale", "telemetry", "sweep", "bmv2", "calibrate", "phases", "batch",
                                       "figure1", "rtl", "pause"])
    ap.add_argument("--senders-list", default="1,47,128",
                    help="7, 10: virtual-time runs at these sender counts (e.g. 1,47,128,512,1020)")
    ap.add_argument("--jobs", type=int, default=2, help="8: points at once")
    ap.add_argument("--record", metavar="CSV",
                    help="7, 9, 10: keep the table for the documentation (e.g. docs/results/virtual-time-phases.csv, "
                         "docs/results/rtl-speed.csv, docs/results/virtual-time-batch.csv)")
    ap.add_argument("--server-process", default="shared", choices=["shared", "per-server"],
                    help="7: one server process for all servers (as the virtual-time figures run), or one each")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="incast-bench-") as d:
        tmp = Path(d)
        steps = {"one": one_sender, "scale": build_scale, "telemetry": telemetry_cost, "sweep": readme_sweep,
                 "bmv2": bmv2_pps, "calibrate": calibration,
                 "phases": lambda tmp: virtual_phases(tmp, [int(n) for n in args.senders_list.split(",")],
                                                      args.server_process, args.record),
                 "batch": lambda tmp: batch_phases(tmp, [int(n) for n in args.senders_list.split(",")],
                                                   args.record),
                 "figure1": lambda tmp: figure1(tmp, args.jobs),
                 "rtl": lambda tmp: rtl_speed(tmp, record=args.record),
                 "pause": lambda tmp: pause_cost(tmp, [int(n) for n in args.senders_list.split(",")], args.record)}
        for name, step in steps.items():
            if args.only and name != args.only:
                continue
            if name == "sweep" and args.skip_sweep:
                continue
            if name == "bmv2" and not shutil.which("simple_switch") and args.only != "bmv2":
                print("== 5. bmv2: not installed, skipped")
                continue
            if name == "rtl" and not shutil.which("verilator") and args.only != "rtl":
                print("== 9. rtl: verilator not installed, skipped")
                continue
            step(tmp)


if __name__ == "__main__":
    main()
