"""The Python side and p4src/incast.p4 agree: what they share is read from the P4 source,
and the one format defined twice (the telemetry report: P4 headers, Scapy layers) is
checked field by field. Needs neither p4c nor bmv2."""
import re

from incast.p4 import program as p4program
from incast.p4.layers import (INT_DS_MD_BITS, INT_REP_MD_BITS, REPORT_SIZE, TELEMETRY_UDP_PORT, IntReport,
                               TelemetryReport, layout)


def test_telemetry_report_matches_the_p4_headers():
    """The Scapy layers with the metadata the switch's bits name are the P4 headers."""
    fields = [(name, bits) for name, _, bits in layout()]
    assert fields == p4program.header("report_group_t") + p4program.header("int_report_t")
    assert [n for n, _ in p4program.header("report_group_t")] == [f.name for f in TelemetryReport.fields_desc]
    # the metadata is as long as the report says: 17 words, each bit's 4 or 8 bytes
    md = dict((n, b) for n, _, b in layout())
    baseline = sum(md[n] for n in ("ingress_port", "egress_port", "hop_latency", "queue", "queue_occupancy",
                                   "ingress_ts", "egress_ts"))
    assert baseline == 32 * (5 + 2)            # RepMdBits 1-5: bits 4 and 5 are 8 bytes
    assert bin(INT_REP_MD_BITS).count("1") == 5 and bin(INT_DS_MD_BITS).count("1") == 10
    assert REPORT_SIZE == 8 + 12 + 4 * IntReport().md_len


def test_shared_constants_come_from_the_p4_source():
    c = p4program.constants()
    assert TELEMETRY_UDP_PORT == c["TELEMETRY_UDP_PORT"] == 32766
    # the truncated clone: Ethernet, IPv4, UDP, the report, the packet's first 56 bytes
    assert c["TELEMETRY_FRAME_BYTES"] == 14 + 20 + 8 + REPORT_SIZE + c["TELEMETRY_INNER_BYTES"]
    assert c["TELEMETRY_INNER_BYTES"] % 4 == 0   # the report counts the packet in 4-byte words


def test_every_setting_is_a_table_parameter_the_program_reads():
    """The switch's settings are the parameters of the action configure (no register
    holds one, so a P4Runtime client can write them all), each read by the pipeline;
    a queue's are configure_queue's. Both actions are the actions of their tables, in
    ingress and in egress."""
    source = p4program.SOURCE.read_text()
    settings = p4program.config_fields()
    assert list(settings) == p4program.action_params("configure") and len(settings) == 18
    assert p4program.action_params("configure_queue") == ["limit", "xoff", "xon"]
    for name in settings:
        assert re.search(rf"meta\.cfg\.{name}\s*=\s*{name};", source), f"configure does not set {name}"
        reads = re.findall(rf"meta\.cfg\.{name}\b(?!\s*=[^=])", source)
        assert reads, f"the setting {name} is never read"
    for name in p4program.action_params("configure_queue"):
        assert re.findall(rf"meta\.q\.{name}\b(?!\s*=[^=])", source), f"the queue setting {name} is never read"
    assert not re.search(r"register<[^>]*>\(\d+\)\s+(cfg|limit_bytes|xoff_bytes|xon_bytes|port_mac);", source)
    for table, action in [("switch_config", "configure"), ("egress_switch_config", "configure"),
                          ("queue_config", "configure_queue"), ("egress_queue_config", "configure_queue")]:
        body = re.search(rf"table\s+{table}\s*\{{(.*?)\n\s*\}}", source, re.S).group(1)
        assert re.search(rf"actions\s*=\s*\{{\s*{action}\(meta\);\s*\}}", body), table


