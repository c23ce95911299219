"""The papers' figures: one small file each in figures/ (incast figure list).

A figure file names the paper, the figure and its caption, the sweep that reproduces it
(a scenario file from scenarios/ with the figure's own settings and grid), the numbers
the paper's text gives, each with the sentence it comes from, and the paper's claims as
checks on our sweep table (incast.campaign.judge). ``incast figure NAME`` runs it
(incast.campaign.make).
"""
from __future__ import annotations

import tomllib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from incast import clock as clocks
from incast import testbed
from incast.constants import FIGURES_DIR
from incast.errors import BadInput
from incast.registry import DATAPLANES
from incast.run import preflight, sweep
from incast.scenario import load_file


class FigureError(BadInput):
    """Bad input (exit 2), as the CLI reports scenario errors."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PaperNumber(_Model):
    series: str
    x: float
    value: float
    metric: str = "goodput_mbps"
    source: str = Field(description="the sentence of the paper the number comes from")
    divergence: str | None = Field(
        None, description="ours does not agree with it (incast.campaign.judge.number_band): why, the numbers, "
                          "what was tried (the suite fails the day it agrees)")
    undecided: str | None = Field(
        None, description="ours stays undecided against it at the judge's last look (80 runs): why, the "
                          "numbers; the suite holds that the kept result reached it")


class Claim(_Model):
    """One of the paper's claims as a check on the sweep table (incast.campaign.judge).

    Exactly one kind of check: a point below or above a fraction of the payload limit
    (below, above), a point below another curve by a margin (below_series,
    margin_mbps), each at one x (at) or at every x from one on (from; with some, at one
    of them at least); or the onsets of two curves compared (onset_at_least)."""
    text: str
    series: str
    at: float | None = None
    from_: float | None = Field(None, alias="from")
    some: bool = Field(False, description="with from: the claim holds where one of its points holds (a paper's "
                                          "'up to': the curve at its deepest), not where every one does")
    metric: str = "goodput_mbps"
    below: float | None = Field(None, description="fraction of the payload limit")
    above: float | None = Field(None, description="fraction of the payload limit")
    below_series: str | None = None
    margin_mbps: float = 0.0
    onset_at_least: float | None = Field(
        None, description="an onset claim: the series' onset (the smallest x from which every point is below "
                          "onset_below of the payload limit) is at least this many times onset_of's")
    onset_of: str | None = Field(None, description="an onset claim: the series whose onset it is compared with")
    onset_below: float | None = Field(
        None, description="an onset claim: the fraction of the payload limit below which a point counts as "
                          "collapsed (the paper's words for its collapse, said in the figure file)")
    divergence: str | None = Field(
        None, description="the claim does not reproduce here: why, the numbers, what was tried (its test "
                          "is a strict xfail, so the day it holds the suite says so)")
    undecided: str | None = Field(
        None, description="the claim stays undecided at the judge's last look (80 runs at each point that "
                          "leaves it so): why, the numbers; the suite holds that the kept result reached it")

    @property
    def onset(self) -> bool:
        return self.onset_at_least is not None

    @model_validator(mode="after")
    def _one_check(self):
        kinds = {"below": self.below, "above": self.above, "below_series": self.below_series,
                 "onset_at_least": self.onset_at_least}
        given = [k for k, v in kinds.items() if v is not None]
        if len(given) != 1:
            raise ValueError(f"claim {self.text!r}: give exactly one of below, above, below_series, onset_at_least"
                             + (f" (it gives {', '.join(given)})" if given else ""))
        if self.onset:
            if self.onset_of is None or self.onset_below is None:
                raise ValueError(f"claim {self.text!r}: an onset claim (onset_at_least) needs onset_of, the "
                                 "series compared with, and onset_below, the fraction of the payload limit "
                                 "below which a point counts as collapsed")
            if self.onset_of == self.series:
                raise ValueError(f"claim {self.text!r}: onset_of is the claim's own series")
            if not self.onset_at_least > 0 or not 0 < self.onset_below < 1:
                raise ValueError(f"claim {self.text!r}: onset_at_least is a factor above 0 and onset_below a "
                                 "fraction of the payload limit between 0 and 1")
            extra = [k for k, v in (("at", self.at), ("from", self.from_), ("margin_mbps", self.margin_mbps or None),
                                    ("some", self.some or None)) if v is not None]
            if extra:
                raise ValueError(f"claim {self.text!r}: an onset claim is judged on the whole curve: "
                                 f"no {', '.join(extra)}")
            return self
        if self.onset_of is not None or self.onset_below is not None:
            raise ValueError(f"claim {self.text!r}: onset_of and onset_below belong to an onset claim "
                             "(onset_at_least)")
        if (self.at is None) == (self.from_ is None):
            raise ValueError(f"claim {self.text!r}: give exactly one of at, from")
        if self.some and self.from_ is None:
            raise ValueError(f"claim {self.text!r}: some goes with from (a claim at one point holds where "
                             "that point does)")
        return self

    def point(self, x: float, series: str | None = None) -> "Claim":
        """The claim as judged at one of its points: a point claim at x (for an onset
        claim, `series` below the onset's fraction there)."""
        if self.onset:
            return Claim(text=self.text, series=series or self.series, at=x, metric=self.metric,
                         below=self.onset_below)
        return self.model_copy(update={"at": x, "from_": None, "some": False})


class Figure(_Model):
    name: str = ""
    paper: str
    figure: str
    caption: str
    sweep: str = Field(description="scenario (sweep) file, relative to the repository")
    x: str = "senders"
    series: str
    settings: dict[str, Any] = Field(default_factory=dict, description="fields as for --set")
    grid: dict[str, list] = Field(default_factory=dict, description="replaces the sweep file's grid")
    repeat: int = 1
    quick: dict[str, Any] = Field(default_factory=dict, description="grid, repeat and settings for --quick")
    paper_numbers: list[PaperNumber] = Field(default_factory=list)
    claims: list[Claim] = Field(default_factory=list)
    model: Literal["wren09"] | None = Field(
        None, description="an analytical model fitted to the fixed-fragment curves and drawn over them "
                          "(wren09: Chen et al.'s Section 6.1, incast.report.wren_model)")


def known() -> list[str]:
    return sorted(p.stem for p in FIGURES_DIR.glob("*.toml"))


def load(name: str) -> Figure:
    path = FIGURES_DIR / f"{name}.toml"
    if not path.is_file():
        raise FigureError(f"no figure {name!r} (incast figure list: {', '.join(known())})")
    try:
        return Figure.model_validate({**tomllib.loads(path.read_text()), "name": name})
    except (ValidationError, tomllib.TOMLDecodeError) as e:
        raise FigureError(f"figures/{name}.toml: {e}") from None


def scenarios(fig: Figure) -> list:
    """Every scenario the figure's full and quick grids run."""
    out = []
    for quick in (False, True):
        data, overrides, grid, _ = plan(fig, quick)
        out += [s for _, s in sweep.expand(data, overrides, sweep.parse_grid([], grid))]
    return out


def needs(fig: Figure) -> list[str]:
    """What the figure's runs need beyond the set-up, read from its scenarios: virtual
    time (the UML kernels) and the data planes that need tools of their own."""
    found = []
    for s in scenarios(fig):
        for need, yes in (("virtual-time", clocks.named(s.clock).simulated),
                          (s.dataplane, bool(DATAPLANES[s.dataplane].tools))):
            if yes and need not in found:
                found.append(need)
    return found


def missing(fig: Figure) -> list[str]:
    """What this machine lacks for the figure, as reasons (empty: it can run here),
    asked of each of its scenarios (incast.run.preflight.host_missing)."""
    why: list[str] = []
    asked = set()
    for s in scenarios(fig):
        # one of each kind (a plane's ports may not reach every sender count): finding a
        # guest kernel hashes its inputs (tens of ms)
        kind = (s.clock, s.kernel, s.dataplane, s.topology.senders)
        if kind not in asked:
            asked.add(kind)
            why += [w for w in preflight.host_missing(s) if w not in why]
    return why


def plan(fig: Figure, quick: bool) -> tuple[dict, dict, dict, int]:
    """(scenario data, overrides, grid, repeat) of the figure's sweep."""
    path = FIGURES_DIR.parent / fig.sweep
    data = load_file(path)
    grid = dict(tomllib.loads(path.read_text()).get("sweep", {}))
    grid.update(fig.grid)
    overrides = {k: cli_value(v) for k, v in fig.settings.items()}
    if "testbed" in fig.settings:
        # The figure runs on its paper's testbed: the testbed's settings win over the
        # sweep file's (a first look at whatever rate this machine holds), the
        # figure's own win over both.
        overrides = {**{k: cli_value(v) for k, v in testbed.settings(str(fig.settings["testbed"])).items()},
                     **overrides}
    repeat = fig.repeat
    if quick:
        grid.update(fig.quick.get("grid", {}))
        overrides.update({k: cli_value(v) for k, v in fig.quick.get("settings", {}).items()})
        repeat = fig.quick.get("repeat", 1)
    return data, overrides, {k: [str(v) for v in vals] for k, vals in grid.items()}, repeat


def cli_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def col(field: str) -> str:
    """The sweep table's column for a grid field (its last part)."""
    return field.split(".")[-1]
