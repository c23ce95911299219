"""The package's tree is its pipeline: a module imports only from its own stage or an
earlier one, except a registry (the one place a data plane, a workload or a topology
is named), which any stage may consult. Read from the source, nothing imported."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Stage of every module, by the longest matching prefix.
STAGES = [
    ("base", ["incast.errors", "incast.constants", "incast.units", "incast.clock", "incast.scenario",
              "incast"]),
    ("machine", ["incast.machine", "incast.vm", "incast.p4"]),
    ("measure", ["incast.measure"]),
    ("network", ["incast.network", "incast.dataplane", "incast.workload"]),
    ("run", ["incast.run"]),
    ("report", ["incast.report"]),
    ("campaign", ["incast.campaign"]),
    ("pages", ["incast.pages"]),
    ("commands", ["incast.cli", "incast.labs", "incast.__main__"]),
]
ORDER = {name: i for i, (name, _) in enumerate(STAGES)}
# The registries: what a module of any stage may import from a later one.
REGISTRIES = {("incast.dataplane", "REGISTRY"), ("incast.dataplane", "get"),
              ("incast.workload", "REGISTRY"), ("incast.topology", "known")}
# Modules imported whole for their registry (dataplane.REGISTRY, dataplane.get(...)).
REGISTRY_MODULES = {"incast.dataplane", "incast.workload"}


def stage(module: str) -> str:
    best = max(((p, s) for s, prefixes in STAGES for p in prefixes
                if module == p or module.startswith(p + ".")), key=lambda ps: len(ps[0]))
    return best[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def absolute(node: ast.ImportFrom, path: Path) -> str | None:
    """The module a (possibly relative) from-import names."""
    if not node.level:
        return node.module
    base = module_name(path).split(".")
    base = base if path.name == "__init__.py" else base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(path: Path):
    """(imported module, name or None, line) of every import of the package."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            node.module = absolute(node, path)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("incast"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                if (REPO / (sub.replace(".", "/") + ".py")).exists() or (REPO / sub.replace(".", "/")).is_dir():
                    yield sub, None, node.lineno         # from incast.run import sweep: a module
                else:
                    yield node.module, a.name, node.lineno
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("incast"):
                    yield a.name, None, node.lineno


def violations() -> list[str]:
    found = []
    for path in sorted((REPO / "incast").rglob("*.py")):
        me = module_name(path)
        for target, name, line in imports(path):
            if ORDER[stage(target)] <= ORDER[stage(me)]:
                continue
            if (target, name) in REGISTRIES or (name is None and target in REGISTRY_MODULES):
                continue
            found.append(f"{path.relative_to(REPO)}:{line}: {stage(me)} imports {target}"
                         f"{'.' + name if name else ''} ({stage(target)})")
    return found


def test_no_module_imports_a_later_stage_except_a_registry():
    assert violations() == []


def test_the_check_catches_an_import_of_a_later_stage(tmp_path, monkeypatch):
    bad = REPO / "incast" / "measure" / "_layout_probe.py"
    bad.write_text("from incast.run.experiment import run\n")
    try:
        found = violations()
    finally:
        bad.unlink()
    assert any("_layout_probe.py:1: measure imports incast.run.experiment.run (run)" in v for v in found), found


def test_every_module_has_a_stage():
    for path in (REPO / "incast").rglob("*.py"):
        assert stage(module_name(path)) in ORDER
