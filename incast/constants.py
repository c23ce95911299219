"""Where things are and the numbers every stage shares: one place, so that a module
never works out the checkout's layout for itself and no stage imports a later one
for a constant."""
from __future__ import annotations

import os
from pathlib import Path

# --- the checkout, or the installed package ----------------------------------------
PACKAGE = Path(__file__).resolve().parent
REPO = PACKAGE.parent
# What a run reads beside the code is in the checkout's folders; an installed package
# carries them as its package data, under the same names (pyproject.toml).
INSTALLED = (PACKAGE / "hosts").is_dir()
SHARE = PACKAGE if INSTALLED else REPO
HOSTS_DIR = SHARE / "hosts"              # programs that run on the emulated hosts
TOPOLOGIES_DIR = SHARE / "topologies"    # one Mininet Topo file per kind (incast.topology)
P4_SOURCE = SHARE / "p4src" / "incast.p4"
FIGURES_DIR = SHARE / "figures"          # its sweep files, relative to SHARE: scenarios/
TESTBEDS_DIR = SHARE / "testbeds"        # the papers' testbeds as profiles (incast.testbed)
KERNELS_DIR = SHARE / "kernels"          # the UML and VM kernels' patches, configuration, build.sh
KERNEL_BUILD_SH = KERNELS_DIR / "build.sh"
RTL_DIR = SHARE / "rtl"                  # the hardware switch's sources and Verilator harness
# The teaching labs' folders. The package ships them as incast/lab_folders: incast.labs
# is the module that lists and checks them.
LABS_DIR = PACKAGE / "lab_folders" if INSTALLED else REPO / "labs"
# The documentation and its kept results are the checkout's (an installed package has none).
DOCS_DIR = REPO / "docs"
DOC_RESULTS_DIR = DOCS_DIR / "results"   # the runs behind the documentation's tables
# What scripts/ and the data planes build: the checkout's build/ (not committed), or
# for an installed package the machine's cache.
BUILD_DIR = (Path(os.environ.get("INCAST_CACHE", "/var/cache/incast")) / "build" if INSTALLED
             else REPO / "build")
BPF_BUILD_DIR = BUILD_DIR / "bpf"
P4_BUILD_DIR = BUILD_DIR / "p4"

# --- Ethernet ----------------------------------------------------------------------
ETH_HLEN = 14
# Bytes a frame occupies on real Ethernet beyond what the kernel counts (preamble 8,
# FCS 4, inter-frame gap 12): with it, 1 Gbit/s carries at most 1448/1538 = 94.1% payload.
WIRE_OVERHEAD = 24

# --- host NICs -----------------------------------------------------------------------
# A host NIC's token bucket holds one frame plus this much link time (the timer that
# restarts a NIC comes late; a shallower bucket loses that time for good) ...
NIC_TIMER_SLACK_US = 1000
# ... but at most this many frames more (a server idle that long sends them at once).
NIC_SLACK_FRAMES_MAX = 8

# --- TCP counters ----------------------------------------------------------------------
# Retransmission timeouts: tcp_retransmit_timer (6.12, 6.18) counts every one in
# TCPTimeouts, and the first of a series once more under the state the connection was
# in (the other five, a breakdown). The summary's timeouts are TCPTimeouts; summing
# all six counted a timeout in recovery twice (a FAST'08 run: 300 against the 192 that
# TCPTimeouts and the servers' capture both found).
RTO_COUNTER = "TCPTimeouts"
RTO_COUNTERS = [RTO_COUNTER, "TCPSackFailures", "TCPRenoFailures", "TCPSackRecoveryFail",
                "TCPRenoRecoveryFail", "TCPLossFailures"]

# A guest run's scratch directory, beside its results (incast.run.in_guest): locked while
# its run lives, so that one a killed run left is told from one in use (points.Store).
VM_SCRATCH_PREFIX = ".incast-vm-"
# A local sweep executor's directory of scenario files in the point store (locked while
# it lives, as a guest run's scratch directory).
POINTS_SCRATCH_PREFIX = ".incast-points-"
