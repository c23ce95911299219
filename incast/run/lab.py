"""Building a run's network: the namespaces, the Mininet topology, the hosts' TCP and
NICs, the data plane's switches."""
from __future__ import annotations

import functools
import os
import resource
import time
from dataclasses import dataclass

from mininet.log import setLogLevel
from mininet.net import Mininet

from incast import topology
from incast.machine import resources
from incast.network import hostconfig
from incast.network.link import BatchedHost, DeferredIntf, VethBatch


@dataclass
class Lab:
    """The built network."""
    net: object
    client: object
    servers: list
    dscps: list[int]
    bottleneck: object
    build_s: float
    netns: frozenset[int] = frozenset()     # inodes of the run's network namespaces


def build(scenario, features, dp, res, results, log) -> Lab:
    # Imported late: Mininet is heavy and only needed once a network is built.

    setLogLevel("error")
    wanted = sorted({t.cc for _, t in scenario.tcp.all_settings()} - set(features.cc_allowed))
    if wanted:
        # Namespaces may only pick algorithms the init namespace allows.
        res.set_global_sysctl("net.ipv4.tcp_allowed_congestion_control",
                              " ".join(features.cc_allowed + wanted))
    # The kernel keeps one ARP table for all namespaces, and past gc_thresh3 entries it
    # refuses new neighbours ("No route to host"). The client has every server for a
    # neighbour and each server the client: a thousand servers pass the default 1024.
    hosts = len(scenario.topology.hosts())
    for level, need in (("gc_thresh1", 2 * hosts), ("gc_thresh2", 3 * hosts), ("gc_thresh3", 4 * hosts)):
        res.raise_global_sysctl(f"net.ipv4.neigh.default.{level}", need)
    # Every frame a veth carries passes a CPU's input backlog, one per CPU for all
    # namespaces. When a thousand servers send at the same instant (virtual time, one
    # CPU) they queue there before the switch sees them, and past netdev_max_backlog
    # (1000) the kernel drops outside the switch (measured: 20 frames at 1020 servers).
    # Room for every host's largest NIC burst (a frame plus NIC_SLACK_FRAMES_MAX) and one more.
    res.raise_global_sysctl("net.core.netdev_max_backlog",
                            (hostconfig.NIC_SLACK_FRAMES_MAX + 2) * hosts)
    res.create_world()
    # Mininet keeps pipes to every host's shell: hundreds of hosts pass 1024 files.
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    t_build = time.monotonic()
    topo = topology.load(scenario.topology.kind, scenario.topology.senders, **scenario.topology.params())
    veths = VethBatch(scenario.link.mtu)
    res.create_host_netns(topo.hosts())
    log(f"build: {len(topo.hosts())} host namespaces made")
    net = Mininet(topo=topo, switch=dp.switch_class(), controller=None,
                  host=functools.partial(BatchedHost, netns_of=res.host_netns),
                  link=veths.link_class(), intf=DeferredIntf, build=False, waitConnected=False)
    try:
        net.build()
        veths.create()
    finally:    # every node shell Mininet started, even if the build failed half-way
        res.track(*(getattr(n, "shell", None) for n in net.hosts + net.switches))
    log(f"build: {len(net.links)} links made")
    net.start()
    log("build: switches started")
    client = net.get(topo.client)
    servers = [net.get(s) for s in topo.servers]
    applied = hostconfig.configure_hosts(net.hosts, servers, scenario, features)
    log("build: hosts configured")
    results.write_json("tcp_hosts.json", applied)
    dp.configure(net, topo)
    log("build: data plane configured")
    for name, text in dp.artifacts().items():
        results.write_text(name, text)
    build_s = time.monotonic() - t_build
    log(f"network of {len(net.hosts)} hosts built in {build_s:.1f} s ({res.token})")
    qos = scenario.switch.qos
    dscps = [qos.class_dscp()[qos.class_of_sender(i)] for i in range(len(servers))]
    netns = frozenset(os.stat(h.netns_path).st_ino for h in net.hosts) | {resources.netns_inode(res.world)}
    return Lab(net, client, servers, dscps, dp.bottleneck(client.name), build_s, netns)
