"""Kept results checked by what today's code does (incast.campaign.check): the rank-sum
test and the two looks, their false alarm shown by simulation; every full kept result
checked by fresh runs at its claims' deciding points; and a change in behaviour (a port
buffer a quarter larger, the 200 ms RTOmin halved) caught, naming the figure."""
from __future__ import annotations

import random
from math import comb

import pandas as pd
import pytest

from conftest import needs_root
from incast.campaign import check, figure, judge, kept

FIG = figure.Figure(paper="P", figure="F", caption="c", sweep="s.toml", series="rto_min", claims=[
    {"text": "recovery", "series": "200us", "at": 16, "above": 0.85},
    {"text": "gap", "series": "200ms", "at": 16, "below_series": "200us", "margin_mbps": 100}])
BOUND = 0.85 * 1000 * judge.PAYLOAD_SHARE


def table(rows):
    return pd.DataFrame([{"rto_min": s, "senders": x, "goodput_mbps": g, "link_mbps": 1000.0,
                          "fidelity_ok": True} for s, x, g in rows])


def test_the_rank_sum_p_is_exact():
    # six against six wholly apart: 2 of the C(12, 6) orderings are as extreme
    assert judge.rank_sum_p([7.0] * 1 + [8, 9, 10, 11, 12], [1, 2, 3, 4, 5, 6]) == pytest.approx(2 / comb(12, 6))
    assert judge.rank_sum_p([1, 2, 3], [1, 2, 3]) == 1.0
    # one swap: U = 1 of 36, P(U <= 1) = 2 / 924
    assert judge.rank_sum_p([6, 8, 9, 10, 11, 12], [1, 2, 3, 4, 5, 7]) == pytest.approx(4 / comb(12, 6))
    # ties count half and make it no less conservative: identical runs never differ
    assert judge.rank_sum_p([907.47] * 6, [907.47] * 20) == 1.0
    assert judge.rank_sum_p([907.5] * 6, [907.47] * 20) == pytest.approx(2 / comb(26, 6))
    # the null distribution is a distribution, symmetric about n*m/2
    pmf = judge._u_null(6, 20)
    assert pmf.sum() == pytest.approx(1.0) and list(pmf) == pytest.approx(list(pmf[::-1]))


def test_deciding_points_are_where_the_kept_verdict_is_nearest_its_bound():
    fig = figure.Figure(paper="P", figure="F", caption="c", sweep="s.toml", series="rto_min", claims=[
        {"text": "collapse", "series": "200ms", "from": 8, "below": 0.5},
        {"text": "recovery", "series": "200us", "from": 8, "above": 0.5},
        {"text": "gap", "series": "200ms", "at": 16, "below_series": "200us", "margin_mbps": 100}])
    rows = [(s, x, g + i) for s, x, g in (("200ms", 8, 300), ("200ms", 16, 100), ("200ms", 32, 50),
                                          ("200us", 8, 900), ("200us", 16, 300), ("200us", 32, 800))
            for i in range(6)]
    d = {(p.series, p.x): p.claims for p in check.deciding_points(fig, table(rows))}
    # collapse holds everywhere; 8 (300) is nearest its bound (470.7)
    # recovery fails at 16 only: that point decides it; the gap's both curves at 16
    assert d == {("200ms", 8.0): (0,), ("200us", 16.0): (1, 2), ("200ms", 16.0): (2,)}


