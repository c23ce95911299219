"""The documentation's generated pages, made fresh from the code at every site build.

``mkdocs build`` runs ``docs/gen_pages.py`` (the mkdocs-gen-files plugin), which writes
what :func:`pages` returns into the site. Nothing here is committed as Markdown:

- ``scenario-fields.md``: every field of the scenario model (:class:`incast.scenario.Scenario`
  and its tables), walked through ``model_fields``: its type, default, limits, short
  name (``scenario.ALIASES``), command-line flag, and its ``description``;
- ``figure-catalog.md``: every file of ``figures/`` as ``incast figure`` reads it
  (:func:`incast.campaign.figure.load`), with our pictures where ``docs/`` has them and
  a kept result (``sweep.parquet``, ``sweep.json`` and ``figure.png`` of ``incast figure
  NAME``, copied into ``docs/figure-results/NAME/``) with its claims judged at the build;
- ``labs/NN-name.md``: each lab's handout (``labs/NN-name/README.md``) with its links
  pointed at the site's pages.
"""
from __future__ import annotations

import json
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from pydantic import BaseModel
from pydantic.fields import PydanticUndefined

from incast import registry as registries
from incast import scenario as scn
from incast import testbed
from incast.campaign import figure, judge, kept, quote
from incast.constants import LABS_DIR, REPO
from incast.registry import DATAPLANES
from incast.units import format_rate, format_size, format_time_us

DOCS_DIR = REPO / "docs"

