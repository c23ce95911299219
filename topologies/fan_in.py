"""Fan-in: the client on a root switch, the servers spread over edge switches, one trunk each.

    client -- s1 (root) ==trunk== s2 .. s(1+E) (edges) -- server1..serverN, in equal runs

Every answer crosses its edge switch and a trunk before it meets the others at s1's
port 1, the client's: the bottleneck. The paper's simulated switch had 2048 ports, a
Linux bridge takes 1023, so SIGCOMM'09 Figure 13's largest points need several
switches; with ``topology.trunk_rate`` well above the link's the trunks carry each
edge's share without becoming the bottleneck (a run's queues.parquet says how much
each trunk's queue held and dropped). ``edges``: edge switches (default one per 1000
servers). It carries no background hosts. Usable by plain Mininet too:

    mn --custom topologies/fan_in.py --topo fan_in,8,edges=2 --switch lxbr
"""
from mininet.topo import Topo

SERVERS_PER_EDGE = 1000     # default: a Linux bridge's 1023 ports, with room to spare


class FanInTopo(Topo):

    def build(self, senders=1, edges=None):
        edges = edges or -(-senders // SERVERS_PER_EDGE)
        if edges > senders:
            raise ValueError(f"edges ({edges}) is more than the {senders} servers")
        self.params = {"edges": edges}
        root = self.addSwitch("s1")
        self.client = self.addHost("client")
        self.addLink(self.client, root)     # port 1 of s1 faces the client: the bottleneck
        edge_switches = [self.addSwitch(f"s{2 + k}") for k in range(edges)]
        for edge in edge_switches:          # the trunks: ports 2.. of s1
            self.addLink(edge, root)
        self.servers, self.others = [], []
        for i in range(senders):            # servers 1..N in equal runs, edge by edge
            server = self.addHost(f"server{i + 1}")
            self.addLink(server, edge_switches[i * edges // senders])
            self.servers.append(server)


topos = {"fan_in": FanInTopo}
