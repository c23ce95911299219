"""The documentation: README.md stays a short way in, and the site builds with
`mkdocs build --strict` (no broken link, no page left out of the navigation), with a
scenario field reference that lists every field of the model and a figure catalog
that lists every file of figures/, both made from the code at the build."""
from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from incast import scenario as scn
from incast.cli import flags
from incast.constants import DOC_RESULTS_DIR, FIGURES_DIR, LABS_DIR
from incast.errors import BadInput
from incast.campaign import figure, kept, make
from incast.pages import doc_tables, reference, scoreboard

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
TWO_COMMANDS = ("./scripts/setup.sh && incast figure sigcomm09-fig1 --out results/fig1",
                "./scripts/setup.sh && ./scripts/test.sh")
SITE_PACKAGES = ("mkdocs", "material", "mkdocs_gen_files")


def test_the_readme_is_short_and_keeps_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 200, "README.md: at most 200 lines; the rest belongs in docs/"
    block = re.search(r"## Two commands\n.*?```sh\n(.*?)```", text, re.S)
    assert block, "README.md has no 'Two commands' section with a sh block"
    lines = [ln for ln in block.group(1).splitlines() if ln and not ln.startswith("#")]
    assert tuple(lines) == TWO_COMMANDS


def test_the_readme_links_only_to_files_that_exist():
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text()):
        if not re.match(r"[a-z]+:", target):
            assert (REPO / target).exists(), f"README.md links to {target}, which does not exist"


def _leaves(model, prefix=""):
    """Every field of the model a scenario can set, walked independently of the
    generator: tables are walked, an optional table too; a table of named tables is
    NAME; an array of tables is NAME[]."""
    out = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        sub = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else (
            args[0] if len(args) == 1 and isinstance(args[0], type) and issubclass(args[0], BaseModel)
            and typing.get_origin(ann) is not list and typing.get_origin(ann) is not dict else None)
        if sub is not None:
            out += _leaves(sub, f"{prefix}{name}.")
        elif typing.get_origin(ann) is list and args and issubclass(args[0], BaseModel):
            out += _leaves(args[0], f"{prefix}{name}[].")
        elif typing.get_origin(ann) is dict and len(args) == 2 and isinstance(args[1], type) \
                and issubclass(args[1], BaseModel):
            out.append(f"{prefix}{name}.NAME")
        else:
            out.append(f"{prefix}{name}")
    return out


def test_the_field_reference_covers_the_model():
    fields = {f.path: f for f in reference.scenario_fields(flags())}
    leaves = _leaves(scn.Scenario)
    missing = [p for p in leaves if p not in fields]
    assert not missing, f"fields the reference leaves out: {missing}"
    for f in fields.values():
        assert f.meaning.strip() and f.type and f.default, f"{f.path}: no meaning, type or default"
        if f.short:
            assert scn.ALIASES[f.short] == f.path
    assert set(scn.ALIASES.values()) <= set(fields), "a short name of a field the reference lacks"


def test_the_catalog_and_the_labs_come_from_their_files():
    pages = reference.pages(flags())
    catalog = pages["figure-catalog.md"]
    for path in FIGURES_DIR.glob("*.toml"):
        assert f"`incast figure {path.stem}`" in catalog, f"the catalog lacks figures/{path.name}"
    for folder in LABS_DIR.glob("[0-9][0-9]-*"):
        assert (folder / "README.md").is_file(), f"{folder.name}: its handout is README.md"
        assert f"labs/{folder.name}.md" in pages


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    absent = [m for m in SITE_PACKAGES if importlib.util.find_spec(m) is None]
    if absent:
        pytest.skip(f"mkdocs is not installed ({', '.join(absent)} missing: scripts/setup.sh installs "
                    "requirements.txt)")
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout}\n{r.stderr}"
    return out


def _page(site: Path, name: str) -> str:
    return html.unescape((site / name / "index.html").read_text())


def test_the_site_lists_every_scenario_field(site):
    page = _page(site, "scenario-fields")
    for path in _leaves(scn.Scenario):
        assert f"<code>{path}</code>" in page, f"the built field reference lacks {path}"


