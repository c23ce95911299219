"""The registries: the one place a data plane, a workload, a topology or an instrument
is named.

Every entry says what the scenario, the CLI and the documentation need to know of its
implementation without loading it: the modules behind them import Mininet, pandas or
a switch's tools, and this one imports nothing, so that any stage may consult it. The
implementation is loaded by the factory of its own package (``incast.dataplane.get``,
``incast.workload.get``, ``incast.topology.load``, ``incast.measure.instrument
.selected``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class DataPlaneEntry:
    """A data plane (incast.dataplane.DataPlane) and what it can do."""
    module: str
    cls: str
    help: str
    pause: bool = False             # sends 802.3x PAUSE to the hosts
    pfc: bool = False               # sends 802.1Qbb PFC per class instead (switch.pause.pfc)
    pause_rx: bool = False          # obeys PAUSE/PFC at its ports (trunks, hosts)
    pause_watchdog: bool = False    # a PFC watchdog, and PAUSE storms from a host (switch.pause.watchdog/storm)
    shared_buffer: bool = False     # a pool every queue of a switch draws from (switch.pool)
    packet_buffers: bool = True     # switch.buffer_packets (queues limited in packets)
    calibrated: bool = False        # incast calibrate measures it (link.rate auto)
    host_tx_checksum: bool = False  # hosts must complete checksums (a software switch forwards frames as they are)
    telemetry_sampling: bool = False  # telemetry.sample other than "all" (records chosen in the switch)
    ecn: bool = False               # marks CE above switch.ecn (where the kernel/program can)
    multi_switch: bool = False      # forwards across several switches (topologies beyond star)
    trunk_buffer: bool = False      # a trunk port's buffer may differ from a host port's (topology.trunk_buffer)
    max_ports: int = 0              # ports a switch takes
    tools: str = ""                 # what it needs beyond the set-up's base (the figure catalog says it)
    # Files outside the Python code its runs execute (globs from incast.constants.SHARE:
    # the checkout's top, or the installed package): they date its points in the point
    # store (incast.run.points), and only its own.
    sources: tuple[str, ...] = ()
    # Files of the code (globs, as sources) that only this plane's runs execute (those of
    # several planes: each of them): they date its points only, and the code version
    # every plane shares leaves them out (incast.run.points.code_version). A file another
    # plane's run imports or reads stays shared: a change there may change its runs too.
    code: tuple[str, ...] = ()
    # Frames a paced switch port may send back to back after idling (its token bucket):
    # the link monitor leaves that many out of each backlogged stretch.
    port_burst_frames: int = 1


@dataclass(frozen=True)
class WorkloadEntry:
    """A workload (incast.workload.Workload) and how it sizes its blocks."""
    module: str
    cls: str
    help: str
    # How a block is sized: "fragment": every server sends workload.sru per block;
    # "block": workload.block bytes are split over the servers.
    sizing: Literal["fragment", "block"] = "fragment"
    # Marks its servers' data with the class's DSCP (switch.qos.queues > 1 needs it).
    dscp: bool = True
    label: str = ""     # what the scenario's one-line description calls it ("" for the papers' read)


@dataclass(frozen=True)
class InstrumentEntry:
    """An instrument (incast.measure.instrument.Instrument): what it measures beside
    the workload, and the results tables it writes."""
    module: str
    cls: str
    tables: tuple[str, ...] = ()


# The P4 program and what reads it: bmv2 runs it, and the RTL switch sends its telemetry
# frames, which the collector decodes with the program's layout (incast.p4.program).
P4_CODE = ("p4src/*.p4", "incast/p4/*.py", "incast/measure/postcards.py")

DATAPLANES: dict[str, DataPlaneEntry] = {
    "linux": DataPlaneEntry("incast.dataplane.linux", "LinuxDataPlane", "kernel bridge + tc", calibrated=True,
                            ecn=True, multi_switch=True, trunk_buffer=True, pause=True, pfc=True, pause_rx=True,
                            pause_watchdog=True, port_burst_frames=4,   # linux.BURST_FRAMES
                            shared_buffer=True,   # in the UML kernels' plug (kernels/patches-um/0006)
                            max_ports=1023,   # the kernel's BR_MAX_PORTS (1024) less port 0
                            code=("incast/dataplane/linux.py", "hosts/switch_pause.py")),
    "bmv2": DataPlaneEntry("incast.dataplane.bmv2", "Bmv2DataPlane", "p4src/incast.p4 on bmv2", pause=True,
                           pfc=True, pause_rx=True, shared_buffer=True, packet_buffers=False,
                           host_tx_checksum=True, telemetry_sampling=True, ecn=True, multi_switch=True,
                           max_ports=500,   # incast.p4's NPORTS, 510 is telemetry
                           tools="bmv2 and p4c (scripts/install-p4.sh)",
                           # bmv2.py and the modules beside it that only it uses (bmv2_*.py)
                           code=("incast/dataplane/bmv2*.py", *P4_CODE)),
    "rtl": DataPlaneEntry("incast.dataplane.rtl", "RtlDataPlane", "rtl/src/incast_switch.sv in Verilator",
                          pause=True, pfc=True, pause_rx=True, shared_buffer=True, packet_buffers=False,
                          host_tx_checksum=True, telemetry_sampling=True, ecn=True,
                          max_ports=48,   # its largest model (incast.dataplane.rtl.SIZES)
                          tools="Verilator (the switch's RTL model)",
                          sources=("rtl/src/*.sv", "rtl/verilator.f", "rtl/harness/*.cpp", "rtl/harness/Makefile"),
                          code=("incast/dataplane/rtl.py", *P4_CODE)),
}

WORKLOADS: dict[str, WorkloadEntry] = {
    "fixed-fragment": WorkloadEntry("incast.workload.synchronized_read", "SynchronizedRead",
                                    "each server sends sru per block (FAST'08, WREN'09)"),
    "fixed-block": WorkloadEntry("incast.workload.synchronized_read", "SynchronizedRead",
                                 "block bytes split over the servers (SIGCOMM'09)", sizing="block"),
    "memcached": WorkloadEntry("incast.workload.memcached", "MemcachedMultiget",
                               "a multiget of sru bytes from every memcached server", dscp=False,
                               label="memcached multiget"),
}

# topologies/<kind>.py, in the order they are offered (simplest first).
TOPOLOGIES: tuple[str, ...] = ("star", "two_switch", "leaf_spine", "fan_in")

# In this order they start and see a repetition's measured blocks begin; in the reverse
# order they see the blocks end and stop, so the first brackets the others (the
# counters, read first and last, take the data plane's health once all else stopped;
# flow control brackets the background flows, so what a switch still holds when it is
# read is what it kept, not what a running flow had just sent into a pause).
INSTRUMENTS: dict[str, InstrumentEntry] = {
    "counters": InstrumentEntry("incast.network.counters", "Counters",
                                ("counters.parquet", "queues.parquet")),
    "cpu": InstrumentEntry("incast.measure.cpu", "CpuUse"),
    "flow_control": InstrumentEntry("incast.network.flow_control", "FlowControl", ("pause_ports.parquet",)),
    "background": InstrumentEntry("incast.workload.background", "BackgroundTraffic", ("background.parquet",)),
    "telemetry": InstrumentEntry("incast.measure.telemetry", "QueueTelemetry", ("telemetry.parquet", "pool.parquet")),
    "capture": InstrumentEntry("incast.measure.capture", "ServerCapture", ("capture/",)),
    "links": InstrumentEntry("incast.measure.fidelity", "LinkMonitor", ("links.parquet",)),
}
