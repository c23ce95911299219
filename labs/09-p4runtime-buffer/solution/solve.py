"""Lab 9's reference solution: the run of step 1, the finished client of step 3
(solution/p4rt_buffer.py) taking the switch over half-way through it, and what the
run's tables say before and after the change (by the rules check.py applies).

    python3 labs/09-p4runtime-buffer/solution/solve.py OUT_DIR   (writes OUT_DIR/answers.toml)
"""
import subprocess
import sys
import time
from pathlib import Path

from incast.machine import resources
from incast.machine.resources import STATE_DIR

CLIENT = Path(__file__).resolve().parent / "p4rt_buffer.py"
RUN = ["--switch", "bmv2", "--link-rate", "10Mbit", "--buffer", "16KiB", "--rto-min", "200ms", "--cc", "reno",
       "--telemetry", "--telemetry-sample", "above:8KiB", "--capture"]
START_S = 300           # for the run's switch to appear (a 2-core VM builds it in seconds)


def run_token(proc, deadline: float) -> str:
    """The token of the run whose process is proc (its state file in /run/incast)."""
    while time.monotonic() < deadline and proc.poll() is None:
        token = resources.token_of(proc.pid)
        if token:
            return token
        time.sleep(0.1)
    raise RuntimeError(f"the run made no state file in {STATE_DIR} (exit {proc.poll()})")


def wait_for(path: Path, proc, deadline: float) -> None:
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear (the run's exit: {proc.poll()})")
        time.sleep(0.1)


def peaks(client_log: Path) -> dict:
    """The client's occupancy peaks before and after the change, from what it printed
    (its last word on each)."""
    out = {}
    for line in client_log.read_text().splitlines():
        for side in ("before", "after"):
            if f"occupancy peak {side} the change:" in line:
                out[f"occupancy_peak_{side}_bytes"] = int(line.split(":")[-1].split()[0])
    return out


def solve(out: Path, blocks: int = 60, senders: int = 8, sru: int = 32768, warmup: int = 2,
          limit: int = 262144) -> dict:
    from incast.dataplane import bmv2
    out.mkdir(parents=True, exist_ok=True)
    run = out / "run"
    p4info = bmv2.compile_program().parent / bmv2.P4INFO_NAME
    with open(out / "run.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "incast", "run", *RUN, "--senders", str(senders), "--sru",
                                 str(sru), "--blocks", str(blocks), "--warmup", str(warmup), "--json", "--out",
                                 str(run)], stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + START_S
            socket = STATE_DIR / f"{run_token(proc, deadline)}-s1.grpc"
            wait_for(socket, proc, deadline)
            # Half-way: the warm-up and half the measured blocks' data through the
            # client's port (its frames' headers make it come a little earlier).
            after = (warmup + blocks // 2) * senders * sru
            client = subprocess.run([sys.executable, str(CLIENT), "--switch", f"unix:{socket}", "--p4info",
                                     str(p4info), "--after-bytes", str(after), "--limit", str(limit)],
                                    capture_output=True, text=True)
            (out / "client.log").write_text(client.stdout + client.stderr)
        finally:
            proc.wait()
    if proc.returncode or client.returncode:
        raise RuntimeError(f"the run exited {proc.returncode} (see {out / 'run.log'}), the client "
                           f"{client.returncode}: {client.stderr.strip()[-1000:]}")
    from incast import labs
    check = labs.get(9).module("check")
    _, block, _, _ = check.change_of(run)
    sides = check.before_after(run, block)
    return {"run_dir": str(run), "change_block": block,
            "goodput_before_mbps": round(sides["goodput_before_mbps"], 3),
            "goodput_after_mbps": round(sides["goodput_after_mbps"], 3),
            "timeouts_before": sides["timeouts_before"], "timeouts_after": sides["timeouts_after"],
            **peaks(out / "client.log"),
            "why_peak_before": "the switch admits a packet only if the queue stays within its limit and "
                               "drops it otherwise, so the queue never held more than the old limit",
            "why_higher_election_id": "a P4Runtime switch accepts writes only from its primary, the "
                                      "client with the highest election id; the testbed's controller "
                                      "bids 10, so ours had to bid more to take over"}


if __name__ == "__main__":
    from incast.labs import solution_main
    solution_main(solve)