# What a field means where its description in incast/scenario.py leaves something out:
# said once here, shown after the description (or alone where there is none).
NOTES = {
    "name": "label of the run",
    "dataplane": "the switch (see [Data planes](data-planes.md))",
    "kernel": "`host`: this machine's kernel; `stock` or `hrtimer`: the same scenario inside a guest "
              "kernel built by `kernels/build.sh` (a QEMU VM on the real clock, User-Mode Linux in "
              "virtual time): see [Kernels and VM hosts](kernels.md)",
    "clock": "`real`: on this machine's clock (in a QEMU VM for `stock`/`hrtimer`); `virtual`: inside "
             "User-Mode Linux with time-travel, where links hold their rate on any machine (needs "
             "`kernel` stock or hrtimer): see [Virtual time](virtual-time.md)",
    "topology.kind": "a file in `topologies/`",
    "topology.senders": "a star's switch, a Linux bridge, takes 1023 ports; bmv2 500 (more: topology fan_in)",
    "topology.others": "`near1..` on s1, `far1..` on s2",
    "topology.trunk_rate": "two_switch, leaf_spine; a slow link among fast ones",
    "background": "bulk TCP flows running during the measured blocks, measured apart "
                  "(`background.parquet`, `background_mbps`): see [Topologies](topologies.md)",
    "link.rate": "rate of every link (host NICs and switch ports); `auto`: the highest rate this machine "
                 "emulates faithfully for the run's servers (linux data plane; see [Fidelity](fidelity.md))",
    "link.mtu": "bytes",
    "testbed": "a paper's testbed (testbeds/*.toml): its settings lie beneath the scenario's own "
               "([The papers' testbeds](testbeds.md), [catalog](testbed-catalog.md))",
    "link.delay": "netem at each host's egress (needs `sch_netem`; refused with a clear error where the "
                  "kernel lacks it)",
    "link.jitter": "netem at each host's egress, around `link.delay`",
    "link.loss": "netem",
    "switch.buffer": "egress buffer per switch port",
    "switch.buffer_packets": "the same in packets (instead of bytes)",
    "switch.qos.queues": "class queues per port, strict priority, class 0 highest",
    "switch.qos.weights": "e.g. `[2, 1, 1, 1]`",
    "switch.qos.dscp_map": "e.g. `{ 10 = 1, 18 = 2 }`; unmapped DSCPs go to class 0",
    "switch.qos.sender_class": "e.g. `[0, 1]`",
    "switch.pause.enabled": "802.3x PAUSE from the switch, and obeyed at its ports (bmv2: a hold loop; "
                            "linux: needs the `plug` qdisc: virtual time)",
    "switch.pause.xoff": "threshold, bytes in the port's queues (linux: each class queue's, from its share); "
                         "default: the buffer less two full frames per sender, but no more than half and no "
                         "less than an eighth of the buffer",
    "switch.pause.xon": "threshold, bytes in the port's queues; default: a quarter of XOFF",
    "switch.pause.pfc": "802.1Qbb PFC per class instead, sent and obeyed",
    "switch.pause.watchdog": "linux: the pause watchdog; unset: none (`--set switch.pause.watchdog=none`)",
    "switch.pause.watchdog.action": "`drop` what arrives for a stormed queue, or `forward` it anyway",
    "switch.pause.storm": "a host's NIC sends PAUSE for `duration`, from `after` past the first measured block",
    "switch.ecn": "DCTCP's K; linux data plane, where the kernel has `sch_red` (the UML kernels do)",
    "tcp.cc": "in every host (the machine's default may be bbr); allowed in the init namespace for the run "
              "if needed, and restored",
    "tcp.rto_min": "minimum RTO (`net.ipv4.tcp_rto_min_us`); `min` = the lowest the kernel accepts. The run "
                   "reports the effective floor: timers run on jiffies, so at HZ=250 nothing fires sooner "
                   "than 4 ms",
    "tcp.delayed_ack": "off = route `quickack`: every segment ACKed at once",
    "tcp.sack": "selective acknowledgements (`net.ipv4.tcp_sack`)",
    "tcp.initcwnd": "route `initcwnd`",
    "tcp.slow_start_after_idle": "`net.ipv4.tcp_slow_start_after_idle`",
    "tcp.hrtimer_rto": "the hrtimer kernel's (see [Kernels and VM hosts](kernels.md)); refused elsewhere",
    "tcp.rto_random_pct": "the hrtimer kernel's; refused elsewhere",
    "tcp.delack_us": "the hrtimer kernel's; refused elsewhere",
    "tcp.profiles.NAME": "a named profile: the `tcp` fields that differ for the hosts it is given (any field "
                         "of `[tcp]` above but `profiles` and `hosts`; unset ones are `[tcp]`'s)",
    "tcp.hosts": "the profile of a role (`client`, `servers`, `others`) or a host (`server3`, `far1`); a "
                 "host's own entry wins over its role's",
    "workload.repetitions": "repetitions (fresh connections, same network)",
    "workload.seed": "order in which the client sends requests",
    "workload.server_process": "`shared` opens every server's listener inside that server's namespace and "
                               "serves them all from one event loop: hundreds of servers",
    "workload.kind": "`memcached`: every server runs memcached and the client multigets `sru` bytes of 16 KiB "
                     "values from each (one class only: memcached marks no DSCP)",
    "telemetry.enabled": "per-packet queue telemetry",
}

# Pictures in docs/ of a catalog figure's setting (beyond a kept result's figure.png).
PICTURES = {
    "sigcomm09-fig1": [
        ("virtual-fig1.png", "The whole figure in virtual time (`incast figure sigcomm09-fig1`): see "
                             "[Virtual time](virtual-time.md) for its table."),
        ("fig1.png", "The same scenario file in real time at the highest rate a 2-core VM emulates "
                     "faithfully for 32 servers (the README's first command)."),
    ],
}


# --- the scenario model --------------------------------------------------------------

@dataclass
class FieldDoc:
    path: str           # dotted, as --set takes it (NAME, WHO: any key; [] an array of tables)
    section: str        # the TOML table it is written in ("" for the top level)
    type: str
    default: str
    meaning: str
    short: str = ""     # scenario.ALIASES
    flag: str = ""      # the command-line flag of that short name, where there is one


_PARSERS = {"parse_size": "size", "parse_rate": "rate", "parse_time_us": "time",
            "_rate_or_auto": "rate or `auto`", "_rto_min": "time or `min`",
            "_sample": "`all`, `1/N`, `change:SIZE` or `above:SIZE`", "_sysctl_value": "text"}
