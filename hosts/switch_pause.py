#!/usr/bin/env python3
"""Ethernet flow control for the linux data plane's switches: 802.3x PAUSE or 802.1Qbb
PFC, sent and obeyed at every switch port, with a pause watchdog.

A kernel bridge neither sends nor obeys PAUSE, so this agent does both, for every switch
of the run, from the namespace the switch ports live in:

* Sending. It learns the ports' class queues' backlogs from the kernel: where the plug
  qdisc has watermarks (kernels/patches-um/0004: the UML kernels), each class queue is
  given its XOFF and XON, and the kernel tells the agent (an RTNLGRP_TC message) at the
  very enqueue that takes a queue past XOFF and the dequeue that brings it back to XON,
  so the agent reads nothing in between. Elsewhere it reads every ``interval`` (an
  RTM_GETQDISC dump, what `tc -s qdisc` reads). A port whose queues hold more than XOFF bytes is
  congested until they are back at XON (each class queue against its own thresholds,
  its share of the port's); while any port of a switch is congested, that
  switch pauses every other of its ports (as the P4 program does): a PAUSE with the
  configured quanta, refreshed at half its length, and quanta 0 once no port needs it.
  With PFC each class is its own: class c's queue above its XOFF pauses class c only.
  Frames bypass the port's queues (PACKET_QDISC_BYPASS), as a MAC sends them ahead of
  data.
* Obeying. Each port's class queues are ``plug`` qdiscs: a PAUSE received at a port
  (from a host or from the switch at the other end of a trunk) holds every class
  queue of that port for quanta x 512 bit times at the port's rate; a PFC frame holds
  the classes it enables. The bridge consumes MAC Control frames, so the agent reads
  them from a packet socket on each port before the bridge sees them.
* Watchdog (as SONiC's PFC watchdog). A class queue held longer than ``detect`` is in
  a storm: it stops obeying pauses and, with action "drop", drops what arrives for it
  (its plug's limit goes to 0) until no pause has been received for ``restore``.

Made for virtual time (User-Mode Linux with time-travel=inf-cpu), where the CPU is
infinitely fast: the agent reads every queue exactly each interval and reacts in no
time. On a real clock its reaction is the interval plus its wake-up delay; the report
gives the intervals achieved.

Reading on a grid, quiet periods cost nothing: once every queue has been empty for a
frame's time, the agent stops reading and sleeps until a frame enters any switch port
(a packet socket on all of them, its filter opened only then), and reads at once when
one does. A block waiting out a 200 ms retransmission timeout is a sleep, not 64500
reads. Told by the kernel, the agent wakes only for crossings, received frames and its
timers (a PAUSE refreshed at half its length, the watchdog): in virtual time a run
with PAUSE costs about what it costs without.

Config: a JSON file (see incast.dataplane.linux.flow_control_config). Prints READY
when every socket is open; on SIGINT or SIGTERM, one JSON line of statistics.
Standard library only.
"""
import argparse
import ctypes
import errno
import json
import os
import select
import signal
import socket
import struct
import sys
import time

ETH_P_ALL = 0x0003
ETH_P_MAC_CONTROL = 0x8808
OP_PAUSE, OP_PFC = 0x0001, 0x0101
PAUSE_DST = bytes.fromhex("0180c2000001")
SOL_PACKET = 263
PACKET_QDISC_BYPASS = 20
PACKET_IGNORE_OUTGOING = 23
SO_ATTACH_FILTER = 26
SWITCH_PRIORITY = 50       # SCHED_FIFO: ahead of every host process (SCHED_OTHER)

from rtnl import (NLM_F_REQUEST, NLMSG_ERROR, NLMSGHDR, RTATTR, RTM_NEWQDISC, TCMSG,  # noqa: E402
                  qdisc_messages, qdisc_stats)

NLM_F_ACK = 0x4
TCA_KIND, TCA_OPTIONS = 1, 2
TCQ_PLUG_BUFFER, TCQ_PLUG_RELEASE_INDEFINITE, TCQ_PLUG_LIMIT = 0, 2, 3
TCQ_PLUG_XOFF, TCQ_PLUG_XON = 4, 5          # kernels/patches-um/0004
RTMGRP_TC = 0x8                             # 1 << (RTNLGRP_TC - 1)
PLUG_QOPT = struct.Struct("=iI")            # struct tc_plug_qopt: action, limit


def _rtattr(kind, payload):
    attr = RTATTR.pack(RTATTR.size + len(payload), kind) + payload
    return attr + b"\0" * (-len(attr) % 4)


