"""Bad input: one clear line, exit status 2, nothing created. Kill -9: cleanup works."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, incast_cmd, needs_root, others_live, our_netns, run_json
from incast.machine import resources

BAD_RUNS = [
    (["--senders", "0"], "topology.senders"),
    (["--senders", "lots"], "topology.senders"),
    (["--buffer", "32XB"], "switch.buffer"),
    (["--buffer", "100"], "switch.buffer"),
    (["--qos-queues", "9"], "switch.qos.queues"),
    (["--rto-min", "fast"], "tcp.rto_min"),
    (["--delayed-ack", "perhaps"], "tcp.delayed_ack"),
    (["--link-rate", "1G"], "link.rate"),
    (["--workload", "random"], "workload.kind"),
    (["--kernel", "windows"], "kernel"),
    (["--switch", "ovs"], "dataplane"),
    (["--cc", "no_such_cc"], "no_such_cc"),              # refused by the kernel probe
    (["--set", "switch.colour=red"], "switch.colour"),
    (["--set", "senders"], "FIELD=VALUE"),
    (["--bogus-flag", "1"], "unrecognized arguments"),
    (["missing-file.toml"], "no such scenario file"),
]


@needs_root
@pytest.mark.parametrize("args,needle", BAD_RUNS)
def test_bad_input_exits_2_with_one_line(args, needle, tmp_path, no_leftovers):
    out = tmp_path / "run"
    r = incast_cmd("run", *args, "--out", out)
    assert r.returncode in (2, 3), r.stderr
    if needle != "no_such_cc":
        assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert needle in lines[0]
    assert not out.exists() and not list(tmp_path.iterdir())


@needs_root
def test_bad_sweep_grid_exits_2(tmp_path, no_leftovers):
    r = incast_cmd("sweep", "--grid", "senders=1,0", "--out", tmp_path / "sw")
    assert r.returncode == 2 and "senders=0" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = incast_cmd("sweep", "--grid", "nonsense=1", "--out", tmp_path / "sw")
    assert r.returncode == 2 and "nonsense" in r.stderr
    assert not list(tmp_path.iterdir())


def test_telemetry_of_a_non_run_exits_2(tmp_path):
    r = incast_cmd("telemetry", tmp_path)
    assert r.returncode == 2 and "not a complete run directory" in r.stderr


@needs_root
def test_existing_out_is_refused(tmp_path, no_leftovers):
    r = incast_cmd("run", "--out", tmp_path)
    assert r.returncode == 2 and "exists" in r.stderr


@needs_root
def test_an_unusable_output_location_exits_2(tmp_path, no_leftovers):
    (tmp_path / "file").write_text("")
    r = incast_cmd("run", "--senders", "1", "--out", tmp_path / "file" / "run")
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "cannot create" in r.stderr


@needs_root
def test_two_runs_started_at_once_both_complete(tmp_path, no_leftovers):
    # Default results names come from the time of day: two runs in the same second
    # share one, and must still each get their own directory.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "incast", "run", "--senders", "2", "--blocks", "3", "--sru", "64KiB",
           "--link-rate", "100Mbit", "--json"]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    dirs = {json.loads(o.strip().splitlines()[-1])["run_dir"] for o, _ in outs}
    assert len(dirs) == 2
    for d in dirs:
        assert (tmp_path / d / "summary.json").is_file() or Path(d, "summary.json").is_file()
    assert not [p for p in (tmp_path / "results").iterdir() if p.name.startswith(".")]


def start_endless_run(out, senders, env=None):
    """A run that would go on for hours, returned once it says its network is built."""
    proc = subprocess.Popen([sys.executable, "-m", "incast", "run", "--senders", str(senders), "--blocks",
                             "100000", "-v", "--out", str(out)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if "network of" in line:
            return proc
    proc.kill()
    pytest.fail("the run never built its network")


@needs_root
def test_sigkill_leaves_state_that_cleanup_removes(tmp_path):
    before = our_netns()
    try:
        # Killed mid-experiment, with its network built.
        proc = start_endless_run(tmp_path / "killed", 8)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        left = our_netns() - before
        assert left, "a killed run should leave its namespaces (that is what cleanup is for)"
        assert any(n.count("-") == 1 for n in left)   # the world namespace
        assert (tmp_path / ".killed.incomplete").is_dir() and not (tmp_path / "killed").exists()
    finally:
        r = incast_cmd("cleanup")
    assert r.returncode == 0 and "removed incast-" in r.stdout
    assert not (our_netns() - before)
    leftover_procs = subprocess.run(["pgrep", "-f", "incast_server.py"], capture_output=True, text=True).stdout
    assert not leftover_procs.strip() or all(
        b"INCAST_RUN" not in Path(f"/proc/{p}/environ").read_bytes() for p in leftover_procs.split()
        if Path(f"/proc/{p}").exists())
    summary = run_json("--senders", "2", "--blocks", "3", "--out", tmp_path / "after")
    assert summary["goodput_mbps"] > 0


@needs_root
def test_a_live_run_of_another_session_is_not_this_tests_leftover(tmp_path):
    """A second test session (or a user's experiment) beside this one: its live run's
    namespaces are not counted as this test's leftovers, nor cleaned; a run of this
    session's is counted."""
    before = our_netns()
    procs = []
    try:
        procs.append(start_endless_run(tmp_path / "theirs", 2,
                                       env={**os.environ, "INCAST_TEST_SESSION": "another-session"}))
        theirs = our_netns() - before
        procs.append(start_endless_run(tmp_path / "ours", 2))
        ours = our_netns() - before - theirs
        assert theirs and ours
        assert others_live(theirs | ours) == theirs
        # A run's token from its process, and its owner from its token.
        token = resources.token_of(procs[1].pid)
        assert token and all(n.startswith(token) for n in ours)
        assert resources.live_owner(token) == procs[1].pid
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=60)
    assert not (our_netns() - before)
    assert resources.live_owner(token) is None and resources.token_of(procs[1].pid) is None


