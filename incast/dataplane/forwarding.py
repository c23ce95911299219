"""Forwarding: which port of each switch leads to each host, and which ports a flood uses.

One computation for both data planes, so a topology forwards the same way on the kernel
bridges (static FDB entries) and on bmv2 (its l2_forward table):

- Every host is reached on a shortest path (fewest switch hops). Where several ports of a
  switch start a shortest path (a leaf with two spines), the destination picks one: the
  host's position in the topology modulo the number of choices. That is multipath by
  destination, which is what an L2 forwarding table can express; per-flow ECMP hashing
  needs routers. It is deterministic: the same host always takes the same spine.
- Floods (ARP broadcasts, unknown unicast) follow one spanning tree of the switches
  (breadth first from the first switch by name), so a topology with a loop between
  switches (two spines) does not circulate broadcasts. Trunks off the tree carry only
  unicast to the hosts routed over them.
"""
from __future__ import annotations

from incast.dataplane import Port


def _by_switch(ports: list[Port]) -> dict[str, list[Port]]:
    by: dict[str, list[Port]] = {}
    for p in sorted(ports, key=lambda p: (p.switch, p.number)):
        by.setdefault(p.switch, []).append(p)
    return by


def _switch_distances(by: dict[str, list[Port]], start: str) -> dict[str, int]:
    dist, frontier = {start: 0}, [start]
    while frontier:
        nxt = []
        for sw in frontier:
            for p in by.get(sw, []):
                if p.trunk and p.peer not in dist:
                    dist[p.peer] = dist[sw] + 1
                    nxt.append(p.peer)
        frontier = nxt
    return dist


def next_hops(ports: list[Port], hosts: list[str]) -> dict[str, dict[str, int]]:
    """switch -> host -> the port number that leads to the host on a shortest path.
    `hosts` is the topology's host order (which picks among equal paths)."""
    by = _by_switch(ports)
    home = {p.peer: p.switch for p in ports if not p.trunk}
    order = {h: i for i, h in enumerate(hosts)}
    hops_from = {sw: _switch_distances(by, sw) for sw in set(home.values())}   # per host's switch
    out: dict[str, dict[str, int]] = {}
    for sw, own in by.items():
        table = out.setdefault(sw, {})
        for h in sorted(home, key=lambda h: order.get(h, len(order))):
            if home[h] == sw:
                table[h] = next(p.number for p in own if p.peer == h)
                continue
            dist = hops_from[home[h]]
            if sw not in dist:
                continue                             # not connected: no entry
            choices = [p.number for p in own if p.trunk and dist.get(p.peer, -1) == dist[sw] - 1]
            table[h] = choices[order.get(h, 0) % len(choices)]
    return out


def flood_ports(ports: list[Port]) -> dict[str, set[int]]:
    """switch -> the ports a flood leaves by: every host port, and the trunks of one
    spanning tree of the switches."""
    by = _by_switch(ports)
    out = {sw: {p.number for p in own if not p.trunk} for sw, own in by.items()}
    if not by:
        return out
    root = min(by)
    seen, frontier = {root}, [root]
    while frontier:
        nxt = []
        for sw in frontier:
            for p in by[sw]:
                if p.trunk and p.peer not in seen:
                    seen.add(p.peer)
                    nxt.append(p.peer)
                    out[sw].add(p.number)
                    back = next(q for q in by[p.peer] if q.trunk and q.peer == sw)
                    out[p.peer].add(back.number)
        frontier = nxt
    return out