class Netlink:
    """Reads qdisc backlogs and changes plug qdiscs over one rtnetlink socket."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        self.seq = 0

    def backlogs(self):
        """{(ifindex, handle major): backlog bytes} of every qdisc."""
        self.seq += 1
        return {(ifindex, major): backlog
                for ifindex, major, _, backlog, _, _, _ in qdisc_stats(self.sock, self.seq)}

    def plug(self, ifindex, major, parent_minor, action, limit=0):
        """`tc qdisc change dev IF parent 1:MINOR handle MAJOR: plug ACTION`."""
        self.seq += 1
        body = (TCMSG.pack(socket.AF_UNSPEC, ifindex, major << 16, (1 << 16) | parent_minor, 0)
                + _rtattr(TCA_KIND, b"plug\0") + _rtattr(TCA_OPTIONS, PLUG_QOPT.pack(action, limit)))
        self.sock.send(NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_NEWQDISC, NLM_F_REQUEST | NLM_F_ACK,
                                     self.seq, 0) + body)
        while True:
            data = self.sock.recv(65536)
            length, kind, _, seq, _ = NLMSGHDR.unpack_from(data)
            if kind == NLMSG_ERROR and seq == self.seq:
                err = struct.unpack_from("=i", data, NLMSGHDR.size)[0]
                if err:
                    raise OSError(-err, f"plug change on ifindex {ifindex} handle {major:x}:")
                return


class Crossings:
    """What the kernel tells of the class queues: an RTNLGRP_TC socket, on which the plug
    qdisc reports each XOFF and XON crossing (and any change of a qdisc) with its
    statistics."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        self.sock.bind((0, RTMGRP_TC))
        self.sock.setblocking(False)
        self.told = 0

    def read(self):
        """{(ifindex, major): backlog} of what was told since the last read (each queue's
        latest), or None where messages were lost (the socket overran): read them all."""
        backlog = {}
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except BlockingIOError:
                return backlog
            except OSError as e:
                if e.errno != errno.ENOBUFS:
                    raise
                return None
            for kind, stats in qdisc_messages(data):
                if kind == RTM_NEWQDISC:
                    ifindex, major, _, b, _, _, _ = stats
                    backlog[(ifindex, major)] = b
                    self.told += 1


def mac_control_filter():
    """Classic BPF: keep frames whose EtherType is MAC Control (the rest of a port's
    traffic never reaches user space)."""
    prog = [(0x28, 0, 0, 12),                     # ldh [12]
            (0x15, 0, 1, ETH_P_MAC_CONTROL),      # jeq #0x8808, keep, drop
            (0x06, 0, 0, 0xFFFF),                 # ret #65535
            (0x06, 0, 0, 0)]                      # ret #0
    return _filter(prog)


