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
