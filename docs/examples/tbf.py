"""A data plane: each switch a Linux bridge that learns where hosts are, each of its
ports' egress one token bucket (tc-tbf) at the port's rate holding switch.buffer bytes
(an incast/dataplane/<name>.py file; one DataPlaneEntry in incast/registry.py)."""
import pandas as pd
from mininet.node import Switch

from incast.dataplane import DataPlane, port_rate, switch_ports
from incast.errors import MissingFeature
from incast.machine import netdev


class LearningBridge(Switch):

    def start(self, controllers):
        ports = [i.name for i in self.intfList() if i.name != "lo"]
        netdev.batch("ip", [f"link add name {self.name} type bridge",
                            *(f"link set dev {p} master {self.name} up" for p in ports),
                            f"link set dev {self.name} up"])

    def stop(self, deleteIntfs=True):
        netdev.delete_link(self.name)
        super().stop(deleteIntfs)


class TbfDataPlane(DataPlane):
    name = "tbf"

    def switch_class(self):
        return LearningBridge

    def configure(self, net, topo):
        self.ports = switch_ports(net)
        frame = self.scenario.link.mtu + 14
        netdev.batch("tc", [f"qdisc replace dev {p.name} root handle 10: tbf rate {port_rate(p, self.scenario)}bit "
                            f"burst {2 * frame} limit {self.scenario.switch.buffer}" for p in self.ports])

    def queue_counters(self):
        every = netdev.qdiscs_by_dev(stats=True)
        return pd.DataFrame([
            {"switch": p.switch, "port": p.name, "peer": p.peer, "queue": 0, "sent_packets": q["packets"],
             "sent_bytes": q["bytes"], "drops": q["drops"], "marks": 0, "overlimits": q["overlimits"],
             "backlog_bytes": q["backlog"], "backlog_packets": q["qlen"], "limit": self.scenario.switch.buffer,
             "limit_unit": "bytes"}
            for p in self.ports for q in every.get(p.name, []) if q["kind"] == "tbf"])

    def telemetry(self, run_dir, host_of_ip, world_inode):
        raise MissingFeature("the tbf data plane records no telemetry")
