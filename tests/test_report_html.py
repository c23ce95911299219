"""incast report: the interactive HTML pages of a run and of a sweep.

The reduction of large traces is checked on synthetic data with known answers; then a
real collapsing run (telemetry and capture) and a real sweep are reported, and the pages
are opened from disk in Debian's chromium (driven by Playwright): nothing may leave the
machine, nothing may fail, and what the graphs hold must be what the parquet tables
hold."""
from __future__ import annotations

import json
import os
import urllib.parse
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from conftest import incast_cmd, needs_root, our_netns, our_state
from incast.errors import BadInput
from incast.report import html as report

CHROMIUM = "/usr/bin/chromium"
# Without the background-networking flags chromium itself phones out (and this
# machine's network refuses it); --disable-gpu: software rendering, as on a server.
BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]
REDUCED_MAX = 400       # a budget small enough that the real bottleneck trace must be reduced


# --- the envelope -------------------------------------------------------------------

def test_a_small_trace_is_drawn_whole():
    t = np.array([5.0, 1.0, 3.0])
    tr = report.envelope(t, [50, 10, 30], max_points=3)
    assert not tr.reduced and tr.events == 3
    assert tr.t_us.tolist() == [1.0, 3.0, 5.0] and tr.values.tolist() == [10, 30, 50]   # in time order


