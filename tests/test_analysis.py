"""Summaries, telemetry decoding and plots from synthetic tables (no network needed)."""
import json

import numpy as np
import pandas as pd
import pytest

from incast.report.plots import idle_gaps, plot_sweep
from incast.measure.results import Claim, ResultsDir, ResultsExist, is_complete, one_line, summarize
from incast.measure.telemetry import COLUMNS, _ip_key, bpftrace_program, decode_raw


def _blocks(durations_ms, nbytes, rep=0, gap_ms=0.0):
    rows, t = [], 0.0
    for i, d in enumerate(durations_ms):
        rows.append({"rep": rep, "block": i, "start_us": t * 1000, "end_us": (t + d) * 1000,
                     "duration_ms": d, "bytes": nbytes, "goodput_mbps": nbytes * 8 / (d * 1000),
                     "last_server": "server1"})
        t += d + gap_ms
    return pd.DataFrame(rows)


def test_goodput_is_bytes_over_wall_time():
    blocks = _blocks([10.0, 10.0, 200.0, 10.0], 1_000_000)
    counters = pd.DataFrame([{"TCPTimeouts": 1, "RetransSegs": 5}, {"TCPTimeouts": 0, "RetransSegs": 2}])
    queues = pd.DataFrame([{"port": "s1-eth1", "drops": 7}, {"port": "s1-eth2", "drops": 1}])
    s = summarize(blocks, counters, queues, None, None, 10**9, 4, "s1-eth1")
    assert s["goodput_mbps"] == pytest.approx(4 * 8e6 / 0.230 / 1e6, abs=1e-3)
    assert s["block_ms_p50"] == 10.0 and s["block_ms_max"] == 200.0
    assert s["timeouts"] == 1 and s["retransmits"] == 7
    assert s["drops"] == 8 and s["bottleneck_drops"] == 7
    assert s["max_queue_bytes"] is None and s["telemetry_records"] is None
    assert "4 senders" in one_line(s)


def test_repetitions_do_not_count_the_time_between_them():
    a = _blocks([10.0, 10.0], 1_000_000, rep=0)
    b = _blocks([10.0, 10.0], 1_000_000, rep=1)
    b[["start_us", "end_us"]] += 5_000_000          # 5 s later: a new connection set-up
    s = summarize(pd.concat([a, b]), pd.DataFrame(), pd.DataFrame(), None, None, 10**9, 1, "p")
    assert s["goodput_mbps"] == pytest.approx(4 * 8e6 / 0.040 / 1e6)


def test_decode_raw_names_ports_flows_and_events():
    c, s = "10.0.0.1", "10.0.0.2"
    lines = [
        f"E,2000000,7,0,1,1514,1,1514,1514,{_ip_key(s)},{_ip_key(c)},0",
        f"X,2500000,7,0,1,1514,1,1514,1514,{_ip_key(s)},{_ip_key(c)},0",
        f"D,3000000,7,0,0,0,0,0,1514,{_ip_key(s)},{_ip_key(c)},1000000",
        "Lost 3 events",
        "E,1000000,9,1,1,42,1,42,42,0,0,0",
    ]
    df = decode_raw("\n".join(lines).encode(), 1_000_000, {7: ("s1", "s1-eth1")}, {c: "client", s: "server1"})
    assert list(df.columns) == COLUMNS
    assert list(df["event"]) == ["enqueue", "enqueue", "drop", "dequeue"]   # sorted by time
    assert df["time_us"].tolist() == [0.0, 1000.0, 1500.0, 2000.0]
    assert df["port"].tolist()[1:] == ["s1-eth1"] * 3 and df["port"].iloc[0] == "if9"
    assert df["flow"].tolist() == ["-", "server1>client", "server1>client", "server1>client"]
    assert np.isnan(df["sojourn_us"].iloc[1]) and df["sojourn_us"].iloc[3] == 1000.0
    assert df["queue"].dtype == np.int8 and df["bytes"].dtype == np.int32


def test_bpftrace_program_follows_the_classification_rule():
    table = [0] * 64
    table[8], table[16] = 1, 2
    prog = bpftrace_program(table, {"QDISC_DROP": 64, "QDISC_OVERLIMIT": 65})
    assert "@dscp[8] = 1;" in prog and "@dscp[16] = 2;" in prog and "@dscp[0]" not in prog
    assert "args->reason == 64 || args->reason == 65" in prog
    single = bpftrace_program([0] * 64, {"QDISC_DROP": 64})
    assert "@dscp" not in single
    with pytest.raises(ValueError):
        bpftrace_program([0] * 64, {})


def test_idle_gaps_find_the_timeouts():
    blocks = pd.DataFrame({"start_us": [0.0, 1000.0], "end_us": [900.0, 300_000.0]})
    enq = np.array([10.0, 20.0, 800.0, 1010.0, 1020.0, 250_000.0, 250_100.0])
    assert idle_gaps(enq, blocks, 100_000) == [(1020.0, 250_000.0)]


def test_results_dir_is_renamed_only_when_complete(tmp_path):
    final = tmp_path / "run"
    r = ResultsDir(final)
    r.write_json("summary.json", {"goodput_mbps": np.float64(1.5), "n": np.int64(3)})
    assert not final.exists() and r.path.name == ".run.incomplete"
    assert not is_complete(r.path)
    r.finalize()
    assert is_complete(final) and json.loads((final / "summary.json").read_text())["n"] == 3
    with pytest.raises(ResultsExist):
        ResultsDir(final)


def test_a_results_location_has_one_writer(tmp_path):
    first = Claim(tmp_path / "run")
    with pytest.raises(ResultsExist, match="another run is writing it"):
        Claim(tmp_path / "run")                       # --out: the user's name, refused
    second = Claim(tmp_path / "run", unique=True)     # a default name: the next one
    assert second.final == tmp_path / "run-2" and second.path.name == ".run-2.incomplete"
    (first.path / "summary.json").write_text("{}")
    assert first.finalize() == tmp_path / "run" and not (tmp_path / "run" / ".lock").exists()
    assert second.finalize().is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "run-2"]


def test_a_killed_runs_work_directory_is_reused(tmp_path):
    left = tmp_path / ".run.incomplete"
    left.mkdir()
    (left / ".lock").touch()                          # nobody holds it: its run is gone
    (left / "blocks.parquet").write_text("half")
    c = Claim(tmp_path / "run")
    assert c.path == left and [p.name for p in left.iterdir()] == [".lock"]
    c.abandon()
    assert not left.exists()


def test_sweep_plot(tmp_path):
    rows = [{"senders": n, "rto_min": r, "goodput_mbps": g, "link_mbps": 1000.0, "rto_floor_us": f}
            for r, f, gs in (("200ms", 200000, [940, 600, 100]), ("min", 4000, [940, 900, 700]))
            for n, g in zip((1, 8, 16), gs)]
    out = plot_sweep(pd.DataFrame(rows), tmp_path / "g.png", title="t")
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_sweep_plot_of_repeated_equal_runs(tmp_path):
    """Three runs of 0.1 average to more than 0.1: the error bars still draw."""
    rows = [{"senders": 1, "repeat": r, "goodput_mbps": 0.1, "link_mbps": 1000.0} for r in range(3)]
    out = plot_sweep(pd.DataFrame(rows), tmp_path / "g.png", title="t")
    assert out.read_bytes()[:4] == b"\x89PNG"
