"""A key-value multiget as the incast workload: every server runs memcached (Debian's,
unmodified) and holds its share of a block as values; the client sends every server one
multiget at once and the next only when all answers are complete. Each server's answer
is workload.sru bytes of values (in keys of VALUE_BYTES) plus memcached's framing
(~30 bytes a key); goodput counts the values. The servers' TCP state comes from the
kernel's socket diagnostics (hosts/port_tcpinfo.py), as memcached cannot report it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from incast.constants import HOSTS_DIR
from incast.errors import MissingFeature
from incast.workload import Hooks, Workload, WorkloadFailed

PORT = 11211
VALUE_BYTES = 16 << 10      # bytes per key: a fragment of 256 KiB is a multiget of 16 keys
LISTENING = "server listening"  # what memcached -vv prints once its socket listens


class MemcachedMultiget(Workload):
    @classmethod
    def require(cls, features, scenario):
        if shutil.which("memcached") is None:
            raise MissingFeature("workload memcached needs memcached (Debian package memcached)")
        return []

    def start_servers(self, servers, dscps):
        memory_mb = 64 + 2 * max(self.scenario.fragments()) // (1 << 20)
        argv = [shutil.which("memcached"), "-l", "0.0.0.0", "-p", str(PORT), "-U", "0", "-t", "1",
                "-m", str(memory_mb), "-c", "64", "-vv"]
        if os.geteuid() == 0:
            argv += ["-u", "root"]      # memcached refuses root unless told which user to be
        procs = [(s, self.popen(s, argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
                 for s in servers]
        for s, p in procs:
            lines = self.lines(p, f"memcached on {s.name}")
            while LISTENING not in lines.next():
                pass
            # -vv goes on logging every command: hand the pipe to a reader that drops it.
            subprocess.Popen(["cat"], stdin=p.stdout, stdout=subprocess.DEVNULL)
            p.stdout.close()

    def repetition(self, rep, client, servers, dscps, hooks: Hooks):
        proc, lines = self.start_client(client, "memcached_client.py", ["--value", str(VALUE_BYTES)],
                                        servers, dscps, PORT, rep)
        self.measured_blocks(proc, lines, hooks)
        lines.expect("MEASURED")
        flows = self._server_tcp_info(client, servers)
        proc.stdin.write("CLOSE\n")
        proc.stdin.flush()
        lines.expect("DONE")
        proc.wait()
        return flows

    def _server_tcp_info(self, client, servers) -> list[dict]:
        procs = [self.popen(s, [sys.executable, str(HOSTS_DIR / "port_tcpinfo.py"), "--port", str(PORT)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for s in servers]
        flows = []
        for i, (s, p) in enumerate(zip(servers, procs)):
            out, err = p.communicate()
            rows = [json.loads(line) for line in out.splitlines()]
            mine = [r["info"] for r in rows if r["peer"] == client.IP()]
            if p.returncode or len(mine) != 1:
                raise WorkloadFailed(f"TCP state of memcached on {s.name}: "
                                     f"{err.strip() or f'{len(mine)} connections from the client'}")
            flows.append({"server_index": i, **mine[0]})
        return flows