def test_an_onset_claim_is_decided_on_each_curve_where_its_onset_is_fixed():
    """An onset claim's deciding points: on each curve, of its last point above the
    onset's bound and its first from which every point is below, the one nearer the
    bound; fresh runs there are judged against that bound. A some claim's: of the points
    that give its verdict, the one nearest its bound."""
    fig = figure.Figure(paper="P", figure="F", caption="c", sweep="s.toml", series="rto_min", claims=[
        {"text": "onset", "series": "64KiB", "onset_at_least": 2, "onset_of": "32KiB", "onset_below": 0.1},
        {"text": "up to", "series": "64KiB", "from": 1, "some": True, "below": 0.1}])
    levels = {"32KiB": {1: 940, 2: 900, 4: 60, 8: 30}, "64KiB": {1: 940, 2: 930, 4: 120, 8: 80, 16: 20}}
    levels["32KiB"][16] = 20
    rows = [(s, x, g + i) for s, lv in levels.items() for x, g in lv.items() for i in range(6)]
    t = table(rows)
    assert judge.judge(fig, t, judge.MEDIAN)[0]["verdict"] == "holds"
    d = {(p.series, p.x): p.claims for p in check.deciding_points(fig, t)}
    # 32 KiB: 2 (900) and 4 (60): 4 nearer 94.1; 64 KiB: 4 (120) and 8 (80): 8, with the
    # some claim (held at 8 and 16; 8 nearest)
    assert d == {("64KiB", 8.0): (0, 1), ("32KiB", 4.0): (0,)}
    # fresh runs at 32 KiB's 4 above the bound: that point turns
    pc = check.judge_point(fig, t, table([("32KiB", 4, 300.0 + i) for i in range(20)]),
                           check.Deciding("32KiB", 4.0, (0,)), final=True)
    assert pc.states[0] == ("holds", "does not hold") and pc.outcome == "disagrees", pc.line()


def look(kept, fresh, final, fig=FIG, claim=0):
    series = fig.claims[claim].series
    d = check.Deciding(series, 16.0, (claim,))
    return check.judge_point(fig, table([(series, 16, g) for g in kept]), table([(series, 16, g) for g in fresh]),
                             d, final)


def test_a_point_agrees_runs_more_or_disagrees():
    kept = [860, 870, 880, 890, 900, 910]
    assert look(kept, [865, 875, 885, 895, 905, 915], final=False).outcome == "agrees"
    # all six fresh runs below the kept ones (p = 0.002) and below the bound: more runs
    first = look(kept, [700, 710, 720, 730, 740, 750], final=False)
    assert first.outcome == "more" and first.states[0] == ("holds", "does not hold")
    last = look(kept, [700 + i for i in range(20)], final=True)
    assert last.outcome == "disagrees" and "differ from the kept ones" in last.why
    assert "200us at 16: kept 885.0 (n=6), fresh 709.5 (n=20)" in last.line()


VERDICT = {"holds": "holds", "fails": "does not hold", "split": "undecided"}


def fast_look(kept, fresh, final):
    """look() without the tables: the same rank-sum test, the judge's point verdict for a
    bound (what judge.judge_claim gives at one point) and the same decide()."""
    def state(runs):
        return VERDICT[judge.point_verdict(runs, lambda g: g > BOUND)]
    turned = [0] if check.opposite(state(kept), state(fresh)) else []
    return check.decide(judge.rank_sum_p(fresh, kept), turned, final)[0]


def test_the_fast_look_is_the_look():
    rng = random.Random(1)
    for _ in range(40):
        kept = [rng.gauss(BOUND + 20, 30) for _ in range(6)]
        fresh = [rng.gauss(BOUND - 10, 30) for _ in range(rng.choice((6, 20)))]
        for final in (False, True):
            assert fast_look(kept, fresh, final) == look(kept, fresh, final).outcome


def simulate(draw, kept_n, trials, seed, fresh_draw=None):
    """The check's two looks at one point, fresh runs drawn by fresh_draw (default: as
    the kept ones were, today's code running as the kept result's did): how often the
    point disagrees."""
    rng = random.Random(seed)
    fresh_draw = fresh_draw or draw
    wrong = 0
    for _ in range(trials):
        kept = [draw(rng) for _ in range(kept_n)]
        fresh = [fresh_draw(rng) for _ in range(check.FIRST_RUNS)]
        if fast_look(kept, fresh, final=False) == "more":
            fresh += [fresh_draw(rng) for _ in range(check.SECOND_RUNS - check.FIRST_RUNS)]
            wrong += fast_look(kept, fresh, final=True) == "disagrees"
    return wrong / trials