_UNITS = {"size": format_size, "rate": format_rate, "time": format_time_us,
          "rate or `auto`": format_rate, "time or `min`": format_time_us}
_HELP = {"dataplane": "DATAPLANES", "workload.kind": "WORKLOADS"}


def _meta_kind(metadata) -> str | None:
    for m in metadata:
        name = getattr(getattr(m, "func", None), "__name__", "")
        if type(m).__name__ == "BeforeValidator" and name in _PARSERS:
            return _PARSERS[name]
    return None


def _choices(metadata) -> list[str] | None:
    """The names a registered field takes (incast.scenario._registered), from its own
    validator's message for a name no registry has."""
    for m in metadata:
        if type(m).__name__ == "AfterValidator":
            try:
                m.func("\0 no such name")
            except ValueError as e:
                found = re.search(r"one of: (.*)$", str(e))
                if found:
                    return [c.strip() for c in found.group(1).split(",")]
            except Exception:       # noqa: BLE001 - another kind of validator
                continue
    return None


def _limits(metadata, unit) -> str:
    """The bounds a field's validators set, in the reader's units ("" where they say
    only that a number is not negative, or that a rate is above zero)."""
    fmt = _UNITS.get(unit, lambda v: f"{v:g}" if isinstance(v, float) else str(v))
    bound = {}
    for m in metadata:
        for attr in ("ge", "gt", "le", "lt"):
            if type(m).__name__ == attr.capitalize() and getattr(m, attr, None) is not None:
                bound[attr] = getattr(m, attr)
    low = ("ge", bound["ge"]) if "ge" in bound else ("gt", bound["gt"]) if "gt" in bound else None
    high = ("le", bound["le"]) if "le" in bound else ("lt", bound["lt"]) if "lt" in bound else None
    if low and low[1] == 0:
        low = None
    if low and high and low[0] == "ge" and high[0] == "le":
        return f"{fmt(low[1])}–{fmt(high[1])}"
    sign = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    return ", ".join(f"{sign[b[0]]} {fmt(b[1])}" for b in (low, high) if b)


def _inner(annotation) -> tuple[object, list]:
    """(type, metadata) of an Annotated[...] or a plain type."""
    if typing.get_origin(annotation) is typing.Annotated:
        base, *meta = typing.get_args(annotation)
        more = []
        for m in meta:       # Field(...) inside Annotated carries its own metadata
            more += list(getattr(m, "metadata", []) or []) if type(m).__name__ == "FieldInfo" else [m]
        base, deeper = _inner(base)
        return base, more + deeper
    return annotation, []


def _describe_type(annotation, metadata) -> tuple[str, str | None, str]:
    """(type as the reader writes it, unit kind for defaults, limits)."""
    base, meta = _inner(annotation)
    meta = list(metadata) + meta
    kind = _meta_kind(meta)
    origin = typing.get_origin(base)
    args = [a for a in typing.get_args(base) if a is not type(None)]
    optional = origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(base)
    if kind:
        limits_meta = list(meta)
        for a in args:
            limits_meta += _inner(a)[1]
        return kind, kind, _limits(limits_meta, kind)
    if optional and len(args) == 1:
        return _describe_type(args[0], meta)
    if origin in (typing.Union, types.UnionType):
        parts = [_describe_type(a, [])[0] for a in args]
        return " or ".join(parts), None, _limits(meta, None)
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{a}`" for a in typing.get_args(base)), None, ""
    if origin is list:
        item = _describe_type(typing.get_args(base)[0], [])[0]
        return f"list of {item}s" if not item.startswith("`") else f"list ({item})", None, ""
    if origin is dict:
        return "table", None, ""
    if isinstance(base, type) and issubclass(base, BaseModel):
        return "table", None, ""
    choices = _choices(meta)
    if choices:
        return "one of " + ", ".join(f"`{c}`" for c in choices), None, ""
    name = {bool: "bool", int: "integer", float: "number", str: "text"}.get(base, getattr(base, "__name__", str(base)))
    pattern = next((m.pattern for m in meta if getattr(m, "pattern", None)), None)
    if pattern and name == "text":
        name = f"text (`{pattern}`)"
    return name, None, _limits(meta, None)


