"""The worked examples of docs/architecture.md: a results table, a topology and a data
plane are each one new file plus one line in incast/registry.py, nothing else edited.
Each is done here for real (a file in a temporary folder, the registry's line added
for the test's length), and the run's own machinery takes it up. And the clock is
asked, never named, outside incast/clock.py."""
import re
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from incast import registry, topology
from incast.clock import REAL
from incast.scenario import build

REPO = Path(__file__).resolve().parent.parent


def _module(tmp_path, monkeypatch, name: str, text: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    return name


class _Features:
    clock = REAL


def test_a_table_is_an_instrument_file_and_a_registry_line(tmp_path, monkeypatch):
    from incast.measure.instrument import Bench, Instruments, selected
    module = _module(tmp_path, monkeypatch, "incast_example_table", """
        import pandas as pd
        from incast.measure.instrument import Instrument, Readings

        class Marks(Instrument):
            def __init__(self, bench):
                super().__init__(bench)
                self.rows = []

            def measuring(self, rep):
                self.rows.append({"rep": rep, "edge": "begin"})

            def measured(self, rep):
                self.rows.append({"rep": rep, "edge": "end"})

            def stop(self):
                return Readings(tables={"marks.parquet": pd.DataFrame(self.rows)}, summary={"marks": len(self.rows)})
        """)
    monkeypatch.setitem(registry.INSTRUMENTS, "marks", registry.InstrumentEntry(module, "Marks", ("marks.parquet",)))
    classes = [c for c in selected(build(), _Features) if c.__name__ == "Marks"]
    assert len(classes) == 1
    bench = Bench(build(), _Features, None, None, None, [], [], frozenset(), 0, tmp_path, None, None)
    instruments = Instruments(classes, bench)
    instruments.start()
    for rep in range(2):
        instruments.measuring(rep)
        instruments.measured(rep)
    readings = instruments.stop()
    assert readings.summary == {"marks": 4}
    assert isinstance(readings.tables["marks.parquet"], pd.DataFrame) and len(readings.tables["marks.parquet"]) == 4


def test_a_topology_is_a_topo_file_and_a_registry_line(tmp_path, monkeypatch):
    folder = tmp_path / "topologies"
    folder.mkdir()
    for f in (REPO / "topologies").glob("*.py"):
        (folder / f.name).write_text(f.read_text())
    (folder / "chain.py").write_text(textwrap.dedent('''
        """Chain: the client on s1, every server one switch further."""
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
        '''))
    monkeypatch.setattr(topology, "TOPOLOGIES_DIR", folder)
    monkeypatch.setattr(topology, "TOPOLOGIES", (*registry.TOPOLOGIES, "chain"))
    for cached in (topology.topo_class, topology.facts):
        cached.cache_clear()
    try:
        s = build({"topology": {"kind": "chain", "senders": 3, "trunk_rate": "10Gbit"}})
        assert s.topology.hosts() == ["client", "server1", "server2", "server3"]
        assert s.topology.most_hosts_on_a_switch() == 3            # the client, a server, the next switch
        assert s.topology.params() == {"others": 0}
        assert "chain" in topology.known() and topology.trunked("chain")
    finally:
        for cached in (topology.topo_class, topology.facts):
            cached.cache_clear()


def test_a_data_plane_is_its_file_and_a_registry_line(tmp_path, monkeypatch):
    from incast import dataplane
    module = _module(tmp_path, monkeypatch, "incast_example_plane", """
        from incast.dataplane import DataPlane

        class NullDataPlane(DataPlane):
            name = "null"

            def switch_class(self):
                raise NotImplementedError

            def configure(self, net, topo):
                pass

            def queue_counters(self):
                raise NotImplementedError

            def telemetry(self, run_dir, host_of_ip, world_inode):
                raise NotImplementedError
        """)
    monkeypatch.setitem(registry.DATAPLANES, "null", registry.DataPlaneEntry(module, "NullDataPlane",
                                                                            "forwards nothing", max_ports=8))
    s = build({"dataplane": "null", "topology": {"senders": 4}})
    assert dataplane.get(s.dataplane).name == "null"
    with pytest.raises(Exception, match="9 ports on one switch"):
        build({"dataplane": "null", "topology": {"senders": 8}})


# A comparison with one of the clocks' names, or a test of which guest runner it is.
_NAMED = re.compile(r"""clock\s*[!=]=\s*["']|["'](real|virtual)["']\s*[!=]=|\bis\s+(VIRTUAL|REAL)\b|"""
                    r"""runner\s+is\s+(uml|qemu)\b|guest_runner\s*==""")


def test_the_clock_is_asked_not_named_outside_clock_py():
    found = [f"{p.relative_to(REPO)}:{i}: {line.strip()}"
             for p in sorted((REPO / "incast").rglob("*.py")) if p.name != "clock.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if _NAMED.search(line)]
    assert found == []


def test_no_data_plane_or_topology_is_compared_by_name_outside_the_registry():
    """What a data plane or a topology can do is asked of the registry (DATAPLANES'
    entries) or of the built Topo (scenario.Topology), never read off its name."""
    import re
    names = "|".join(["linux", "bmv2", "rtl", "star", "two_switch", "leaf_spine", "fan_in"])
    compared = re.compile(rf"""(==|!=|\bin)\s*\(?["']({names})["']|["']({names})["']\s*(==|!=)""")
    found = []
    for path in sorted((REPO / "incast").rglob("*.py")):
        if path.name == "registry.py":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if compared.search(line.split("#")[0]):
                found.append(f"{path.relative_to(REPO)}:{i}: {line.strip()}")
    assert not found, "\n".join(found)


def _function_imports():
    """(path, line, source line) of every import made inside a function of the package."""
    import ast
    out = []
    for path in sorted((REPO / "incast").rglob("*.py")):
        lines = path.read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out += [(path.relative_to(REPO), node.lineno, lines[node.lineno - 1])
                        for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom))]
    return out


def test_imports_are_at_the_top_of_their_module():
    """A module's imports say what it depends on, at its top: at most ten are made inside
    a function, each saying why on its line (an optional extra, a slow import only one
    path needs)."""
    late = _function_imports()
    assert len(late) <= 10, "\n".join(f"{p}:{n}: {text.strip()}" for p, n, text in late)
    unexplained = [f"{p}:{n}: {text.strip()}" for p, n, text in late if "#" not in text]
    assert not unexplained, "\n".join(unexplained)


def test_no_data_plane_imports_another():
    """What data planes share lives in a common room (e.g. the P4 postcards' collector,
    incast/measure/postcards.py), never in one of them."""
    import ast
    planes = {p.stem for p in (REPO / "incast" / "dataplane").glob("*.py")} - {"__init__", "forwarding"}
    wrong = []
    for plane in planes:
        path = REPO / "incast" / "dataplane" / f"{plane}.py"
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            wrong += [f"{plane}.py imports {n}" for n in names
                      if any(n == f"incast.dataplane.{o}" for o in planes - {plane})]
    assert not wrong, wrong