def test_the_site_lists_every_figure_and_every_lab(site):
    page = _page(site, "figure-catalog")
    for path in FIGURES_DIR.glob("*.toml"):
        assert f'id="{path.stem}"' in page, f"the built catalog lacks figures/{path.name}"
    for folder in LABS_DIR.glob("[0-9][0-9]-*"):
        first = (folder / "README.md").read_text().splitlines()[0].lstrip("# ").strip()
        assert first in _page(site, f"labs/{folder.name}")


def test_the_site_fetches_nothing(site):
    for page in site.rglob("*.html"):
        text = page.read_text()
        outside = re.findall(r'<(?:link|script|img)\b[^>]*(?:href|src)="(https?:)?//[^"]*"', text)
        assert not outside, f"{page.relative_to(site)} loads from the network"
        assert "fonts.googleapis" not in text and "fonts.gstatic" not in text


# --- numbers that cannot drift --------------------------------------------------------

@pytest.mark.parametrize("page", doc_tables.PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_table_of_numbers_is_drawn_from_its_results(page):
    assert not doc_tables.typed_tables(page), (
        f"{page.relative_to(REPO)}: a table of numbers typed by hand; keep its runs in docs/results/ "
        "and draw it (incast/pages/doc_tables.py)")
    assert doc_tables.refresh(page) == page.read_text(), (
        f"{page.relative_to(REPO)} and docs/results/ disagree: python -m incast.pages.doc_tables redraws it")


def test_every_result_row_names_its_command_and_commit():
    files = sorted(DOC_RESULTS_DIR.glob("*.csv"))
    assert files
    used = "".join(p.read_text() for p in doc_tables.PAGES)
    for f in files:
        assert f"<!-- results: {f.name}" in used, f"docs/results/{f.name} is drawn in no page"
        for row in doc_tables.rows(f.name):
            assert re.fullmatch(r"[0-9a-f]{7,40}", str(row["commit"])), f"{f.name}: {row['commit']!r}"
            # the CLI, a script, or one of the project's own modules (python -m incast.report...)
            assert str(row["command"]).startswith(("incast ", "scripts/", "python -m incast.")), \
                f"{f.name}: {row['command']!r}"


def test_a_number_changed_in_its_file_is_caught(tmp_path, monkeypatch):
    """The check fails when a page and its result file part: here the file changes."""
    page = REPO / "docs" / "ecn.md"
    assert doc_tables.refresh(page) == page.read_text()
    for f in DOC_RESULTS_DIR.glob("*.csv"):
        (tmp_path / f.name).write_text(f.read_text().replace("14256", "14257"))
    monkeypatch.setattr(doc_tables, "RESULTS_DIR", tmp_path)
    redrawn = doc_tables.refresh(page)
    assert redrawn != page.read_text() and "| 14257 |" in redrawn


def test_a_table_typed_by_hand_is_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Text.\n\n| servers | goodput |\n|---|---|\n| 16 | 117.0 |\n\nMore text.\n")
    assert doc_tables.typed_tables(page) == ["| servers | goodput |"]


def test_a_result_file_is_recorded_from_a_sweep(tmp_path, monkeypatch):
    import pandas as pd
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    pd.DataFrame([{"senders": 47, "goodput_mbps": 786.5, "run_dir": "/x/runs/n47-r1"},
                  {"senders": 47, "goodput_mbps": 801.0, "run_dir": "/x/runs/n47-r2"}]).to_parquet(sweep / "sweep.parquet")
    monkeypatch.setattr(doc_tables, "code_commit", lambda: "abc1234")
    out = tmp_path / "t.csv"
    assert doc_tables.record(out, [sweep], ["senders", "goodput_mbps"], "incast sweep X  # {label}") == 2
    monkeypatch.setattr(doc_tables, "RESULTS_DIR", tmp_path)
    assert doc_tables.rows("t.csv") == [
        {"label": "n47-r1", "senders": 47, "goodput_mbps": 786.5, "command": "incast sweep X  # n47-r1", "commit": "abc1234"},
        {"label": "n47-r2", "senders": 47, "goodput_mbps": 801.0, "command": "incast sweep X  # n47-r2", "commit": "abc1234"}]
    with pytest.raises(BadInput, match="no field"):
        doc_tables.record(out, [sweep], ["drops"], "incast sweep X")


def test_a_template_draws_a_share_from_the_columns(tmp_path, monkeypatch):
    (tmp_path / "t.csv").write_text("label,timeouts,full_window,blocks,command,commit\n"
                                    "a,306,203,40,incast run,abc1234\n")
    monkeypatch.setattr(doc_tables, "RESULTS_DIR", tmp_path)
    text = doc_tables.render("t.csv", "| run | per block | full window |\n"
                             "| {label} | {timeouts / blocks:.1f} | {100 * full_window / timeouts:.0f}% |",
                             False, "")
    assert "| a | 7.7 | 66% |" in text
    with pytest.raises(BadInput, match="does not fit"):
        doc_tables.render("t.csv", "| x |\n| {nosuch / blocks} |", False, "")


def test_a_sample_of_output_is_drawn_from_the_runs_that_printed_it(tmp_path, monkeypatch):
    """A ``text`` block: a command's printed lines, each drawn from its run's row, so a
    sample of output cannot drift from the runs it quotes."""
    (tmp_path / "t.csv").write_text("label,senders,goodput_mbps,command,commit\n"
                                    "n16,16,70.43,incast run --senders 16,abc1234\n")
    page = tmp_path / "p.md"
    page.write_text("<!-- results: t.csv text\n{senders} senders: goodput {goodput_mbps:.1f} Mbit/s -> {label}\n-->\n"
                    "stale\n<!-- end results -->\n")
    monkeypatch.setattr(doc_tables, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(doc_tables, "REPO", tmp_path)
    text = doc_tables.refresh(page)
    assert "```text\n16 senders: goodput 70.4 Mbit/s -> n16\n```" in text and "stale" not in text
    assert "command and commit of each line" in text

def test_the_scoreboard_is_current():
    """docs/scoreboard.md is what the kept results and this checkout's judge give now."""
    assert scoreboard.main(["--check"]) == 0, "docs/scoreboard.md: run python -m incast.pages.scoreboard"


def test_the_scoreboard_marks_a_kept_result_made_with_other_settings():
    fig = figure.load("sigcomm09-fig1")
    data, overrides, _, _ = figure.plan(fig, True)
    today = make.code_versions()
    assert kept.stale(fig, {"quick": True, "base": data, "overrides": overrides, "code": today}) == ""
    old = {**overrides, "switch.buffer": "32KiB"}
    assert kept.stale(fig, {"quick": True, "base": data, "overrides": old, "code": today}) == \
        "made with other settings (switch.buffer)"


def test_a_kept_result_made_by_other_code_is_not_stale_by_its_bytes():
    """A kept result's code version is its provenance: one made by code that differs
    from today's only in bytes (a comment changed in incast/run/experiment.py, say) is
    not stale, on the scoreboard or in the suite; whether today's code still gives it is
    asked of fresh runs (incast.campaign.check, tests/test_check.py)."""
    fig = figure.load("sigcomm09-fig1")
    data, overrides, _, _ = figure.plan(fig, True)
    meta = {"quick": True, "base": data, "overrides": overrides}
    today = make.code_versions()
    assert kept.stale(fig, {**meta, "code": {**today, "linux": "0" * 16}}) == ""
    assert kept.stale(fig, meta) == ""
    # ablation still says whether a kept result's runs were made by this code's bytes
    assert kept.stale_code({**meta, "code": {**today, "linux": "0" * 16}}, ["linux"]).startswith(
        "made by code that has since changed")


def test_the_code_version_of_an_earlier_commit_is_its_files():
    """code_versions_at(commit) hashes that commit's files as code_version hashes the
    checkout's: HEAD's, where no file a run executes differs from it, is today's."""
    try:
        head = doc_tables.code_commit()      # refused where a file a run executes changed
    except BadInput as e:
        pytest.skip(str(e))
    if not head:
        pytest.skip("not a git checkout")
    assert make.code_versions_at(head) == make.code_versions()