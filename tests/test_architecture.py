"""The worked examples of docs/architecture.md: a results table, a topology and a data
plane are each one new file plus one line in incast/registry.py, nothing else edited.
Each is done here for real (a file in a temporary folder, the registry's line added
for the test's length), and the run's own machinery takes it up. And the clock is
asked, never named, outside incast/clock.py."""
import re
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import needs_root
from incast import registry, topology
from incast.scenario import build

REPO = Path(__file__).resolve().parent.parent


EXAMPLES = REPO / "docs" / "examples"
# A small real run on this machine's kernel: each worked example is made for real.
REAL_RUN = {"senders": "2", "link_rate": "100Mbit", "buffer": "64KiB", "blocks": "3", "warmup": "1",
            "sru": "64KiB"}


def _module(tmp_path, monkeypatch, name: str, example: str) -> str:
    """docs/examples/<example>.py as the module `name`, as a user's file would be."""
    (tmp_path / f"{name}.py").write_text((EXAMPLES / f"{example}.py").read_text())
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    return name


def _run(scenario, out):
    from incast.run.experiment import run
    return run(scenario, out).summary


def test_the_worked_examples_are_the_documentations():
    """docs/architecture.md shows each example file whole, as the tests below run it."""
    text = (REPO / "docs" / "architecture.md").read_text()
    for f in sorted(EXAMPLES.glob("*.py")):
        assert f"```python\n# docs/examples/{f.name}\n{f.read_text()}```" in text, f"{f.name} differs from the page"


@needs_root
@pytest.mark.network
def test_a_table_is_an_instrument_file_and_a_registry_line(tmp_path, monkeypatch, no_leftovers):
    module = _module(tmp_path, monkeypatch, "incast_example_marks", "marks")
    monkeypatch.setitem(registry.INSTRUMENTS, "marks", registry.InstrumentEntry(module, "Marks", ("marks.parquet",)))
    summary = _run(build({}, {**REAL_RUN, "repetitions": "2"}), tmp_path / "run")
    marks = pd.read_parquet(tmp_path / "run" / "marks.parquet")
    assert summary["marks"] == 4 and list(marks["edge"]) == ["begin", "end"] * 2
    assert (marks["t_ns"].diff().dropna() > 0).all()


@needs_root
@pytest.mark.network
def test_a_topology_is_a_topo_file_and_a_registry_line(tmp_path, monkeypatch, no_leftovers):
    folder = tmp_path / "topologies"
    folder.mkdir()
    for f in [*(REPO / "topologies").glob("*.py"), EXAMPLES / "chain.py"]:
        (folder / f.name).write_text(f.read_text())
    monkeypatch.setattr(topology, "TOPOLOGIES_DIR", folder)
    monkeypatch.setattr(topology, "TOPOLOGIES", (*registry.TOPOLOGIES, "chain"))
    for cached in (topology.topo_class, topology.facts):
        cached.cache_clear()
    try:
        s = build({"topology": {"kind": "chain", "trunk_rate": "1Gbit"}}, {**REAL_RUN, "senders": "3"})
        assert s.topology.hosts() == ["client", "server1", "server2", "server3"]
        assert s.topology.most_hosts_on_a_switch() == 3            # the client, a server, the next switch
        assert "chain" in topology.known() and topology.trunked("chain")
        summary = _run(s, tmp_path / "run")
        assert summary["senders"] == 3 and summary["goodput_mbps"] > 0
        assert summary["bottleneck_port"] == "s1-eth1"
    finally:
        for cached in (topology.topo_class, topology.facts):
            cached.cache_clear()


@needs_root
@pytest.mark.network
def test_a_data_plane_is_its_file_and_a_registry_line(tmp_path, monkeypatch, no_leftovers):
    from incast import dataplane
    module = _module(tmp_path, monkeypatch, "incast_example_tbf", "tbf")
    monkeypatch.setitem(registry.DATAPLANES, "tbf", registry.DataPlaneEntry(
        module, "TbfDataPlane", "a learning bridge, a token bucket a port", packet_buffers=False, max_ports=8))
    s = build({}, {**REAL_RUN, "dataplane": "tbf"})
    assert dataplane.get(s.dataplane).name == "tbf"
    with pytest.raises(Exception, match="9 ports on one switch"):
        build({}, {**REAL_RUN, "dataplane": "tbf", "senders": "8"})
    summary = _run(s, tmp_path / "run")
    queues = pd.read_parquet(tmp_path / "run" / "queues.parquet")
    assert summary["dataplane"] == "tbf" and summary["goodput_mbps"] > 0
    assert set(queues["port"]) == {"s1-eth1", "s1-eth2", "s1-eth3"} and queues["sent_bytes"].sum() > 0


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
    incast/measure/postcards.py), never in one of them. A module beside a plane named
    for it (bmv2_runtime.py: <plane>_*.py, as the registry dates a plane's code) is that
    plane's own."""
    from test_layout import imports     # the layout test's reading of a module's imports
    modules = {p.stem for p in (REPO / "incast" / "dataplane").glob("*.py")} - {"__init__", "forwarding"}

    def plane(module):
        return module.split("_")[0] if module.split("_")[0] in modules else module
    wrong = [f"{m}.py imports {module} (line {line})" for m in modules
             for module, _, line in imports(REPO / "incast" / "dataplane" / f"{m}.py")
             if module in {f"incast.dataplane.{o}" for o in modules if plane(o) != plane(m)}]
    assert not wrong, wrong


def test_every_data_plane_is_what_instruments_ask_of_it():
    """The bench types the data plane by what instruments ask of it (Switches): every
    registered data plane has it, with the same parameters."""
    import importlib
    import inspect
    from incast.measure.instrument import Switches
    wanted = {n: inspect.signature(getattr(Switches, n)) for n in ("telemetry", "paced_ports")}
    for name, entry in registry.DATAPLANES.items():
        cls = getattr(importlib.import_module(entry.module), entry.cls)
        assert issubclass(cls, Switches), name
        for method, sig in wanted.items():
            assert list(inspect.signature(getattr(cls, method)).parameters) == list(sig.parameters), (name, method)
