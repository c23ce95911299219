"""Leaf-spine: two leaves, one or more spines, every leaf linked to every spine.

    client, server1..serverK, near1..nearM -- s1 (leaf) ==== s3 .. s(2+spines) (spines) ==== s2 (leaf) -- serverK+1..serverN, far1..farM

The far servers' answers climb from leaf s2 to a spine and come down to leaf s1, where
the client's port is the bottleneck. With two spines there are two equal paths between
the leaves; the testbed's data planes pick one per destination host (incast.dataplane.
forwarding) and flood over one spanning tree, so the loop the spines close never
carries a broadcast. ``far`` servers sit on s2 (default: half, rounded down); ``others``
extra hosts on each leaf (near1.., far1..) carry background traffic.

With plain Mininet's Linux bridges, two spines make a loop: let STP break it (one
spine's links then stand by):

    mn --custom topologies/leaf_spine.py --topo leaf_spine,8,spines=2 --switch lxbr,stp=1
"""
from mininet.topo import Topo


class LeafSpineTopo(Topo):

    def build(self, senders=1, far=None, others=0, spines=2):
        far = senders // 2 if far is None else far
        if far > senders:
            raise ValueError(f"far ({far}) is more than the {senders} servers")
        self.params = {"far": far, "others": others, "spines": spines}
        leaves = [self.addSwitch("s1"), self.addSwitch("s2")]
        self.client = self.addHost("client")
        self.addLink(self.client, leaves[0])    # port 1 of s1 faces the client: the bottleneck
        self.servers = []
        for i in range(1, senders + 1):
            server = self.addHost(f"server{i}")
            self.addLink(server, leaves[0] if i <= senders - far else leaves[1])
            self.servers.append(server)
        self.others = []
        for side, leaf in (("near", leaves[0]), ("far", leaves[1])):
            for i in range(1, others + 1):
                h = self.addHost(f"{side}{i}")
                self.addLink(h, leaf)
                self.others.append(h)
        for k in range(spines):                 # the trunks: each leaf to each spine
            spine = self.addSwitch(f"s{3 + k}")
            for leaf in leaves:
                self.addLink(leaf, spine)


topos = {"leaf_spine": LeafSpineTopo}
