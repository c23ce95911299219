"""Guest kernels: how `incast run --kernel stock|hrtimer` reaches a kernel other than
the machine's. A clock names its runner (incast.clock.Clock.guest_runner): qemu.py
boots a VM in real time, uml.py runs User-Mode Linux in virtual time. Both answer the
same questions (``LABEL``, ``BUILD_HINT``, ``variant``, ``missing``, ``run_scenario``),
so a caller asks the runner instead of naming it."""
from __future__ import annotations

import importlib


def runner(clock):
    """The guest runner of a clock (incast.vm.qemu or incast.vm.uml)."""
    return importlib.import_module(f"incast.vm.{clock.guest_runner}")
