"""What the Python side shares with p4src/incast.p4, read from the P4 source itself, so
the two cannot drift: its constants (config-register indexes, EtherTypes, mirror
sessions, the telemetry frame length) and the layout of its telemetry header.
(p4c's P4Info lists tables and registers, not constants, so the source is the one
place both sides can read.)"""
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


def config_registers() -> dict[str, int]:
    """Index in the `cfg` register of each setting: CFG_XOFF -> {"xoff": 2}."""
    return {k[4:].lower(): v for k, v in constants().items() if k.startswith("CFG_")}


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
