"""Every ip, tc and ethtool command the testbed runs on links, namespaces and queues,
with one error style: a command that fails raises NetdevError naming the command and the
tool's own words. Nothing is hidden behind `|| true`: a link that is not up, an offload
left on or a qdisc not installed changes the experiment.

Why the iproute2 tools and, mostly, not a netlink library: a tc or ip batch is the
readable, replayable artifact a run saves (switch.tc, the hosts' scripts), and one batch
is one process. Measured on a 2-core VM with 64 veth pairs in a namespace: `ip -batch`
sets 64 links up in 16 ms and `ip -j link show` lists 129 links in 10 ms; pyroute2 0.7.2
(Debian 12) takes 329 ms to import, 83 ms to list the links of a namespace (NetNS forks a
helper) and 25 ms for the 64 link changes. Two exceptions, for a thousand hosts under
User-Mode Linux where every process costs tens of milliseconds: ethtool has no batch, so
offloads_off makes ethtool's own ioctl from this process; and a host's NIC queue is made
over netlink (tbf_replace, plug) from a thread already in its namespace, with the very
messages tc sends (tests/test_netdev.py compares). The one netlink query the tools do not
answer cheaply (a process's sockets' TCP_INFO) is read with the standard library
(hosts/port_tcpinfo.py).
"""
from __future__ import annotations

import ctypes
import fcntl
import fnmatch
import json
import os
import socket
import struct
import subprocess

from pyroute2.iproute.linux import transform_handle
from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST
from pyroute2.netlink.rtnl import RTM_NEWQDISC, TC_H_ROOT
from pyroute2.netlink.rtnl.tcmsg import sched_tbf, tcmsg
from pyroute2.netlink.rtnl.tcmsg.common import calc_xmittime

from incast.errors import RunFailed


class NetdevError(RunFailed):
    pass


def run(*argv: str, ns: str | None = None, input: str | None = None) -> str:
    """Run one ip/tc/ethtool command (in the named network namespace); its stdout."""
    cmd = ["ip", "netns", "exec", ns, *argv] if ns else list(argv)
    r = subprocess.run(cmd, input=input, capture_output=True, text=True)
    if r.returncode:
        why = (r.stderr or r.stdout).strip().splitlines()
        shown = " ".join(argv) if input is None else f"{' '.join(argv)} ({input.count(chr(10))} lines)"
        raise NetdevError(f"`{shown}` failed: {why[-1] if why else f'exit status {r.returncode}'}")
    return r.stdout


def batch(tool: str, lines: list[str], ns: str | None = None, force: bool = False) -> None:
    """Run lines through `ip -batch` or `tc -batch` in one process. force: go on after a
    failed line (teardown), and raise for none."""
    if not lines:
        return
    if force:
        subprocess.run([tool, "-force", "-batch", "-"], input="\n".join(lines) + "\n", text=True,
                       capture_output=True)
        return
    run(tool, "-batch", "-", ns=ns, input="\n".join(lines) + "\n")


def version() -> str:
    return run("tc", "-V").strip()


def ifindexes(ns: str | None = None) -> dict[str, int]:
    """Interface name -> ifindex in this (or the named) network namespace."""
    return {link["ifname"]: link["ifindex"] for link in json.loads(run("ip", "-j", "link", "show", ns=ns))}


def qdiscs_by_dev(stats: bool = False) -> dict[str, list[dict]]:
    """Every device's qdiscs in this namespace, from one `tc` (a thousand switch ports
    read one `tc` each cost 39 s of host time under User-Mode Linux)."""
    out: dict[str, list[dict]] = {}
    for q in json.loads(run("tc", *(["-s"] if stats else []), "-j", "qdisc", "show") or "[]"):
        out.setdefault(q["dev"], []).append(q)
    return out


def add_veth(name: str, peer: str) -> None:
    run("ip", "link", "add", name, "type", "veth", "peer", "name", peer)


def delete_link(name: str) -> None:
    """Remove a link if it is still there (teardown: its namespace may be gone already)."""
    subprocess.run(["ip", "link", "del", name], capture_output=True)


