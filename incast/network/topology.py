"""Topologies: Mininet `Topo` files in topologies/, the registry being the folder itself.

A file topologies/<kind>.py defines `topos = {"<kind>": TopoClass}` (Mininet's --custom
convention, so `mn --custom` runs it too); TopoClass(senders=N) sets `client` and
`servers` (host names). Adding a topology is adding its file.
"""
from __future__ import annotations

import importlib.util

from incast.constants import TOPOLOGIES_DIR


def known() -> list[str]:
    return sorted(p.stem for p in TOPOLOGIES_DIR.glob("*.py") if not p.name.startswith("_"))


def load(kind: str, senders: int, **params):
    """Instantiate topologies/<kind>.py's topology with `senders` servers (and the
    topology's own parameters: scenario.Topology.params())."""
    path = TOPOLOGIES_DIR / f"{kind}.py"
    if not path.is_file():
        raise ValueError(f"unknown topology {kind!r} (known: {', '.join(known())})")
    spec = importlib.util.spec_from_file_location(f"incast_topology_{kind}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)   # imports Mininet: only once a network is built
    return module.topos[kind](senders=senders, **params)
