"""What the Python side shares with p4src/incast.p4, read from the P4 source itself, so
the two cannot drift: its constants (EtherTypes, mirror sessions, the telemetry frame
length), the layout of its telemetry header and the settings its configuration actions
take. (p4c's P4Info lists tables, actions and registers, not constants, and exists only
once p4c has run; the source is the one place both sides can always read.)"""
from __future__ import annotations

import ast
import functools
import operator
import re

from incast.constants import P4_SOURCE as SOURCE

_CONST = re.compile(r"^\s*const\s+bit<\d+>\s+(\w+)\s*=\s*([^;]+);", re.M)
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _value(expr: str) -> int:
    """An integer constant expression of the P4 source (literals, + - *)."""
    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"not a constant expression of {SOURCE.name}: {expr!r}")
    return ev(ast.parse(expr.strip(), mode="eval").body)


@functools.cache
def constants() -> dict[str, int]:
    """Every `const bit<N> NAME = VALUE;` of the program."""
    text = _COMMENT.sub("", SOURCE.read_text())
    return {name: _value(expr) for name, expr in _CONST.findall(text)}


@functools.cache
def action_params(name: str) -> list[str]:
    """The control plane's parameters of a top-level action, in order (its directional
    parameters, which the tables bind, left out): action_params("configure") ->
    ["switch_id", "pause_on", ...]."""
    text = _COMMENT.sub("", SOURCE.read_text())
    m = re.search(r"^action\s+" + re.escape(name) + r"\s*\(([^)]*)\)", text, re.M)
    if m is None:
        raise LookupError(f"{SOURCE.name} has no top-level action {name}")
    params = [" ".join(p.split()) for p in m.group(1).split(",")]
    return [p.split()[-1] for p in params if p and p.split()[0] not in ("in", "out", "inout")]


def config_fields() -> dict[str, int]:
    """Each setting of the switch (action configure's parameters) and its place:
    {"switch_id": 0, "pause_on": 1, "xoff": 2, ...}."""
    return {name: i for i, name in enumerate(action_params("configure"))}


@functools.cache
def header(name: str) -> list[tuple[str, int]]:
    """(field, bits) of a header type, in order."""
    text = _COMMENT.sub("", SOURCE.read_text())
    m = re.search(r"header\s+" + re.escape(name) + r"\s*\{([^}]*)\}", text)
    if m is None:
        raise LookupError(f"{SOURCE.name} has no header {name}")
    return [(f, int(bits)) for bits, f in re.findall(r"bit<(\d+)>\s+(\w+)\s*;", m.group(1))]


# Teaching labs: regions of the program a lab's student writes, marked in the source:
#     /* lab N begin: what the region does (the TODO the student sees) */
#     /* lab N stub: code that compiles in its place (does nothing useful) */
#     ...the real code...
#     /* lab N end */
_REGION = re.compile(r"^(?P<indent>[ \t]*)/\* lab (?P<lab>\d+) begin: (?P<hint>.*?)\*/\n"
                     r"[ \t]*/\* lab (?P=lab) stub: (?P<stub>.*?)\*/\n"
                     r"(?P<body>.*?)"
                     r"^[ \t]*/\* lab (?P=lab) end \*/\n", re.M | re.S)


def lab_regions(lab: int, text: str | None = None) -> list[str]:
    """The hints of lab's regions, in source order."""
    text = SOURCE.read_text() if text is None else text
    return [_hint(m) for m in _REGION.finditer(text) if int(m["lab"]) == lab]


def _hint(m) -> str:
    return " ".join(re.sub(r"\n[ \t]*\*", " ", m["hint"]).split())


def lab_starter(lab: int, text: str | None = None) -> str:
    """The program with lab's regions replaced by a TODO and a stub that compiles; the
    other labs' regions keep their code (and lose their markers)."""
    text = SOURCE.read_text() if text is None else text

    def replace(m):
        ind = m["indent"]
        if int(m["lab"]) != lab:
            return m["body"]
        hint = _hint(m)
        return f"{ind}/* TODO (lab {lab}): {hint} */\n{ind}{' '.join(m['stub'].split())}\n"
    out = _REGION.sub(replace, text)
    if out == text or "TODO (lab" not in out:
        raise ValueError(f"p4src/incast.p4 has no region for lab {lab}")
    return out