@needs_root
def test_sigterm_tears_down(tmp_path):
    before = our_netns()
    proc = start_endless_run(tmp_path / "term", 4)
    proc.terminate()
    assert proc.wait(timeout=60) != 0
    assert not (our_netns() - before)
    assert not (tmp_path / "term").exists()


@needs_root
def test_run_json_and_tables(tmp_path, no_leftovers):
    import pandas as pd
    out = tmp_path / "r"
    s = run_json("--senders", "2", "--blocks", "5", "--sru", "64KiB", "--out", out)
    for field in ("goodput_mbps", "link_mbps", "senders", "blocks", "block_ms_p50", "block_ms_p99",
                  "block_ms_max", "timeouts", "retransmits", "drops", "max_queue_bytes",
                  "telemetry_records", "telemetry_lost"):
        assert field in s
    assert s["senders"] == 2 and s["blocks"] == 5
    blocks = pd.read_parquet(out / "blocks.parquet")
    assert len(blocks) == 5 and (blocks["bytes"] == 2 * 65536).all()
    flows = pd.read_parquet(out / "flows.parquet")
    assert sorted(flows["server"]) == ["server1", "server2"]
    assert (flows["bytes_acked"] >= 7 * 65536).all()     # 2 warm-up + 5 measured fragments
    counters = pd.read_parquet(out / "counters.parquet")
    assert set(counters["host"]) == {"client", "server1", "server2"}
    env = json.loads((out / "environment.json").read_text())
    assert env["hz"] > 0 and env["rto_floor_us"] >= env["rto_min_us"]
    assert "rate 1000000000bit" in (out / "switch.tc").read_text()


@needs_root
def test_sweep_writes_a_table_and_a_plot(tmp_path, no_leftovers):
    import pandas as pd
    out = tmp_path / "sw"
    r = incast_cmd("sweep", "--grid", "senders=1,2", "--grid", "rto_min=200ms,min", "--repeat", "2",
                   "--blocks", "3", "--sru", "32KiB", "--out", out)
    assert r.returncode == 0, r.stderr
    table = pd.read_parquet(out / "sweep.parquet")
    assert len(table) == 8 and sorted(table["repeat"].unique()) == [0, 1]
    assert set(table["rto_min"]) == {"200ms", "min"}
    assert (table["goodput_mbps"] > 0).all()
    assert (out / "goodput.png").read_bytes()[:4] == b"\x89PNG"
    assert len(list((out / "runs").iterdir())) == 8
    assert not (tmp_path / ".sw.incomplete").exists()


def test_compare_draws_summary_fields_of_runs_and_names_a_missing_field(tmp_path):
    import json
    for name, good, bg in (("none", 177.8, [840.8]), ("pfc", 940.7, [470.8])):
        d = tmp_path / name
        d.mkdir()
        (d / "summary.json").write_text(json.dumps({"goodput_mbps": good, "background_mbps": bg,
                                                    "fidelity": {"ok": True}}))
        (d / "scenario.toml").write_text('name = "two-switch-pfc"\n')
    out = tmp_path / "cmp.png"
    r = incast_cmd("compare", tmp_path / "none", tmp_path / "pfc", "--field", "goodput_mbps",
                   "--field", "background_mbps", "--out", out)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = incast_cmd("compare", tmp_path / "none", "--field", "no_such_field", "--out", out)
    assert r.returncode == 2 and "no_such_field" in r.stderr
    r = incast_cmd("compare", tmp_path / "none", tmp_path / "missing", "--out", out)
    assert r.returncode == 2 and "no summary.json" in r.stderr
    r = incast_cmd("compare", tmp_path / "none", "--blocks", "--out", out)
    assert r.returncode == 2 and "no blocks.parquet" in r.stderr


def test_compare_blocks_draws_block_times_with_the_storm_shaded(tmp_path):
    import pandas as pd
    d = tmp_path / "storm"
    d.mkdir()
    (d / "summary.json").write_text(json.dumps({"goodput_mbps": 656.1, "storm_start_us": 10e3,
                                                "storm_end_us": 70e3, "fidelity": {"ok": True}}))
    starts = [0.0, 4.5e3, 9e3, 71.4e3]
    durations = [4.5, 4.5, 62.4, 4.5]
    pd.DataFrame({"rep": 0, "block": range(4), "start_us": starts,
                  "end_us": [s + d * 1e3 for s, d in zip(starts, durations)], "duration_ms": durations,
                  "bytes": 524288, "goodput_mbps": 900.0, "last_server": "server1"}).to_parquet(d / "blocks.parquet")
    out = tmp_path / "blocks.png"
    r = incast_cmd("compare", d, "--blocks", "--label", "no watchdog", "--out", out)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = incast_cmd("compare", d, "--blocks", "--field", "goodput_mbps", "--out", out)
    assert r.returncode == 2 and "takes no --field" in r.stderr