def set_up(names: list[str], ns: str | None = None) -> None:
    batch("ip", [f"link set dev {n} up" for n in names], ns=ns)


def offloads_off_command(dev: str, tx_checksum: bool = False) -> str:
    # Without this the queues hold 64 KB GSO/GRO super-packets and a 32 KB buffer
    # drops nearly everything. tx_checksum: a software switch that forwards frames as
    # they are (bmv2) needs checksums complete when they leave the host, not left to a
    # NIC that veth does not have.
    return f"ethtool -K {dev} tso off gso off gro off" + (" tx off" if tx_checksum else "")


# linux/sockios.h and linux/ethtool.h.
SIOCETHTOOL = 0x8946
ETHTOOL_GSTRINGS, ETHTOOL_GSSET_INFO, ETHTOOL_SFEATURES = 0x1B, 0x37, 0x3B
ETH_SS_FEATURES = 4
ETH_GSTRING_LEN = 32
# ethtool -K's words as patterns over the kernel's feature names (ethtool's own table).
OFFLOAD_FEATURES = {"tso": "tx-tcp*-segmentation", "gso": "tx-generic-segmentation", "gro": "rx-gro",
                    "tx": "tx-checksum-*"}


def _ethtool(sock, dev: str, data: bytearray) -> None:
    """One SIOCETHTOOL call on dev with the command structure data (filled in place)."""
    buf = (ctypes.c_char * len(data)).from_buffer(data)
    ifreq = struct.pack("16sP", dev.encode(), ctypes.addressof(buf)).ljust(40, b"\0")
    fcntl.ioctl(sock.fileno(), SIOCETHTOOL, ifreq)


def _feature_names(sock, dev: str) -> list[str]:
    info = bytearray(struct.pack("=IIQI", ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_FEATURES, 0))
    _ethtool(sock, dev, info)
    count = struct.unpack_from("=I", info, 16)[0]
    strings = bytearray(struct.pack("=III", ETHTOOL_GSTRINGS, ETH_SS_FEATURES, count)
                        + bytes(count * ETH_GSTRING_LEN))
    _ethtool(sock, dev, strings)
    return [strings[12 + i * ETH_GSTRING_LEN:12 + (i + 1) * ETH_GSTRING_LEN].split(b"\0")[0].decode()
            for i in range(count)]


