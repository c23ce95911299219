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
