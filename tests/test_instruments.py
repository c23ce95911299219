"""The instruments' contract (incast.measure.instrument): typed facts merged as the
runner judges by them, and tables only as the registry declares them."""
import pandas as pd
import pytest

from incast import registry
from incast.measure.instrument import Facts, Instrument, Instruments, Readings


class Marks(Instrument):
    def stop(self) -> Readings:
        return Readings(tables={"marks.parquet": pd.DataFrame({"a": [1]}), "stray.parquet": pd.DataFrame()})


def test_facts_merge_warnings_and_take_what_each_instrument_gave():
    merged = Readings()
    merged.add(Readings(facts=Facts(cpu={"busy": 0.5}, dataplane_warnings=["late"])))
    merged.add(Readings(facts=Facts(monitored=True, link_rows=[{"port": "s1-eth1"}], dataplane_warnings=["lag"])))
    merged.add(Readings(facts=Facts(telemetry_lost=0)))
    f = merged.facts
    assert f.dataplane_warnings == ["late", "lag"]
    assert f.cpu == {"busy": 0.5} and f.monitored and f.link_rows == [{"port": "s1-eth1"}]
    assert f.telemetry_lost == 0        # a count of none lost is a count, not a fact left out
    # a fact of a name no field has is refused where it is made
    with pytest.raises(TypeError):
        Facts(link_row=[])


def test_an_instrument_writes_only_the_tables_its_registry_line_names(monkeypatch):
    monkeypatch.setitem(registry.INSTRUMENTS, "marks",
                        registry.InstrumentEntry(__name__, "Marks", ("marks.parquet",)))
    with pytest.raises(RuntimeError, match=r"Marks wrote \['stray.parquet'\].*names \['marks.parquet'\]"):
        Instruments([Marks], bench=None).stop()
    monkeypatch.setitem(registry.INSTRUMENTS, "marks",
                        registry.InstrumentEntry(__name__, "Marks", ("marks.parquet", "stray.parquet")))
    assert set(Instruments([Marks], bench=None).stop().tables) == {"marks.parquet", "stray.parquet"}


def test_flow_control_is_read_once_the_background_flows_have_stopped(monkeypatch):
    """A switch's flow-control report (e.g. bmv2's held_at_end, the packets its hold
    loop still keeps) is read after the background flows stop: read before, a flow still
    sending into a pause leaves packets on their way round the loop, and a loop that
    lost none looked as if it had (seen once in CI: 7 held at the end, drained by the
    time the counters read the switch's buffer as empty)."""
    from incast.network.flow_control import FlowControl
    from incast.workload.background import BackgroundTraffic
    stopped = []
    for cls in (FlowControl, BackgroundTraffic):
        monkeypatch.setattr(cls, "__init__", lambda self, bench: None)
        monkeypatch.setattr(cls, "stop", lambda self, name=cls.__name__: stopped.append(name) or Readings())
    order = [c for c in (getattr(__import__(e.module, fromlist=[e.cls]), e.cls) for e in registry.INSTRUMENTS.values())
             if c in (FlowControl, BackgroundTraffic)]
    Instruments(order, bench=None).stop()
    assert stopped == ["BackgroundTraffic", "FlowControl"]
