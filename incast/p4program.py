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
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent / "p4src" / "incast.p4"

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