def _default(field, unit) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    else:
        value = field.default
    if value is PydanticUndefined:
        return "required"
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, (list, dict)) and not value:
        return "none"
    if isinstance(value, BaseModel):
        return "table"
    if unit in _UNITS and isinstance(value, int):
        return f"`{_UNITS[unit](value)}`"
    return f"`{value}`"


def _help_of(path: str) -> dict[str, str]:
    name = _HELP.get(path)
    if not name:
        return {}
    registry = getattr(registries, name)
    return {name: entry.help for name, entry in registry.items()}


def _meaning(path: str, field) -> str:
    parts = [p for p in (field.description, NOTES.get(path)) if p]
    text = "; ".join(p.rstrip(".") if i < len(parts) - 1 else p for i, p in enumerate(parts))
    helps = "; ".join(f"`{name}`: {h}" for name, h in _help_of(path).items())
    return "; ".join(p for p in (helps, text) if p)


def _model_of(annotation):
    """The model an annotation names (alone or as X | None), else None."""
    base, _ = _inner(annotation)
    if isinstance(base, type) and issubclass(base, BaseModel):
        return base
    models = [a for a in typing.get_args(base) if isinstance(a, type) and issubclass(a, BaseModel)]
    return models[0] if len(models) == 1 and typing.get_origin(base) in (typing.Union, types.UnionType) else None


def scenario_fields(flags: frozenset[str] = frozenset()) -> list[FieldDoc]:
    """Every scenario field, depth first in the model's order: tables are walked
    (an optional table too), a table of named tables (tcp.profiles) is one row NAME,
    an array of tables (background) is walked as ``background[].FIELD``. ``flags``:
    the command line's --flags (incast.cli.flags()), to name a short name's flag."""
    short = {path: alias for alias, path in scn.ALIASES.items()}
    out: list[FieldDoc] = []

    def walk(model, prefix: str, section: str):
        for name, field in model.model_fields.items():
            path = f"{prefix}{name}"
            sub = _model_of(field.annotation)
            origin = typing.get_origin(_inner(field.annotation)[0])
            args = typing.get_args(_inner(field.annotation)[0])
            if sub is not None:
                if typing.get_args(_inner(field.annotation)[0]):      # optional table: a row for itself
                    out.append(FieldDoc(path, section, "table", _default(field, None),
                                        _meaning(path, field) or (sub.__doc__ or "").split("\n\n")[0].strip()))
                walk(sub, path + ".", path)
            elif origin is list and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
                out.append(FieldDoc(path, section, "array of tables", _default(field, None),
                                    _meaning(path, field) or (args[0].__doc__ or "").strip()))
                walk(args[0], f"{path}[].", f"[{path}]")
            elif origin is dict and len(args) == 2 and isinstance(args[1], type) and issubclass(args[1], BaseModel):
                key = f"{path}.NAME"
                out.append(FieldDoc(key, section, "table of tables", "none", _meaning(key, field)))
            else:
                kind, unit, limits = _describe_type(field.annotation, field.metadata)
                if limits:
                    kind += f", {limits}"
                alias = short.get(path, "")
                flag = f"--{alias.replace('_', '-')}" if alias and f"--{alias.replace('_', '-')}" in flags else ""
                out.append(FieldDoc(path, section, kind, _default(field, unit), _meaning(path, field),
                                    alias, flag))
    walk(scn.Scenario, "", "")
    return out


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _sections() -> list[tuple[str, type | None]]:
    """(TOML table, its model) in the order scenario_fields() walks them."""
    found: list[tuple[str, type | None]] = [("", scn.Scenario)]

    def walk(model, prefix):
        for name, field in model.model_fields.items():
            sub = _model_of(field.annotation)
            args = typing.get_args(_inner(field.annotation)[0])
            if sub is not None:
                found.append((f"{prefix}{name}", sub))
                walk(sub, f"{prefix}{name}.")
            elif typing.get_origin(_inner(field.annotation)[0]) is list and args and \
                    isinstance(args[0], type) and issubclass(args[0], BaseModel):
                found.append((f"[{prefix}{name}]", args[0]))
    walk(scn.Scenario, "")
    return found


