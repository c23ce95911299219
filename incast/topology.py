"""Topologies: Mininet `Topo` files in topologies/, each named in incast.registry.TOPOLOGIES.

A file topologies/<kind>.py defines `topos = {"<kind>": TopoClass}` (Mininet's --custom
convention, so `mn --custom` runs it too). ``TopoClass(senders=N, **params)`` builds its
graph and sets ``client``, ``servers`` and ``others`` (host names) and ``params`` (its
parameters as it used them, defaults resolved). The keyword parameters of its
``build()`` beyond ``senders`` are the scenario fields it takes (``topology.far``,
``topology.spines``, ...). Whatever else the testbed needs to know of a topology (its
hosts, the ports of its busiest switch, whether switches are joined by trunks) is
asked of the built Topo here, never worked out again elsewhere: adding a topology is
its file and its line in the registry.
"""
from __future__ import annotations

import importlib.util
import inspect
from dataclasses import dataclass
from functools import lru_cache

from incast.constants import TOPOLOGIES_DIR
from incast.registry import TOPOLOGIES


def known() -> list[str]:
    return list(TOPOLOGIES)


@lru_cache(maxsize=None)
def topo_class(kind: str):
    """topologies/<kind>.py's Topo class (loading it imports Mininet's topo module only)."""
    path = TOPOLOGIES_DIR / f"{kind}.py"
    if kind not in TOPOLOGIES or not path.is_file():
        raise ValueError(f"unknown topology {kind!r} (known: {', '.join(known())})")
    spec = importlib.util.spec_from_file_location(f"incast_topology_{kind}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.topos[kind]


def parameters(kind: str) -> tuple[str, ...]:
    """The parameters the topology declares: its build()'s keywords beyond senders."""
    names = inspect.signature(topo_class(kind).build).parameters
    return tuple(n for n in names if n not in ("self", "senders"))


def load(kind: str, senders: int, **params):
    """The topology with `senders` servers (and its own parameters: scenario.Topology.params())."""
    return topo_class(kind)(senders=senders, **params)


@dataclass(frozen=True)
class Facts:
    """What the testbed asks of a built topology."""
    hosts: tuple[str, ...]          # the client, the servers, the other hosts, in that order
    busiest_switch_ports: int       # ports of the switch with the most (a bridge or P4 switch's limit)
    trunked: bool                   # some switches are joined by a link (topology.trunk_rate applies)
    params: tuple                   # its parameters as it used them, as (name, value) pairs


@lru_cache(maxsize=256)
def facts(kind: str, senders: int, given: tuple = ()) -> Facts:
    """The facts of topology `kind` with `senders` servers and the parameters `given`
    ((name, value) pairs); raises ValueError where the topology refuses them."""
    topo = load(kind, senders, **dict(given))
    switches = set(topo.switches())
    trunked = any(a in switches and b in switches for a, b in topo.links())
    ports = max((len(topo.ports.get(s, {})) for s in switches), default=0)
    return Facts(tuple([topo.client, *topo.servers, *topo.others]), ports, trunked,
                 tuple(topo.params.items()))


def trunked(kind: str) -> bool:
    """Whether the topology joins its switches by trunks (with two servers: one may
    need a switch of its own)."""
    return facts(kind, 2).trunked
