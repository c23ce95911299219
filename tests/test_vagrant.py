"""The Vagrantfile is valid (needs the vagrant command; skipped without it)."""
import shutil
import subprocess

import pytest

from conftest import REPO


@pytest.mark.skipif(shutil.which("vagrant") is None, reason="vagrant is not installed (apt-get install vagrant)")
def test_vagrantfile_validates():
    r = subprocess.run(["vagrant", "validate"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "validated successfully" in r.stdout


def test_vagrant_provisions_with_the_projects_setup():
    text = (REPO / "Vagrantfile").read_text()
    assert "./scripts/setup.sh --p4" in text
    setup = (REPO / "scripts/setup.sh").read_text()
    assert "p4lang-p4c" in setup and "p4lang-bmv2" in setup