def scenario_reference(flags: frozenset[str]) -> str:
    fields = scenario_fields(flags)
    lines = ["# Scenario field reference", "",
             "Generated from the scenario model (`incast/scenario.py`) each time the site is built: every",
             "field with its type, default, limits and description, the short name that `--set`, `--grid`",
             "and a sweep file's `[sweep]` table accept (`scenario.ALIASES`), and the `incast run` flag of",
             "that name. How scenarios are written, and the units: [Scenario files](scenarios.md).", "",
             "Sizes take `B, KB, KiB, MB, MiB, GB, GiB` (KiB = 1024), rates `bit, kbit, Mbit, Gbit`, times",
             "`ns, us, ms, s` (1 µs resolution). A field marked *unset* by default takes the value its",
             "meaning names, or nothing.", ""]
    for section, model in _sections():
        rows = [f for f in fields if f.section == section]
        if not rows:
            continue
        title = f"`[{section}]`" if section and not section.startswith("[") else (
            f"`[{section}]`" if section else "The top level")
        lines += [f"## {title}", ""]
        doc = (model.__doc__ or "").strip() if model is not scn.Scenario else ""
        if doc and not doc.startswith(("A base class", "Usage docs")):
            lines += [" ".join(doc.split()), ""]
        lines += ["| field | short name | type | default | meaning |", "|---|---|---|---|---|"]
        for f in rows:
            short = f"`{f.short}`" + (f", `{f.flag}`" if f.flag else "") if f.short else ""
            lines.append(f"| `{f.path}` | {short} | {_cell(f.type)} | {_cell(f.default)} | {_cell(f.meaning)} |")
        lines.append("")
    switches = sorted(flags & {"--telemetry", "--capture"})
    if switches:
        lines += [" and ".join(f"`{f}`" for f in switches) + " take no value: each sets its field to true.", ""]
    return "\n".join(lines)


# --- the figure catalog ----------------------------------------------------------------

def _comments(path: Path) -> list[str]:
    """The figure file's comment blocks, as paragraphs (the first line's pointer to
    the code is left out)."""
    blocks, current = [], []
    for line in path.read_text().splitlines():
        text = line.strip()
        if text.startswith("#"):
            current.append(text.lstrip("#").strip())
            continue
        if current:
            blocks.append(" ".join(current))
            current = []
        head, _, tail = line.partition(" #")
        if tail.strip() and "=" in head and '"""' not in line:
            blocks.append(f"`{head.strip()}`: {tail.strip()}")
    if current:
        blocks.append(" ".join(current))
    return [b for b in blocks if not b.startswith("One file per figure")]


def _needs(fig) -> str:
    what = {"virtual-time": "the UML kernels (`kernels/build.sh --uml`): it runs in virtual time",
            **{name: e.tools for name, e in DATAPLANES.items() if e.tools}}
    return "; ".join(what.get(n, n) for n in figure.needs(fig)) or "nothing beyond the set-up: it runs in real time"


def _claim_check(fig, c) -> str:
    metric = "" if c.metric == "goodput_mbps" else f" ({c.metric})"
    if c.onset:
        return (f"onset of `{c.series}` at least {c.onset_at_least:g} times that of `{c.onset_of}` (a curve's onset: "
                f"the smallest {fig.x} from which it is below {c.onset_below:.0%} of the payload limit){metric}")
    where = (f"at {fig.x} = {c.at:g}" if c.at is not None else
             f"at some {fig.x} from {c.from_:g} on" if c.some else f"from {fig.x} = {c.from_:g} on")
    if c.below is not None:
        test = f"below {c.below:.0%} of the payload limit"
    elif c.above is not None:
        test = f"above {c.above:.0%} of the payload limit"
    else:
        m = c.margin_mbps
        test = (f"at most `{c.below_series}` less {m:g} Mbit/s" if m > 0 else
                f"at most `{c.below_series}` plus {-m:g} Mbit/s" if m < 0 else f"at most `{c.below_series}`")
    return f"`{c.series}` {where}: {test}{metric}"


