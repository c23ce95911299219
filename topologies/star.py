"""Star: one client and N servers on one switch -- the incast fan-in.

Every server answers the client at once, so the switch port toward the client is the
bottleneck. Usable by the testbed (``topology.kind = "star"``) and by plain Mininet:

    mn --custom topologies/star.py --topo star,8 --switch lxbr
"""
from mininet.topo import Topo


class StarTopo(Topo):
    """client -- s1 -- server1..serverN"""

    def build(self, senders=1, others=0):
        self.params = {"others": others}
        switch = self.addSwitch("s1")
        self.client = self.addHost("client")
        # Port 1 of the switch faces the client: it is the bottleneck port.
        self.addLink(self.client, switch)
        self.servers = []
        for i in range(1, senders + 1):
            server = self.addHost(f"server{i}")
            self.addLink(server, switch)
            self.servers.append(server)
        # Extra hosts for background traffic (near1..nearM).
        self.others = []
        for i in range(1, others + 1):
            h = self.addHost(f"near{i}")
            self.addLink(h, switch)
            self.others.append(h)


topos = {"star": StarTopo}
