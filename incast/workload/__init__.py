"""Workloads: the application whose synchronized requests make incast.

A workload driver starts its servers on the emulated hosts, runs repetitions from the
client and reports, per measured block, when it started and ended, and per server
connection, the sender's TCP state at the end. The runner (incast.experiment) measures
around it: it is told when the measured blocks begin and end, so counters, CPU time
and queue statistics cover exactly those blocks, whatever the workload.

`workload.kind` in the scenario names a driver in REGISTRY.
"""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Block:
    index: int          # measured block number, from 0
    start_ns: int       # CLOCK_MONOTONIC, when the request for the block went out
    end_ns: int         # when its last byte arrived
    last_server: int    # index of the server whose data came last (-1: unknown)


@dataclass
class Hooks:
    """What the runner does around the measured blocks of a repetition."""
    measuring: Callable[[], None]           # just before the first measured block
    block: Callable[[Block], None]          # after each measured block
    measured: Callable[[], None]            # just after the last measured block


class Workload(ABC):
    def __init__(self, scenario, popen, lines):
        """popen(host, argv, **kw) starts a process on an emulated host;
        lines(proc, what) reads its stdout line by line with a stall detector."""
        self.scenario = scenario
        self.popen = popen
        self.lines = lines

    @abstractmethod
    def start_servers(self, servers: list, dscps: list[int]) -> None:
        """Start the servers; return when every one accepts connections."""

    @abstractmethod
    def repetition(self, rep: int, client, servers: list, dscps: list[int], hooks: Hooks) -> list[dict]:
        """Run one repetition (warm-up, then the measured blocks, calling hooks);
        return one row per server connection: {"server_index": i, **tcp_info}."""

    def block_bytes(self) -> int:
        """Bytes the client receives per block."""
        return sum(self.scenario.fragments())


# The one place a workload is named: the scenario's workload.kind values.
REGISTRY: dict[str, tuple[str, str]] = {
    "fixed-fragment": ("incast.workload.synchronized_read", "SynchronizedRead"),
    "fixed-block": ("incast.workload.synchronized_read", "SynchronizedRead"),
}


def get(kind: str) -> type[Workload]:
    if kind not in REGISTRY:
        raise ValueError(f"unknown workload {kind!r} (known: {', '.join(REGISTRY)})")
    module, cls = REGISTRY[kind]
    return getattr(importlib.import_module(module), cls)