def _kept(fig) -> list[str]:
    """A kept result (docs/figure-results/NAME/: the sweep's sweep.parquet and
    sweep.json, and figure.png, as `incast figure NAME` wrote them), its claims judged
    again now, by the rules and the figure file of this checkout."""
    folder = kept.KEPT_FIGURES_DIR / fig.name
    if not (folder / "sweep.parquet").is_file():
        return []
    table = pd.read_parquet(folder / "sweep.parquet")
    meta = json.loads((folder / "sweep.json").read_text()) if (folder / "sweep.json").is_file() else {}
    faithful = table["fidelity_ok"].fillna(False).astype(bool) if "fidelity_ok" in table else None
    link = table["link_mbps"].dropna() if "link_mbps" in table else []
    what = "quick mode" if meta.get("quick") else "the full grid"
    runs = f"{len(table)} runs" + (f" at {link.iloc[0]:g} Mbit/s" if len(link) else "")
    if faithful is not None:
        runs += ", every run faithful" if faithful.all() else f", {int((~faithful).sum())} not faithful"
    lines = [f"**Kept result** (`docs/figure-results/{fig.name}/`, {what}: {runs}; its claims judged at "
             "this build):", "", "| claim | verdict | measured (median [min-max, runs]) |", "|---|---|---|"]
    lines += [f"| {_cell(v['claim'])} | {v['verdict']} | {_cell(v['detail'])} |" for v in judge.judge(fig, table)]
    lines.append("")
    compared = judge.comparison(fig, table)
    compared = compared[compared["ours"].notna()]
    if len(compared):
        lines += [f"| curve | {fig.x} | paper | ours [interval] | ratio | verdict |", "|---|---|---|---|---|---|"]
        lines += [f"| `{r['series']}` | {r[fig.x]:g} | {r['paper']:g} | {r['ours']:g} [{r['lo']:g}-{r['hi']:g}] | "
                  f"{r['ratio']:g} | {r['verdict']}{' (declared divergence)' if r['divergence'] else ''} |"
                  for _, r in compared.iterrows()]
        lines.append("")
    if (folder / "figure.png").is_file():
        lines += [f"![{fig.name}, kept result](figure-results/{fig.name}/figure.png)", ""]
    return lines


def figure_catalog() -> str:
    lines = ["# Figure catalog", "",
             "Generated from `figures/*.toml` each time the site is built: each figure as `incast figure`",
             "runs it, the numbers its paper's text gives, and its claims as checks. What the catalog is",
             "and how a claim is judged: [The papers' figures](figures.md).", "",
             "| figure | paper | needs |", "|---|---|---|"]
    names = figure.known()
    loaded = {name: figure.load(name) for name in names}
    for name, fig in loaded.items():
        lines.append(f"| [`{name}`](#{name}) | {_cell(fig.paper)}, {_cell(fig.figure)} | "
                     f"{', '.join(figure.needs(fig)) or 'real time'} |")
    lines.append("")
    for name, fig in loaded.items():
        lines += [f"## {fig.paper}, {fig.figure} {{ #{name} }}", "",
                  f"`incast figure {name}` (`figures/{name}.toml`)", "",
                  "> " + " ".join(fig.caption.split()), "",
                  f"- **Sweep:** `{fig.sweep}`, x: `{fig.x}`, one curve per `{fig.series}`",
                  f"- **Needs:** {_needs(fig)}"]
        if fig.settings:
            lines.append("- **Settings:** " + ", ".join(f"`{k} = {v}`" for k, v in fig.settings.items()))
        if fig.grid:
            lines.append("- **Grid:** " + "; ".join(f"`{k}` = {', '.join(map(str, v))}" for k, v in fig.grid.items()))
        if fig.repeat != 1:
            lines.append(f"- **Repetitions:** {fig.repeat}")
        if fig.quick:
            quick = fig.quick
            parts = [f"`{k}` = {', '.join(map(str, v))}" for k, v in quick.get("grid", {}).items()]
            parts += [f"`{k} = {v}`" for k, v in quick.get("settings", {}).items()]
            if "repeat" in quick:
                parts.append(f"{quick['repeat']} repetitions")
            lines.append("- **`--quick`:** " + "; ".join(parts))
        lines.append("")
        for note in _comments(figure.FIGURES_DIR / f"{name}.toml"):
            lines += [f"*From the figure file:* {note}", ""]
        if fig.paper_numbers:
            lines += ["The paper's numbers:", "", "| curve | x | value | from the text |", "|---|---|---|---|"]
            for n in fig.paper_numbers:
                metric = "Mbit/s" if n.metric == "goodput_mbps" else n.metric
                lines.append(f"| `{n.series}` | {n.x:g} | {n.value:g} {metric} | {_cell(n.source)} |")
            lines.append("")
        if fig.claims:
            lines += ["Claims:", "", "| claim | check |", "|---|---|"]
            lines += [f"| {_cell(c.text)} | {_cell(_claim_check(fig, c))} |" for c in fig.claims]
            lines.append("")
            result = kept.result(name)
            for c in fig.claims:
                if getattr(c, "divergence", None):
                    text = quote.fill(fig, c.divergence, *(result or (None, None)))
                    lines += [f"*Does not reproduce here:* \u201c{_cell(c.text)}\u201d: {_cell(text)}", ""]
        lines += _kept(fig)
        for picture, caption in PICTURES.get(name, []):
            if (DOCS_DIR / picture).is_file():
                lines += [f"![{fig.paper}, {fig.figure}]({picture})", "", f"*{caption}*", ""]
    return "\n".join(lines)


