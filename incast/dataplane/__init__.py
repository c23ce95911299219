"""Data planes: what forwards and queues packets between the hosts.

A data plane supplies the Mininet switch class, configures the switches' egress queues
from the scenario, reads their counters and (optionally) records queue telemetry. Every
data plane fills the same tables (see incast.measure.results), so analysis and plots do not
care which one ran.
"""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass

import pandas as pd

from incast.machine.netdev import ifindexes
from incast.registry import DATAPLANES


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
    return scenario.port_rate(port.trunk)


def far_end(intf):
    """The interface at the other end of a Mininet interface's link."""
    return intf.link.intf2 if intf.link.intf1 is intf else intf.link.intf1


def switch_ports(net) -> list[Port]:
    """Every switch port of a started Mininet network, with the node at its far end."""
    index = ifindexes()
    ports = []
    for sw in net.switches:
        for intf, number in sorted(sw.ports.items(), key=lambda kv: kv[1]):
            if intf.name == "lo" or intf.link is None:
                continue
            other = far_end(intf)
            ports.append(Port(switch=sw.name, name=intf.name, number=number,
                              peer=other.node.name, ifindex=index[intf.name],
                              trunk=other.node in net.switches))
    return ports


class DataPlane(ABC):
    """A data plane; incast.registry.DATAPLANES says what it can do."""
    name: str

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
    def host_missing(cls, scenario) -> str | None:
        """What this machine lacks for the data plane to run the scenario, in a line, or
        None; the tools it needs on the host, whatever kernel the run is on (asked before
        a figure or a sweep starts, and by require())."""
        return None

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
    e = DATAPLANES.get(name)
    if e is None:
        raise ValueError(f"unknown data plane {name!r} (known: {', '.join(DATAPLANES)})")
    return getattr(importlib.import_module(e.module), e.cls)
