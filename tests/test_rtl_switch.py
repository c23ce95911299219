"""The hardware switch (rtl/src, SystemVerilog) under Verilator: lint-clean at every
size, and the cycle-level checks of tests/rtl/switch_checks.py run with cocotb, each
reported here as its own test. Skipped, saying why, where Verilator or cocotb is
missing (scripts/setup.sh installs both)."""
import ast
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CHECKS_MODULE = REPO / "tests" / "rtl" / "switch_checks.py"

pytestmark = [pytest.mark.rtl,
              pytest.mark.skipif(shutil.which("verilator") is None,
                                 reason="verilator is not installed (scripts/setup.sh installs it)")]


def cocotb_checks() -> list[str]:
    tree = ast.parse(CHECKS_MODULE.read_text())
    return [f.name for f in tree.body if isinstance(f, ast.AsyncFunctionDef)
            and any(ast.unparse(d).startswith("cocotb.test") for d in f.decorator_list)]


@pytest.mark.parametrize("params", [
    {}, {"NPORTS": 2, "LW": 8, "CW": 16}, {"NPORTS": 16, "CW": 16}, {"NPORTS": 48, "CW": 64, "CELL_AW": 11}],
    ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "default")
def test_lint_clean(params):
    r = subprocess.run(["verilator", "--lint-only", "-Wall", "-f", "rtl/verilator.f", "--top-module",
                        "incast_switch", *[f"-G{k}={v}" for k, v in params.items()]],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr


# The port timings the switch is built for (docs/rtl.md): LW link bytes a cycle, CW core
# bytes a cycle (four ports' worth).
PORT_TIMINGS = {"1G": {"LW": 1, "CW": 8}, "10G": {"LW": 8, "CW": 32}}


@pytest.fixture(scope="module", params=list(PORT_TIMINGS))
def cocotb_results(request):
    """Every check, on a 4-port switch at one port timing: 1 Gbit/s (125 MHz, a byte a
    cycle) and 10 Gbit/s (156.25 MHz, eight bytes a cycle)."""
    pytest.importorskip("cocotb", reason="cocotb is not installed (requirements.txt pins it)")
    from cocotb.runner import get_runner
    timing = PORT_TIMINGS[request.param]
    build = REPO / "build" / "rtl" / f"cocotb-p4-l{timing['LW']}-c{timing['CW']}"
    sources = [REPO / "rtl" / "src" / f for f in ("sync_fifo.sv", "port_rx.sv", "port_tx.sv", "incast_switch.sv")]
    runner = get_runner("verilator")
    runner.build(verilog_sources=sources, hdl_toplevel="incast_switch", build_dir=str(build),
                 build_args=["--unroll-count", "4096", "--unroll-stmts", "100000", "-Wno-fatal"],
                 parameters={"NPORTS": 4, **timing, "CELL_AW": 13})
    # The runner hands its sys.path to the simulator's Python: the checks, the frame
    # checks they share with the P4 switch's tests, and this checkout.
    added = [str(CHECKS_MODULE.parent), str(REPO / "tests"), str(REPO)]
    sys.path[:0] = added
    try:
        xml = runner.test(hdl_toplevel="incast_switch", test_module="switch_checks", build_dir=str(build))
    finally:
        del sys.path[:len(added)]
    results = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        failure = case.find("failure")
        results[case.get("name")] = None if failure is None else (failure.get("message") or "failed")
    return results


@pytest.mark.parametrize("check", cocotb_checks())
def test_cycle_level(check, cocotb_results):
    assert check in cocotb_results, f"{check} did not run (the simulation ended early?)"
    assert cocotb_results[check] is None, cocotb_results[check]


@pytest.mark.parametrize("senders", [1, 8])
def test_the_output_port_stays_busy_under_incast(senders):
    """The harness's --incast: SENDERS ports each send six full frames at once toward
    one port (no I/O). The output port is busy from its first byte to its last, as many
    senders as one (measured 1.0000 at 1, 2, 8 and 15 ports, nothing dropped within the
    limit): whatever slows a run through the rtl plane is not the switch idling."""
    import json
    from incast.dataplane import rtl
    exe = rtl.build_model(16, rtl.cell_bits(16, 32768))    # FAST'08's 32 KiB model, shared with its runs
    r = subprocess.run([str(exe), "--limit", "65536", "--incast", str(senders), "6", "1514"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["received"] == out["sent"] == 6 * senders and out["dropped"] == 0, out
    assert out["span"] == out["ideal_span"] and out["utilization"] >= 0.9999, out


def test_every_command_is_answered_when_the_client_reads_late(tmp_path):
    """The control socket: a client that sends thousands of commands before it reads an
    answer (more answers than a socket holds) gets every one, in order. (A harness that
    wrote its answers as they came dropped those its socket had no room for, and the
    client waited for them until its timeout.)"""
    import socket
    from incast.dataplane import rtl
    exe = rtl.build_model(4, rtl.cell_bits(4, 8192))
    path = tmp_path / "ctl"
    proc = subprocess.Popen([str(exe), "--control", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        n = 20000
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(60)
            s.connect(str(path))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # the harness's writes fill it soon
            s.sendall(b"".join(b"w 0x%x %d\nnow\n" % (0x1000, i) for i in range(n // 2)))
            got = b""
            NL = b"\n"
            while got.count(NL) < n:
                chunk = s.recv(1 << 16)
                assert chunk, f"the harness closed after {got.count(NL)} of {n} answers"
                got += chunk
        lines = got.decode().split()
        assert len(lines) == n and lines[0::2] == ["ok"] * (n // 2), lines[:6]
        assert all(x.isdigit() for x in lines[1::2])
    finally:
        proc.terminate()
        proc.wait(timeout=10)
