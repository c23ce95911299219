"""The papers' testbeds as named profiles (``testbed = "sigcomm09-s50"``).

A paper states what its testbed was: the link rate, the round trip, the kernel, the
switch and its buffer, the client's delayed ACK. Each file in testbeds/ holds one
paper's testbed as scenario settings, each with the sentence of the paper it comes
from (or the published specification of its hardware), and what the paper leaves
unsaid is left at the testbed's defaults, the same in every profile.

A scenario naming a testbed starts from the profile's settings; what the scenario
file, a figure or the command line sets wins over them, so the settings of today's
kernel stay one ``--set`` away (an ablation), and a figure that varies a setting varies
it on the paper's testbed. A profile is fixed per paper: never adjusted for one figure
or one claim.
"""
from __future__ import annotations

import tomllib
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from incast.constants import TESTBEDS_DIR
from incast.errors import BadInput
from incast.units import keep_given_buffer_unit


class TestbedError(BadInput):
    """Bad input (exit 2): an unknown testbed or a bad testbed file."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Setting(_Model):
    field: str = Field(description="a scenario field, as for --set")
    value: Any
    source: str = Field(min_length=20, description="the paper's sentence (or the hardware's specification)")


class Testbed(_Model):
    name: str = ""
    paper: str
    what: str = Field(description="which of the paper's testbeds, and for which of its figures")
    settings: list[Setting]
    not_modelled: list[str] = Field(default_factory=list,
                                    description="what the paper states that the testbed does not (yet) model")


def known() -> list[str]:
    return sorted(p.stem for p in TESTBEDS_DIR.glob("*.toml"))


@lru_cache(maxsize=None)
def load(name: str) -> Testbed:
    path = TESTBEDS_DIR / f"{name}.toml"
    if not path.is_file():
        raise TestbedError(f"no testbed {name!r} (testbeds: {', '.join(known())})")
    try:
        return Testbed.model_validate({**tomllib.loads(path.read_text()), "name": name})
    except (ValidationError, tomllib.TOMLDecodeError) as e:
        raise TestbedError(f"testbeds/{name}.toml: {e}") from None


def settings(name: str) -> dict[str, Any]:
    """The profile's settings, field -> value (as --set takes them)."""
    return {s.field: s.value for s in load(name).settings}


def overrides(name: str) -> dict[str, Any]:
    """The profile's settings as --set gives them (the scenario lays them out as its
    data: incast.scenario.build)."""
    return {k: _text(v) for k, v in settings(name).items()}


def under(data: dict, base: dict) -> dict:
    """The raw scenario data with a testbed's settings (base, laid out as scenario data)
    beneath it: every field the data gives wins; the rest come from the testbed."""
    return _merge(base, data)


def _text(v):
    """A TOML value as --set would give it (lists and tables stay as they are)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return v if isinstance(v, (list, dict)) else str(v)


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    if isinstance(out.get("switch"), dict) and isinstance(top.get("switch"), dict):
        keep_given_buffer_unit(out["switch"], top["switch"])
    return out
