"""The PAUSE agent on a kernel with the plug qdisc (the VM kernels have it; this
machine's may not): a host that starts sending during a pause stays silent until the
pause ends. Only the timing-insensitive test runs here: under TCG the agent reacts in
~15 ms, not the ~0.4 ms tests/test_pause_agent.py bounds. Skipped where the kernels
are not built for the current inputs."""
import sys

import pytest

from conftest import REPO, needs_root

from incast.vm import qemu

pytestmark = [needs_root, pytest.mark.network]


@pytest.fixture(scope="module", autouse=True)
def _kernel():
    if qemu.qemu_binary() is None:
        pytest.skip("qemu-system-x86_64 is missing (Debian package qemu-system-x86)")
    if qemu.kernel_dir("stock") is None:
        pytest.skip("the stock kernel is not built for the current inputs: run kernels/build.sh")


def test_plug_holds_a_paused_host_in_the_vm():
    r = qemu.run(f"cd {REPO} && PYTHONDONTWRITEBYTECODE=1 {sys.executable} -m pytest -q -s -p no:cacheprovider "
                 "tests/test_pause_agent.py -k stays_silent", kernel="stock", timeout=900)
    print(r.output[-3000:])
    assert r.returncode == 0, r.output[-3000:]
    assert "(mechanism: plug)" in r.output and "1 passed" in r.output
