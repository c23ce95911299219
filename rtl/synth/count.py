#!/usr/bin/env python3
"""What a Yosys run counted, as one JSON line (rtl/synth/synth.sh calls it).

    count.py YOSYS_LOG TARGET NPORTS CW CELL_AW FMAX_MHZ|null YOSYS_VERSION

The log's last statistics have one section a module: its own cells ("N name"; Yosys
0.23 writes "name N") and the instances of its submodules. With the hierarchy kept
(HIER=1) the design's count is the top's cells plus each submodule's, times its
instances, down the tree; Yosys's own "design hierarchy" totals leave out the library
cells (FDRE, CARRY4, ...) it files under submodules, so they are not read.
"""
from __future__ import annotations

import json
import os
import re
import sys

# The summary lines of a section, which are not cells.
SUMMARY = {"wires", "cells", "ports", "submodules", "memories", "processes"}
TOP = "incast_switch"


def last_statistics(text: str) -> str:
    return text[text.rfind("Printing statistics"):]


def module_cells(stat: str) -> dict[str, dict[str, int]]:
    """module -> {cell type or submodule: count}, each module's own."""
    local = {}
    for m in re.finditer(r"^=== (.+?) ===$(.*?)(?=^=== |\Z)", stat, re.M | re.S):
        if m.group(1) == "design hierarchy":
            continue
        counts = {}
        for line in m.group(2).splitlines():
            a = re.match(r"^\s+(\d+)\s+(\S+)\s*$", line) or re.match(r"^\s+(\S+)\s+(\d+)\s*$", line)
            if not a:
                continue
            n, name = (a.group(1), a.group(2)) if a.group(1).isdigit() else (a.group(2), a.group(1))
            if name not in SUMMARY:
                # "$_DFF_P_" and "_DFF_P_" alike; a parametrized module keeps its name
                counts[name if name.startswith("$paramod") else name.lstrip("$")] = int(n)
        local[m.group(1)] = counts
    return local


def design_cells(stat: str, top: str = TOP) -> dict[str, int]:
    """Every leaf cell type of the design under `top` (chparam names it
    $paramod...\\incast_switch), counted once per instance."""
    local = module_cells(stat)

    def flat(module: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for name, n in local[module].items():
            for leaf, k in (flat(name).items() if name in local else [(name, 1)]):
                out[leaf] = out.get(leaf, 0) + n * k
        return out

    tops = [m for m in local if m == top or m.endswith("\\" + top)]
    return flat(tops[0]) if tops else {}


def counts(log: str, target: str) -> dict:
    stat = last_statistics(open(log).read())
    cells = design_cells(stat)

    def total(prefixes):
        return sum(n for c, n in cells.items() if any(c.startswith(p) for p in prefixes))

    if target == "xilinx":
        return {"lut": total(["LUT"]), "ff": total(["FD"]), "carry": total(["CARRY"]),
                "lutram": total(["RAM32", "RAM64", "RAM128", "RAM256"]),
                "bram36": total(["RAMB36"]), "bram18": total(["RAMB18"]), "dsp": total(["DSP48"])}
    if target == "ice40":
        out = {"lut": total(["SB_LUT4"]), "ff": total(["SB_DFF"]), "carry": total(["SB_CARRY"]),
               "bram": total(["SB_RAM40_4K"])}
        # What the HX8K offers against what the design asks (nextpnr's utilization
        # lines): a design too large stops before placement, with no clock to report.
        pnr = os.path.join(os.path.dirname(log), "nextpnr.log")
        if os.path.isfile(pnr):
            use = dict(re.findall(r"^Info:\s+(ICESTORM_LC|ICESTORM_RAM|SB_IO):\s+(\d+/\s*\d+)",
                                  open(pnr).read(), re.M))
            out["fit"] = " ".join(f"{k} {v.replace(' ', '')}" for k, v in use.items())
        return out
    # generic: "Number of cells: N" (Yosys 0.23) or "N cells" (0.70)
    n = re.search(r"Number of cells:\s+(\d+)|^\s+(\d+) cells\s*$", stat, re.M)
    return {"cells": int(n.group(1) or n.group(2)),
            "ff": total(["_DFF", "_SDFF", "_DFFE", "_SDFFE", "_SDFFCE", "_ALDFF"]),
            "mem": total(["$mem", "mem_v2"])}


def main(argv: list[str]) -> int:
    if len(argv) != 8:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    log, target, nports, cw, cell_aw, fmax, version = argv[1:]
    print(json.dumps({"target": target, "ports": int(nports), "cw": int(cw), "cells": 1 << int(cell_aw),
                      **counts(log, target), "fmax_mhz": None if fmax == "null" else float(fmax),
                      "yosys": version}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
