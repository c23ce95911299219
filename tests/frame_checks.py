"""Checks of frames a switch forwarded, shared by the P4 switch's tests (bmv2 and the
rtl model behind the same rig) and the rtl switch's cycle-level checks."""
from __future__ import annotations


def check_ecn_marks(sent: list[bytes], got: list, k: int, ahead) -> int:
    """Each received frame (Scapy packets, in order) against the one sent: marked CE
    where it was ECN-capable and found more than k bytes ahead of it in its queue
    (ahead(i): frames still queued when frame i arrived), unchanged otherwise, its IPv4
    checksum valid whatever was rewritten. Returns how many were marked."""
    from scapy.layers.l2 import Ether
    assert len(got) == len(sent), (len(got), len(sent))
    marked = 0
    for i, pkt in enumerate(got):
        ip = pkt["IP"]
        capable = Ether(sent[i])["IP"].tos & 3 != 0
        finds = ahead(i) * len(sent[i])
        assert ip.tos & 3 == (3 if capable and finds > k else (2 if capable else 0)), (i, ip.tos)
        marked += ip.tos & 3 == 3
        checksum = ip.chksum
        del ip.chksum
        assert Ether(bytes(pkt))["IP"].chksum == checksum, f"frame {i}: bad checksum"
    return marked


def check_report_frame(frame: bytes):
    """A telemetry report as the switches send it: its IPv4 checksum valid, the IPv4 and
    UDP lengths and the report's length (in words) reaching the frame's end, UDP to the
    collector's port, version 2. Returns the frame's (TelemetryReport, IntReport)."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from incast.p4.layers import TELEMETRY_UDP_PORT, IntReport, TelemetryReport
    pkt = Ether(frame)
    ip = pkt[IP]
    again = IP(bytes(ip))
    del again.chksum
    assert IP(bytes(again)).chksum == ip.chksum, "bad IPv4 checksum"
    assert ip.len == len(frame) - 14 and ip[UDP].len == len(frame) - 34 and ip[UDP].dport == TELEMETRY_UDP_PORT
    group, report = pkt[TelemetryReport], pkt[IntReport]
    assert group.version == 2
    assert 4 * (report.rep_len + 1) == len(frame) - 14 - 20 - 8 - 8   # the report's length: to the frame's end
    return group, report


def tshark_fields(frames: list[bytes], fields: list[str], workdir) -> list[list[str]] | None:
    """The int_report.* fields (and any other tshark field named whole) of each frame as
    tshark reads them with scripts/wireshark/int-report.lua; None without tshark."""
    import shutil
    import subprocess
    from pathlib import Path
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcap
    tshark = shutil.which("tshark")
    if tshark is None:
        return None
    pcap = Path(workdir) / "reports.pcap"
    wrpcap(str(pcap), [Ether(f) for f in frames])
    dissector = Path(__file__).resolve().parent.parent / "scripts" / "wireshark" / "int-report.lua"
    names = [f if "." in f else f"int_report.{f}" for f in fields]
    out = subprocess.run([tshark, "-n", "-X", f"lua_script:{dissector}", "-r", str(pcap), "-T", "fields",
                          "-E", "separator=,", *[a for n in names for a in ("-e", n)]],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [line.split(",") for line in out.stdout.splitlines()]
