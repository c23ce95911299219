"""Incast inside the VM kernels: with the jiffy floor gone, the hrtimer kernel's
microsecond rto_min recovers a synchronized read faster than the stock kernel's lowest
rto_min (4 ms at HZ=250). Runs where kernels/build.sh has built both kernels for the
current inputs; skipped otherwise."""

import pytest

from conftest import needs_root, run_json

from incast.vm import qemu

pytestmark = [needs_root, pytest.mark.network, pytest.mark.scenario]

# Measured under TCG: stock 55.7 Mbit/s (block p50 17.8 ms), hrtimer 86.5 (11.3 ms).
SCENARIO = ["--senders", "16", "--link-rate", "100Mbit", "--buffer", "16KiB", "--sru", "8KiB",
            "--blocks", "40", "--delayed-ack", "off", "--cc", "reno"]


@pytest.fixture(scope="module", autouse=True)
def _kernels():
    if qemu.qemu_binary() is None:
        pytest.skip("qemu-system-x86_64 is missing (Debian package qemu-system-x86)")
    for variant in ("stock", "hrtimer"):
        if qemu.kernel_dir(variant) is None:
            pytest.skip(f"the {variant} kernel is not built for the current inputs: run kernels/build.sh")


def test_hrtimer_kernel_beats_the_jiffy_floor(tmp_path):
    stock = run_json("--kernel", "stock", "--rto-min", "min", *SCENARIO, "--out", tmp_path / "stock")
    hr = run_json("--kernel", "hrtimer", "--rto-min", "200us", *SCENARIO, "--out", tmp_path / "hrtimer")
    assert stock["kernel"] == "stock" and hr["kernel"] == "hrtimer"
    assert stock["rto_floor_us"] >= 4000 and hr["rto_floor_us"] == 200
    assert stock["timeouts"] > 0 and hr["timeouts"] > 0
    assert hr["goodput_mbps"] > 1.2 * stock["goodput_mbps"], (stock, hr)
