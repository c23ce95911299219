"""Everything a run creates on the machine, registered so it can always be removed.

A run gets a token (``incast-<8 hex>``). It builds its whole emulated network inside a
network namespace of that name (the *world*): the switches' bridges and ports live
there, and each Mininet host is a namespace of its own, also given a name
(``<token>-<host>``) so users can ``ip netns exec`` into it. Every process the run
starts carries ``INCAST_RUN=<token>`` in its environment. A state file in
/run/incast records the run's PID and anything global it changed.

Teardown (normal exit, exception, SIGTERM/SIGINT) and ``incast cleanup`` (after a
SIGKILL) both: kill the processes marked with the token, delete the token's
namespaces (which deletes every link inside them) and restore what the state file
says was changed. Nothing outside the token is ever touched.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import socket
import threading
import time
import uuid
from pathlib import Path

from incast.machine import netdev

STATE_DIR = Path("/run/incast")
NETNS_DIR = Path("/run/netns")
PREFIX = "incast-"
ENV_MARK = "INCAST_RUN"
CLONE_NEWNET = 0x40000000
_TOKEN_RE = re.compile(r"^incast-[0-9a-f]{8}$")


def _libc():
    return ctypes.CDLL("libc.so.6", use_errno=True)


def setns(path: str) -> None:
    """Move the calling thread (and its future children) into a network namespace."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc().setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def netns_inode(name: str) -> int:
    return os.stat(NETNS_DIR / name).st_ino


def interface_index(ns: str, ifname: str) -> tuple[int, int]:
    """(inode of the network namespace at path ns, ifindex of ifname in it)."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        setns(ns)
        try:
            index = socket.if_nametoindex(ifname)
        finally:
            if _libc().setns(home, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the calling namespace")
    finally:
        os.close(home)
    return os.stat(ns).st_ino, index


def _pids_with_mark(token: str | None) -> list[int]:
    """PIDs whose environment carries INCAST_RUN (=token, or any value when token is None)."""
    me = os.getpid()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == me:
            continue
        try:
            env = (proc / "environ").read_bytes()
        except OSError:
            continue
        for item in env.split(b"\0"):
            if item.startswith(ENV_MARK.encode() + b"="):
                value = item.split(b"=", 1)[1].decode(errors="replace")
                if token is None or value == token:
                    found.append(int(proc.name))
                break
    return found


def _start_time(pid: int) -> int | None:
    """Kernel start time of a process (field 22 of stat): tells a reused PID apart."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def kill_marked(token: str) -> int:
    """SIGKILL every process of the run; returns how many there were."""
    pids = _pids_with_mark(token)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # Wait until they are gone (they may be holding namespaces open).
    for pid in pids:
        for _ in range(2000):
            if not Path(f"/proc/{pid}").exists() or _is_zombie(pid):
                break
            time.sleep(0.001)
    return len(pids)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return True


def _netns_of(token: str) -> list[str]:
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name == token or p.name.startswith(token + "-"))


def delete_netns(names: list[str]) -> None:
    if not names:
        return
    # One ip process for all: -batch keeps teardown of 128 hosts fast.
    netdev.netns_delete(names)


