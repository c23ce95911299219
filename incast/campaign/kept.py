"""A figure's kept result: docs/figure-results/NAME, as `incast figure NAME` wrote it
(sweep.parquet, sweep.json, figure.png), and whether it still shows what the figure runs.

Stale means made with settings the figure (or its testbed) no longer has. Whether
today's code still gives it is asked of fresh runs (incast.campaign.check); the code
version its sweep.json records is its provenance.
"""
from __future__ import annotations

import json

import pandas as pd

from incast.campaign import figure, make
from incast.constants import DOCS_DIR

KEPT_FIGURES_DIR = DOCS_DIR / "figure-results"


def result(name: str):
    """(table, sweep.json) of a figure's kept result, or None."""
    folder = KEPT_FIGURES_DIR / name
    if not (folder / "sweep.parquet").is_file():
        return None
    meta = json.loads((folder / "sweep.json").read_text()) if (folder / "sweep.json").is_file() else {}
    return pd.read_parquet(folder / "sweep.parquet"), meta


def full(name: str):
    """(table, sweep.json) of a figure's full kept result, or None."""
    r = result(name)
    return None if r is None or r[1].get("quick") else r


def stale(fig, meta: dict) -> str:
    """Why a kept result no longer shows what the figure runs (empty: it does): the
    sweep file's settings or the figure's (its testbed's included) changed since. Whether
    today's code still gives it is asked of the code, not of its bytes: fresh runs at
    its claims' deciding points (incast.campaign.check, run by the test suite); the code
    version it records is its provenance."""
    data, overrides, _, _ = figure.plan(fig, bool(meta.get("quick")))
    if meta.get("base") is not None and meta["base"] != data:
        return "its sweep file changed since"
    if meta.get("overrides") is not None and meta["overrides"] != overrides:
        changed = sorted(k for k in set(overrides) | set(meta["overrides"])
                         if overrides.get(k) != meta["overrides"].get(k))
        return "made with other settings (" + ", ".join(changed) + ")"
    return ""


def stale_code(meta: dict, planes) -> str:
    """Why a kept result's runs did not execute today's code (empty: they did)."""
    code = meta.get("code")
    if not code:
        return "its code is not recorded"
    today = make.code_versions()
    changed = sorted(p for p in planes if code.get(p) != today.get(p))
    if changed:
        return "made by code that has since changed what its runs do (" + ", ".join(
            f"{p}: {code.get(p)} then, {today.get(p)} now" for p in changed) + ")"
    if meta.get("uncommitted_changes") and meta.get("code_from_commit"):
        return "made with uncommitted changes beside its commit's code (which is today's)"
    return ""

