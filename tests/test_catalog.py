"""incast catalog: kept results made only from a clean commit on main, recording what
made them; the figures it makes are those a setting or the check dates."""
from __future__ import annotations

import json
import subprocess

import pandas as pd
import pytest

from conftest import incast_cmd
from incast.campaign import check, figure, judge, kept
from incast.pages import catalog


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"})


def test_a_kept_result_is_made_only_from_a_clean_commit_on_main(tmp_path):
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "f").write_text("1\n")
    git(repo, "add", "f")
    git(repo, "commit", "-qm", "one")
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert catalog.clean_commit_on_main(repo) == head
    (repo / "f").write_text("2\n")
    with pytest.raises(catalog.CatalogError, match="uncommitted changes"):
        catalog.clean_commit_on_main(repo)
    git(repo, "checkout", "-q", "-b", "elsewhere")
    git(repo, "commit", "-qam", "two")
    with pytest.raises(catalog.CatalogError, match="is not on main"):
        catalog.clean_commit_on_main(repo)
    with pytest.raises(catalog.CatalogError, match="not a git checkout"):
        catalog.clean_commit_on_main(tmp_path / "none")


def test_bad_input_is_refused_in_one_line():
    r = incast_cmd("catalog", "no-such-figure", "--dry-run")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "no-such-figure" in r.stderr
    r = incast_cmd("catalog", "--all", "fast08-fig3", "--dry-run")
    assert r.returncode == 2 and "not both" in r.stderr


def test_the_figures_asked_for_are_listed_and_none_made_on_a_dry_run():
    r = incast_cmd("catalog", "fast08-fig3", "sigcomm09-fig1", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "fast08-fig3: asked for" in r.stdout and "2 figures to make (--dry-run: none made)" in r.stdout


def test_a_figure_is_dated_by_its_settings_or_by_the_check(monkeypatch):
    """A kept result made with other settings is dated without a run; one whose check
    disagrees is dated naming the points; one that agrees is not."""
    name = "sigcomm09-fig1"
    table, meta = kept.full(name)
    outcomes = {}

    def fake_check(n, run=None, alter=None, log=None):
        return check.FigureCheck(n, [check.PointCheck("200us", 47.0, (1,), [1.0], [2.0], 1e-6, {},
                                                      outcomes[n], "")])
    monkeypatch.setattr(check, "check_figure", fake_check)
    monkeypatch.setattr(figure, "missing", lambda fig: [])
    outcomes[name] = "agrees"
    assert catalog.dated([name]) == []
    outcomes[name] = "disagrees"
    assert catalog.dated([name]) == [(name, "today's code disagrees at 200us 47")]
    monkeypatch.setattr(kept, "stale", lambda fig, meta: "made with other settings (switch.buffer)")
    assert catalog.dated([name]) == [(name, "made with other settings (switch.buffer)")]


def test_a_figure_whose_kept_result_leaves_a_claim_undecided_is_dated(monkeypatch):
    """A claim rendered anew can need runs its kept result lacks: the figure is dated,
    naming the points incast figure gives more runs, before any check runs."""
    name = "sigcomm09-fig1"

    def no_check(*a, **k):
        raise AssertionError("no check for a figure already dated")
    monkeypatch.setattr(check, "check_figure", no_check)
    monkeypatch.setattr(figure, "missing", lambda fig: [])
    monkeypatch.setattr(judge, "undecided_points", lambda fig, table, numbers=False: [("200us", 47.0), ("200ms", 8.0)])
    assert catalog.dated([name]) == [(name, "undecided on the kept result at 200us 47, 200ms 8")]


def test_a_kept_result_records_its_commit_command_time_and_machine(tmp_path, monkeypatch):
    made = tmp_path / "made"
    made.mkdir()
    pd.DataFrame({"goodput_mbps": [1.0, 2.0], "host_seconds": [3.5, 4.0]}).to_parquet(made / "sweep.parquet")
    (made / "sweep.json").write_text(json.dumps({"figure": "x", "commit": "old", "uncommitted_changes": True}))
    (made / "figure.png").write_bytes(b"png")
    monkeypatch.setattr(kept, "KEPT_FIGURES_DIR", tmp_path / "kept")
    dest = catalog.keep("x", made, "c0ffee", "incast catalog --all", 12.34)
    meta = json.loads((dest / "sweep.json").read_text())
    assert meta["commit"] == "c0ffee" and meta["uncommitted_changes"] is False
    assert meta["command"] == "incast catalog --all" and meta["host_seconds"] == 7.5 and meta["runs"] == 2
    assert meta["wall_seconds"] == 12.3 and meta["machine"]["cpus"] >= 1 and meta["kept"]
    assert (dest / "figure.png").read_bytes() == b"png" and (dest / "sweep.parquet").is_file()


def test_a_stopped_catalog_resumes_over_what_it_wrote(tmp_path):
    """The kept results and pages a stopped catalog wrote do not make the tree unclean;
    any other change does."""
    repo = tmp_path / "r"
    (repo / "docs" / "figure-results" / "x").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    for f in ("docs/figure-results/x/sweep.json", "docs/scoreboard.md", "README.md", "code.py"):
        (repo / f).write_text("1\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "one")
    for f in ("docs/figure-results/x/sweep.json", "docs/scoreboard.md", "README.md"):
        (repo / f).write_text("2\n")
    assert catalog.clean_commit_on_main(repo)
    (repo / "code.py").write_text("2\n")
    with pytest.raises(catalog.CatalogError, match="uncommitted changes"):
        catalog.clean_commit_on_main(repo)
