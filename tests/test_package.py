"""The package installs on its own: what a run reads beside the code (the hosts'
programs, the topologies, the P4 program, the testbeds, the figures and their sweep
files, the kernels' build script and patches, the RTL switch's sources, the labs) is
package data, found where an installed package keeps it; installed outside the
checkout it finds its kernels, lists its labs and runs in virtual time."""
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import needs_uml

REPO = Path(__file__).resolve().parent.parent
# checkout folder -> (where the wheel keeps it, the files it must carry)
SHIPPED = {"hosts": ("hosts", "*.py"), "topologies": ("topologies", "*.py"), "p4src": ("p4src", "*.p4"),
           "testbeds": ("testbeds", "*.toml"), "figures": ("figures", "*.toml"),
           "scenarios": ("scenarios", "*.toml"), "kernels": ("kernels", "**/*"), "rtl": ("rtl", "**/*"),
           "labs": ("lab_folders", "**/*")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "--disable-pip-version-check", "-w", str(out), str(REPO)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    found, = out.glob("incast-*.whl")
    return found


def test_the_wheel_carries_what_a_run_reads(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder, (shipped_as, pattern) in SHIPPED.items():
        files = [f for f in (REPO / folder).glob(pattern)
                 if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"]
        assert files, f"{folder}/{pattern} matches nothing"
        for f in files:
            rel = f.relative_to(REPO / folder).as_posix()
            assert f"incast/{shipped_as}/{rel}" in names, f"{folder}/{rel} is not in the wheel"
    assert "incast/registry.py" in names and "incast/vm/guest-init.sh" in names


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> dict:
    """The wheel installed into a directory of its own, outside the checkout; the
    environment that runs it from there (its dependencies are this interpreter's)."""
    target = tmp_path_factory.mktemp("installed")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
                        "--target", str(target), str(wheel)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return {"target": target, "env": {**os.environ, "PYTHONPATH": str(target)}}


def incast(installed, *args, timeout=120):
    return subprocess.run([sys.executable, "-m", "incast.cli", *args], cwd=installed["target"].parent,
                          env=installed["env"], capture_output=True, text=True, timeout=timeout)


def test_the_installed_package_finds_its_data_and_lists_its_labs(installed):
    r = incast(installed, "paths")
    assert r.returncode == 0, r.stderr
    where = dict(line.split(": ", 1) for line in r.stdout.splitlines())
    package = installed["target"] / "incast"
    assert where["package"] == str(package), r.stdout
    assert where["kernel build script"] == str(package / "kernels" / "build.sh")
    assert where["rtl sources"] == str(package / "rtl") and where["labs"] == str(package / "lab_folders")
    # builds go to the machine's cache, never into site-packages
    assert not where["builds (p4, bpf, rtl)"].startswith(str(installed["target"]))
    r = incast(installed, "lab", "list")
    assert r.returncode == 0, r.stderr
    checkout_labs = sorted(p.name for p in (REPO / "labs").glob("[0-9][0-9]-*"))
    assert len(r.stdout.splitlines()) == len(checkout_labs) >= 8, r.stdout


@needs_uml("uml-hrtimer")
def test_the_installed_package_finds_the_same_kernels_and_runs_in_virtual_time(installed, tmp_path, no_leftovers):
    """Its kernels' inputs are the checkout's (the key hashes their contents, not their
    place): the kernels built from the checkout serve it, and a run boots them."""
    from incast.vm import guest
    r = incast(installed, "setup")
    assert r.returncode == 0 and str(guest.kernel_dir("uml-stock")) in r.stdout, r.stdout + r.stderr
    r = incast(installed, "run", "--clock", "virtual", "--kernel", "hrtimer", "--senders", "2", "--blocks", "2",
               "--rto-min", "200us", "--out", str(tmp_path / "run"), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["kernel"] == "hrtimer" and summary["clock"] == "virtual" and summary["goodput_mbps"] > 500, summary


def test_an_installed_package_finds_its_data_beside_its_code():
    from incast import constants
    if constants.INSTALLED:
        assert constants.HOSTS_DIR == constants.PACKAGE / "hosts"
    else:       # a checkout (or an editable install of one)
        assert constants.HOSTS_DIR == constants.REPO / "hosts" and constants.TOPOLOGIES_DIR.is_dir()


def imported_distributions() -> dict[str, set[str]]:
    """Every distribution outside the standard library that a module the package ships
    (incast/, hosts/, topologies/) imports, by the file that imports it."""
    import ast
    from importlib.metadata import packages_distributions
    by_module = packages_distributions()
    ours = {"incast", "tcpinfo", "rtnl", "incast_client", "incast_server"}    # hosts/ import each other
    found: dict[str, set[str]] = {}
    for folder in ("incast", "hosts", "topologies"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                         else [])
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top in ours or top == "__future__":
                        continue
                    assert top in by_module, f"{path.relative_to(REPO)} imports {top}, which no installed package provides"
                    for dist in by_module[top]:
                        found.setdefault(dist.lower().replace("_", "-"), set()).add(str(path.relative_to(REPO)))
    return found


def test_the_declared_dependencies_are_what_the_code_imports():
    """pyproject's dependencies (and its extras) name every package the code imports,
    with a lower bound, and nothing it does not import."""
    import re
    import tomllib
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {}
    for spec in project["dependencies"] + [d for ds in project["optional-dependencies"].values() for d in ds]:
        name = re.match(r"[A-Za-z0-9_.-]+", spec).group(0).lower().replace("_", "-")
        assert ">=" in spec, f"{spec}: a lower bound"
        declared[name] = spec
    imported = imported_distributions()
    assert set(imported) - set(declared) == set(), \
        "imported, not declared: " + ", ".join(f"{d} ({sorted(imported[d])[0]})" for d in set(imported) - set(declared))
    assert set(declared) - set(imported) == set(), f"declared, never imported: {set(declared) - set(imported)}"
