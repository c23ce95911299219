"""Star: one client and N servers on one switch -- the incast fan-in.

Every server answers the client at once, so the switch port toward the client is the
bottleneck. Usable by the testbed (``topology.kind = "star"``) and by plain Mininet:

    mn --custom topologies/star.py --topo star,8 --switch lxbr
"""
from mininet.topo import Topo


class StarTopo(Topo):
    """client -- s1 -- server1..serverN"""

    def build(self, senders=1):
        switch = self.addSwitch("s1")
        self.client = self.addHost("client")
        # Port 1 of the switch faces the client: it is the bottleneck port.
        self.addLink(self.client, switch)
        self.servers = []
        for i in range(1, senders + 1):
            server = self.addHost(f"server{i}")
            self.addLink(server, switch)
            self.servers.append(server)


topos = {"star": StarTopo}