def _filter(prog):
    """A sock_fprog for SO_ATTACH_FILTER, with the buffer it points into (keep both)."""
    code = b"".join(struct.pack("HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(code)
    return buf, struct.pack("HL", len(prog), ctypes.addressof(buf))


class Doorbell:
    """Rings when a frame enters any port of the namespace's switches: one packet socket
    on every interface, inbound frames only, whose filter takes nothing while the agent
    reads on its grid and the first byte of every frame while it sleeps."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
        self.sock.setblocking(False)
        self._filters = {on: _filter([(0x06, 0, 0, 1 if on else 0)]) for on in (True, False)}
        self.listen(False)

    def listen(self, on: bool):
        self.sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, self._filters[on][1])
        if not on:
            while True:                  # what rang before the filter closed
                try:
                    self.sock.recv(1)
                except BlockingIOError:
                    return


class _SockaddrLL(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("protocol", ctypes.c_ushort), ("ifindex", ctypes.c_int),
                ("hatype", ctypes.c_ushort), ("pkttype", ctypes.c_ubyte), ("halen", ctypes.c_ubyte),
                ("addr", ctypes.c_ubyte * 8)]


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint), ("iov", ctypes.POINTER(_Iovec)),
                ("iovlen", ctypes.c_size_t), ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]


class _Mmsghdr(ctypes.Structure):
    _fields_ = [("hdr", _Msghdr), ("len", ctypes.c_uint)]


class Frames:
    """The MAC Control frames the switches send, all of one decision together: one
    sendmmsg(2) on one packet socket, each frame addressed to its port by ifindex.

    Why not a send(2) a frame: a queue crossing XOFF pauses every other port of its
    switch, a frame each, and under User-Mode Linux every system call costs host time
    (the guest's process and the kernel's are host processes). With 24 ports, a send a
    frame made a PAUSE run cost about twice the same run without PAUSE. The frames leave
    in the order they were decided, as they did one call each, and bypass the ports'
    queues (PACKET_QDISC_BYPASS), as a MAC sends them ahead of data."""

    def __init__(self):
        # Protocol 0: this socket receives nothing; the ports' own sockets do.
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        self.sock.setsockopt(SOL_PACKET, PACKET_QDISC_BYPASS, 1)
        self._sendmmsg = ctypes.CDLL(None, use_errno=True).sendmmsg
        self.pending = []           # (ifindex, frame)
        self.calls = 0

    def add(self, ifindex, frame):
        self.pending.append((ifindex, frame))

    def flush(self):
        n = len(self.pending)
        if not n:
            return
        msgs = (_Mmsghdr * n)()
        keep = []                   # what the messages point into, alive until sent
        for i, (ifindex, frame) in enumerate(self.pending):
            buf = ctypes.create_string_buffer(frame, len(frame))
            addr = _SockaddrLL(socket.AF_PACKET, socket.htons(ETH_P_MAC_CONTROL), ifindex)
            iov = _Iovec(ctypes.addressof(buf), len(frame))
            keep += [buf, addr, iov]
            msgs[i].hdr.name = ctypes.addressof(addr)
            msgs[i].hdr.namelen = ctypes.sizeof(addr)
            msgs[i].hdr.iov = ctypes.pointer(iov)
            msgs[i].hdr.iovlen = 1
        self.pending = []
        sent = 0
        while sent < n:
            r = self._sendmmsg(self.sock.fileno(), ctypes.byref(msgs, sent * ctypes.sizeof(_Mmsghdr)),
                               n - sent, 0)
            self.calls += 1
            if r < 0:
                err = ctypes.get_errno()
                raise OSError(err, f"sendmmsg of {n - sent} MAC Control frames: {os.strerror(err)}")
            sent += r


class Gate:
    """One class queue of one port: its plug, held by pauses, watched by the watchdog."""

    def __init__(self, port, cls):
        self.port, self.cls = port, cls
        self.until = None          # held until (monotonic s), None when open
        self.held_since = None
        self.held_s = 0.0
        self.storm = False         # the watchdog fired: pauses are ignored
        self.last_pause = 0.0      # when a pause for this queue last arrived


class Port:
    def __init__(self, cfg, classes):
        self.switch, self.dev, self.ifindex = cfg["switch"], cfg["dev"], cfg["ifindex"]
        self.peer = cfg["peer"]
        self.quantum_s = 512 / cfg["rate"]
        self.limits = cfg["limits"]
        self.gates = [Gate(self, c) for c in range(classes)]
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self._filter = mac_control_filter()
        self.sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, self._filter[1])
        # It receives; Frames sends. Not what Frames sends on this port.
        self.sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
        self.sock.bind((self.dev, ETH_P_ALL))
        self.sock.setblocking(False)
        self.mac = self.sock.getsockname()[4]
        # What this port has told its peer: classes held, and when to refresh.
        self.sent_classes = 0
        self.refresh_at = 0.0
        self.stats = {"pause_sent": 0, "xon_sent": 0, "pause_received": 0, "xon_received": 0,
                      "watchdog_fired": 0, "watchdog_restored": 0}

    def frame(self, pfc, hold, release, quanta):
        """A PAUSE (quanta, or 0 when nothing is held), or a PFC frame that holds the
        classes in `hold` and releases those in `release`."""
        if not pfc:
            body = struct.pack("!HH", OP_PAUSE, quanta if hold else 0)
        else:
            body = struct.pack("!HH8H", OP_PFC, hold | release,
                               *[quanta if hold & (1 << c) else 0 for c in range(8)])
        return (PAUSE_DST + self.mac + struct.pack("!H", ETH_P_MAC_CONTROL) + body).ljust(60, b"\0")


class Agent:
    def __init__(self, cfg):
        self.cfg = cfg
        self.pfc = cfg["pfc"]
        self.classes = cfg["classes"]
        self.leaf_base = cfg["leaf_base"]
        self.quanta = cfg["quanta"]
        self.nl = Netlink()
        self.frames = Frames()
        self.ports = [Port(p, self.classes) for p in cfg["ports"]]
        self.by_ifindex = {p.ifindex: p for p in self.ports}
        self.by_fd = {p.sock.fileno(): p for p in self.ports}
        self.xoff, self.xon = cfg["xoff"], cfg["xon"]     # per class queue, bytes
        wd = cfg.get("watchdog")
        self.detect_s = wd["detect_us"] / 1e6 if wd else None
        self.restore_s = wd["restore_us"] / 1e6 if wd else None
        self.drop = bool(wd and wd["action"] == "drop")
        self.congested = {}        # (ifindex, class) -> above XOFF, not yet back at XON
        self.polls = 0
        self.gaps_us = []
        self.last_poll = None
        self.xoff_lag_s = 0.0      # the longest a queue may have been above XOFF unseen
        self.quiet = False         # the last read found every queue empty
        self.doorbell = Doorbell()
        self.sleeps = 0
        self.slept_s = 0.0
        self.woke = False          # woken by the doorbell, no XOFF seen since
        self.woke_to_xoff = 0      # wakes whose traffic went on to cross XOFF
        self.crossings = self.watermarks()
        # A pipe a signal writes a byte to (signal.set_wakeup_fd, main): it wakes the
        # loop's select, which else resumes waiting (with no timeout while nothing is due).
        self.signalled, self.wake_fd = os.pipe()
        os.set_blocking(self.signalled, False)
        os.set_blocking(self.wake_fd, False)

    def watermarks(self):
        """Each class queue's XOFF and XON given to its plug, so that the kernel tells
        each crossing (Crossings); None where the kernel's plug has no watermarks (it
        refuses them), and the agent reads on its grid."""
        if self.cfg.get("watch") == "grid" or min(self.xoff) <= 0:
            return None                # a grid asked for; an XOFF of 0 is the kernel's "none"
        crossings = Crossings()        # listening before any mark is set: none missed
        try:
            for port in self.ports:
                for c in range(self.classes):
                    leaf = self.leaf_base + c
                    self.nl.plug(port.ifindex, leaf, leaf, TCQ_PLUG_XOFF, self.xoff[c])
                    self.nl.plug(port.ifindex, leaf, leaf, TCQ_PLUG_XON, self.xon[c])
        except OSError as e:
            crossings.sock.close()
            if e.errno != errno.EINVAL:
                raise
            return None
        return crossings

    # -- obeying ---------------------------------------------------------------------
    def receive(self, port, now):
        while True:
            try:
                frame = port.sock.recv(128)
            except BlockingIOError:
                return
            if len(frame) < 18 or frame[:6] != PAUSE_DST:
                continue
            opcode = struct.unpack_from("!H", frame, 14)[0]
            if opcode == OP_PAUSE:
                quanta = struct.unpack_from("!H", frame, 16)[0]
                held = {c: quanta for c in range(self.classes)}
            elif opcode == OP_PFC and len(frame) >= 34:
                enabled = struct.unpack_from("!H", frame, 16)[0]
                q = struct.unpack_from("!8H", frame, 18)
                held = {c: q[c] for c in range(self.classes) if enabled & (1 << c)}
            else:
                continue
            if any(held.values()):
                port.stats["pause_received"] += 1
            else:
                port.stats["xon_received"] += 1
            for c, quanta in held.items():
                gate = port.gates[c]
                gate.last_pause = now
                if gate.storm:
                    continue
                if quanta:
                    self.hold(gate, now + quanta * port.quantum_s, now)
                else:
                    self.release(gate, now)

    def hold(self, gate, until, now):
        if gate.until is None:
            self.nl.plug(gate.port.ifindex, self.leaf_base + gate.cls, self.leaf_base + gate.cls, TCQ_PLUG_BUFFER)
            gate.held_since = now
        gate.until = until             # a new pause replaces the old timer

    def release(self, gate, now):
        if gate.until is not None:
            self.nl.plug(gate.port.ifindex, self.leaf_base + gate.cls, self.leaf_base + gate.cls,
                         TCQ_PLUG_RELEASE_INDEFINITE)
            gate.held_s += now - gate.held_since
            gate.until = gate.held_since = None

    def timers(self, now):
        """Expire pauses; run the watchdog. Returns the next deadline."""
        nxt = float("inf")
        for port in self.ports:
            for gate in port.gates:
                if gate.until is not None and now >= gate.until:
                    self.release(gate, now)
                if self.detect_s is not None:
                    if gate.until is not None and now - gate.held_since >= self.detect_s:
                        self.release(gate, now)
                        gate.storm = True
                        port.stats["watchdog_fired"] += 1
                        if self.drop:
                            self._limit(gate, 0)
                    elif gate.storm and now - gate.last_pause >= self.restore_s:
                        gate.storm = False
                        port.stats["watchdog_restored"] += 1
                        if self.drop:
                            self._limit(gate, port.limits[gate.cls])
                    if gate.until is not None:
                        nxt = min(nxt, gate.held_since + self.detect_s)
                    if gate.storm:
                        nxt = min(nxt, gate.last_pause + self.restore_s)
                if gate.until is not None:
                    nxt = min(nxt, gate.until)
        return nxt

    def _limit(self, gate, limit):
        self.nl.plug(gate.port.ifindex, self.leaf_base + gate.cls, self.leaf_base + gate.cls, TCQ_PLUG_LIMIT, limit)

    # -- sending ---------------------------------------------------------------------
    def poll(self, now, told=None):
        """Decide on the queues' backlogs: all of them read now, or those the kernel told
        (told: {(ifindex, major): backlog}; the others as they were)."""
        backlog = self.nl.backlogs() if told is None else told
        if told is None:
            self.quiet = not any(backlog.get((port.ifindex, self.leaf_base + c), 0)
                                 for port in self.ports for c in range(self.classes))
        # Each class queue has its own XOFF/XON (a partition of the port's buffer): with
        # 802.3x any congested class pauses the whole port's senders, with PFC its class.
        for port in self.ports:
            for c in range(self.classes):
                if told is not None and (port.ifindex, self.leaf_base + c) not in told:
                    continue
                b = backlog.get((port.ifindex, self.leaf_base + c), 0)
                key = (port.ifindex, c)
                was = self.congested.get(key, False)
                self.congested[key] = b > self.xoff[c] if not was else b > self.xon[c]
                if self.congested[key] and not was and told is None:
                    # It passed XOFF since the last read: that long, at most, before this one.
                    if self.last_poll is not None:
                        self.xoff_lag_s = max(self.xoff_lag_s, now - self.last_poll)
                    self.woke_to_xoff += self.woke
                    self.woke = False
        if told is None:
            self.last_poll = now
        # Congested ports per (switch, class): a port is asked to pause for a class
        # when some other port of its switch is congested in it.
        count = {}
        for port in self.ports:
            for c in range(self.classes):
                count[(port.switch, c)] = count.get((port.switch, c), 0) + self.congested[(port.ifindex, c)]
        every = (1 << self.classes) - 1
        for port in self.ports:
            classes = [c for c in range(self.classes)
                       if count[(port.switch, c)] - self.congested[(port.ifindex, c)] > 0]
            wanted = sum(1 << c for c in classes) if self.pfc else (every if classes else 0)
            self.tell(port, wanted, now)
        self.frames.flush()

    def tell(self, port, wanted, now):
        """Send what changed (and refresh what still holds) to the port's peer (queued
        in self.frames: the caller flushes)."""
        released = port.sent_classes & ~wanted
        if wanted and (wanted != port.sent_classes or now >= port.refresh_at):
            # PFC: one frame does both
            self.frames.add(port.ifindex, port.frame(self.pfc, wanted, released, self.quanta))
            port.stats["pause_sent"] += 1
            port.refresh_at = now + self.quanta * port.quantum_s / 2
        elif released:
            self.frames.add(port.ifindex, port.frame(self.pfc, 0, released, 0))
            port.stats["xon_sent"] += 1
        port.sent_classes = wanted

    # -- the loop --------------------------------------------------------------------
    def run(self, stop):
        if self.crossings is not None:
            self.run_told(stop)
        else:
            self.run_grid(stop)
        now = time.monotonic()
        for port in self.ports:
            for gate in port.gates:
                self.release(gate, now)
                if gate.storm and self.drop:
                    self._limit(gate, port.limits[gate.cls])

    def run_told(self, stop):
        """Woken by the kernel's crossings, the frames the ports receive, and timers."""
        fds = list(self.by_fd)
        told = self.crossings.sock.fileno()
        self.poll(time.monotonic())          # where the queues stand (empty, at the start)
        self.polls += 1
        print("READY", flush=True)
        while not stop:
            now = time.monotonic()
            deadline = self.timers(now)
            for port in self.ports:          # a PAUSE still wanted is sent again at half its length
                if port.sent_classes:
                    if now >= port.refresh_at:
                        self.tell(port, port.sent_classes, now)
                    deadline = min(deadline, port.refresh_at)
            self.frames.flush()
            timeout = None if deadline == float("inf") else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select(fds + [told, self.signalled], [], [], timeout)
            if self.signalled in ready:
                ready.remove(self.signalled)
            now = time.monotonic()
            if told in ready:
                backlog = self.crossings.read()
                if backlog is None:          # messages lost: read every queue
                    self.poll(now)
                    self.polls += 1
                elif backlog:
                    self.poll(now, backlog)
                ready.remove(told)
            for fd in ready:
                self.receive(self.by_fd[fd], now)

    def run_grid(self, stop):
        """Reading the queues every interval, asleep while they are empty."""
        interval = self.cfg["interval_us"] / 1e6
        # Reads in a row that found every queue empty before the agent sleeps: a
        # frame's time, so that a flow's gaps between frames do not toggle it.
        quiet_reads = max(1, round(self.cfg.get("frame_us", 0) / self.cfg["interval_us"]))
        fds = list(self.by_fd)
        bell = self.doorbell.sock.fileno()
        last_poll = None
        next_poll = time.monotonic()
        quiet_for = 0
        asleep_since = None
        print("READY", flush=True)
        while not stop:
            now = time.monotonic()
            if asleep_since is None and now >= next_poll:
                if last_poll is not None:
                    self.gaps_us.append((now - last_poll) * 1e6)
                last_poll = now
                self.poll(now)
                self.polls += 1
                next_poll += interval
                if next_poll < now:
                    next_poll = now + interval      # behind: no burst of catch-up polls
                quiet_for = quiet_for + 1 if self.quiet else 0
                if quiet_for >= quiet_reads:
                    # Open the doorbell, then read once more: a frame that came in
                    # between is either in that read or rings the bell.
                    self.doorbell.listen(True)
                    self.poll(time.monotonic())
                    self.polls += 1
                    if self.quiet:
                        asleep_since = time.monotonic()
                        self.sleeps += 1
                        self.woke = False
                    else:
                        self.doorbell.listen(False)
                    quiet_for = 0
            deadline = self.timers(now)
            if asleep_since is None:
                deadline = min(deadline, next_poll)
            # select: its timeout has microseconds (poll's and epoll's are milliseconds).
            timeout = None if deadline == float("inf") else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select((fds + [bell] if asleep_since is not None else fds) + [self.signalled],
                                        [], [], timeout)
            if self.signalled in ready:
                ready.remove(self.signalled)
            now = time.monotonic()
            if bell in ready:
                # A frame entered a switch: read at once, and on the grid from here.
                self.doorbell.listen(False)
                self.slept_s += now - asleep_since
                asleep_since = None
                self.woke = True
                last_poll = self.last_poll = now     # nothing was queued until the bell rang
                next_poll = now
                ready.remove(bell)
            for fd in ready:
                self.receive(self.by_fd[fd], now)
        if asleep_since is not None:
            self.slept_s += time.monotonic() - asleep_since

    def report(self):
        gaps = sorted(self.gaps_us)

        def pct(p):
            return round(gaps[min(len(gaps) - 1, int(p / 100 * len(gaps)))], 1) if gaps else None

        # Told by the kernel, a queue's crossing is seen at the enqueue that made it: no lag.
        return {"watch": "told" if self.crossings is not None else "grid",
                "send_calls": self.frames.calls,
                "crossings_told": self.crossings.told if self.crossings is not None else None,
                "polls": self.polls, "poll_gap_us_p50": pct(50), "poll_gap_us_p99": pct(99),
                "sleeps": self.sleeps, "slept_ms": round(self.slept_s * 1000, 3), "woke_to_xoff": self.woke_to_xoff,
                "xoff_lag_us_max": round(self.xoff_lag_s * 1e6, 1),
                "poll_gap_us_max": round(gaps[-1], 1) if gaps else None,
                "ports": [{"switch": p.switch, "port": p.dev, "peer": p.peer, **p.stats,
                           "held_ms": [round(g.held_s * 1000, 3) for g in p.gates]} for p in self.ports]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", help="JSON file: ports, thresholds, interval, watchdog")
    cfg = json.load(open(ap.parse_args().config))
    # Wake on the poll grid (the default timer slack would add up to 50 us).
    ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)     # PR_SET_TIMERSLACK
    # The switch is hardware of its own: its reads must not wait behind the hosts'
    # processes on the guest's one CPU (each of whose clock reads moves virtual time).
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(SWITCH_PRIORITY))
    except OSError:
        pass        # not permitted: the report's gaps say how late reads came
    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda s, f: stop.append(s))
    agent = Agent(cfg)
    signal.set_wakeup_fd(agent.wake_fd)
    agent.run(stop)
    print(json.dumps(agent.report()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