@pytest.mark.parametrize("kind", ["normal", "bimodal", "tied"])
def test_the_check_raises_a_false_alarm_rarely(kind):
    """Where today's code runs as the kept result's did, a point disagrees at most
    ALPHA (the rank-sum test) plus what the fresh runs' verdict adds: nothing where the
    point lies clear of its bound. Runs spread as the kept results' do: normal, two
    modes (a run with or without a timeout at a tipping point), or tied (lossless runs
    repeat to the bit)."""
    draw = {"normal": lambda r: r.gauss(BOUND + 60, 15.0),
            "bimodal": lambda r: r.gauss(BOUND + 80, 8.0) if r.random() < 0.7 else r.gauss(BOUND + 30, 8.0),
            "tied": lambda r: 907.47 if r.random() < 0.8 else r.gauss(880.0, 10.0)}[kind]
    trials = 20000
    rate = simulate(draw, kept_n=6, trials=trials, seed=11)
    # 20000 trials at ALPHA = 2e-4 expect at most 4 false alarms: 13 or more happen with
    # probability under 1e-3
    assert rate * trials < 13, rate


def test_a_point_on_its_bound_turns_at_most_as_the_judge_allows():
    """The worst case of the verdict's part: the runs' median exactly on the claim's
    bound, the kept runs having decided it (six all above it, as happens one time in
    64). Twenty fresh runs then decide it the other way one time in 170
    (P(Binomial(20, 1/2) <= 4) = 0.59 %)."""
    rng = random.Random(5)
    trials, wrong = 20000, 0
    kept = [BOUND + 1 + i for i in range(6)]
    for _ in range(trials):
        fresh = [rng.gauss(BOUND, 20.0) for _ in range(check.SECOND_RUNS)]
        wrong += fast_look(kept, fresh, final=True) == "disagrees" and \
            judge.point_verdict(fresh, lambda g: g > BOUND) == "fails"
    exact = sum(comb(20, k) for k in range(5)) / 2 ** 20
    assert exact == pytest.approx(0.0059, abs=1e-4)
    assert wrong / trials < 1.5 * exact, wrong / trials    # 118 expected; 177 or more: p < 1e-6


def test_a_shift_the_size_of_a_behaviour_change_is_caught():
    """Power: a point whose runs move by three times their spread (what halving the
    RTOmin does to a collapsed curve is far more) is caught nearly always."""
    rate = simulate(lambda r: r.gauss(880, 15), 6, 2000, seed=3, fresh_draw=lambda r: r.gauss(835, 15))
    assert rate > 0.8, rate


def test_a_failed_check_names_the_figure_and_the_command_that_makes_it_again():
    bad = check.PointCheck("200us", 47.0, (1,), [737.0] * 6, [850.0] * 20, 1e-6,
                           {1: ("does not hold", "holds")}, "disagrees", "the fresh runs differ")
    text = check.FigureCheck("sigcomm09-fig1", [bad]).message()
    assert text.startswith("sigcomm09-fig1: today's code does not give the kept result")
    assert "make it again: incast catalog sigcomm09-fig1 --jobs 2 (from a clean tree at a commit on main" in text


KEPT = [n for n in figure.known() if kept.full(n) is not None]


@needs_root
@pytest.mark.network
@pytest.mark.check
@pytest.mark.parametrize("name", KEPT)
def test_a_kept_result_is_what_todays_code_gives(name, check_runner, no_leftovers):
    """Fresh runs of today's code at each deciding point of the figure's full kept
    result agree with its runs there, and decide its claims as they do; where they do
    not, the test names the points and the command that makes the figure again."""
    why = figure.missing(figure.load(name))
    if why:
        pytest.skip("; ".join(why))
    r = check.check_figure(name, check_runner)
    assert not r.skipped, r.message()
    assert not r.disagrees, r.message()


def halve_200ms(s):
    """The 200 ms RTOmin halved, as a change to the code that applies it would."""
    if s.tcp.rto_min != 200_000:
        return s
    return s.model_copy(update={"tcp": s.tcp.model_copy(update={"rto_min": 100_000})})