# --- the labs ---------------------------------------------------------------------------

def lab_folders() -> list[Path]:
    return sorted(p for p in LABS_DIR.glob("[0-9][0-9]-*") if (p / "README.md").is_file())


def lab_page(folder: Path) -> str:
    """A lab's handout as a page of the site: links into docs/ become the site's, links
    to another lab's folder become its page, anything else in the checkout is named."""
    text = (folder / "README.md").read_text()

    def link(m):
        label, target = m.group(1), m.group(2)
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            return m.group(0)
        if target.startswith("../../docs/"):
            return f"[{label}](../{target[len('../../docs/'):]})"
        other = re.fullmatch(r"\.\./([0-9][0-9]-[a-z0-9-]+)/(?:README\.md)?(#.*)?", target)
        if other:
            return f"[{label}]({other.group(1)}.md{other.group(2) or ''})"
        return f"{label} (`labs/{folder.name}/{target}`)"
    return re.sub(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)", link, text)


def testbed_catalog() -> str:
    """The papers' testbeds (testbeds/*.toml): each setting with the sentence it comes
    from, and what the testbed does not model."""
    lines = ["# The papers' testbeds", "",
             "Made from `testbeds/` at every build. How a testbed applies to a scenario: "
             "[Testbeds](testbeds.md).", ""]
    for name in testbed.known():
        t = testbed.load(name)
        lines += [f"## `{name}`", "", f"{t.paper}: {t.what}.", "",
                  "| setting | value | the paper |", "|---|---|---|"]
        for st in t.settings:
            value = str(st.value).lower() if isinstance(st.value, bool) else st.value
            lines.append(f"| `{st.field}` | `{value}` | {st.source.replace('|', '/')} |")
        if t.not_modelled:
            lines += ["", "Not modelled:", ""] + [f"- {x}" for x in t.not_modelled]
        lines.append("")
    return "\n".join(lines)


def pages(flags: frozenset[str]) -> dict[str, str]:
    """Every generated page: its path in the site's docs, its Markdown. ``flags``: the
    command line's --flags (incast.cli.flags(): the commands are a later stage than this
    one, so their caller hands them in)."""
    out = {"scenario-fields.md": scenario_reference(flags), "figure-catalog.md": figure_catalog(),
           "testbed-catalog.md": testbed_catalog()}
    for folder in lab_folders():
        out[f"labs/{folder.name}.md"] = lab_page(folder)
    return out
