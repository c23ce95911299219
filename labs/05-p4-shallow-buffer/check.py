"""Checks lab 5: the student's program compiles and passes the packet tests of
forwarding, class queues and byte-limit admission (incast lab check 5)."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = "forwards_to_the_learned_port or classifies_dscp or byte_limit_admission"


def missing() -> list[str]:
    from incast.dataplane.bmv2 import tool
    return [f"{t} (p4lang's packages; the Vagrant VM has them)" for t in ("p4c-bm2-ss", "simple_switch")
            if not tool(t) and not shutil.which(t)]


def check(answers: dict, lab) -> list[str]:
    problems: list[str] = []
    program = Path(str(answers.get("program", "")))
    if not answers.get("program") or not program.is_file():
        return [f"program: {answers.get('program')!r} is not a file; give the path of your incast.p4 "
                "(incast lab starter 5 DIR writes one)"]
    if "TODO (lab 5)" in program.read_text() and "occ_bytes.write" not in program.read_text():
        problems.append("program: admit() and release() are still the starter's stubs")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_p4_switch.py",
                        "-k", TESTS], cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, "INCAST_P4_PROGRAM": str(program.resolve()),
                            "COLUMNS": "400"})   # the summary lines whole, not cut at 80
    out = r.stdout + r.stderr
    if "p4c failed" in out:
        err = re.search(r"p4c failed on [^:]+: (.*)", out)
        problems.append(f"program: p4c cannot compile it: {err.group(1)[:300] if err else 'see p4c'}")
    else:
        for m in re.finditer(r"FAILED tests/test_p4_switch.py::(\w+)(?: - (.*))?", out):
            problems.append(f"program: the packet test {m.group(1)} fails: {(m.group(2) or '')[:200]}")
        if r.returncode not in (0, 1) or " skipped" in out and " passed" not in out:
            problems.append(f"program: the packet tests did not run: {out.strip().splitlines()[-1][:200]}")
    why = str(answers.get("why_count_bytes_in_p4", "")).lower()
    if len(why) < 20 or not any(w in why for w in ("packet", "byte", "frame")):
        problems.append("why_count_bytes_in_p4: what does bmv2's own queue count?")
    return problems
