"""Every run measures its own fidelity; calibration finds the rate this machine holds."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import faithful_or_fail, faithful_rate_bps, incast_cmd, needs_root, run_json
from incast.measure import fidelity
from incast.report.plots import plot_sweep
from incast.measure.results import flat_summary


# --- units ---------------------------------------------------------------------------

def test_histogram_buckets_cover_their_values():
    # Every value lands in the bucket whose bounds contain it (the BPF side's index).
    for v in [0, 1, 7, 8, 15, 16, 100, 12_304, 999_999, 2**39]:
        msb = v.bit_length() - 1
        idx = v if v < 8 else (msb - 3 + 1) * 8 + ((v >> (msb - 3)) & 7)
        low, high = fidelity.bucket_bounds(np.array([idx]))
        assert low[0] <= v < high[0], (v, idx, low, high)


def test_quantile_of_a_histogram():
    hist = {str(i): 10 for i in range(8)}          # 0..7 ns, 10 each
    assert fidelity.hist_quantile(hist, 0.5) == pytest.approx(4.0, abs=0.01)
    assert fidelity.hist_quantile({}, 0.5) is None


def _row(link, role, ratio, busy_ms=900.0, packets=20_000):
    return {"link": link, "role": role, "rate_mbps": 1000.0, "busy_packets": packets,
            "busy_ms": busy_ms, "busy_mbit": busy_ms / 1e3 * 1000 * ratio,
            "served_mbps": 1000 * ratio, "service_ratio": ratio}


def test_a_link_below_its_rate_is_not_faithful():
    f = fidelity.assess([_row("s1-eth1", "switch", 0.80), _row("server1-eth0", "nic", 1.0)],
                        None, {"cpu_busy": 0.5}, 0, [], True, measured_ms=1000)
    assert not f["ok"]
    assert f["reasons"][0].startswith("s1-eth1 served at 80% of 1000 Mbit/s")
    assert f["min_service_link"] == "s1-eth1"


def test_a_brief_stall_does_not_unmake_a_run():
    # One NIC 1.5 ms short in a second: the switch saw the same experiment.
    rows = [_row("s1-eth1", "switch", 0.99), _row("server1-eth0", "nic", 0.85, busy_ms=10, packets=300)]
    f = fidelity.assess(rows, None, {"cpu_busy": 0.5}, 0, [], True, measured_ms=1000)
    assert f["ok"], f


@pytest.mark.parametrize("kw, reason", [
    ({"cpu": {"cpu_busy": 0.6, "cpu_busy_max": 0.99}}, "a CPU saturated"),
    ({"backlog_drops": 3}, "3 packets dropped by full CPU input backlogs"),
    ({"monitored": False}, "link rates not measured"),
    ({"warnings": ["warning: the switch fell behind: 10 packets waited"]}, "the switch fell behind"),
])
def test_other_reasons(kw, reason):
    f = fidelity.assess([_row("s1-eth1", "switch", 1.0)], None, kw.get("cpu", {"cpu_busy": 0.3}),
                        kw.get("backlog_drops", 0), kw.get("warnings", []), kw.get("monitored", True),
                        measured_ms=1000)
    assert not f["ok"] and any(r.startswith(reason) for r in f["reasons"]), f


def test_niced_work_beside_a_run_does_not_saturate_its_cpu():
    # A build under nice -n 19 fills both CPUs; the emulation's nice-0 work still gets
    # them. Only work at normal priority makes a CPU "saturated".
    niced = {"cpu_busy": 1.0, "cpu_busy_max": 1.0, "cpu_contended_max": 0.41, "cpu_niced": 0.62,
             "cpu_others": 0.0}
    f = fidelity.assess([_row("s1-eth1", "switch", 1.0)], None, niced, 0, [], True, measured_ms=1000)
    assert f["ok"], f
    assert f["cpu_niced"] == 0.62 and f["cpu_busy_max"] == 1.0     # reported beside the verdict
    hog = {"cpu_busy": 1.0, "cpu_busy_max": 1.0, "cpu_contended_max": 1.0, "cpu_niced": 0.0,
           "cpu_others": 0.48, "cpu_others_top": "hog 48%"}
    f = fidelity.assess([_row("s1-eth1", "switch", 1.0)], None, hog, 0, [], True, measured_ms=1000)
    assert not f["ok"]
    assert f["reasons"] == ["a CPU saturated (100% busy at normal priority; niced work 0% of the CPUs; "
                            "other processes at normal priority 48% (hog 48%))"]


def test_a_niced_hog_beside_a_run_yields_but_a_link_it_starves_still_fails():
    # Links are judged by their service whatever the CPU reads: a link served short
    # with niced work beside is not faithful.
    niced = {"cpu_busy": 1.0, "cpu_busy_max": 1.0, "cpu_contended_max": 0.5, "cpu_niced": 0.5}
    f = fidelity.assess([_row("s1-eth1", "switch", 0.80)], None, niced, 0, [], True, measured_ms=1000)
    assert not f["ok"] and f["reasons"][0].startswith("s1-eth1 served at 80%")


def test_the_cpu_shares_of_two_snapshots():
    from incast.measure import cpu
    # Two CPUs, 100 ticks each: CPU 0 all niced work; CPU 1 half the run's, half idle.
    before = cpu.Snapshot([[0] * 8, [0] * 8], {
        10: cpu.Process(0, 0, "editor", False), 11: cpu.Process(0, 19, "cc1", False),
        12: cpu.Process(0, 0, "server", True)})
    after = cpu.Snapshot([[0, 100, 0, 0, 0, 0, 0, 0], [30, 0, 10, 50, 0, 0, 10, 0]], {
        10: cpu.Process(20, 0, "editor", False), 11: cpu.Process(100, 19, "cc1", False),
        12: cpu.Process(20, 0, "server", True)})
    u = cpu.use(before, after)
    assert u["cpu_busy"] == 0.75 and u["cpu_busy_max"] == 1.0
    assert u["cpu_niced"] == 0.5
    assert u["cpu_contended_max"] == 0.5          # CPU 1: user + system + softirq
    assert u["cpu_others"] == 0.1 and u["cpu_others_top"] == "editor 10%"   # niced cc1 and ours left out
    assert u["cpu_run"] == 0.15


def _hogs(nice: int):
    """One CPU-bound process per CPU at this niceness (not in the run's tree)."""
    import os
    import subprocess
    import sys
    # Named (PR_SET_NAME) so the reports can be searched for it.
    code = "import ctypes; ctypes.CDLL(None).prctl(15, b'incast-hog', 0, 0, 0)\nwhile True: pass"
    return [subprocess.Popen(["nice", "-n", str(nice), sys.executable, "-c", code])
            for _ in range(len(os.sched_getaffinity(0)))]


def test_processes_tell_niced_and_normal_work_apart():
    import os
    import time
    import subprocess
    from incast.measure import cpu
    hogs = _hogs(19)
    # The run: a process of its own, so that the hogs (this test's children) are not in
    # its tree, as a build beside `incast run` is not.
    run = subprocess.Popen(["sleep", "30"])
    try:
        before = cpu.snapshot(root=run.pid)
        time.sleep(1.0)             # the measured window: the hogs run meanwhile
        after = cpu.snapshot(root=run.pid)
    finally:
        for h in [*hogs, run]:
            h.kill()
            h.wait()
    u = cpu.use(before, after)
    total = sum(sum(a) - sum(b) for a, b in zip(after.cpus, before.cpus))
    hog_ticks = sum(after.procs[h.pid].ticks - before.procs[h.pid].ticks for h in hogs)
    assert hog_ticks > 0 and all(after.procs[h.pid].nice == 19 for h in hogs)
    assert not any(before.procs[h.pid].ours for h in hogs)      # not the run's
    # The niced hogs show as niced work (with whatever else ran niced) ...
    assert u["cpu_niced"] >= 0.9 * hog_ticks / total - 0.01, (u, hog_ticks, total)
    # ... and not as other processes at normal priority.
    assert "incast-hog" not in u["cpu_others_top"], u
    assert before.procs[run.pid].ours and not before.procs[os.getpid()].ours


def test_the_flag_survives_into_sweep_rows_and_plots(tmp_path):
    import matplotlib
    matplotlib.rcParams["svg.fonttype"] = "none"     # text stays text in the SVG
    rows = []
    for n, ok in [(1, True), (2, True), (4, False)]:
        summary = {"senders": n, "goodput_mbps": 900.0 / n, "link_mbps": 1000.0,
                   "fidelity": {"ok": ok, "reasons": [] if ok else ["s1-eth1 served at 60% of 1000 Mbit/s"],
                                "min_service_ratio": 1.0 if ok else 0.6}}
        rows.append(flat_summary(summary))
    table = pd.DataFrame(rows)
    assert table["fidelity_ok"].tolist() == [True, True, False]
    assert "fidelity" not in table
    svg = plot_sweep(table, tmp_path / "g.svg", axes=[]).read_text()
    assert "not faithful: s1-eth1 served at 60% of 1000 Mbit/s" in svg
    # The table still loads in one line, flag included.
    table.to_parquet(tmp_path / "s.parquet")
    assert pd.read_parquet(tmp_path / "s.parquet")["fidelity_ok"].tolist() == [True, True, False]


def test_time_the_hypervisor_took_is_not_faithful_in_real_time_only():
    from incast.clock import VIRTUAL
    links = [_row("s1-eth1", "switch", 0.98)]          # above MIN_SERVICE_RATIO: not flagged
    f = fidelity.assess(links, None, {"cpu_busy": 0.5, "cpu_steal": 0.025}, 0, [], True, measured_ms=1700)
    assert f["reasons"] == ["the hypervisor took 2.5% of the CPUs' time (steal)"], f
    assert fidelity.assess(links, None, {"cpu_busy": 0.5, "cpu_steal": 0.004}, 0, [], True,
                           measured_ms=1700)["ok"]
    # In virtual time a stolen millisecond stops the clock too: nothing is lost.
    assert fidelity.assess([], None, {"cpu_busy": 0.5, "cpu_steal": 0.2}, 0, [], False,
                           measured_ms=1700, clock=VIRTUAL)["ok"]


def test_a_rate_above_the_calibrated_one_is_not_faithful():
    f = fidelity.assess([_row("s1-eth1", "switch", 1.0)], None, {"cpu_busy": 0.5}, 0, [], True,
                        measured_ms=1000, rate_bps=10**9, faithful_bps=3 * 10**8, senders=16)
    assert not f["ok"] and f["faithful_rate_mbps"] == 300
    assert f["reasons"] == ["link rate 1000 Mbit/s is above this machine's faithful rate for 16 senders, "
                            "300 Mbit/s (incast calibrate)"]
    at = fidelity.assess([_row("s1-eth1", "switch", 1.0)], None, {"cpu_busy": 0.5}, 0, [], True,
                         measured_ms=1000, rate_bps=3 * 10**8, faithful_bps=3 * 10**8, senders=16)
    assert at["ok"], at


# --- on this machine -------------------------------------------------------------------

@needs_root
@pytest.mark.network
def test_a_run_above_the_faithful_rate_is_flagged(tmp_path, no_leftovers):
    # 20 Gbit/s of 1500-byte frames through veth, a bridge and two token buckets per
    # packet: no machine of today emulates it. Such a link may never backlog (the CPU
    # cannot fill it), so the calibrated rate is what tells.
    faithful_rate_bps(1)                       # this machine is calibrated (cached)
    r = incast_cmd("run", "--senders", "1", "--link-rate", "20Gbit", "--sru", "4MiB", "--blocks", "5",
                   "--buffer", "256KiB", "--out", tmp_path / "run", "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["fidelity"]["ok"] is False
    assert any("above this machine's faithful rate" in x for x in s["fidelity"]["reasons"]), s["fidelity"]
    assert "warning: not faithful:" in r.stderr
    assert (tmp_path / "run" / "links.parquet").is_file()


@needs_root
@pytest.mark.network
# The long tier: what decides it on a 2-core VM is how well the machine's timers serve
# the link, a fraction of a percent either side of 93% run by run (docs/tests.md).
@pytest.mark.long
def test_one_sender_at_the_calibrated_rate_reaches_93_percent(tmp_path, no_leftovers):
    """What the testbed's hosts and TCP make of the link: 93% of it, of a 94.1% ceiling
    (1448 payload bytes in 1538 on the wire). The link's service is the machine's: a
    run is faithful while every loaded link is served at >= 95% of its rate
    (incast.fidelity), but a link served below 93 / 94.1 = 98.8% of its rate in its
    worst window caps the run below 93% whatever the hosts do (seen on a 2-core VM:
    goodput 91.1-93.2% following a worst-window service of 0.978-0.992, with no drop and
    no timeout). Such a run cannot test the claim and does not count, as a run the
    machine stalled does not. Judged as calibration judges a rate: it fails only if two
    runs that count fall short."""
    from incast.run.calibrate import ONE_SENDER_BLOCK_MS
    ceiling = 1448 / 1538
    sru = faithful_rate_bps(1) * ONE_SENDER_BLOCK_MS // 8000     # reads as long as calibration's
    runs, short, capped = [], [], []
    for attempt in range(5):
        s = run_json("--senders", "1", "--link-rate", "auto", "--sru", sru, "--blocks", "8", "--cc", "reno",
                     "--buffer", "64KiB", "--out", tmp_path / f"run{attempt}")
        runs.append(s)
        assert s["link_rate_auto"] is True
        assert s["link_mbps"] * 1e6 == faithful_rate_bps(1)
        f = s["fidelity"]
        if f["ok"] and s["goodput_mbps"] >= 0.93 * s["link_mbps"]:
            return
        if not f["ok"]:
            continue
        if f["min_service_ratio"] * ceiling < 0.93:
            capped.append(s)
            continue
        short.append(s)
        if len(short) == 2:
            break
    seen = [(r["goodput_mbps"], r["fidelity"].get("min_service_ratio"), r["fidelity"]["reasons"]) for r in runs]
    if len(short) == 2:
        pytest.fail(f"one sender at the calibrated rate: two runs whose link was served at >= "
                    f"{0.93 / ceiling:.3f} of its rate fell below 93% of it (goodput, service, reasons): {seen}")
    if capped:
        pytest.skip(f"one sender at the calibrated rate: this machine served the link below {0.93 / ceiling:.3f} "
                    f"of its rate in {len(capped)} of {len(runs)} runs, which caps them below 93% (its timers, "
                    f"not the testbed; goodput, service, reasons): {seen}")
    faithful_or_fail([r for r in runs if not r["fidelity"]["ok"]], "one sender at the calibrated rate")


@needs_root
@pytest.mark.network
@pytest.mark.parametrize("nice", [19, 0])
def test_the_verdict_beside_a_cpu_hog_follows_the_links(tmp_path, no_leftovers, nice):
    # A hog on every CPU: niced (a build beside the run) the emulation keeps its CPUs
    # and its links, and the run is faithful; at normal priority it takes half of
    # every CPU from the emulation, and the run is flagged.
    rate = f"{min(faithful_rate_bps(4), 100_000_000)}bit"
    hogs = _hogs(nice)
    runs, summaries = [], []
    try:
        for attempt in range(3):    # a run the machine stalled is flagged; measure again
            s = run_json("--senders", "4", "--link-rate", rate, "--sru", "128KiB", "--blocks", "10",
                         "--buffer", "256KiB", "--out", tmp_path / f"run{attempt}")
            summaries.append(s)
            f = s["fidelity"]
            runs.append((f["ok"], f["reasons"], f.get("min_service_ratio"), f.get("cpu_busy_max"),
                         f.get("cpu_contended_max"), f.get("cpu_niced"), f.get("cpu_others")))
            if nice == 0 or f["ok"]:
                break
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    cpu_reasons = [r for r in f["reasons"] if r.startswith("a CPU saturated")]
    if nice:
        assert f["cpu_niced"] >= 0.3 and f["cpu_busy_max"] >= 0.9, runs     # the hog ran
        if cpu_reasons:
            # Saturated at normal priority: by other processes in every attempt (a
            # busy machine, e.g. another suite's guests beside this one: a skip that
            # says so), else by the niced hog, which must never count (a failure).
            faithful_or_fail(summaries, "a run beside a niced CPU hog")
        if not f["ok"]:
            # The hog is not what flagged them (above). Where the hypervisor took the
            # CPUs in every attempt the machine decided the runs: a skip that says so.
            faithful_or_fail(summaries, "a run beside a niced CPU hog")
    else:
        if (f.get("cpu_niced") or 0) >= 0.3 and (f["ok"] or f["cpu_others"] < 0.3):
            # Niced work beside the run that is not the hog (here the hog runs at normal
            # priority): the hog then shares its CPUs with it, need not saturate one or
            # get the share it would alone (with autogroup a nice value weighs only
            # within its session: seen, the hogs 19.8% of the CPUs beside 44.8% of
            # niced work from another session), and the links may keep their rate
            # (seen: service 0.994 with another suite's guests niced beside it). A busy
            # machine, not the testbed's verdict.
            pytest.skip(f"other niced work took {100 * f['cpu_niced']:.0f}% of the CPUs beside the hog "
                        f"({100 * f['cpu_others']:.0f}% at normal priority): {runs}")
        assert f["cpu_others"] >= 0.3, runs
        assert not f["ok"] and cpu_reasons, runs
        assert "incast-hog" in cpu_reasons[0], runs      # named beside the verdict


@needs_root
@pytest.mark.network
def test_calibration_is_cached_and_reused(monkeypatch):
    from incast.run import calibrate
    first = calibrate.calibrate()
    assert calibrate.cache_path().is_file()
    assert set(first["rates_bps"]) == {"1", "16", "64"}

    def no_trials(*a, **kw):
        raise AssertionError("calibration ran again instead of using the cache")
    monkeypatch.setattr(calibrate, "_trial", no_trials)
    again = calibrate.calibrate()
    assert again == first
    r = incast_cmd("probe")
    assert "faithful link rate:" in r.stdout


def test_no_faithful_rate_says_why_and_what_to_do():
    from incast.errors import MissingFeature
    from incast.measure import calibration
    c = {"rates_bps": {"1": 0, "16": 0, "64": 0}, "load": {"cpu_others": 0.4},
         "trials": [{"reasons": ["a CPU saturated (100% busy at normal priority)"]}]}
    with pytest.raises(MissingFeature) as e:
        calibration.faithful_rate(c, 4)
    line = str(e.value)
    assert "\n" not in line
    assert "a CPU saturated (100% busy at normal priority)" in line and "40% of the CPUs" in line
    assert "--clock virtual" in line and "incast calibrate --force" in line


BUSY = {"rates_bps": {"1": 0, "16": 0}, "trials": [{"reasons": ["a link below its rate"]}],
        "load": {"cpu_others": 0.3, "cpu_others_top": "linux 30%"}}


def test_a_calibration_made_on_a_busy_machine_is_not_reused_once_it_is_quiet(monkeypatch):
    """A cached calibration made beside other work (a third of the CPUs, say) is
    measured again once the machine is quiet; kept while it is still busy; one made
    on a quiet machine is kept either way."""
    from incast.errors import MissingFeature
    from incast.run import calibrate
    cache = {"c": BUSY}
    monkeypatch.setattr(calibrate, "cached", lambda: cache["c"])
    # measuring again needs the link monitor: without it, calibrate() says so, which is
    # how this test sees that it would measure
    monkeypatch.setattr(calibrate, "monitor_binary", lambda: None)
    monkeypatch.setattr(calibrate, "others_now", lambda: 0.0)
    with pytest.raises(MissingFeature, match="needs the link monitor"):
        calibrate.calibrate()
    monkeypatch.setattr(calibrate, "others_now", lambda: 0.4)
    assert calibrate.calibrate() is BUSY
    cache["c"] = {**BUSY, "load": {"cpu_others": 0.01}}
    monkeypatch.setattr(calibrate, "others_now", lambda: 0.0)
    assert calibrate.calibrate() is cache["c"]


def test_no_faithful_rate_on_a_busy_machine_skips_and_on_a_quiet_one_fails(monkeypatch):
    from incast.measure.calibration import NoFaithfulRate
    from incast.run import calibrate
    monkeypatch.setattr(calibrate, "calibrate", lambda: BUSY)
    with pytest.raises(pytest.skip.Exception, match="other processes at normal priority 30%"):
        faithful_rate_bps(16)
    monkeypatch.setattr(calibrate, "calibrate", lambda: {**BUSY, "load": {"cpu_others": 0.0}})
    with pytest.raises(NoFaithfulRate):
        faithful_rate_bps(16)


def test_the_share_other_processes_take_now_is_measured():
    from incast.measure import cpu
    assert 0.0 <= cpu.others_now(0.2) <= 1.0


def test_runs_not_faithful_on_a_busy_machine_skip_and_on_a_quiet_one_fail():
    """A measurement none of whose attempts was faithful: where other processes took a
    share of the CPUs in every attempt, the machine decided it (skip, saying so); where
    one attempt had the machine to itself, the testbed did (NotFaithful)."""
    from conftest import NotFaithful
    def run(others):
        return {"fidelity": {"ok": False, "reasons": ["a CPU saturated (99% busy at normal priority)"],
                             "cpu_others": others}}
    with pytest.raises(pytest.skip.Exception, match="other processes took 30%, 12%"):
        faithful_or_fail([run(0.3), run(0.12)], "a run")
    with pytest.raises(NotFaithful):
        faithful_or_fail([run(0.3), run(0.0)], "a run")


def test_other_processes_that_start_or_end_between_the_snapshots_count():
    """A suite beside a run whose guests and tools each live a few seconds: a process
    born between the snapshots counts whole, one that ended counts in its parent's time
    for reaped children (less what it had used before), the run's own and niced ones
    not at all."""
    from incast.measure.cpu import Process, others_ticks
    before = {10: Process(100, 0, "pytest", False, reaped=50, ppid=1),
              11: Process(30, 0, "linux", False, ppid=10),          # ends, reaped by pytest
              20: Process(500, 0, "incast", True, ppid=1),          # the run
              30: Process(5, 19, "cc1", False, ppid=1)}
    after = {10: Process(110, 0, "pytest", False, reaped=50 + 30 + 70 + 40, ppid=10),
             12: Process(60, 0, "linux", False, ppid=10),           # born in between, alive
             20: Process(900, 0, "incast", True, reaped=300, ppid=1),
             30: Process(400, 19, "cc1", False, ppid=1)}
    # pytest: 10 of its own; reaped 11 (30 before, 70 in between) and one born and gone
    # in between (40): 10 + 70 + 40; the new guest 60; the run and the niced compiler nothing.
    assert others_ticks(before, after) == {"pytest": 120, "linux": 60}


def test_a_child_that_lived_and_ended_between_two_snapshots_is_seen():
    """Measured: a busy child process of another tree that starts and ends between two
    snapshots shows in cpu_others (before, such processes were not seen at all)."""
    import subprocess
    import sys
    from incast.measure import cpu
    runner = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        before = cpu.snapshot(root=runner.pid)       # the run: another process; this one is "other"
        subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\n"
                        "while time.process_time() - t < 0.5: pass"], check=True)
        after = cpu.snapshot(root=runner.pid)
    finally:
        runner.communicate(b"")
    # 0.5 s of CPU in USER_HZ (100) ticks, in this process's time for reaped children
    me = Path("/proc/self/comm").read_text().strip()
    assert cpu.others_ticks(before.procs, after.procs).get(me, 0) >= 40, cpu.others_ticks(before.procs, after.procs)
    assert cpu.use(before, after)["cpu_others"] > 0
