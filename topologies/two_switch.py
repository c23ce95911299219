"""Two switches: the client and the near servers on s1, the far servers on s2, one trunk.

    client, server1..serverK, near1..nearM -- s1 ==trunk== s2 -- serverK+1..serverN, far1..farM

The far servers' answers cross the trunk, and so does any traffic between the two
sides: an innocent flow from a far host to a near one shares the trunk with the incast,
and with PAUSE on, a congested port can stop the trunk and everything on it (FAST'08
§6). ``far`` servers sit on s2 (default: half, rounded down); ``others`` extra hosts on
each side (near1.., far1..) carry background traffic. Usable by plain Mininet too:

    mn --custom topologies/two_switch.py --topo two_switch,8 --switch lxbr
"""
from mininet.topo import Topo


class TwoSwitchTopo(Topo):

    def build(self, senders=1, far=None, others=0):
        far = senders // 2 if far is None else far
        if far > senders:
            raise ValueError(f"far ({far}) is more than the {senders} servers")
        self.params = {"far": far, "others": others}
        s1, s2 = self.addSwitch("s1"), self.addSwitch("s2")
        self.client = self.addHost("client")
        self.addLink(self.client, s1)       # port 1 of s1 faces the client: the bottleneck
        self.servers = []
        for i in range(1, senders + 1):
            server = self.addHost(f"server{i}")
            self.addLink(server, s1 if i <= senders - far else s2)
            self.servers.append(server)
        self.others = []
        for side, switch in (("near", s1), ("far", s2)):
            for i in range(1, others + 1):
                h = self.addHost(f"{side}{i}")
                self.addLink(h, switch)
                self.others.append(h)
        self.addLink(s1, s2)                # the trunk


topos = {"two_switch": TwoSwitchTopo}