def test_a_large_trace_keeps_each_bins_lowest_and_highest_event():
    rng = np.random.default_rng(1)
    n, budget = 100_000, 1_000
    t = np.cumsum(rng.uniform(0.5, 1.5, n))
    v = rng.integers(100, 1000, n)
    v[54_321] = 50_000                      # a one-packet peak
    v[777] = 0                              # one moment the queue was empty
    tr = report.envelope(t, v, max_points=budget)
    assert tr.reduced and tr.events == n and len(tr.t_us) <= budget
    assert np.all(np.diff(tr.t_us) >= 0)
    # The peak and the empty moment are drawn, at their own times.
    assert tr.values.max() == 50_000 and tr.t_us[tr.values.argmax()] == t[54_321]
    assert tr.values.min() == 0 and tr.t_us[tr.values.argmin()] == t[777]
    # Every kept point is a real event.
    where = np.searchsorted(t, tr.t_us)
    assert np.array_equal(t[where], tr.t_us) and np.array_equal(v[where], tr.values)
    # Each bin's extremes survive.
    bins = np.minimum(((t - t[0]) / tr.bin_us).astype(int), budget // 2 - 1)
    kept_bins = np.minimum(((tr.t_us - t[0]) / tr.bin_us).astype(int), budget // 2 - 1)
    for b in rng.choice(budget // 2, 50, replace=False):
        assert tr.values[kept_bins == b].max() == v[bins == b].max()
        assert tr.values[kept_bins == b].min() == v[bins == b].min()


# --- bad input ----------------------------------------------------------------------

def test_a_directory_that_is_neither_a_run_nor_a_sweep_is_bad_input(tmp_path):
    (tmp_path / "blocks.parquet").write_text("")
    with pytest.raises(BadInput):
        report.directory_kind(tmp_path)
    r = incast_cmd("report", tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "neither a complete run directory" in r.stderr
    r = incast_cmd("report", tmp_path / "missing")
    assert r.returncode == 2 and "no such directory" in r.stderr
    assert not list(tmp_path.rglob("*.html"))


# --- real runs, real pages ----------------------------------------------------------

def _ok(r):
    assert r.returncode == 0, f"{r.args}: exit {r.returncode}: {r.stderr.strip()[-2000:]}"
    return r


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A collapsing run with telemetry and capture, reported before and after incast
    explain (and once with a budget that forces the envelope), and a sweep, reported.
    Checks itself that the runs left nothing behind."""
    if os.geteuid() != 0:
        pytest.skip("builds network namespaces: run as root")
    root = tmp_path_factory.mktemp("report")
    before = our_netns(), our_state()
    run = root / "run"
    _ok(incast_cmd("run", "--senders", "16", "--blocks", "6", "--sru", "32KiB", "--link-rate", "100Mbit",
                   "--rto-min", "20ms", "--telemetry", "--capture", "--out", run))
    # No timeouts.parquet yet: the page computes them from the capture, writing nothing.
    _ok(incast_cmd("report", run, "--out", root / "before-explain.html"))
    computed, _ = report.load_timeouts(run)
    assert not (run / "timeouts.parquet").exists()
    _ok(incast_cmd("explain", run))
    _ok(incast_cmd("report", run))
    report.write_run_report(run, root / "reduced.html", max_points=REDUCED_MAX)
    sweep = root / "sweep"
    _ok(incast_cmd("sweep", "--grid", "senders=1,4", "--blocks", "3", "--sru", "32KiB", "--link-rate", "100Mbit",
                   "--out", sweep))
    _ok(incast_cmd("report", sweep))
    left = (our_netns() - before[0]) | (our_state() - before[1])
    if left:
        incast_cmd("cleanup")
    assert not left, f"left behind: {sorted(left)}"
    return SimpleNamespace(root=root, run=run, sweep=sweep, computed=computed)


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no {CHROMIUM}: apt-get install chromium (scripts/setup.sh does)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="no playwright: pip install -r requirements.txt")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        yield b
        b.close()


class Opened:
    """A page opened from disk, with every request it made and every error it showed.
    Any http(s) request is aborted and kept: a page that works offline makes none."""

    def __init__(self, browser, path: Path):
        self.context = browser.new_context()
        self.page = self.context.new_page()
        self.requests, self.outside, self.errors = [], [], []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.route("**/*", self._route)
        self.goto(path)

    def _route(self, route):
        if route.request.url.startswith(("http://", "https://")):
            self.outside.append(route.request.url)
            route.abort()
        else:
            route.continue_()

    def goto(self, path: Path):
        self.page.goto(path.as_uri())
        # Rendered: every graph has drawn its SVG and laid out every trace.
        self.page.wait_for_function("""() => {
            const gs = Array.from(document.querySelectorAll('.js-plotly-plot'));
            return gs.length > 0 && gs.every(g => g.querySelector('.main-svg') && g._fullData
                                              && g._fullData.length === g.data.length);
        }""", timeout=30_000)

    def graphs(self) -> dict:
        """Per graph (by id): its traces' names, meta, point counts, y extremes and more."""
        return self.page.evaluate("""() => {
            const extreme = (ys, f) => ys.reduce((a, y) => (a === null || f(y, a)) ? y : a, null);
            const out = {};
            for (const g of document.querySelectorAll('.js-plotly-plot')) {
                out[g.id] = g.data.map(t => {
                    const ys = t.y ? Array.from(t.y) : [];
                    const xs = t.x ? Array.from(t.x) : [];
                    const top = extreme(ys, (y, a) => y > a);
                    return {name: t.name, type: t.type, n: xs.length, meta: t.meta || {},
                            ymax: top, ymin: extreme(ys, (y, a) => y < a),
                            x_at_ymax: top === null ? null : xs[ys.indexOf(top)],
                            customdata: t.customdata ? Array.from(t.customdata) : null,
                            symbols: (t.marker && Array.isArray(t.marker.symbol)) ? t.marker.symbol : null};
                });
            }
            return out;
        }""")

    def assert_clean(self):
        assert not self.outside, f"requests left the machine: {self.outside}"
        assert all(u.split(":", 1)[0] in ("file", "data", "blob", "about") for u in self.requests), self.requests
        assert not self.errors, f"errors on the page: {self.errors}"

    def close(self):
        self.context.close()


@pytest.fixture
def opened(browser):
    pages = []

    def open_(path: Path) -> Opened:
        pages.append(Opened(browser, path))
        return pages[-1]
    yield open_
    for p in pages:
        p.close()


def _occupancy(run: Path) -> pd.DataFrame:
    tele = pd.read_parquet(run / "telemetry.parquet")
    return tele.assign(port=tele["port"].astype(str), event=tele["event"].astype(str))


def _verdict_words(summary: dict) -> list[str]:
    f = summary["fidelity"]
    return ["Faithful"] if f["ok"] else ["NOT FAITHFUL", *f["reasons"]]



@needs_root
@pytest.mark.network
def test_the_run_page_works_offline_and_holds_every_queue_event(made, opened):
    page = opened(made.run / "report.html")
    page.assert_clean()
    traces = page.graphs()["queue-graph"]
    tele = _occupancy(made.run)
    occupancy = [t for t in traces if "port" in t["meta"] and not t["meta"].get("drops")]
    drops = [t for t in traces if t["meta"].get("drops")]
    # One trace per switch port and class queue, each whole (the run is small) and equal to the table.
    expected = tele.groupby(["port", "queue"]).size().index
    assert sorted((t["meta"]["port"], t["meta"]["queue"]) for t in occupancy) == sorted(expected)
    for t in occupancy:
        mine = tele[(tele["port"] == t["meta"]["port"]) & (tele["queue"] == t["meta"]["queue"])]
        events = mine[mine["event"] != "drop"]
        assert t["meta"]["bin_us"] is None and t["n"] == t["meta"]["events"] == len(events), t["name"]
        assert t["ymax"] == events["bytes"].max()
    assert sum(t["n"] for t in drops) == int((tele["event"] == "drop").sum())
    timeouts = pd.read_parquet(made.run / "timeouts.parquet")
    marked = [t for t in traces if t["meta"].get("timeouts")]
    assert sum(t["n"] for t in marked) == len(timeouts)
    words = _verdict_words(json.loads((made.run / "summary.json").read_text()))
    fidelity = page.page.inner_text("#fidelity")
    assert all(w in fidelity for w in words), fidelity
    assert "[workload]" in page.page.inner_text("#scenario")


@needs_root
@pytest.mark.network
def test_each_blocks_timeouts_and_causes_are_those_incast_explain_found(made, opened):
    page = opened(made.run / "report.html")
    page.assert_clean()
    bars = page.graphs()["block-graph"]
    blocks = pd.read_parquet(made.run / "blocks.parquet")
    timeouts = pd.read_parquet(made.run / "timeouts.parquet")
    measured = timeouts[timeouts["block"] >= 0]
    assert sum(t["n"] for t in bars) == sum(t["meta"]["blocks"] for t in bars) == len(blocks)
    assert sum(sum(t["meta"]["timeouts"]) for t in bars) == len(measured)
    decided = measured[measured["decided_block"]].groupby(["rep", "block"]).size()
    assert sum(t["n"] for t in bars if t["name"].startswith("decided by a timeout")) == len(decided)
    causes = {t["name"].split(": ", 1)[1].replace(" ", "_") for t in bars if t["name"].startswith("decided")}
    assert causes <= set(measured.loc[measured["decided_block"], "cause"].astype(str))
    # Before incast explain, the page computed the same timeouts from the capture.
    assert made.computed is not None
    assert sorted(zip(made.computed["server"], made.computed["cause"].astype(str))) == \
        sorted(zip(timeouts["server"], timeouts["cause"].astype(str)))
    assert "computed from the capture" in (made.root / "before-explain.html").read_text()


@needs_root
@pytest.mark.network
def test_a_large_trace_is_drawn_as_its_envelope_with_every_peak(made, opened):
    page = opened(made.root / "reduced.html")
    page.assert_clean()
    tele = _occupancy(made.run)
    summary = json.loads((made.run / "summary.json").read_text())
    [bottleneck] = [t for t in page.graphs()["queue-graph"]
                    if t["meta"].get("port") == summary["bottleneck_port"] and not t["meta"].get("drops")]
    events = tele[(tele["port"] == summary["bottleneck_port"]) & (tele["queue"] == bottleneck["meta"]["queue"])
                  & (tele["event"] != "drop")]
    assert len(events) > REDUCED_MAX, "the run was too small to need an envelope"
    assert bottleneck["meta"]["bin_us"] > 0 and bottleneck["n"] <= REDUCED_MAX < bottleneck["meta"]["events"]
    assert bottleneck["meta"]["events"] == len(events)
    assert bottleneck["ymax"] == events["bytes"].max() and bottleneck["ymin"] == events["bytes"].min()
    peak_times = events.loc[events["bytes"] == events["bytes"].max(), "time_us"] / 1000
    assert np.isclose(peak_times, bottleneck["x_at_ymax"]).any()
    assert "lowest and its highest" in page.page.inner_text("#queues")


@needs_root
@pytest.mark.network
def test_the_sweep_page_links_every_point_to_its_runs_page(made, opened):
    page = opened(made.sweep / "report.html")
    page.assert_clean()
    table = pd.read_parquet(made.sweep / "sweep.parquet")
    traces = page.graphs()["sweep-graph"]
    runs = [t for t in traces if t["meta"].get("role") == "runs"]
    assert sum(t["n"] for t in runs) == int(table["goodput_mbps"].notna().sum())
    for t in runs:
        for row, link, symbol in zip(t["meta"]["rows"], t["customdata"], t["symbols"]):
            hollow = table.loc[row, "fidelity_ok"] == False  # noqa: E712
            assert symbol == ("circle-open" if hollow else "circle")
            assert link and (made.sweep / urllib.parse.unquote(link)).is_file(), link
    hrefs = page.page.eval_on_selector_all("#runs a", "as => as.map(a => a.getAttribute('href'))")
    assert len(hrefs) == len(table)
    for href in hrefs:
        assert (made.sweep / urllib.parse.unquote(href)).resolve().is_file(), href
    # A click on a marker opens that run's page, which works offline too.
    box = page.page.locator("#sweep-graph .scatterlayer .trace .points path").first.bounding_box()
    with page.page.expect_navigation():
        page.page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    assert page.page.url.endswith("/report.html") and "/runs/" in page.page.url
    page.goto(Path(urllib.parse.unquote(urllib.parse.urlparse(page.page.url).path)))
    page.assert_clean()
    assert "No telemetry in this run" in page.page.inner_text("#queues")
    assert any(w in page.page.inner_text("#fidelity") for w in ("Faithful", "NOT FAITHFUL"))
