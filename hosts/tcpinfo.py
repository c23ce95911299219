"""Decode Linux ``struct tcp_info`` (include/uapi/linux/tcp.h) from getsockopt(TCP_INFO).

Standard library only: this file runs on the emulated hosts, which may be VMs with
nothing but a Python interpreter. Fields a running kernel does not fill are None.
"""
import socket
import struct

# (format, names) in the order of struct tcp_info; bitfield bytes are kept raw.
_LAYOUT = [
    ("B", "state"), ("B", "ca_state"), ("B", "retransmits"), ("B", "probes"),
    ("B", "backoff"), ("B", "options"), ("B", "wscale"), ("B", "flags"),
    ("I", "rto"), ("I", "ato"), ("I", "snd_mss"), ("I", "rcv_mss"),
    ("I", "unacked"), ("I", "sacked"), ("I", "lost"), ("I", "retrans"), ("I", "fackets"),
    ("I", "last_data_sent"), ("I", "last_ack_sent"), ("I", "last_data_recv"), ("I", "last_ack_recv"),
    ("I", "pmtu"), ("I", "rcv_ssthresh"), ("I", "rtt"), ("I", "rttvar"),
    ("I", "snd_ssthresh"), ("I", "snd_cwnd"), ("I", "advmss"), ("I", "reordering"),
    ("I", "rcv_rtt"), ("I", "rcv_space"), ("I", "total_retrans"),
    ("Q", "pacing_rate"), ("Q", "max_pacing_rate"), ("Q", "bytes_acked"), ("Q", "bytes_received"),
    ("I", "segs_out"), ("I", "segs_in"), ("I", "notsent_bytes"), ("I", "min_rtt"),
    ("I", "data_segs_in"), ("I", "data_segs_out"),
    ("Q", "delivery_rate"), ("Q", "busy_time"), ("Q", "rwnd_limited"), ("Q", "sndbuf_limited"),
    ("I", "delivered"), ("I", "delivered_ce"),
    ("Q", "bytes_sent"), ("Q", "bytes_retrans"),
    ("I", "dsack_dups"), ("I", "reord_seen"), ("I", "rcv_ooopack"), ("I", "snd_wnd"),
    ("I", "rcv_wnd"), ("I", "rehash"),
    ("H", "total_rto"), ("H", "total_rto_recoveries"), ("I", "total_rto_time"),
]
FIELDS = [name for _, name in _LAYOUT]
_STRUCT = struct.Struct("=" + "".join(f for f, _ in _LAYOUT))
SIZE = _STRUCT.size


def _prefix_len(nbytes):
    """How many leading fields fit in nbytes (the kernel may return a shorter struct)."""
    count, offset = 0, 0
    for fmt, _ in _LAYOUT:
        width = struct.calcsize("=" + fmt)
        if offset + width > nbytes:
            break
        offset += width
        count += 1
    return count, offset


def decode(raw):
    count, used = _prefix_len(len(raw))
    values = struct.unpack("=" + "".join(f for f, _ in _LAYOUT[:count]), raw[:used])
    info = dict(zip(FIELDS, values))
    for name in FIELDS[count:]:
        info[name] = None
    return info


def read(sock):
    return decode(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, SIZE))
