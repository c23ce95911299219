"""Teaching labs: `incast lab list`, `incast lab check N [ANSWERS]`, `incast lab starter N [DIR]`.

Each lab is a folder in labs/ (``NN-name``): ``README.md``, the handout (goal, what it
needs and how long it takes, background, steps with the exact commands, questions,
what to hand in), ``answers.toml`` (the starter the student fills in), ``solution/``
(the reference: ``solve.py`` runs the steps and writes the answers a correct student
would give) and ``check.py``, whose ``check(answers, lab)`` returns the problems it
finds, each saying what is wrong and where to look. The checker reads the runs the
student made (their directories are answers too), so it checks the student's own
measurements, not numbers copied from somewhere.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from incast.constants import LABS_DIR
from incast.dataplane.bmv2 import tool
from incast.errors import BadInput, MissingFeature
from incast.measure.results import single_threaded_arrow
from incast.p4 import program as p4program


class LabError(BadInput):
    """Bad input (exit 2), as the CLI reports scenario errors."""


@dataclass
class Lab:
    number: int
    name: str
    path: Path

    @property
    def title(self) -> str:
        first = (self.path / "README.md").read_text().splitlines()[0].lstrip("# ").strip()
        return first.split(": ", 1)[1] if first.startswith("Lab ") and ": " in first else first

    def module(self, name: str):
        spec = importlib.util.spec_from_file_location(f"incast_lab_{self.number}_{name}", self.path / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    def needs(self) -> list[str]:
        """What the lab needs that this machine lacks (check.py's NEEDS)."""
        return list(getattr(self.module("check"), "missing", lambda: [])())


def known() -> list[Lab]:
    labs = []
    for p in sorted(LABS_DIR.glob("[0-9][0-9]-*")):
        if (p / "check.py").is_file():
            labs.append(Lab(int(p.name[:2]), p.name[3:], p))
    return labs


def get(number: int) -> Lab:
    for lab in known():
        if lab.number == number:
            return lab
    raise LabError(f"no lab {number} (incast lab list: {', '.join(str(x.number) for x in known())})")


def load_answers(path: Path) -> dict:
    if not path.is_file():
        raise LabError(f"{path}: no such answers file (copy the lab's answers.toml and fill it in)")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise LabError(f"{path}: not valid TOML: {e}") from None


def check(lab: Lab, answers: dict) -> list[str]:
    """The problems with a student's answers (empty: all correct)."""
    return list(lab.module("check").check(answers, lab.path))


# A lab's region in a Python file of its solution/: the code the student writes, with
# a hint and a stub that runs (and fails saying what is missing); the starter has the
# hint as a TODO and the stub in its place. As p4src/incast.p4's regions (p4program).
_PY_REGION = re.compile(r"^(?P<indent>[ \t]*)# lab (?P<lab>\d+) begin: (?P<hint>.*?)\n"
                        r"[ \t]*# lab (?P=lab) stub: (?P<stub>[^\n]*)\n"
                        r"(?P<body>.*?)"
                        r"^[ \t]*# lab (?P=lab) end\n", re.M | re.S)


def python_starter(lab: int, text: str) -> str:
    """A solution's Python file with lab's regions replaced by a TODO and the stub."""
    def replace(m):
        if int(m["lab"]) != lab:
            return m["body"]
        ind = m["indent"]
        hint = " ".join(re.sub(r"\n[ \t]*#", " ", m["hint"]).split())
        lines = textwrap.wrap(f"TODO (lab {lab}): {hint}", 88 - len(ind) - 2)
        return "".join(f"{ind}# {line}\n" for line in lines) + f"{ind}{m['stub'].strip()}\n"
    out = _PY_REGION.sub(replace, text)
    if out == text:
        raise ValueError(f"no region for lab {lab}")
    return out


def starter_files(lab: Lab) -> dict[str, str]:
    """What `incast lab starter` writes: file name -> text. incast.p4 where the program
    has the lab's regions; each Python file of the solution that has some."""
    files = {}
    try:
        files["incast.p4"] = p4program.lab_starter(lab.number)
    except ValueError:
        pass
    for src in sorted((lab.path / "solution").glob("*.py")):
        try:
            files[src.name] = python_starter(lab.number, src.read_text())
        except ValueError:
            continue
    return files


def cmd_lab(args) -> int:
    if args.action == "starter":
        lab = get(args.number) if args.number is not None else None
        if lab is None:
            raise LabError("incast lab starter N [DIR]: which lab?")
        files = starter_files(lab)
        if not files:
            raise LabError(f"lab {lab.number} has no program to write: its handout says what to make")
        out = Path(args.answers or ".")
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (out / name).write_text(text)
            print(f"{out / name}: lab {lab.number}'s parts to write marked TODO (lab {lab.number})")
        return 0
    if args.action == "list":
        for lab in known():
            why = lab.needs()
            print(f"{lab.number:2}  {lab.title}" + (f"  (needs: {'; '.join(why)})" if why else ""))
        return 0
    if args.number is None:
        raise LabError("incast lab check N [ANSWERS]: which lab?")
    lab = get(args.number)
    why = lab.needs()
    if why:
        raise MissingFeature(f"lab {lab.number}: " + "; ".join(why))
    answers = load_answers(Path(args.answers) if args.answers else Path.cwd() / "answers.toml")
    problems = check(lab, answers)
    if not problems:
        print(f"lab {lab.number} ({lab.title}): every answer checks out")
        return 0
    print(f"lab {lab.number} ({lab.title}): {len(problems)} problem{'s' if len(problems) > 1 else ''}")
    for p in problems:
        print(f"  - {p}")
    return 1


# Helpers the labs' checkers share.

def run_dir(answers: dict, key: str, problems: list[str]) -> Path | None:
    """The run (or sweep) directory an answer names, if it is a finished one."""
    value = answers.get(key)
    if not value:
        problems.append(f"{key}: empty; give the directory your run wrote (its --out)")
        return None
    p = Path(value)
    if not ((p / "summary.json").is_file() or (p / "sweep.parquet").is_file()):
        problems.append(f"{key}: {value} is not a finished run or sweep directory (no summary.json "
                        "or sweep.parquet); did the run end?")
        return None
    return p


def close(answer, truth: float, rel: float = 0.02, absolute: float = 0.0) -> bool:
    try:
        a = float(answer)
    except (TypeError, ValueError):
        return False
    return abs(a - truth) <= max(abs(truth) * rel, absolute)


def sweep_table(answers: dict, column: str, values: list[str], problems: list[str]):
    """The table of the sweep an answer (sweep_dir) names, if it varies `column` over
    at least `values`; else None with the problem said."""
    sweep = run_dir(answers, "sweep_dir", problems)
    if sweep is None:
        return None
    t = pd.read_parquet(sweep / "sweep.parquet")
    if column not in t or not set(values) <= set(t[column].astype(str)):
        problems.append(f"sweep_dir: the sweep must vary {column} over {', '.join(values)} "
                        f"(--grid {column}={','.join(values)})")
        return None
    return t


def onset_and_goodput(answers: dict, rows, suffix: str, what: str, problems: list[str]) -> None:
    """Check measured_onset_<suffix> (the fewest servers whose run dropped at the
    bottleneck) and goodput_16_<suffix> against a sweep's rows for one setting."""
    rows = rows.sort_values("senders")
    dropping = rows[rows["bottleneck_drops"] > 0]
    key = f"measured_onset_{suffix}"
    if not len(dropping):
        problems.append(f"{key}: no run of your sweep dropped {what}; add more servers")
    elif answers.get(key) != int(dropping["senders"].iloc[0]):
        problems.append(f"{key}: {answers.get(key)} is not the fewest servers with bottleneck_drops > 0 "
                        f"in your sweep {what}")
    at16 = rows[rows["senders"] == 16]["goodput_mbps"]
    key = f"goodput_16_{suffix}"
    if not len(at16):
        problems.append(f"{key}: your sweep has no 16-server run")
    elif not close(answers.get(key), float(at16.mean())):
        problems.append(f"{key}: {answers.get(key)} is not your sweep's goodput_mbps at 16 servers {what}")


def sentence(answers: dict, key: str, words: tuple[str, ...], hint: str, problems: list[str]) -> None:
    """A one-sentence answer: long enough, and touching what it must."""
    text = str(answers.get(key, "")).lower()
    if len(text) < 20 or not any(w in text for w in words):
        problems.append(f"{key}: {hint}")


def p4_missing() -> list[str]:
    """What a P4 lab needs that this machine lacks."""
    return [f"{t} (scripts/install-p4.sh; the Vagrant box has them)" for t in ("p4c-bm2-ss", "simple_switch")
            if not tool(t) and not shutil.which(t)]


def p4_program(answers: dict, lab: int, written: str) -> tuple[Path | None, list[str]]:
    """The student's program from answers["program"], and whether the lab's parts are
    still the starter's stubs (`written`: a fragment the real code has)."""
    program = Path(str(answers.get("program", "")))
    if not answers.get("program") or not program.is_file():
        return None, [f"program: {answers.get('program')!r} is not a file; give the path of your incast.p4 "
                      f"(incast lab starter {lab} DIR writes one)"]
    text = program.read_text()
    if f"TODO (lab {lab})" in text and written not in text:
        return program, [f"program: lab {lab}'s parts are still the starter's stubs"]
    return program, []


def p4_packet_tests(program: Path, tests: str) -> list[str]:
    """Compile `program` and run the packet tests selected by `tests` (pytest -k) of
    tests/test_p4_switch.py against it: what fails, in the tests' own words."""
    repo = LABS_DIR.parent
    if not (repo / "tests" / "test_p4_switch.py").is_file():
        return ["program: the packet tests (tests/test_p4_switch.py) come with the testbed's checkout, not with "
                "the installed package: run incast lab check from a checkout"]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_p4_switch.py",
                        "-k", tests], cwd=repo, capture_output=True, text=True,
                       env={**os.environ, "INCAST_P4_PROGRAM": str(program.resolve()),
                            "COLUMNS": "400"})   # the summary lines whole, not cut at 80
    out = r.stdout + r.stderr
    if "p4c failed" in out:
        err = re.search(r"p4c failed on [^:]+: (.*)", out)
        return [f"program: p4c cannot compile it: {err.group(1)[:300] if err else 'see p4c'}"]
    problems = [f"program: the packet test {m.group(1)} fails: {(m.group(2) or '')[:200]}"
                for m in re.finditer(r"FAILED tests/test_p4_switch.py::(\w+)(?: - (.*))?", out)]
    if r.returncode not in (0, 1) or " skipped" in out and " passed" not in out:
        problems.append(f"program: the packet tests did not run: {out.strip().splitlines()[-1][:200]}")
    return problems


def solution_main(solve) -> None:
    """A lab's solve.py as a command: solve.py OUT_DIR writes OUT_DIR/answers.toml."""
    single_threaded_arrow()     # solve() reads tables; the script must exit cleanly
    out = Path(sys.argv[1])
    answers = solve(out)
    (out / "answers.toml").write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in answers.items()))
    print(out / "answers.toml")
