"""Chain: the client on s1, each server one switch further (a topologies/<kind>.py file;
its name in incast/registry.py's TOPOLOGIES)."""
from mininet.topo import Topo


class ChainTopo(Topo):

    def build(self, senders=1, others=0):
        self.params = {"others": others}
        switches = [self.addSwitch(f"s{i + 1}") for i in range(senders)]
        self.client = self.addHost("client")
        self.addLink(self.client, switches[0])
        self.servers, self.others = [], []
        for i, sw in enumerate(switches):
            if i:
                self.addLink(switches[i - 1], sw)
            self.servers.append(self.addHost(f"server{i + 1}"))
            self.addLink(self.servers[-1], sw)


topos = {"chain": ChainTopo}
