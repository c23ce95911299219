"""The teaching labs: each has its parts, its starter fails its check with a helpful
message, and its reference solution passes it (network labs as root)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from conftest import incast_cmd, needs_root
from incast import labs
from incast.p4 import program as p4program

LABS = labs.known()


@pytest.mark.parametrize("lab", LABS, ids=[f"lab{x.number}" for x in LABS])
def test_every_lab_has_a_handout_a_starter_and_a_solution(lab):
    text = (lab.path / "README.md").read_text()
    for part in ("**Goal.**", "**Background.**", "**Steps.**", "**Questions**", "**Hand in**"):
        assert part in text, f"{lab.name}: the handout has no {part}"
    assert (lab.path / "solution" / "solve.py").is_file()
    starter = labs.load_answers(lab.path / "answers.toml")
    problems = labs.check(lab, starter)
    assert problems, "an empty starter must not pass"
    assert all(len(p) > 30 for p in problems), problems       # each says what to do


def test_lab_check_from_the_command_line(tmp_path):
    r = incast_cmd("lab", "check", "1", str(LABS[0].path / "answers.toml"))
    assert r.returncode == 1 and "run_dir: empty" in r.stdout
    r = incast_cmd("lab", "check", "99")
    assert r.returncode == 2 and "no lab 99" in r.stderr
    r = incast_cmd("lab", "check", "1", str(tmp_path / "missing.toml"))
    assert r.returncode == 2 and "no such answers file" in r.stderr


def test_lab_starter_writes_the_reference_with_its_regions_as_todos(tmp_path):
    """incast lab starter: lab 5's program from p4src/incast.p4's regions, lab 9's client
    from its reference's: each region a TODO and a stub; the rest as the reference."""
    r = incast_cmd("lab", "starter", "9", str(tmp_path / "nine"))
    assert r.returncode == 0, r.stderr
    reference = (labs.get(9).path / "solution" / "p4rt_buffer.py").read_text()
    starter = (tmp_path / "nine" / "p4rt_buffer.py").read_text()
    regions = reference.count("# lab 9 begin:")
    assert regions == 4 and starter.count("# TODO (lab 9):") == regions
    assert "# lab 9" not in starter and "sw.modify(" not in starter and "default=20" not in starter
    assert "e.data async for e in sw.read(" not in starter
    assert starter.count('raise NotImplementedError("TODO (lab 9)') + starter.count(
        'raise NotImplementedError(f"TODO (lab 9)') == 3
    compile(starter, "p4rt_buffer.py", "exec")
    # outside the regions, line for line the reference
    outside = [ln for ln in reference.splitlines() if ln not in starter.splitlines()]
    assert len(outside) < len(reference.splitlines()) // 5, outside
    r = incast_cmd("lab", "starter", "1", str(tmp_path / "one"))
    assert r.returncode == 2 and "no program to write" in r.stderr
    assert not (tmp_path / "one").exists()


def solver(lab):
    spec = importlib.util.spec_from_file_location(f"solve{lab.number}", lab.path / "solution" / "solve.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.solve


SMALL = {1: {}, 2: {"senders": "2,3,4,16", "blocks": 5}, 3: {"blocks": 5}, 4: {"senders": "1,2,4,16", "blocks": 5},
         9: {"blocks": 30}}


@needs_root
@pytest.mark.network
@pytest.mark.parametrize("number", [1, 2, 3, 4])
def test_the_reference_solution_passes_its_check(number, tmp_path, no_leftovers):
    lab = labs.get(number)
    answers = solver(lab)(tmp_path, **SMALL[number])
    assert labs.check(lab, answers) == []
    wrong = dict(answers)
    key = next(k for k, v in answers.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and v)
    wrong[key] = answers[key] * 3 + 7
    problems = labs.check(lab, wrong)
    assert any(p.startswith(key) for p in problems), (key, problems)


@needs_root
@pytest.mark.p4
@pytest.mark.parametrize("number, failing", [(5, "test_byte_limit_admission"), (6, "test_pause_at_xoff"),
                                             (7, "test_telemetry_above_a_threshold")])
def test_a_p4_lab_passes_with_the_program_and_fails_with_the_starter(number, failing, tmp_path):
    """A P4 lab compiles the student's program and runs the packet tests against it."""
    lab = labs.get(number)
    if lab.needs():
        pytest.skip(f"lab {number} needs " + ", ".join(lab.needs()))
    answers = solver(lab)(tmp_path / "solution")
    assert labs.check(lab, answers) == []
    starter = tmp_path / "starter" / "incast.p4"
    starter.parent.mkdir()
    starter.write_text(p4program.lab_starter(number))
    problems = labs.check(lab, {**answers, "program": str(starter)})
    assert any("still the starter's stubs" in p for p in problems), problems
    assert any(failing in p for p in problems), problems


@pytest.mark.rtl
def test_the_rtl_lab_solution_passes_its_check(tmp_path):
    """Lab 8: the reference reads the first refusal off its own waveform; an answer a
    cycle off is caught."""
    lab = labs.get(8)
    if lab.needs():
        pytest.skip(", ".join(lab.needs()))
    answers = solver(lab)(tmp_path)
    assert labs.check(lab, answers) == []
    wrong = {**answers, "first_drop_cycle": answers["first_drop_cycle"] + 1}
    assert any(p.startswith("first_drop_cycle") for p in labs.check(lab, wrong))


@needs_root
@pytest.mark.network
@pytest.mark.p4
def test_the_p4runtime_lab_solution_takes_the_switch_over_and_passes(tmp_path, no_leftovers):
    """Lab 9: the reference's client takes the running switch over and deepens the client's
    port's buffer half-way, reading the queue's occupancy register over P4Runtime; the
    run still ends well (the testbed's controller reads on as a backup and records that
    it lost the primary role), the check finds the change in the run's own tables, the
    collapse is gone after it, the occupancy the client read stayed within the old
    limit before and passed it after, and wrong answers are caught."""
    lab = labs.get(9)
    if lab.needs():
        pytest.skip("lab 9 needs " + ", ".join(lab.needs()))
    answers = solver(lab)(tmp_path, **SMALL[9])     # raises if the run or the client failed
    assert labs.check(lab, answers) == []
    summary = json.loads((Path(answers["run_dir"]) / "summary.json").read_text())
    assert summary["blocks"] == SMALL[9]["blocks"] and summary["max_queue_bytes"] > 16384, summary
    assert answers["goodput_after_mbps"] > answers["goodput_before_mbps"], answers
    assert answers["timeouts_after"] < answers["timeouts_before"], answers
    assert 0 < answers["occupancy_peak_before_bytes"] <= 16384 < answers["occupancy_peak_after_bytes"], answers
    for key, wrong in (("change_block", answers["change_block"] + 1),
                       ("occupancy_peak_before_bytes", 16385), ("occupancy_peak_before_bytes", 1),
                       ("occupancy_peak_after_bytes", 16384),
                       ("goodput_after_mbps", answers["goodput_after_mbps"] * 0.8),
                       ("timeouts_before", answers["timeouts_before"] + 1)):
        problems = labs.check(lab, {**answers, key: wrong})
        assert any(p.startswith(key) for p in problems), (key, problems)
