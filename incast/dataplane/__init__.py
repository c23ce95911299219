"""Data planes: what forwards and queues packets between the hosts.

A data plane supplies the Mininet switch class, configures the switches' egress queues
from the scenario, reads their counters and (optionally) records queue telemetry. Every
data plane fills the same tables (see incast.results), so analysis and plots do not
care which one ran.
"""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class Entry:
    """What the scenario and the CLI need to know of a data plane without loading it
    (its module imports Mininet)."""
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
    max_ports: int = 0              # host ports a switch takes


# The one place a data plane is registered: the factory, the scenario's allowed values
# and the CLI help all read it.
REGISTRY: dict[str, Entry] = {
    "linux": Entry("incast.dataplane.linux", "LinuxDataPlane", "kernel bridge + tc", calibrated=True,
                   ecn=True, multi_switch=True, pause=True, pfc=True, pause_rx=True,
                   pause_watchdog=True,
                   max_ports=1023),   # the kernel's BR_MAX_PORTS (1024) less port 0
    "bmv2": Entry("incast.dataplane.bmv2", "Bmv2DataPlane", "p4src/incast.p4 on bmv2", pause=True, pfc=True,
                  pause_rx=True, shared_buffer=True,
                  packet_buffers=False, host_tx_checksum=True, telemetry_sampling=True, ecn=True,
                  multi_switch=True, max_ports=500),   # incast.p4's NPORTS, 510 is telemetry
}


@dataclass(frozen=True)
class Port:
    switch: str        # switch name in the topology, e.g. "s1"
    name: str          # interface name, e.g. "s1-eth1"
    number: int        # port number on the switch (1-based, Mininet order)
    peer: str          # node at the other end of the link
    ifindex: int
    trunk: bool = False  # the peer is a switch


def port_rate(port: Port, scenario) -> int:
    """A switch port's rate: a trunk's own (topology.trunk_rate), else the link's."""
    if port.trunk and scenario.topology.trunk_rate:
        return scenario.topology.trunk_rate
    return scenario.link.rate


def switch_ports(net) -> list[Port]:
    """Every switch port of a started Mininet network, with the node at its far end."""
    from incast.machine.netdev import ifindexes
    index = ifindexes()
    ports = []
    for sw in net.switches:
        for intf, number in sorted(sw.ports.items(), key=lambda kv: kv[1]):
            if intf.name == "lo" or intf.link is None:
                continue
            other = intf.link.intf2 if intf.link.intf1 is intf else intf.link.intf1
            ports.append(Port(switch=sw.name, name=intf.name, number=number,
                              peer=other.node.name, ifindex=index[intf.name],
                              trunk=other.node in net.switches))
    return ports


class DataPlane(ABC):
    name: str
    # Frames a paced switch port may send back to back after idling (its token bucket):
    # the link monitor leaves that many out of each backlogged stretch.
    port_burst_frames: int = 1

    def __init__(self, scenario, features):
        self.scenario = scenario
        self.features = features
        self.ports: list[Port] = []
        self.log_dir = None         # where the switches write their logs (the run's directory)

    @classmethod
    def require(cls, features, scenario) -> list[str]:
        """Raise MissingFeature naming what this data plane needs for the scenario and the
        machine lacks; return notes worth telling the user. Checked before anything is built."""
        return []

    @classmethod
    def prepare_on_host(cls, scenario) -> None:
        """Make, on the host, what a run inside a guest will need and cannot make there
        (the guest sees this checkout read-only)."""

    @abstractmethod
    def switch_class(self):
        """The Mininet Switch subclass that forwards packets."""

    @abstractmethod
    def configure(self, net, topo) -> None:
        """Set up every switch port's egress queues (rate, buffer, classes)."""

    @abstractmethod
    def queue_counters(self) -> pd.DataFrame:
        """One row per (switch, port, queue): sent_packets, sent_bytes, drops,
        overlimits, backlog_bytes, backlog_packets, limit, limit_unit."""

    @abstractmethod
    def telemetry(self, run_dir, host_of_ip: dict[str, str], world_inode: int):
        """A telemetry recorder (start(), stop(t0_ns) -> TelemetryResult) for the switch
        ports, or raise MissingFeature."""

    def health(self, sent_packets: int) -> tuple[dict, list[str]]:
        """Whether the data plane itself kept up with sent_packets through its ports:
        summary fields and warnings (none by default)."""
        return {}, []

    def artifacts(self) -> dict[str, str]:
        """Files for the results directory that show how the switches were set up
        (name -> text), replayable by hand."""
        return {}

    def start_flow_control(self, run_dir) -> None:
        """Start what sends and obeys PAUSE at the switches outside the data plane itself
        (nothing by default: a P4 switch does it in its pipeline)."""

    def stop_flow_control(self) -> pd.DataFrame | None:
        """Stop it: one row per switch port (pause_sent, xon_sent, pause_received,
        xon_received, held_ms; the linux plane's watchdog_fired, watchdog_restored),
        or None."""
        return None

    def pause_counters(self) -> dict:
        """PAUSE frames sent by the switches (pause_frames_sent, xon_frames_sent) and
        whatever else the data plane counts, for data planes that send PAUSE."""
        return {}

    def paced_ports(self) -> list[Port]:
        """The switch ports a root qdisc paces (whose service the link monitor can
        measure). Default: every port."""
        return self.ports

    def bottleneck(self, client: str) -> Port:
        """The switch port facing the client: where incast builds its queue."""
        for p in self.ports:
            if p.peer == client:
                return p
        raise LookupError(f"no switch port faces {client}")


def get(name: str) -> type[DataPlane]:
    e = REGISTRY.get(name)
    if e is None:
        raise ValueError(f"unknown data plane {name!r} (known: {', '.join(REGISTRY)})")
    return getattr(importlib.import_module(e.module), e.cls)
