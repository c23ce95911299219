"""The package installs on its own: what a run reads beside the code (the hosts'
programs, the topologies, the P4 program, the testbeds, the figures and their sweep
files) is package data, found where an installed package keeps it."""
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHIPPED = {"hosts": "*.py", "topologies": "*.py", "p4src": "*.p4", "testbeds": "*.toml",
           "figures": "*.toml", "scenarios": "*.toml"}


def test_the_wheel_carries_what_a_run_reads(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "--disable-pip-version-check", "-w", str(tmp_path), str(REPO)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    wheel, = tmp_path.glob("incast-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder, pattern in SHIPPED.items():
        for f in (REPO / folder).glob(pattern):
            assert f"incast/{folder}/{f.name}" in names, f"{folder}/{f.name} is not in the wheel"
    assert "incast/registry.py" in names and "incast/vm/guest-init.sh" in names


def test_an_installed_package_finds_its_data_beside_its_code():
    from incast import constants
    if constants.INSTALLED:
        assert constants.HOSTS_DIR == constants.PACKAGE / "hosts"
    else:       # a checkout (or an editable install of one)
        assert constants.HOSTS_DIR == constants.REPO / "hosts" and constants.TOPOLOGIES_DIR.is_dir()
