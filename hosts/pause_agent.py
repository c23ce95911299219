#!/usr/bin/env python3
"""Honour 802.3x PAUSE frames on a host whose NIC ignores them (veth does).

Where the host's kernel has the plug qdisc of kernels/patches-um/0005, the plug obeys
PAUSE itself and no agent runs (incast/network/flow_control.py); this agent is for the
other kernels, for switch.pause.hosts = "agent", and for the host that storms.

Listens on the host's interface for MAC Control frames (EtherType 0x8808). A PAUSE
with quanta q stops the host's egress for q x 512 bit-times at the link rate; quanta 0,
or the expiry of the last PAUSE, resumes it. A PFC frame (opcode 0x0101) is treated as
a PAUSE with the largest quanta of the enabled classes this host sends in (--classes;
the host has one queue, so a PFC frame for any of its classes stops all of it, and one
for other classes only is ignored).

With --storm-us the agent is a broken NIC: --storm-after-us after it gets SIGUSR1 (the
runner sends it when the first measured block begins), it keeps sending PAUSE frames
for that long (then quanta 0), the pause storm a watchdog must catch.

How egress stops is given as two tc commands (run by one persistent `tc -batch`):
where the kernel has the `plug` qdisc, `qdisc change ... plug block` /
`release_indefinite`; otherwise the host NIC's token bucket is changed to a rate too
low to send anything, and back. Either way, frames wait in the host's queue; none is
lost. Changing a token bucket fills it: one full frame could still leave at any
moment of the pause. With --spend-token the agent makes that token go at once: to the
frame at the head of the queue (the frame "on the wire" when the PAUSE arrived), or,
if the queue is empty, to a full-size MAC Control frame with a reserved opcode, which
switches drop.

Prints READY when listening; on SIGTERM/SIGINT prints one JSON line of statistics:
pause frames, resumes, paused time, and per PAUSE the delay from the frame's arrival to
the tc command being issued. Standard library only.
"""
import argparse
import json
import os
import signal
import socket
import struct
import subprocess
import threading
import time

ETH_P_MAC_CONTROL = 0x8808
OP_PAUSE = 0x0001
OP_PFC = 0x0101
SOL_PACKET = 263
PACKET_QDISC_BYPASS = 20
REALTIME_PRIORITY = 10


class Gate:
    """The host's egress: open or closed, via one persistent `tc -batch` process.

    After each change the gate asks tc to show the root qdisc and waits for the
    answer: tc runs its lines in order, so the answer means the change is in force.
    A qdisc that was stopped does not look at its queue again until something is
    sent, so opening the gate is followed by a kick: a MAC Control frame that no
    switch forwards."""

    def __init__(self, dev, pause_cmd, resume_cmd, kick, drain=None):
        self.dev, self.pause_cmd, self.resume_cmd, self.kick = dev, pause_cmd, resume_cmd, kick
        self.drain = drain
        self.tc = subprocess.Popen(["tc", "-s", "-force", "-batch", "-"], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
        self.closed_since = None
        self.paused_s = 0.0
        self.drains = 0
        self.announce = False   # print CLOSED / OPENED as the gate changes

    def close(self):
        if self.closed_since is None:
            backlog = self._apply(self.pause_cmd)
            self.closed_since = time.monotonic()
            if self.drain:
                # The refilled bucket holds one frame's worth. Queue empty: spend it
                # on a frame of our own. Else the queued frame takes it, now rather
                # than when the bucket's old timer fires (a change does not rearm
                # it): a kick makes the qdisc look at its queue.
                if backlog == 0:
                    self.drain()
                else:
                    self.kick()
                self.drains += 1
            if self.announce:
                print("CLOSED", flush=True)

    def open(self):
        if self.closed_since is not None:
            self._apply(self.resume_cmd)
            self.kick()
            self.paused_s += time.monotonic() - self.closed_since
            self.closed_since = None
            if self.announce:
                print("OPENED", flush=True)

    def _apply(self, cmd):
        self.tc.stdin.write(f"{cmd}\nqdisc show dev {self.dev}\n")
        self.tc.stdin.flush()
        # Each show lists the root qdisc once (children say "parent"): its line means
        # the change before it is in force. Its statistics follow: the packets queued.
        root = False
        while True:
            line = self.tc.stdout.readline()
            if not line:
                raise RuntimeError("tc exited")
            if " root " in line:
                root = True
            elif root and line.lstrip().startswith("backlog"):
                # " backlog 0b 0p requeues 0"
                return int(line.split()[2].rstrip("p"))

    def stop(self):
        self.open()
        self.tc.stdin.close()
        self.tc.wait()


def pause_quanta(frame, classes=range(8)):
    """Quanta asked for by a MAC Control frame, or None if it is not PAUSE/PFC (or a
    PFC frame for none of `classes`)."""
    if len(frame) < 18 or struct.unpack_from("!H", frame, 12)[0] != ETH_P_MAC_CONTROL:
        return None
    opcode = struct.unpack_from("!H", frame, 14)[0]
    if opcode == OP_PAUSE and len(frame) >= 18:
        return struct.unpack_from("!H", frame, 16)[0]
    if opcode == OP_PFC and len(frame) >= 34:
        enabled = struct.unpack_from("!H", frame, 16)[0]
        quanta = struct.unpack_from("!8H", frame, 18)
        active = [q for c, q in enumerate(quanta) if enabled & (1 << c) and c in classes]
        return max(active) if active else None
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dev", required=True)
    ap.add_argument("--rate", type=int, required=True, help="link rate, bit/s (sets the quantum's length)")
    ap.add_argument("--spend-token", action="store_true",
                    help="the pause command refills a token bucket: spend its last frame's worth at once")
    ap.add_argument("--mtu", type=int, default=1500, help="the link's MTU (size of the token-spending frame)")
    ap.add_argument("--events", action="store_true", help="print CLOSED / OPENED as egress stops and restarts")
    ap.add_argument("--pause-cmd", required=True, help="tc batch line that stops egress")
    ap.add_argument("--resume-cmd", required=True, help="tc batch line that restarts it")
    ap.add_argument("--classes", default="0,1,2,3,4,5,6,7",
                    help="comma-separated traffic classes this host sends in (whose PFC it obeys)")
    ap.add_argument("--storm-after-us", type=float, default=0.0)
    ap.add_argument("--storm-us", type=float, default=0.0, help="send a PAUSE storm for this long")
    ap.add_argument("--quanta", type=int, default=0xFFFF, help="quanta of the storm's frames")
    args = ap.parse_args()
    classes = {int(c) for c in args.classes.split(",")}
    realtime = _realtime()

    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_MAC_CONTROL))
    sock.bind((args.dev, ETH_P_MAC_CONTROL))
    # MAC Control with a reserved opcode (0): link-local, never forwarded, never obeyed.
    kick = bytes.fromhex("0180c2000001") + sock.getsockname()[4] + struct.pack("!HH", ETH_P_MAC_CONTROL, 0)
    drain = kick.ljust(args.mtu + 14, b"\0")
    kick = kick.ljust(60, b"\0")
    gate = Gate(args.dev, args.pause_cmd, args.resume_cmd, lambda: sock.send(kick),
                (lambda: sock.send(drain)) if args.spend_token else None)
    gate.announce = args.events
    quantum_s = 512 / args.rate
    stats = {"pause_frames": 0, "resume_frames": 0, "expiries": 0, "realtime": realtime, "reaction_us": []}
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    deadline = None
    if args.storm_us > 0:
        go = threading.Event()
        signal.signal(signal.SIGUSR1, lambda *_: go.set())
        threading.Thread(target=storm, daemon=True, args=(
            sock, go, args.storm_after_us / 1e6, args.storm_us / 1e6, args.quanta, quantum_s, stats)).start()
    print("READY", flush=True)
    try:
        while True:
            deadline = handle_one(sock, gate, deadline, quantum_s, stats, classes)
    except Stop:
        pass
    gate.stop()
    stats["paused_ms"] = round(gate.paused_s * 1000, 3)
    stats["drains"] = gate.drains
    print(json.dumps(stats), flush=True)


