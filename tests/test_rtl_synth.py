"""The synthesis script's counting (rtl/synth/count.py): what the resource table in
docs/rtl.md is read from. Yosys itself is not run here (minutes to hours a size)."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("count", REPO / "rtl" / "synth" / "count.py")
count = importlib.util.module_from_spec(spec)
spec.loader.exec_module(count)

# Yosys 0.70's statistics with the hierarchy kept, cut down: a top with two instances of
# a port module, which holds one FIFO; library cells (FDRE, CARRY4) filed under
# "submodules", and a "design hierarchy" section whose totals leave them out.
HIERARCHY = r"""
12.23. Printing statistics.

=== $paramod$aa\sync_fifo ===

        +----------Local Count, excluding submodules.
        |
       10 wires
        3 cells
        2   LUT2
        1   RAMB18E1
        4 submodules
        4   FDRE

=== $paramod$bb\port_tx ===

        +----------Local Count, excluding submodules.
        |
        7 cells
        5   LUT6
        2   DSP48E1
       12 submodules
        1   $paramod$aa\sync_fifo
        1   CARRY4
       10   FDRE

=== $paramod$cc\incast_switch ===

        +----------Local Count, excluding submodules.
        |
      100 cells
       90   LUT6
       10   RAMB36E1
      206 submodules
        2   $paramod$bb\port_tx
        4   CARRY4
      200   FDRE
   Estimated number of LCs:         95

=== design hierarchy ===

        +----------Count including submodules.
        |
      120 $paramod$cc\incast_switch
      120 cells
      100   LUT6
      206 submodules
      200   FDRE
"""

# Yosys 0.23's flat statistics: "name N".
FLAT_023 = """
Printing statistics.

=== incast_switch ===

   Number of wires:                 12
   Number of cells:                 30
     $_DFF_P_                       20
     $_AND_                         10
"""


def test_a_kept_hierarchy_counts_each_instance_of_each_module():
    cells = count.design_cells(count.last_statistics(HIERARCHY))
    # the top's own, plus two ports, each with its FIFO
    assert cells["LUT6"] == 90 + 2 * 5
    assert cells["LUT2"] == 2 * 2
    assert cells["FDRE"] == 200 + 2 * (10 + 4)
    assert cells["CARRY4"] == 4 + 2 * 1
    assert cells["RAMB18E1"] == 2 and cells["RAMB36E1"] == 10 and cells["DSP48E1"] == 4
    assert not any("paramod" in c for c in cells), cells


def test_the_row_a_log_gives(tmp_path):
    log = tmp_path / "yosys.log"
    log.write_text("earlier statistics, not read\n=== x ===\n 99 LUT6\n" + HIERARCHY)
    r = subprocess.run([sys.executable, str(REPO / "rtl" / "synth" / "count.py"), str(log), "xilinx",
                        "2", "8", "12", "null", "Yosys 0.70"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)
    assert row == {"target": "xilinx", "ports": 2, "cw": 8, "cells": 4096, "lut": 104, "ff": 228, "carry": 6,
                   "lutram": 0, "bram36": 10, "bram18": 2, "dsp": 4, "fmax_mhz": None, "yosys": "Yosys 0.70"}


def test_yosys_023_flat_statistics_are_read_too(tmp_path):
    log = tmp_path / "yosys.log"
    log.write_text(FLAT_023)
    assert count.counts(str(log), "generic") == {"cells": 30, "ff": 20, "mem": 0}
