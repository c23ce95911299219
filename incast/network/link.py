"""Mininet links and hosts whose interfaces are made and configured in batches.

Mininet makes each veth pair with one command in a host's shell and configures each
interface with several ``ifconfig`` calls (up, address, loopback): about ten processes
and as many shell round trips per host. Under User-Mode Linux a process costs tens of
milliseconds of host time, so a 47-server network took about 70 s of host time to build
(Figure 1's setting; run summaries' host_phase_s). Here the topology is still built with
Mininet (``Topo.addHost/addLink``, ``Mininet.build``), but:

* ``BatchedLink`` records each veth pair instead of making it; ``VethBatch.create``
  makes them all in one ``ip -batch`` (each end in its node's namespace) and brings up
  the ends in the run's own namespace (the switch ports);
* ``DeferredIntf`` and ``BatchedHost`` record addresses instead of running ``ifconfig``;
  each host's address, its loopback and its interface come up with the rest of its
  configuration, over netlink from inside its namespace (``hostconfig.host_requests``);
* a ``BatchedHost`` is a named namespace without a shell.

Nothing reads an interface between the two: Mininet knows each one's name, MAC (it
draws one per end) and IP from its own bookkeeping.
"""
from __future__ import annotations

from mininet.link import Intf, Link
from mininet.node import Host

from incast.machine import netdev
from incast.machine.resources import NETNS_DIR


class DeferredIntf(Intf):
    """An interface whose MAC and IP are recorded, not applied: the host's configuration applies them."""

    def config(self, mac=None, ip=None, ifconfig=None, up=True, **_params):
        if ifconfig:
            raise ValueError(f"{self.name}: ifconfig parameters are not supported ({ifconfig!r})")
        if mac:
            self.mac = mac
        if ip:
            self.setIP(ip)
        return {}

    def setIP(self, ipstr, prefixLen=None):
        self.ip, self.prefixLen = ipstr.split("/") if "/" in ipstr else (ipstr, prefixLen)
        return ""

    def setMAC(self, macstr):
        raise ValueError(f"{self.name}: a MAC is chosen when the link is made, not changed after")

    def isUp(self, setUp=False):
        return True


class BatchedHost(Host):
    """A Mininet host that is a named network namespace and nothing more: no shell.

    Mininet starts a shell per host to hold its namespace and to run its commands. Here
    every host's namespace is made beforehand (``resources.Run.create_host_netns``: one
    ``ip -batch`` for all), and every process on a host is started into it by path
    (``hostconfig.host_popen``), so a host costs no process. Under User-Mode Linux a
    process costs tens of milliseconds of host time: a thousand hosts' shells took 24 s
    of a 1020-server build. Its default configuration (IP, loopback up) is only
    recorded on its interface; hostconfig.host_requests applies it."""

    def __init__(self, name, netns_of, **params):
        self.netns = netns_of(name)          # resources.Run.host_netns: the run names them
        super().__init__(name, **params)

    @property
    def netns_path(self) -> str:
        return str(NETNS_DIR / self.netns)

    def startShell(self, mnopts=None):
        # Nothing to start: the namespace exists already. Mininet's own commands
        # (cmd, popen) have no shell to run in and are not used on these hosts.
        self.shell, self.pid = None, None

    def cmd(self, *args, **kwargs):
        raise RuntimeError(f"{self.name} has no shell: start processes with hostconfig.host_popen")

    def config(self, mac=None, ip=None, defaultRoute=None, lo="up", **params):
        if defaultRoute:
            raise ValueError(f"{self.name}: defaultRoute is not supported (one /8 subnet)")
        intf = self.defaultIntf()
        if intf is not None and ip:
            intf.setIP(ip, params.get("prefixLen", 8))
        if intf is not None and mac and mac != intf.MAC():
            raise ValueError(f"{self.name}: give a host's MAC to its link (addr1), not to the host")
        return {}


class VethBatch:
    """The veth pairs of one network, made together."""

    def __init__(self, mtu: int = 1500):
        self.lines: list[str] = []
        self.local_ends: list[str] = []      # ends in the run's namespace (switch ports)
        # link.mtu on both ends of every pair: a host's TCP takes its MSS from its own
        # interface, and a switch port must carry what the hosts send. 1500 is the
        # kernel's own default and left unsaid.
        self.mtu = mtu

    def link_class(self):
        batch = self

        class BatchedLink(Link):
            def __init__(self, node1, node2, **params):
                params["fast"] = True      # make the pair with each end where it belongs
                params.setdefault("intf", DeferredIntf)
                super().__init__(node1, node2, **params)

            def makeIntfPair(self, intfname1, intfname2, addr1=None, addr2=None,
                             node1=None, node2=None, deleteIntfs=True):
                batch.add(intfname1, intfname2, addr1, addr2, node1, node2)
        return BatchedLink

    def add(self, name1, name2, addr1, addr2, node1, node2) -> None:
        ends = []
        for name, addr, node in ((name1, addr1, node1), (name2, addr2, node2)):
            ns = getattr(node, "netns", None) or (node.pid if node is not None else None)
            where = f" netns {ns}" if node is not None and node.inNamespace else ""
            ends.append(f"name {name}{f' address {addr}' if addr else ''}"
                        f"{f' mtu {self.mtu}' if self.mtu != 1500 else ''}{where}")
            if not where:
                self.local_ends.append(name)
        self.lines.append(f"link add {ends[0]} type veth peer {ends[1]}")

    def create(self) -> None:
        """Make every recorded pair (one process), then bring up the local ends."""
        netdev.batch("ip", self.lines + [f"link set dev {n} up" for n in self.local_ends])
        self.lines, self.local_ends = [], []