def _realtime():
    """A NIC obeys PAUSE in hardware; this agent competes for the CPU with the
    switch and the hosts' applications, and at normal priority its wake-up can
    take a millisecond on a busy machine. Real-time priority (inherited by its tc)
    brings the reaction back to ~0.1 ms. Returns whether it was granted."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
        return True
    except (AttributeError, PermissionError, OSError):
        return False


class Stop(Exception):
    pass


def _stop(*_):
    raise Stop()


def storm(sock, go, after_s, duration_s, quanta, quantum_s, stats):
    """Once `go` is set and after_s has passed, send PAUSE frames, each before the
    last expires (at least every millisecond), for duration_s, then quanta 0. They
    bypass this host's own (maybe paused) queue."""
    frame = bytes.fromhex("0180c2000001") + sock.getsockname()[4] + struct.pack("!HHH", ETH_P_MAC_CONTROL,
                                                                                OP_PAUSE, quanta)
    frame = frame.ljust(60, b"\0")
    out = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    out.setsockopt(SOL_PACKET, PACKET_QDISC_BYPASS, 1)
    out.bind((sock.getsockname()[0], 0))
    every = min(1e-3, quanta * quantum_s / 2)
    go.wait()
    time.sleep(after_s)
    stats["storm_start_ns"] = time.monotonic_ns()
    end = time.monotonic() + duration_s
    while time.monotonic() < end:
        out.send(frame)
        stats["storm_frames"] = stats.get("storm_frames", 0) + 1
        time.sleep(min(every, max(0.0, end - time.monotonic())))
    out.send(frame[:16] + b"\0\0" + frame[18:])     # quanta 0: the storm is over
    stats["storm_end_ns"] = time.monotonic_ns()


def handle_one(sock, gate, deadline, quantum_s, stats, classes=range(8)):
    """Wait for one frame or the pause's expiry; returns the new expiry (or None)."""
    timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
    sock.settimeout(timeout)
    try:
        frame, addr = sock.recvfrom(2048)
    except socket.timeout:
        gate.open()
        stats["expiries"] += 1
        return None
    arrived = time.monotonic()
    if addr[2] == socket.PACKET_OUTGOING:   # our own kick
        return deadline
    quanta = pause_quanta(frame, classes)
    if quanta is None:
        return deadline
    if quanta == 0:
        stats["resume_frames"] += 1
        gate.open()
        return None
    stats["pause_frames"] += 1
    gate.close()
    stats["reaction_us"].append(round((time.monotonic() - arrived) * 1e6, 1))
    return arrived + quanta * quantum_s   # a new PAUSE replaces the old timer


if __name__ == "__main__":
    main()