def buffer_a_quarter_larger(s):
    return s.model_copy(update={"switch": s.switch.model_copy(update={"buffer": s.switch.buffer * 5 // 4})})


@needs_root
@pytest.mark.network
@pytest.mark.check
@pytest.mark.parametrize("change,points", [
    (halve_200ms, {("200ms", 47.0)}),
    (buffer_a_quarter_larger, None)])
def test_a_change_in_behaviour_fails_the_check(change, points, check_runner, no_leftovers):
    """SIGCOMM'09 Figure 1 with its runs changed as a change to the code would change
    them: the check disagrees, naming the figure and the points the change moved (the
    RTOmin: the collapsed 200 ms point at 47 servers, whose goodput doubles; the buffer:
    wherever it shows). The 200 ms point at 8 servers moves too, but its kept runs
    spread from 123 to 290 Mbit/s (the kept result made at 596f8aa), and 20 fresh runs
    need not part from six such at the check's alpha of 2e-4: that the change is seen
    at one point is what fails the suite."""
    name = "sigcomm09-fig1"
    why = figure.missing(figure.load(name))
    if why:
        pytest.skip("; ".join(why))
    r = check.check_figure(name, check_runner, alter=change)
    assert r.disagrees and r.message().startswith(f"{name}: today's code does not give the kept result")
    if points is not None:
        assert {(p.series, p.x) for p in r.disagrees} >= points, r.message()


def test_a_gap_between_two_curves_gets_its_second_look_on_both(monkeypatch):
    """Where only one curve of a gap claim is in doubt after six runs, both get the
    second look: judged on one curve alone the gap would be missing, and the claim turned
    (a false alarm) or untestable (a change unseen)."""
    fig = figure.Figure(paper="P", figure="F", caption="c", sweep="s.toml", series="rto_min", claims=[
        {"text": "gap", "series": "200ms", "at": 16, "below_series": "200us", "margin_mbps": 100}])
    kept_rows = [("200ms", 16, 100.0 + i) for i in range(6)] + [("200us", 16, 900.0 + i) for i in range(6)]
    asked = []

    def run(scenarios, grid, repeat, out):
        asked.append((sorted(grid["rto_min"]), repeat))
        # the 200 ms curve's fresh runs all above the kept ones (p = 0.002: more runs),
        # the 200 us curve's among them; the gap holds throughout
        return table([("200ms", 16, 110.0 + i) for i in range(repeat)] +
                     [("200us", 16, 900.0 + (i % 6)) for i in range(repeat)])
    monkeypatch.setattr(check, "fresh_points",
                        lambda f, pts, alter=None: ([], {"rto_min": sorted({d.series for d in pts})}))
    results = check.looks(fig, table(kept_rows), run)
    assert asked == [(["200ms", "200us"], 6), (["200ms", "200us"], 20)]
    assert all(r.states[0] == ("holds", "holds") for r in results), [r.line() for r in results]


def test_failed_fresh_runs_are_run_once_more_and_named_if_they_fail_again(monkeypatch):
    """A failed fresh run measured nothing: the look runs it once more (the point store
    serves the runs that finished); if every run at a point fails again, the check says
    so with the error, not that no run was faithful."""
    fig = figure.Figure(paper="P", figure="F", caption="c", sweep="s.toml", series="rto_min", claims=[
        {"text": "recovery", "series": "200us", "at": 16, "above": 0.85}])
    kept_rows = [("200us", 16, 900.0 + i) for i in range(6)]
    monkeypatch.setattr(check, "fresh_points", lambda f, pts, alter=None: ([], {"rto_min": ["200us"]}))

    def failed(repeat, error):
        t = table([("200us", 16, float("nan"))] * repeat)
        t["error"] = error
        t["fidelity_ok"] = None
        return t
    outs = []

    def flaky(scenarios, grid, repeat, out):
        outs.append(out.name)
        return failed(repeat, "RuntimeError: building the rtl switch failed") if len(outs) == 1 else \
            table([("200us", 16, 900.0 + i) for i in range(repeat)])
    (r,) = check.looks(fig, table(kept_rows), flaky)
    assert outs == ["look6", "look6-again"] and r.outcome == "agrees", (outs, r.line())

    outs.clear()
    (r,) = check.looks(fig, table(kept_rows), lambda s, g, repeat, out: outs.append(out) or failed(repeat, "boom\nOSError: x"))
    assert len(outs) == 2 and r.outcome == "not testable"
    assert r.why == "every fresh run failed: OSError: x", r.why
