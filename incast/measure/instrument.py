"""Instruments: what measures a run beside its workload, all of one shape.

An instrument is started once the network and the workload's servers are up, is told
when each repetition's measured blocks begin (``measuring``) and end (``measured``),
and is stopped after the last repetition, when it hands back its ``Readings``: the
tables it writes into the results directory, the fields it adds to summary.json,
lines for the user, and facts the run judges itself by (incast.measure.fidelity).

The runner measures with the instruments the scenario asks for (``wanted``), in the
order of ``incast.registry.INSTRUMENTS``. Adding a table is a new instrument: its
file, and its line in the registry.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Protocol, runtime_checkable

import pandas as pd
from mininet.net import Mininet
from mininet.node import Host

from incast.machine.probe import Features
from incast.registry import INSTRUMENTS
from incast.scenario import Scenario


@runtime_checkable
class Switches(Protocol):
    """What instruments ask of the data plane (incast.dataplane.DataPlane has it; the
    data planes sit above the instruments, so they are named by what they do)."""

    def telemetry(self, run_dir: Path, host_of_ip: dict[str, str], world_inode: int):
        """A recorder of the switch ports' queues (start(), stop(t0_ns))."""

    def paced_ports(self) -> list:
        """The switch ports a root qdisc paces."""


@dataclass
class Bench:
    """The run as an instrument sees it: the scenario, the built network, where the
    results go, and how to start a process on a host."""
    scenario: Scenario
    features: Features          # the kernel and its clock
    dataplane: Switches         # its ports and telemetry
    net: Mininet                # the started network
    client: Host
    servers: list[Host]
    dscps: list[int]            # each server's DSCP, in the order of servers
    netns: frozenset[int]       # inodes of the run's network namespaces (its hosts' and the switches')
    world_inode: int            # inode of the switches' namespace
    run_dir: Path               # the results directory being written
    popen: Callable             # popen(host, argv, **kw): a process in a host's namespace
    lines: Callable             # lines(proc, what): its stdout line by line, with a stall detector
    log: Callable = lambda msg: None
    t0_ns: int | None = None    # CLOCK_MONOTONIC as the first measured block began: the time axis


@dataclass
class Facts:
    """What a run is judged by (incast.measure.fidelity.assess) and summarized with, not
    written as it is: one field a fact, each given by the instrument that measures it."""
    link_rows: list[dict] = field(default_factory=list)     # the link monitor's per-port service
    watchdog: dict | None = None        # the link monitor's own lateness, where it ran
    monitored: bool = False             # whether the link monitor ran
    cpu: dict = field(default_factory=dict)                 # CPU use over the run (incast.measure.cpu)
    dataplane_warnings: list[str] = field(default_factory=list)     # the data plane fell behind
    telemetry_lost: int | None = None   # telemetry records the collector missed

    def add(self, other: Facts) -> None:
        """Another instrument's facts: warnings add up, any other fact it gave is taken."""
        self.dataplane_warnings = self.dataplane_warnings + other.dataplane_warnings
        for f in fields(self):
            given = getattr(other, f.name)
            if f.name != "dataplane_warnings" and given != getattr(Facts(), f.name):
                setattr(self, f.name, given)


@dataclass
class Readings:
    """What instruments hand back when they stop (and, merged, what they all did)."""
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # results file -> table (its registry entry's)
    summary: dict = field(default_factory=dict)     # summary.json fields
    messages: list[str] = field(default_factory=list)   # lines for the user ("warning: ..." where one is)
    facts: Facts = field(default_factory=Facts)

    def add(self, other: Readings) -> None:
        self.tables.update(other.tables)
        self.summary.update(other.summary)
        self.messages += other.messages
        self.facts.add(other.facts)


class Instrument:
    """The contract; every step does nothing unless an instrument says otherwise."""

    def __init__(self, bench: Bench):
        self.bench = bench

    @classmethod
    def wanted(cls, scenario: Scenario, features: Features) -> bool:
        """Whether a run of this scenario on this machine measures with it."""
        return True

    def start(self) -> None:
        """Before the first repetition: start what records (return once it does)."""

    def measuring(self, rep: int) -> None:
        """Just before repetition rep's first measured block."""

    def measured(self, rep: int) -> None:
        """Just after its last measured block."""

    def stop(self) -> Readings:
        """After the last repetition: stop, and say what was measured."""
        return Readings()


def selected(scenario: Scenario, features: Features) -> list[type[Instrument]]:
    """The instruments a run of the scenario measures with, in the registry's order."""
    classes = [getattr(importlib.import_module(e.module), e.cls) for e in INSTRUMENTS.values()]
    return [c for c in classes if c.wanted(scenario, features)]


class Instruments:
    """Several instruments driven as one: started and told of the measured blocks'
    beginning in order; told of their end and stopped in the reverse order."""

    def __init__(self, classes: list[type[Instrument]], bench: Bench):
        self.bench = bench
        self.all = [cls(bench) for cls in classes]

    def start(self) -> None:
        for i in self.all:
            i.start()

    def measuring(self, rep: int) -> None:
        for i in self.all:
            i.measuring(rep)

    def measured(self, rep: int) -> None:
        for i in reversed(self.all):
            i.measured(rep)

    def stop(self) -> Readings:
        stopped = [(i, i.stop()) for i in reversed(self.all)]
        readings = Readings()
        for i, r in reversed(stopped):     # merged in the registry's order
            declared = declared_tables(type(i))
            if not set(r.tables) <= set(declared):
                raise RuntimeError(f"{type(i).__name__} wrote {sorted(set(r.tables) - set(declared))}, which its "
                                   f"line in incast.registry.INSTRUMENTS does not name (it names {list(declared)})")
            readings.add(r)
        return readings


def declared_tables(cls: type[Instrument]) -> tuple[str, ...]:
    """The results tables an instrument's registry line says it writes."""
    for e in INSTRUMENTS.values():
        if (e.module, e.cls) == (cls.__module__, cls.__name__):
            return e.tables
    raise LookupError(f"{cls.__module__}.{cls.__name__} has no line in incast.registry.INSTRUMENTS")