def test_a_labs_starter_replaces_only_its_regions_with_todos_and_stubs():
    from incast.p4 import program as p4program
    source = p4program.SOURCE.read_text()
    hints = p4program.lab_regions(5)
    assert len(hints) == 2 and all("occ_bytes" in h for h in hints)
    starter = p4program.lab_starter(5)
    assert starter.count("TODO (lab 5)") == 2
    assert "lab 5 begin" not in starter and "lab 5 end" not in starter
    assert "occ_bytes.write" not in starter            # the student writes both actions
    assert "meta.accounted = 0;" in starter            # a stub that compiles in their place
    # Everything outside the regions is the program itself.
    assert starter.splitlines()[:50] == source.splitlines()[:50]
    import pytest
    with pytest.raises(ValueError, match="no region for lab 99"):
        p4program.lab_starter(99)


def test_two_compiles_of_one_program_at_once_both_get_it(tmp_path, monkeypatch):
    """Runs side by side (--jobs) each compile incast.p4 where the build directory lacks
    it: each compiles into a directory of its own, and both find the one installed."""
    import threading
    from incast.dataplane import bmv2
    started = threading.Barrier(2)
    p4c = tmp_path / "p4c-bm2-ss"
    # A stand-in p4c: writes its -o file; both compiles are in it at once (the barrier).
    p4c.write_text("#!/bin/sh\n[ \"$1\" = --version ] && { echo 'Version 1.2.3.7' >&2; exit 0; }\n"
                   "while [ \"$1\" != -o ]; do shift; done; echo '{}' > \"$2\"\n")
    p4c.chmod(0o755)
    monkeypatch.setattr(bmv2, "BUILD_DIR", tmp_path / "build")
    monkeypatch.setattr(bmv2, "tool", lambda name: str(p4c))
    real_run = bmv2.subprocess.run

    def run(cmd, **kw):
        if "-o" in cmd:
            started.wait(timeout=30)
        return real_run(cmd, **kw)
    monkeypatch.setattr(bmv2.subprocess, "run", run)
    got, errors = [], []

    def compile_once():
        try:
            got.append(bmv2.compile_program())
        except Exception as e:          # the failure this guards against
            errors.append(e)
    threads = [threading.Thread(target=compile_once) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(got) == 2 and got[0] == got[1] and got[0].is_file(), errors
    assert [p.name for p in (tmp_path / "build").iterdir()] == [got[0].parent.name]   # no work left


def test_the_rtl_switchs_address_map_comes_from_its_source(tmp_path):
    """incast.dataplane.rtl reads the RTL switch's register indexes and regions from
    rtl/src/incast_switch.sv, as the bmv2 plane reads incast.p4's: a change there moves
    the Python side with it. The two switches share their settings' indexes where their
    units agree (the RTL counts cycles where the P4 program counts microseconds): the
    P4 program's are its action configure's parameters, in that order."""
    from incast.dataplane import rtl
    assert rtl.address_map() == rtl.ADDRESSES and rtl.OCC == rtl.ADDRESSES["ADDR_OCC"] == 0x4000
    moved = tmp_path / "incast_switch.sv"
    moved.write_text(rtl.SWITCH_SOURCE.read_text().replace("ADDR_OCC = 16'h4000", "ADDR_OCC = 16'hE000"))
    assert rtl.address_map(moved)["ADDR_OCC"] == 0xE000
    # every region is used by the switch's management decode, and no two overlap
    source = rtl.SWITCH_SOURCE.read_text()
    regions = {k: v for k, v in rtl.ADDRESSES.items() if k.startswith("ADDR_")}
    assert len(set(regions.values())) == len(regions)
    for name in regions:
        assert len(re.findall(rf"\b{name}\b", source)) >= 2, f"{name} is declared and never decoded"
    p4 = p4program.config_fields()
    shared = set(p4) & set(rtl.CFG)
    assert {"xoff", "xon", "quanta", "ecn_k", "pfc", "pool_bytes", "pool_alpha16", "tel_mode"} <= shared
    assert {k: rtl.CFG[k] for k in shared} == {k: p4[k] for k in shared}
