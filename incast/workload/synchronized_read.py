"""The synchronized read of the papers: a client asks every server for its fragment of
a block at once and asks for the next block only when all have arrived (the barrier
that makes incast). Fixed fragments (FAST'08's SRU per server) or a fixed block split
over the servers (SIGCOMM'09 Figure 1, WREN'09's variable fragment). The programs are
hosts/incast_server.py and hosts/incast_client.py (standard library only, so they run
unchanged in a namespace, a container or a VM)."""
from __future__ import annotations

import json
import subprocess
import sys

from incast.workload import Hooks, Workload, WorkloadFailed
from incast.constants import HOSTS_DIR

SERVER_PORT = 5001


class SynchronizedRead(Workload):
    def start_servers(self, servers, dscps):
        if self.scenario.workload.server_process == "shared":
            # One process, started in the first server's namespace (so the run's cleanup
            # finds it with that host's), opens each listener in its server's namespace.
            spec = [f"--netns={s.netns_path}:{d}" for s, d in zip(servers, dscps)]
            proc = self.popen(servers[0], [sys.executable, str(HOSTS_DIR / "incast_server.py"), "--port",
                                           str(SERVER_PORT), *spec],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self.lines(proc, f"shared server of {len(servers)} hosts").expect("READY")
            return
        procs = [(s, self.popen(s, [sys.executable, str(HOSTS_DIR / "incast_server.py"), "--port",
                                     str(SERVER_PORT), "--dscp", str(d)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
                 for s, d in zip(servers, dscps)]
        for s, p in procs:
            self.lines(p, f"server on {s.name}").expect("READY")

    def repetition(self, rep, client, servers, dscps, hooks: Hooks):
        proc, lines = self.start_client(client, "incast_client.py", [], servers, dscps, SERVER_PORT, rep)
        self.measured_blocks(proc, lines, hooks)
        flows = []
        for _ in servers:
            parts = lines.next().split(" ", 2)
            if parts[0] != "FLOW":
                raise WorkloadFailed(f"{lines.what}: unexpected output {parts[0]!r}")
            flows.append({"server_index": int(parts[1]), **json.loads(parts[2])})
        lines.expect("DONE")
        proc.wait()
        return flows
