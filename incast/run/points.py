"""A campaign's memory: every measured point kept under a key, so that no point is
measured twice and a killed sweep loses only the points that were running.

A point's key hashes everything that decides its result:

* the resolved scenario (``to_toml``: canonical units, the seed included),
* the code's version (a hash of the package, the host programs, the topologies, the
  P4 program and the kernel patches: the files a run executes; not incast/report/,
  incast/pages/ or incast/campaign/, which choose runs and read their results): the
  files every plane's runs execute, and those its data plane has as its own (the
  registry's DataPlaneEntry.code and .sources: the P4 program dates bmv2 and rtl points,
  the RTL switch's sources rtl points, the linux plane's module linux points only),
* the kernel it runs on: for a guest, the kernels/build.sh key of its variant (every
  input of the build); for this machine's kernel, its release and build string.

The store is a directory of run directories named by key
(``${INCAST_POINTS:-/var/cache/incast/points}``, or ``~/.cache/incast/points`` where
that cannot be written). A run writes its directory under ``.KEY.incomplete`` and
renames it when complete (incast.measure.results.Claim), so a point is either
whole in the store or absent: SIGKILL at any moment leaves nothing half-done that a
later sweep could mistake for a result.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import platform
import shutil
import uuid
from functools import lru_cache
from pathlib import Path

from incast import vm
from incast.clock import named
from incast.constants import POINTS_SCRATCH_PREFIX, REPO, VM_SCRATCH_PREFIX
from incast.measure.results import is_complete
from incast.registry import DATAPLANES
from incast.scenario import Scenario, to_toml
from incast.vm import guest

# The files a run executes or reads; their bytes are the code's version.
CODE_GLOBS = ("incast/**/*.py", "incast/**/*.sh", "incast/bpf/*.c", "incast/bpf/*.h", "hosts/**/*.py",
              "topologies/*.py", "p4src/*.p4", "kernels/patches*/*.patch", "kernels/config/*.config",
              "kernels/build.sh")


# What a run never executes: what is made from results afterwards (reports, the
# documentation's pages), the campaigns that choose which scenarios to run (a point's key
# holds its whole scenario), and the teaching labs.
NOT_RUN = ("incast/report/", "incast/campaign/", "incast/pages/", "incast/labs.py")


def run_files(globs=CODE_GLOBS, root: Path = REPO) -> list[Path]:
    """The files of `globs` a run executes (sorted), in the checkout at `root`."""
    return sorted({p for g in globs for p in root.glob(g)
                   if p.is_file() and not str(p.relative_to(root)).startswith(NOT_RUN)})


def plane_globs() -> tuple[str, ...]:
    """Every data plane's own files (registry: DataPlaneEntry.sources and .code)."""
    return tuple(g for e in DATAPLANES.values() for g in (*e.sources, *e.code))


def shared_files(root: Path = REPO) -> list[Path]:
    """The files of the code every plane's runs execute: CODE_GLOBS' less those a data
    plane has as its own code (DataPlaneEntry.code)."""
    own = set(run_files(tuple(g for e in DATAPLANES.values() for g in e.code), root))
    return [p for p in run_files(root=root) if p not in own]


@lru_cache(maxsize=8)
def code_version(dataplane: str | None = None, root: Path = REPO) -> str:
    """The hash of what a run executes: the shared files, and with `dataplane` that
    plane's own code and sources too. `root`: another checkout's files (an earlier
    commit's, to tell whether a kept result's code is today's)."""
    h = hashlib.sha256()
    files = shared_files(root)
    if dataplane is not None:
        entry = DATAPLANES[dataplane]
        files += run_files((*entry.code, *entry.sources), root)
    for p in files:
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@lru_cache(maxsize=8)
def kernel_key(kernel: str, clock: str) -> str:
    """What identifies the kernel a point runs on (see the module's docstring)."""
    if kernel == "host":
        return f"host:{platform.release()}:{platform.version()}"
    variant = vm.runner(named(clock)).variant(kernel)
    d = guest.kernel_dir(variant)
    return f"{variant}:{d.name if d else 'not-built'}"


def point_key(scenario: Scenario) -> str:
    h = hashlib.sha256()
    for part in (to_toml(scenario), code_version(scenario.dataplane), kernel_key(scenario.kernel, scenario.clock)):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:20]


@contextlib.contextmanager
def locked(directory: Path):
    """Hold directory/.lock for the block. The lock is taken on a file of another name
    and renamed into place, so .lock never exists unheld while its user lives: a sweep
    starting meanwhile (Store.remove_stale) cannot take a live run's directory for one
    a killed run left."""
    fd = os.open(directory / ".lock-taking", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(directory / ".lock-taking", directory / ".lock")
        yield
    finally:
        os.close(fd)


def abandoned(d: Path) -> bool:
    """Whether the directory's .lock exists and no live process holds it (a directory
    without one is being made: it is not touched)."""
    try:
        fd = os.open(d / ".lock", os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False            # a run is writing it now
    finally:
        os.close(fd)
    return True


def default_store() -> Path:
    env = os.environ.get("INCAST_POINTS")
    if env:
        return Path(env)
    system = Path(os.environ.get("INCAST_CACHE", "/var/cache/incast")) / "points"
    try:
        system.mkdir(parents=True, exist_ok=True)
        if os.access(system, os.W_OK):
            return system
    except OSError:
        pass
    return Path.home() / ".cache" / "incast" / "points"


class Store:
    """Finished points by key; a point's directory is an ordinary run directory."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root else default_store()
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        return self.root / key

    def get(self, key: str) -> Path | None:
        p = self.path(key)
        return p if is_complete(p) else None

    def scratch(self, key: str) -> Path:
        """Where a new measurement of key is written before it is installed: a name of
        its own, so that measuring a point again never touches the one stored."""
        return self.root / f".{key}.{uuid.uuid4().hex[:8]}.new"

    def install(self, key: str, run_dir: Path) -> None:
        """A complete run directory becomes the point `key` (replacing an older one)."""
        old = self.path(key)
        trash = self.root / f".{key}.{uuid.uuid4().hex[:8]}.old"
        if old.exists():
            os.rename(old, trash)
        os.rename(run_dir, old)
        shutil.rmtree(trash, ignore_errors=True)

    def remove_stale(self) -> int:
        """What killed sweeps left: a measurement that completed before its sweep could
        install it is installed now (nothing measured is lost); the work directory of
        one that did not complete, a guest run's scratch directory and a local executor's
        (their locks held by no live process), are removed. Returns how many were removed."""
        for d in self.root.glob(".*.new"):
            if is_complete(d):
                self.install(d.name.split(".")[1], d)
        removed = 0
        for d in [*self.root.glob(".*.incomplete"), *self.root.glob(f"{VM_SCRATCH_PREFIX}*"),
                  *self.root.glob(f"{POINTS_SCRATCH_PREFIX}*")]:
            if abandoned(d):
                shutil.rmtree(d, ignore_errors=True)
                removed += 1
        return removed

    def copy_into(self, key: str, dest: Path) -> None:
        """The point's run directory at dest: hard links where the file system allows
        (a sweep directory costs no space twice), else a copy."""
        src = self.path(key)
        try:
            shutil.copytree(src, dest, copy_function=os.link)
        except OSError:
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(src, dest)
