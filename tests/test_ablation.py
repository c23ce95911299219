"""python -m incast.campaign.ablation: a figure's setting with its grid narrowed and one
setting changed, as the divergences' ablations are made."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from conftest import REPO, needs_uml
from incast.campaign import ablation


def test_the_grid_is_narrowed_to_fields_it_has():
    grid = {"senders": ["1", "8", "47"], "rto_min": ["200ms", "200us"]}
    assert ablation.narrowed(grid, {"senders": "47, 40"}) == {"senders": ["47", "40"], "rto_min": ["200ms", "200us"]}
    with pytest.raises(ablation.AblationError, match="--at buffer: the figure's grid has senders, rto_min"):
        ablation.narrowed(grid, {"buffer": "64KiB"})
    with pytest.raises(ablation.AblationError, match="give FIELD=VALUE"):
        ablation.pairs(["switch.buffer"], "--set")


def test_each_point_is_shown_beside_the_kept_result():
    ablated = pd.DataFrame({"senders": [47, 47], "rto_min": ["200us"] * 2, "goodput_mbps": [850.0, 870.0],
                            "timeouts": [900, 1000], "fidelity_ok": [True, True]})
    kept = pd.DataFrame({"senders": [47, 47, 47, 8], "rto_min": ["200us"] * 3 + ["200ms"],
                         "goodput_mbps": [700.0, 740.0, 760.0, 100.0]})
    [line] = ablation.lines(ablated, kept, ["senders", "rto_min"], same_code=False)
    assert line == ("senders=47 rto_min=200us: 860.0 [850.0-870.0] Mbit/s, n=2 (2 faithful), timeouts 900-1000 "
                    "a run; kept result 740.0 [700.0-760.0], n=3 (earlier code)")


def test_a_bad_setting_is_refused_before_anything_runs(tmp_path):
    r = subprocess.run([sys.executable, "-m", "incast.campaign.ablation", "sigcomm09-fig1", "--at", "senders=47",
                        "--set", "switch.buffer=huge", "--out", str(tmp_path / "a")],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and "switch.buffer: not a size" in r.stderr, r.stderr
    assert not (tmp_path / "a").exists()


@needs_uml("uml-hrtimer")
def test_an_ablation_runs_the_figures_setting_with_the_change(tmp_path, no_leftovers):
    """Figure 1's testbed at one server, two blocks, the port's buffer changed: the
    sweep keeps what was changed, and each run is the figure's setting with it."""
    env = {**os.environ, "INCAST_POINTS": str(tmp_path / "points")}     # a store of its own
    r = subprocess.run([sys.executable, "-m", "incast.campaign.ablation", "sigcomm09-fig1", "--at", "senders=1",
                        "--at", "rto_min=200us", "--set", "switch.buffer=128KiB", "--set", "workload.blocks=2",
                        "--repeat", "1", "--out", str(tmp_path / "a")],
                       cwd=REPO, capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "sigcomm09-fig1 with switch.buffer=128KiB, workload.blocks=2 (0 of 1 runs from the point store)" in r.stdout
    meta = json.loads((tmp_path / "a" / "sweep.json").read_text())
    assert meta["ablation_of"] == "sigcomm09-fig1" and meta["changed"]["switch.buffer"] == "128KiB"
    [run] = list((tmp_path / "a" / "runs").iterdir())
    scenario = (run / "scenario.toml").read_text()
    assert f"buffer = {128 * 1024}" in scenario and "delay = 50" in scenario, scenario   # the change, the testbed
