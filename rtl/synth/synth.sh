#!/usr/bin/env bash
# Synthesize the switch with Yosys, and place and route it where nextpnr can.
#
#   rtl/synth/synth.sh generic NPORTS [CW] [CELL_AW]  -> Yosys's generic cells (synth)
#   rtl/synth/synth.sh xilinx  NPORTS [CW] [CELL_AW]  -> 7-series LUTs, FFs, block RAM (synth_xilinx)
#   rtl/synth/synth.sh ice40   NPORTS [CW] [CELL_AW]  -> iCE40 (synth_ice40), then nextpnr-ice40's Fmax
#   HIER=1 rtl/synth/synth.sh xilinx ...                -> the same, the per-port modules kept apart
#
# Each prints one JSON line: the target, the parameters, the Yosys that counted, and
# what it counted. Work files go to build/rtl/synth/ (never committed). The machine is
# shared: nice'd.
#
# Yosys: pyosys 0.70 in the testbed's venv, where `scripts/setup.sh --synth` puts it
# (rtl/synth/yosys.py says why not Debian's), else $YOSYS or `yosys` on PATH.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${INCAST_VENV:-/opt/incast/venv}/bin/python
if [ -z "${YOSYS:-}" ] && [ -x "$python" ] && "$python" -c "import pyosys" 2>/dev/null; then
  yosys_p() { nice -n 19 "$python" "$repo/rtl/synth/yosys.py" "$1"; }
  version=$("$python" "$repo/rtl/synth/yosys.py" -V)
else
  yosys=${YOSYS:-yosys}
  command -v "$yosys" >/dev/null || { echo "synth: no Yosys (scripts/setup.sh --synth installs it)" >&2; exit 2; }
  yosys_p() { nice -n 19 "$yosys" -p "$1"; }
  version=$("$yosys" -V)
fi
version=$(grep -o 'Yosys [0-9][0-9.+a-z-]*' <<<"$version" | head -1)
target=${1:?generic, xilinx or ice40}
case "$target" in generic|xilinx|ice40) ;; *) echo "synth: unknown target $target (generic, xilinx or ice40)" >&2; exit 2 ;; esac
nports=${2:?ports}
cw=${3:-8}
cell_aw=${4:-12}
# A smaller switch for the iCE40's 7680 cells: short receive and transmit memories,
# few forwarding entries, no per-queue counters.
rx_aw=${RX_AW:-9}; tx_aw=${TX_AW:-9}; nmac=${NMAC:-16}; stats=${STATS:-1}; maxlen=${MAXLEN:-2048}
# HIER=1 (7-series): the hierarchy kept, so the ports' receive and transmit logic is
# synthesized once for all ports and counted once per instance, and Yosys holds one
# port's netlist instead of 48 (flattened, 48 ports outgrew the VM's 24 GB). Nothing is
# optimized across a port's boundary, so counts are a little above the flat flow's.
hier=${HIER:-0}
case "$hier" in 0) flatten=-flatten ;; 1) flatten= ;;
  *) echo "synth: HIER is 0 or 1, not $hier" >&2; exit 2 ;; esac
[ "$hier" = 0 ] || [ "$target" = xilinx ] || { echo "synth: HIER=1 is for the xilinx target" >&2; exit 2; }
out=$repo/build/rtl/synth/$target-p$nports-c$cw-b$cell_aw-r$rx_aw-t$tx_aw-m$nmac-s$stats-h$hier
mkdir -p "$out"
src="$repo/rtl/src/sync_fifo.sv $repo/rtl/src/port_rx.sv $repo/rtl/src/port_tx.sv $repo/rtl/src/incast_switch.sv"
params="-set NPORTS $nports -set CW $cw -set CELL_AW $cell_aw -set RX_AW $rx_aw -set TX_AW $tx_aw \
  -set NMAC $nmac -set STATS $stats -set MAXLEN $maxlen"
read="read_verilog -sv $src; chparam $params incast_switch"
# Each flow is Yosys's own, less its SAT-based resource sharing (share), which at 16
# ports and more ran for hours on the per-queue multiplexers and saves little here.
case "$target" in
  generic) flow="synth -top incast_switch -flatten -noshare; stat" ;;
  xilinx)
    x="synth_xilinx -top incast_switch $flatten -family xc7"
    flow="$x -run begin:coarse; techmap -map +/cmp2lut.v -map +/cmp2lcu.v -D LUT_WIDTH=6; alumacc; opt;
          memory -nomap; opt_clean; $x -run map_memory:; stat" ;;
  ice40)
    i="synth_ice40 -top incast_switch -json $out/switch.json"
    flow="$i -run begin:coarse; opt_expr; opt_clean; check; opt -nodffe -nosdff; fsm; opt; wreduce; peepopt;
          opt_clean; techmap -map +/cmp2lut.v -D LUT_WIDTH=4; opt_expr; opt_clean; memory_dff; alumacc; opt;
          memory -nomap; opt_clean; $i -run map_ram:; stat" ;;
  *) echo "synth: unknown target $target" >&2; exit 2 ;;
esac
yosys_p "$read; $flow" > "$out/yosys.log"
fmax=null
if [ "$target" = ice40 ] && command -v nextpnr-ice40 >/dev/null; then
  # 125 MHz asked for: the 1 Gbit/s ports' byte clock. nextpnr reports what it reached.
  nice -n 19 nextpnr-ice40 --hx8k --package ct256 --json "$out/switch.json" --freq 125 \
    --ignore-loops --timing-allow-fail -q -l "$out/nextpnr.log" >/dev/null 2>&1 || true
  fmax=$(grep -oP "Max frequency for clock .*?: \K[0-9.]+" "$out/nextpnr.log" | tail -1 || true)
  fmax=${fmax:-null}
fi
python3 "$repo/rtl/synth/count.py" "$out/yosys.log" "$target" "$nports" "$cw" "$cell_aw" "$fmax" "$version"
