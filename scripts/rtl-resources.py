#!/usr/bin/env python3
"""The hardware switch's resources: rtl/synth/synth.sh at each size, one CSV row each.

    scripts/rtl-resources.py xilinx 4:8:12 16:16:13 48:64:13 [--record docs/results/rtl-resources.csv]
    scripts/rtl-resources.py ice40 2:8:8 --env RX_AW=7 TX_AW=8 NMAC=4 STATS=0 MAXLEN=1024

Each SIZE is PORTS:CW:CELL_AW. Prints a row per size as it is done; with --record,
adds them to the CSV (the documentation draws its resource table from it) with the
command and the commit, replacing rows of the same target and size.
"""
import argparse
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIELDS = ["target", "ports", "cw", "cells", "lut", "ff", "carry", "lutram", "bram36", "bram18", "bram", "dsp", "fit",
          "fmax_mhz", "yosys", "settings", "command", "commit"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", choices=["generic", "xilinx", "ice40"])
    ap.add_argument("sizes", nargs="+", help="PORTS:CW:CELL_AW")
    ap.add_argument("--env", nargs="*", default=[], help="the smaller switch's parameters, e.g. RX_AW=7")
    ap.add_argument("--record", metavar="CSV")
    args = ap.parse_args()
    env = {**os.environ, **dict(e.split("=", 1) for e in args.env)}
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    rows = []
    for size in args.sizes:
        ports, cw, cell_aw = size.split(":")
        r = subprocess.run([str(REPO / "rtl" / "synth" / "synth.sh"), args.target, ports, cw, cell_aw], env=env,
                           capture_output=True, text=True)
        if r.returncode:
            print(f"{args.target} {size}: FAILED: {r.stderr.strip()[-500:]}", file=sys.stderr)
            return 1
        row = json.loads(r.stdout.strip().splitlines()[-1])
        row["settings"] = " ".join(args.env)
        row["command"] = " ".join(["scripts/rtl-resources.py", args.target, size] +
                                  (["--env", *args.env] if args.env else []))
        row["commit"] = commit
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.record:
        path = Path(args.record)
        old = list(csv.DictReader(path.open())) if path.is_file() else []
        keys = {(r["target"], str(r["ports"])) for r in rows}
        kept = [r for r in old if (r["target"], r["ports"]) not in keys]
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore", lineterminator="\n")
            w.writeheader()
            for r in kept + rows:
                w.writerow({k: ("" if r.get(k) is None else r.get(k, "")) for k in FIELDS})
    return 0


if __name__ == "__main__":
    sys.exit(main())
