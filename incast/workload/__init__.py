"""Workloads: the application whose synchronized requests make incast.

A workload driver starts its servers on the emulated hosts, runs repetitions from the
client and reports, per measured block, when it started and ended, and per server
connection, the sender's TCP state at the end. The runner (incast.experiment) measures
around it: it is told when the measured blocks begin and end, so counters, CPU time
and queue statistics cover exactly those blocks, whatever the workload.

`workload.kind` in the scenario names a driver in incast.registry.WORKLOADS.
"""
from __future__ import annotations

import importlib
import subprocess
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

from incast.errors import RunFailed
from incast.registry import WORKLOADS

# The programs that run on the emulated hosts (standard library only).
from incast.constants import HOSTS_DIR  # noqa: F401  (workloads find their host programs here)


class WorkloadFailed(RunFailed):
    """A workload's program said something it should not have."""


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

    @classmethod
    def require(cls, features, scenario) -> list[str]:
        """Raise incast.probe.MissingFeature naming what this workload needs and the
        machine lacks (its programs); return notes for the user. Checked before anything
        is built."""
        return []

    @abstractmethod
    def start_servers(self, servers: list, dscps: list[int]) -> None:
        """Start the servers; return when every one accepts connections."""

    @abstractmethod
    def repetition(self, rep: int, client, servers: list, dscps: list[int], hooks: Hooks) -> list[dict]:
        """Run one repetition (warm-up, then the measured blocks, calling hooks);
        return one row per server connection: {"server_index": i, **tcp_info}."""

    def start_client(self, client, program: str, extra: list[str], servers: list, dscps: list[int],
                     port: int, rep: int):
        """Start a client program of ours (hosts/<program>, the arguments every one takes,
        as hosts/incast_client.py) on the client host; return (process, its line reader)
        once it says CONNECTED."""
        w = self.scenario.workload
        cmd = [sys.executable, str(HOSTS_DIR / program), *extra,
               "--servers", ",".join(s.IP() for s in servers),
               "--fragments", ",".join(map(str, self.scenario.fragments())),
               "--dscp", ",".join(map(str, dscps)), "--port", str(port),
               "--blocks", str(w.blocks), "--warmup", str(w.warmup), "--seed", str(w.seed + rep)]
        proc = self.popen(client, cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
        lines = self.lines(proc, program.removesuffix(".py").replace("_", " "))
        lines.expect("CONNECTED")
        return proc, lines

    def measured_blocks(self, proc, lines, hooks: Hooks) -> None:
        """The part of the client protocol every client of ours speaks: WARM, then GO on
        its stdin starts the measured blocks, one BLOCK line each; hooks around them."""
        lines.expect("WARM")
        hooks.measuring()
        proc.stdin.write("GO\n")
        proc.stdin.flush()
        for _ in range(self.scenario.workload.blocks):
            parts = lines.next().split()
            if parts[0] != "BLOCK":
                raise WorkloadFailed(f"{lines.what}: unexpected output {' '.join(parts)!r}")
            hooks.block(Block(*map(int, parts[1:5])))
        hooks.measured()

    def block_bytes(self) -> int:
        """Bytes of application data the client receives per block."""
        return sum(self.scenario.fragments())


def get(kind: str) -> type[Workload]:
    e = WORKLOADS.get(kind)
    if e is None:
        raise ValueError(f"unknown workload {kind!r} (known: {', '.join(WORKLOADS)})")
    return getattr(importlib.import_module(e.module), e.cls)
