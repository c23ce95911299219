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

from . import HOSTS_DIR, Block, Hooks, Workload, WorkloadFailed

SERVER_PORT = 5001


class SynchronizedRead(Workload):
    def start_servers(self, servers, dscps):
        procs = [(s, self.popen(s, [sys.executable, str(HOSTS_DIR / "incast_server.py"), "--port",
                                     str(SERVER_PORT), "--dscp", str(d)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
                 for s, d in zip(servers, dscps)]
        for s, p in procs:
            self.lines(p, f"server on {s.name}").expect("READY")

    def repetition(self, rep, client, servers, dscps, hooks: Hooks):
        w = self.scenario.workload
        cmd = [sys.executable, str(HOSTS_DIR / "incast_client.py"),
               "--servers", ",".join(s.IP() for s in servers),
               "--fragments", ",".join(map(str, self.scenario.fragments())),
               "--dscp", ",".join(map(str, dscps)), "--port", str(SERVER_PORT),
               "--blocks", str(w.blocks), "--warmup", str(w.warmup), "--seed", str(w.seed + rep)]
        proc = self.popen(client, cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
        lines = self.lines(proc, "client")
        lines.expect("CONNECTED")
        lines.expect("WARM")
        hooks.measuring()
        proc.stdin.write("GO\n")
        proc.stdin.flush()
        for _ in range(w.blocks):
            parts = lines.next().split()
            if parts[0] != "BLOCK":
                raise WorkloadFailed(f"client: unexpected output {' '.join(parts)!r}")
            hooks.block(Block(*map(int, parts[1:5])))
        hooks.measured()
        flows = []
        for _ in servers:
            parts = lines.next().split(" ", 2)
            if parts[0] != "FLOW":
                raise WorkloadFailed(f"client: unexpected output {parts[0]!r}")
            flows.append({"server_index": int(parts[1]), **json.loads(parts[2])})
        lines.expect("DONE")
        proc.wait()
        return flows
