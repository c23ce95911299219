#!/usr/bin/env python3
"""Run a Yosys script with pyosys (Yosys as a Python library), as `yosys -p SCRIPT`.

    yosys.py "read_verilog -sv a.sv; synth -top a; stat" > yosys.log
    yosys.py -V

PyPI's pyosys wheel is Yosys 0.70 built natively, with its ABC beside it: Debian 12's
Yosys is 0.23, which took 65 minutes for the 4-port switch and did not finish 16 ports
in hours, and YoWASP's 0.70 (WebAssembly) runs out of its 4 GiB address space at 48.
The log goes to standard output, as yosys's does.
"""
import sys

from pyosys import libyosys as ys


def main(argv: list[str]) -> int:
    if argv[1:] == ["-V"]:
        print(ys.yosys_maybe_version())
        return 0
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    # Yosys splits the script on its semicolons itself, as for `yosys -p`
    ys.run_pass(argv[1], ys.Design())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