def offloads_off(devs: list[str], tx_checksum: bool = False) -> None:
    """offloads_off_command's changes, made by this process with ethtool's own ioctl (in
    the calling thread's network namespace): a thousand switch ports or hosts' NICs
    take a thousand ethtool processes otherwise, about 20 ms of host time each under
    User-Mode Linux."""
    words = ["tso", "gso", "gro"] + (["tx"] if tx_checksum else [])
    request = None      # the same for every device: the feature names are the kernel's
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for dev in devs:
            try:
                if request is None:
                    names = _feature_names(sock, dev)
                    valid = [0] * ((len(names) + 31) // 32)
                    for i, n in enumerate(names):
                        if any(fnmatch.fnmatchcase(n, OFFLOAD_FEATURES[w]) for w in words):
                            valid[i // 32] |= 1 << (i % 32)
                    request = struct.pack("=II", ETHTOOL_SFEATURES, len(valid)) + b"".join(
                        struct.pack("=II", v, 0) for v in valid)
                _ethtool(sock, dev, bytearray(request))
            except OSError as e:
                raise NetdevError(f"{offloads_off_command(dev, tx_checksum)} failed: {e.strerror}") from e


def netns_add(name: str) -> None:
    run("ip", "netns", "add", name)


def netns_add_many(names: list[str]) -> None:
    """Create named network namespaces, all in one process."""
    batch("ip", [f"netns add {n}" for n in names])


def netns_delete(names: list[str]) -> None:
    """Delete namespaces in one process, going on past any already gone (teardown)."""
    batch("ip", [f"netns del {n}" for n in names], force=True)


# --- qdiscs over netlink, from a thread that is already in the device's namespace ---
#
# Why: under User-Mode Linux a process costs tens of milliseconds of host time, and a
# thousand hosts' NICs made by one `tc` each took most of a 1020-host network's build.
# The messages are tc's own: the same attributes `tc qdisc replace ... tbf ...` and
# `... plug ...` send (iproute2 6.1's q_tbf.c, q_plug.c), so a qdisc made here reads
# back from `tc qdisc show` exactly as the tc line would have made it (a test compares).

def _tbf_message():
    """pyroute2's tcmsg for tbf, with the attributes its 0.7 table lacks: tc sends
    TCA_TBF_BURST (the bucket in bytes, which the kernel then takes as it is) and,
    above 2^32 bytes/s, TCA_TBF_RATE64."""

    class tbf_options(sched_tbf.options):
        nla_map = (*sched_tbf.options.nla_map,
                   ('TCA_TBF_RATE64', 'uint64'), ('TCA_TBF_PRATE64', 'uint64'),
                   ('TCA_TBF_BURST', 'uint32'), ('TCA_TBF_PBURST', 'uint32'))

    class tbf_msg(tcmsg):
        @staticmethod
        def get_options(self, *argv, **kwarg):
            return tbf_options
    return tbf_msg


def tbf_replace(ipr, index: int, *, handle: str, rate_bps: int, burst: int, limit: int,
                overhead: int) -> None:
    """`tc qdisc replace dev DEV root handle H tbf rate R burst B limit L overhead O`, over
    ipr (a pyroute2 IPRoute in the device's namespace)."""
    try:
        rate = rate_bps // 8                 # tc_ratespec counts bytes per second
        # rate___reserved is tc_ratespec's linklayer: ethernet (1), as tc says, and
        # then the kernel wants no rate table (it computes from the rate itself)
        parms = {"rate": min(rate, 0xFFFFFFFF), "rate___reserved": 1, "rate_overhead": overhead, "limit": limit,
                 # in ticks, cut to 32 bits as tc's C conversion cuts it (a paused bucket's
                 # 8 bit/s overflows it; the kernel then takes TCA_TBF_BURST as it is)
                 "buffer": int(calc_xmittime(rate, burst)) & 0xFFFFFFFF, "mtu": 0}
        opts = [["TCA_TBF_PARMS", parms], ["TCA_TBF_BURST", burst]]
        if rate >= 1 << 32:
            opts.append(["TCA_TBF_RATE64", rate])
        msg = _tbf_message()()
        msg["index"], msg["handle"], msg["parent"] = index, transform_handle(handle), TC_H_ROOT
        msg["attrs"] = [["TCA_KIND", "tbf"], ["TCA_OPTIONS", {"attrs": opts}]]
        ipr.nlm_request(msg, msg_type=RTM_NEWQDISC,
                        msg_flags=NLM_F_REQUEST | NLM_F_ACK | NLM_F_REPLACE | NLM_F_CREATE)
    except Exception as e:      # pyroute2's NetlinkError carries the kernel's errno
        raise NetdevError(f"tbf on ifindex {index} (rate {rate_bps}bit burst {burst} limit {limit}) "
                          f"failed: {e}") from None


def plug(ipr, index: int, *, handle: str, parent: str, action: str, limit: int = 0,
         change: bool = False) -> None:
    """`tc qdisc replace|change dev DEV parent P handle H plug limit L|release_indefinite`
    (action: limit or release_indefinite), by pyroute2's own plug builder."""
    try:
        ipr.tc("change" if change else "replace", "plug", index, handle=handle, parent=parent,
               action=f"TCQ_PLUG_{action.upper()}", limit=limit)
    except Exception as e:
        raise NetdevError(f"plug {action} on ifindex {index} failed: {e}") from None


# --- a plug that obeys MAC Control frames itself (kernels/patches-um/0005) ---
#
# Actions of struct tc_plug_qopt that neither tc nor pyroute2 has a word for, and the
# plug's TCA_XSTATS (struct tc_plug_xstats), over a netlink socket of the calling
# thread's namespace. A kernel whose plug lacks them refuses the actions with EINVAL.

TCQ_PLUG_OBEY, TCQ_PLUG_OBEY_PFC = 6, 7
_NLMSGHDR = struct.Struct("=IHHII")
_TCMSG = struct.Struct("=BxxxiIII")           # family, ifindex, handle, parent, info
_RTATTR = struct.Struct("=HH")
_PLUG_QOPT = struct.Struct("=iI")             # action, limit
_PLUG_XSTATS = struct.Struct("=IIIIQ")        # pause, resume, PFC ignored, pad, paused ns
_RTM_GETQDISC, _NLMSG_ERROR, _NLMSG_DONE, _NLM_F_DUMP = 38, 2, 3, 0x300
_TCA_KIND, _TCA_OPTIONS, _TCA_XSTATS = 1, 2, 4


def _rtattr(kind: int, payload: bytes) -> bytes:
    attr = _RTATTR.pack(_RTATTR.size + len(payload), kind) + payload
    return attr + b"\0" * (-len(attr) % 4)


def _rtattrs(data: bytes):
    offset = 0
    while offset + _RTATTR.size <= len(data):
        length, kind = _RTATTR.unpack_from(data, offset)
        if length < _RTATTR.size:
            return
        yield kind & 0x3FFF, data[offset + _RTATTR.size:offset + length]
        offset += (length + 3) & ~3


def _netlink_messages(sock, seq: int):
    """(type, payload) of each answer to request seq, until its ack or dump's end."""
    while True:
        data = sock.recv(1 << 16)
        offset = 0
        while offset + _NLMSGHDR.size <= len(data):
            length, kind, _, mseq, _ = _NLMSGHDR.unpack_from(data, offset)
            if length < _NLMSGHDR.size:
                return
            payload = data[offset + _NLMSGHDR.size:offset + length]
            offset += (length + 3) & ~3
            if mseq != seq:
                continue
            if kind == _NLMSG_ERROR:
                err = struct.unpack_from("=i", payload)[0]
                if err:
                    raise OSError(-err, os.strerror(-err))
                return
            if kind == _NLMSG_DONE:
                return
            yield kind, payload


def plug_action(index: int, *, handle: str, parent: str, action: int, limit: int) -> None:
    """`tc qdisc change dev DEV parent P handle H plug` with a raw tc_plug_qopt action;
    raises OSError with the kernel's errno."""
    body = (_TCMSG.pack(socket.AF_UNSPEC, index, transform_handle(handle), transform_handle(parent), 0)
            + _rtattr(_TCA_KIND, b"plug\0") + _rtattr(_TCA_OPTIONS, _PLUG_QOPT.pack(action, limit)))
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as sock:
        sock.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(body), RTM_NEWQDISC, NLM_F_REQUEST | NLM_F_ACK, 1, 0)
                  + body)
        for _ in _netlink_messages(sock, 1):
            pass


def plug_xstats(index: int, handle: str) -> dict | None:
    """The plug's MAC Control statistics (struct tc_plug_xstats): frames that paused
    and resumed it, PFC frames it ignored, the time it was paused; None where the plug
    dumps none (a kernel without them)."""
    want = transform_handle(handle)
    body = _TCMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
    found = None
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as sock:
        sock.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(body), _RTM_GETQDISC, NLM_F_REQUEST | _NLM_F_DUMP, 1, 0)
                  + body)
        for kind, payload in _netlink_messages(sock, 1):
            if kind != RTM_NEWQDISC:
                continue
            _, ifindex, qhandle, _, _ = _TCMSG.unpack_from(payload)
            if ifindex != index or qhandle != want:
                continue
            attrs = dict(_rtattrs(payload[_TCMSG.size:]))
            xstats = attrs.get(_TCA_XSTATS, b"")
            if attrs.get(_TCA_KIND) == b"plug\0" and len(xstats) >= _PLUG_XSTATS.size:
                pause, resume, ignored, _, paused_ns = _PLUG_XSTATS.unpack_from(xstats)
                found = {"pause_frames": pause, "resume_frames": resume, "pfc_ignored": ignored,
                         "paused_ns": paused_ns}
    return found
