"""Parsing of the human units used in scenarios and on the command line.

Sizes are bytes (``32KiB``, ``64KB``, ``1MiB``, ``1500``), rates are bits per second
(``1Gbit``, ``100Mbit``), times are microseconds (``200ms``, ``200us``, ``1s``).
Binary prefixes (KiB) are 1024-based and SI prefixes (KB) 1000-based, so ``32KiB``
is the 32768-byte buffer the papers mean and ``32KB`` is 32000 bytes.
"""
from __future__ import annotations

import re

_NUMBER = r"(?P<num>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[A-Za-zµ]*)"

SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3,
}
RATE_UNITS = {
    "bit": 1, "bps": 1,
    "kbit": 1e3, "mbit": 1e6, "gbit": 1e9,
    "kbps": 1e3, "mbps": 1e6, "gbps": 1e9,
}
TIME_UNITS_US = {"ns": 1e-3, "us": 1, "µs": 1, "ms": 1e3, "s": 1e6}


def _split(text: str, what: str, allowed: dict) -> tuple[float, float]:
    m = re.fullmatch(_NUMBER, text.strip())
    unit = m.group("unit").lower() if m else None
    if not m or unit not in allowed:
        units = ", ".join(u for u in allowed if u)
        raise ValueError(f"not a {what}: {text!r} (use a number with one of: {units})")
    return float(m.group("num")), allowed[unit]


def parse_size(value) -> int:
    """Bytes from ``32KiB``-style text or a plain integer."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        return value
    num, mult = _split(str(value), "size", SIZE_UNITS)
    return int(round(num * mult))


def parse_rate(value) -> int:
    """Bits per second from ``1Gbit``-style text or a plain integer."""
    if isinstance(value, bool):
        raise ValueError(f"not a rate: {value!r}")
    if isinstance(value, int):
        return value
    num, mult = _split(str(value), "rate", RATE_UNITS)
    return int(round(num * mult))


def parse_time_us(value) -> int:
    """Microseconds from ``200ms``-style text or a plain integer (already µs)."""
    if isinstance(value, bool):
        raise ValueError(f"not a time: {value!r}")
    if isinstance(value, int):
        return value
    text = str(value).strip()
    num, mult = _split(text, "time", TIME_UNITS_US)
    us = num * mult
    if us != int(us):
        raise ValueError(f"time {text!r} is finer than the 1 µs resolution")
    return int(us)


def format_size(nbytes: int) -> str:
    for unit, mult in (("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= mult and nbytes % mult == 0:
            return f"{nbytes // mult}{unit}"
    return f"{nbytes}B"


def format_rate(bps: int) -> str:
    for unit, mult in (("Gbit", 10**9), ("Mbit", 10**6), ("kbit", 10**3)):
        if bps >= mult and bps % mult == 0:
            return f"{bps // mult}{unit}"
    return f"{bps}bit"


def format_time_us(us: int) -> str:
    if us >= 1000 and us % 1000 == 0:
        return f"{us // 1000}ms"
    return f"{us}us"


# A switch's buffer is a size (switch.buffer) or a packet count (switch.buffer_packets),
# never both: where a layer of settings (a scenario file over a testbed, --set over a
# file) gives one, it replaces the other beneath it. Switch._one_buffer refuses both.
BUFFER_UNITS = ("buffer", "buffer_packets")


def keep_given_buffer_unit(switch: dict, given) -> None:
    """In raw switch data, drop the buffer unit the layer that set `given` (field
    names) did not give, where it gave the other."""
    units = [u for u in BUFFER_UNITS if u in given]
    if len(units) == 1:
        other, = [u for u in BUFFER_UNITS if u != units[0]]
        switch.pop(other, None)
