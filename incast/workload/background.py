"""Background traffic: bulk TCP flows between chosen hosts while the blocks run.

Each flow (scenario ``background``) is a sink on its destination and a source on its
sender (hosts/bulk.py), started before the first measured block. The sinks are marked
when a repetition's measured blocks start and end; the bytes between the marks over the
time between them is the flow's goodput during the incast (``background.parquet``, and
``background_mbps`` in the summary).
"""
from __future__ import annotations

import subprocess
import sys

import pandas as pd

from incast.constants import HOSTS_DIR
from incast.measure.instrument import Instrument, Readings

BASE_PORT = 6000


class BackgroundTraffic(Instrument):
    def __init__(self, bench):
        super().__init__(bench)
        self.flows = bench.scenario.background
        self.popen, self.lines = bench.popen, bench.lines
        self.sinks, self.sources, self.marks, self.rows = [], [], {}, []

    @classmethod
    def wanted(cls, scenario, features) -> bool:
        return bool(scenario.background)

    def start(self) -> None:
        net = self.bench.net
        for i, f in enumerate(self.flows):
            dst, src = net.get(f.dst), net.get(f.src)
            port = BASE_PORT + i
            sink = self.popen(dst, [sys.executable, str(HOSTS_DIR / "bulk.py"), "sink", "--port", str(port)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            reader = self.lines(sink, f"background sink on {f.dst}")
            reader.expect("READY")
            source = self.popen(src, [sys.executable, str(HOSTS_DIR / "bulk.py"), "source", "--to", dst.IP(),
                                      "--port", str(port), "--dscp", str(f.dscp)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self.lines(source, f"background source on {f.src}").expect("CONNECTED")
            self.sinks.append((sink, reader))
            self.sources.append(source)

    def mark(self) -> list[tuple[int, int]]:
        """(time ns, bytes received) of every flow, now."""
        out = []
        for sink, reader in self.sinks:
            sink.stdin.write("MARK\n")
            sink.stdin.flush()
            _, t, n = reader.next().split()
            out.append((int(t), int(n)))
        return out

    def measuring(self, rep: int) -> None:
        self.marks[rep] = self.mark()

    def measured(self, rep: int) -> None:
        for i, ((t0, b0), (t1, b1)) in enumerate(zip(self.marks.pop(rep), self.mark())):
            f = self.flows[i]
            seconds = (t1 - t0) / 1e9
            self.rows.append({"rep": rep, "flow": i, "src": f.src, "dst": f.dst, "dscp": f.dscp,
                              "bytes": b1 - b0, "seconds": seconds,
                              "goodput_mbps": (b1 - b0) * 8 / seconds / 1e6 if seconds > 0 else 0.0})

    def stop(self) -> Readings:
        for p in self.sources + [s for s, _ in self.sinks]:
            if p.poll() is None:
                p.kill()
            p.wait()
        table = pd.DataFrame(self.rows)
        summary = {}
        if len(table):
            summary["background_mbps"] = [round(float(g), 3) for g in table.groupby("flow")["goodput_mbps"].mean()]
        return Readings(tables={"background.parquet": table}, summary=summary)
