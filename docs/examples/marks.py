"""A results table: marks.parquet, a row at each edge of each repetition's measured
blocks (an Instrument; one line in incast/registry.py's INSTRUMENTS)."""
import time

import pandas as pd

from incast.measure.instrument import Instrument, Readings


class Marks(Instrument):

    def __init__(self, bench):
        super().__init__(bench)
        self.rows = []

    def measuring(self, rep):
        self.rows.append({"rep": rep, "edge": "begin", "t_ns": time.monotonic_ns()})

    def measured(self, rep):
        self.rows.append({"rep": rep, "edge": "end", "t_ns": time.monotonic_ns()})

    def stop(self):
        return Readings(tables={"marks.parquet": pd.DataFrame(self.rows)}, summary={"marks": len(self.rows)})
