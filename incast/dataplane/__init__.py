"""Data planes: what forwards and queues packets between the hosts.

A data plane supplies the Mininet switch class, configures the switches' egress queues
from the scenario, reads their counters and (optionally) records queue telemetry. Every
data plane fills the same tables (see incast.results), so analysis and plots do not
care which one ran.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class Port:
    switch: str        # switch name in the topology, e.g. "s1"
    name: str          # interface name, e.g. "s1-eth1"
    number: int        # port number on the switch (1-based, Mininet order)
    peer: str          # node at the other end of the link
    ifindex: int


class DataPlane(ABC):
    name: str

    def __init__(self, scenario, features):
        self.scenario = scenario
        self.features = features
        self.ports: list[Port] = []

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


def get(name: str):
    if name == "linux":
        from .linux import LinuxDataPlane
        return LinuxDataPlane
    if name == "bmv2":
        from .bmv2 import Bmv2DataPlane
        return Bmv2DataPlane
    raise ValueError(f"unknown data plane {name!r}")