class Run:
    """The resources of one run. Use as a context manager: teardown is guaranteed."""

    def __init__(self):
        self.token = f"{PREFIX}{uuid.uuid4().hex[:8]}"
        self.world = self.token
        self.state_file = STATE_DIR / f"{self.token}.json"
        self.state: dict = {"pid": os.getpid(), "pid_start": _start_time(os.getpid()),
                            "started": time.time(), "restore_sysctls": {}}
        self._old_handlers: dict = {}
        self._entered = False
        self._children: list = []     # subprocess.Popen objects to reap at teardown
        self._tearing_down = False
        self._signalled: int | None = None

    # --- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> "Run":
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        self._save()
        os.environ[ENV_MARK] = self.token
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def _on_signal(self, signum, frame):
        if self._tearing_down:
            return              # a second signal must not cut the teardown short
        if self._signalled is None:
            self._signalled = signum
            # A handler that raises inside a finalizer or a weakref callback (an import's
            # module lock, measured) has its exception printed and dropped, and the run
            # went on without its sweep: until teardown starts, the signal comes again.
            threading.Thread(target=self._signal_again, args=(signum,), daemon=True).start()
        raise KeyboardInterrupt(f"signal {signum}")

    def _signal_again(self, signum: int) -> None:
        while True:
            time.sleep(1.0)
            if self._tearing_down:
                return
            os.kill(os.getpid(), signum)

    def _save(self) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state))
        tmp.replace(self.state_file)

    # --- what a run creates ----------------------------------------------------------
    def create_world(self) -> None:
        """Create the world namespace and move this process into it."""
        netdev.netns_add(self.world)
        self._home = os.open("/proc/self/ns/net", os.O_RDONLY)
        setns(str(NETNS_DIR / self.world))
        self._entered = True
        netdev.set_up(["lo"])

    def leave_world(self) -> None:
        if self._entered:
            if _libc().setns(self._home, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the original namespace")
            os.close(self._home)
            self._entered = False

    def host_netns(self, host: str) -> str:
        """The name of a host's network namespace (``ip netns exec NAME`` reaches it)."""
        return f"{self.token}-{host}"

    def create_host_netns(self, hosts: list[str]) -> None:
        """Create every host's network namespace, named, in one process: a host needs
        no process of its own to hold its namespace (under User-Mode Linux a process
        costs tens of milliseconds of host time, a thousand hosts' shells 24 s)."""
        netdev.netns_add_many([self.host_netns(h) for h in hosts])

    def set_global_sysctl(self, key: str, value: str) -> None:
        """Change an init-namespace sysctl, remembering the old value for teardown."""
        path = Path("/proc/sys", key.replace(".", "/"))
        old = path.read_text().strip()
        if old == value:
            return
        self.state["restore_sysctls"].setdefault(key, old)
        self._save()
        path.write_text(value)

    def raise_global_sysctl(self, key: str, at_least: int) -> None:
        """Raise a numeric init-namespace sysctl to at_least (never lower it), restored
        at teardown like set_global_sysctl's."""
        if int(Path("/proc/sys", key.replace(".", "/")).read_text()) < at_least:
            self.set_global_sysctl(key, str(at_least))

    # --- teardown --------------------------------------------------------------------
    def track(self, *children) -> None:
        """Child processes this run started outside its own bookkeeping (Mininet's node
        shells): teardown kills them with the rest and then waits for each, so none
        outlives the run as a zombie (a sweep of hundreds of hosts per run piles them up)."""
        self._children += [c for c in children if c is not None]

    def teardown(self) -> None:
        self._tearing_down = True
        try:
            self.leave_world()
        finally:
            remove_run(self.token, self.state)
            self._reap()
            for sig, handler in self._old_handlers.items():
                signal.signal(sig, handler)
            os.environ.pop(ENV_MARK, None)


    def _reap(self) -> None:
        for child in self._children:
            if child.poll() is None:
                child.kill()
            try:
                child.wait(timeout=5)
            except Exception:       # noqa: BLE001  a child that will not die is killed again by cleanup
                pass
        self._children = []


def remove_run(token: str, state: dict | None = None) -> dict:
    """Remove everything a run created. Safe to call twice."""
    state_file = STATE_DIR / f"{token}.json"
    if state is None:
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError):
            state = {}
    killed = kill_marked(token)
    names = _netns_of(token)
    delete_netns(names)
    # Global sysctls are restored after the world is gone: in the init namespace.
    for key, old in (state.get("restore_sysctls") or {}).items():
        try:
            Path("/proc/sys", key.replace(".", "/")).write_text(old)
        except OSError:
            pass
    # Files the run's processes made beside its state (bmv2's notification sockets).
    for leftover in STATE_DIR.glob(f"{token}-*"):
        leftover.unlink(missing_ok=True)
    state_file.unlink(missing_ok=True)
    return {"token": token, "processes": killed, "namespaces": len(names)}


def stale_tokens() -> list[str]:
    """Tokens of runs whose owner is gone: from state files, namespaces and processes."""
    tokens: set[str] = set()
    if STATE_DIR.is_dir():
        tokens |= {p.stem for p in STATE_DIR.glob(f"{PREFIX}*.json")}
    if NETNS_DIR.is_dir():
        tokens |= {p.name[:len(PREFIX) + 8] for p in NETNS_DIR.iterdir() if p.name.startswith(PREFIX)}
    for pid in _pids_with_mark(None):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(ENV_MARK.encode() + b"="):
                tokens.add(item.split(b"=", 1)[1].decode(errors="replace"))
    stale = []
    for token in sorted(tokens):
        if not _TOKEN_RE.match(token):
            continue
        if live_owner(token) is None:
            stale.append(token)     # a live run is not ours to touch
    return stale


def live_owner(token: str) -> int | None:
    """The pid of the process that runs the run `token`, as its state file records it,
    if that process is still the one alive (a reused pid is told apart by its start
    time); None when the run has no state file or its owner is gone."""
    try:
        state = json.loads((STATE_DIR / f"{token}.json").read_text())
        owner, started = state["pid"], state["pid_start"]
    except (OSError, ValueError, KeyError):
        return None
    return owner if _is_alive(owner) and _start_time(owner) == started else None


def token_of(pid: int) -> str | None:
    """The token of the run whose process is pid, from the runs' state files; None while
    it has written none (a run writes its state file as it starts)."""
    for f in STATE_DIR.glob(f"{PREFIX}*.json"):
        try:
            if json.loads(f.read_text())["pid"] == pid:
                return f.stem
        except (OSError, ValueError, KeyError):
            continue        # being written, or its run gone meanwhile
    return None


def _is_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and not _is_zombie(pid)


def cleanup_all() -> list[dict]:
    removed = [remove_run(t) for t in stale_tokens()]
    # Scratch namespaces of a feature probe that was killed half-way.
    probes = [p.name for p in NETNS_DIR.glob(f"{PREFIX}probe-*")] if NETNS_DIR.is_dir() else []
    delete_netns(probes)
    return removed
