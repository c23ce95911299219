"""The ``incast`` command line.

Exit status: 0 success, 2 bad input (one line on stderr, nothing created),
3 the machine lacks a feature the scenario needs, 1 the run failed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from tqdm import tqdm

from incast import constants
from incast import scenario as scn
from incast.campaign.make import cmd_figure
from incast.errors import EXIT_FAILED, EXIT_INTERRUPTED, IncastError, MissingFeature, RunFailed, UsageError
from incast.labs import cmd_lab
from incast.machine.probe import probe
from incast.measure.calibration import CACHE_DIR as CALIBRATION_DIR
from incast.machine.resources import cleanup_all
from incast.measure.results import one_line, single_threaded_arrow
from incast.pages.catalog import cmd_catalog
from incast.registry import DATAPLANES, WORKLOADS
from incast.report.explain import cmd_explain
from incast.report.html import cmd_report
from incast.report.plots import cmd_compare, cmd_telemetry, plot_sweep_dir
from incast.run import calibrate, sweep
from incast.run.experiment import run
from incast.run.phases import block_lines
from incast.run.points import Store, default_store
from incast.vm import guest

# (flag, scenario field, help). Values are validated by the scenario model, not here.
RUN_FLAGS = [
    ("--senders", "senders", "servers answering each block (N)"),
    ("--testbed", "testbed", "a paper's testbed as a profile beneath the other settings, e.g. sigcomm09-s50 "
                             "(testbeds/)"),
    ("--workload", "workload", "; ".join(f"{k}: {e.help}" for k, e in WORKLOADS.items())),
    ("--sru", "sru", "bytes per server per block, e.g. 256KiB (fixed-fragment, memcached)"),
    ("--block", "block", "bytes per block split over the servers, e.g. 1MiB (fixed-block)"),
    ("--blocks", "blocks", "measured blocks per repetition"),
    ("--warmup", "warmup", "unmeasured blocks before them"),
    ("--repetitions", "repetitions", "repetitions of the measurement"),
    ("--seed", "seed", "seed of the request order"),
    ("--link-rate", "link_rate", "rate of every link, e.g. 1Gbit"),
    ("--delay", "delay", "one-way delay at each host's egress (needs netem)"),
    ("--buffer", "buffer", "egress buffer per switch port, e.g. 32KiB"),
    ("--buffer-packets", "buffer_packets", "egress buffer per switch port in packets"),
    ("--qos-queues", "qos_queues", "class queues per port splitting the buffer (1-8)"),
    ("--sender-class", "sender_class", "class of all servers, or [0,1,...] cycled"),
    ("--rto-min", "rto_min", "TCP minimum RTO, e.g. 200ms, 200us, or 'min'"),
    ("--cc", "cc", "TCP congestion control, e.g. reno, cubic"),
    ("--delayed-ack", "delayed_ack", "on | off"),
    ("--sack", "sack", "on | off"),
    ("--dupack-threshold", "dupack_threshold", "duplicate ACKs before fast retransmit"),
    ("--initcwnd", "initcwnd", "initial congestion window, segments"),
    ("--switch", "switch", "data plane: " + ", ".join(f"{n} ({e.help})" for n, e in DATAPLANES.items())),
    ("--kernel", "kernel", "host (this machine's), or stock|hrtimer: inside a VM (kernels/build.sh)"),
    ("--clock", "clock", "real, or virtual: inside User-Mode Linux in virtual time (needs --kernel stock|hrtimer)"),
    ("--rto-random-pct", "rto_random_pct", "hrtimer kernel: RTO + rand(pct)*RTO"),
    ("--delack-us", "delack_us", "hrtimer kernel: delayed-ACK timeout in us"),
    ("--pause", "pause", "802.3x PAUSE from the switch: on | off (bmv2; linux: in virtual time)"),
    ("--ecn-threshold", "ecn_threshold", "mark CE above this many bytes per class queue, e.g. 16KiB"),
    ("--ecn", "ecn", "hosts negotiate ECN: on | off (dctcp does anyway)"),
    ("--xoff", "xoff", "PAUSE when a port holds more than this, e.g. 16KiB"),
    ("--xon", "xon", "resume below this"),
    ("--telemetry-sample", "telemetry_sample", "all | 1/N | change:SIZE | above:SIZE (bmv2)"),
]


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(f"{self.prog}: {message}")


def _add_scenario_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario_file", nargs="?", help="scenario TOML file (flags override it)")
    for flag, field, help_ in RUN_FLAGS:
        p.add_argument(flag, dest=f"f_{field}", metavar="V", help=help_)
    p.add_argument("--telemetry", action="store_true", help="record per-packet queue telemetry")
    p.add_argument("--capture", action="store_true",
                   help="capture packet headers at every server's NIC (what incast explain reads)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="set any scenario field, e.g. switch.qos.weights=[2,1]")


def _add_campaign_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", type=int, metavar="N",
                   help="points at once (default: one per core where all are in virtual time, else 1)")
    p.add_argument("--force-jobs", action="store_true",
                   help="allow --jobs > 1 for real-time points (each run's fidelity records the others)")
    p.add_argument("--executor", metavar="WHERE",
                   help="local (default), dask://HOST:PORT or a Dask scheduler file: where points run")
    p.add_argument("--batch", type=int, metavar="N",
                   help="points a guest runs, booted once, at most (default 10; 1: a guest each point, "
                        "repeating a fresh guest's runs bit for bit)")
    p.add_argument("--fresh", action="store_true",
                   help="measure every point again, even those the point store already holds")


def scenario_from_args(args) -> tuple[dict, dict]:
    data = scn.load_file(args.scenario_file) if args.scenario_file else {}
    overrides = {}
    for _, field, _ in RUN_FLAGS:
        value = getattr(args, f"f_{field}")
        if value is not None:
            overrides[field] = value
    if args.telemetry:
        overrides["telemetry"] = "true"
    if args.capture:
        overrides["capture"] = "true"
    for item in args.set:
        if "=" not in item:
            raise scn.ScenarioError(f"--set {item!r}: expected FIELD=VALUE")
        k, v = item.split("=", 1)
        overrides[k.strip()] = v.strip()
    return data, overrides


def default_out(scenario: scn.Scenario) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("results") / f"{stamp}-{scenario.name}-n{scenario.topology.senders}"


def cmd_run(args) -> int:
    data, overrides = scenario_from_args(args)
    scenario = scn.build(data, overrides)
    out = Path(args.out) if args.out else default_out(scenario)
    if args.out and out.exists():
        raise scn.ScenarioError(f"--out {out}: exists; choose another directory")
    bar = None
    if not args.json and sys.stderr.isatty():
        bar = tqdm(total=scenario.workload.blocks * scenario.workload.repetitions, unit="block",
                   desc=scenario.describe(), leave=False, file=sys.stderr)
    def log(message):   # warnings always; the rest with -v
        if args.verbose or message.startswith("warning:"):
            print(message, file=sys.stderr, flush=True)
    progress = bar.update if bar else (block_lines(scenario) if args.verbose else None)
    calibrate.ensure(scenario, log)
    fallback = calibrate.virtual_fallback([scenario], log)
    if fallback:
        scenario = scn.build(data, {**overrides, **fallback})
    try:
        # A default name is made unique (two runs in the same second); --out is the user's.
        outcome = run(scenario, out, progress=progress, log=log, unique_out=not args.out)
    finally:
        if bar:
            bar.close()
    if args.json:
        print(json.dumps(outcome.summary))
    else:
        print(f"{one_line(outcome.summary)} -> {outcome.run_dir}")
    return 0


def cmd_sweep(args) -> int:

    if args.resume:
        if not args.out:
            raise UsageError("--resume needs --out: the sweep to continue")
        before = sweep.resume_args(Path(args.out))
        data, overrides, grid = before.get("base", {}), before.get("overrides", {}), before["grid"]
        repeat = before.get("repeat", args.repeat)
    else:
        data, overrides = scenario_from_args(args)
        file_grid = (tomllib.loads(Path(args.scenario_file).read_text()).get("sweep")
                     if args.scenario_file else None)
        grid = sweep.parse_grid(args.grid, file_grid)
        repeat = args.repeat
    points = sweep.expand(data, overrides, grid)
    out = Path(args.out) if args.out else Path("results") / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    def log(message):   # warnings, the auto rate and the store always; the rest with -v
        if args.verbose or message.startswith(("warning:", "link.rate auto")) or re.match(r"(run \d+ failed|\d+ of \d+ runs already)", message):
            tqdm.write(message, file=sys.stderr)
    calibrate.ensure(points[0][1], log)
    fallback = calibrate.virtual_fallback([p[1] for p in points], log)
    if fallback:
        overrides = {**overrides, **fallback}
        points = sweep.expand(data, overrides, grid)
    t_start = time.monotonic()
    quiet = not sys.stderr.isatty() and not args.verbose
    # A default name is made unique (two sweeps in the same second); --out is the user's.
    result = sweep.run_sweep(points, grid, repeat, out, unique=not args.out,
                             meta={"base": data, "overrides": overrides}, log=log,
                             progress=lambda runs: tqdm(total=len(runs), unit="run", file=sys.stderr, disable=quiet),
                             jobs=args.jobs, executor=args.executor, force_jobs=args.force_jobs, batch=args.batch,
                             fresh=args.fresh)
    final = result.final
    plot_sweep_dir(final, grid)
    reused = f" ({result.reused} from earlier runs)" if result.reused else ""
    print(f"{result.runs - result.failures}/{result.runs} runs{reused} in {time.monotonic() - t_start:.0f} s "
          f"-> {final}/sweep.parquet, {final}/goodput.png")
    return 1 if result.failures else 0


def cmd_cleanup(args) -> int:
    removed = cleanup_all()
    for r in removed:
        print(f"removed {r['token']}: {r['processes']} processes, {r['namespaces']} namespaces")
    store = Store()
    scratch = store.remove_stale()
    if scratch:
        print(f"removed {scratch} directories killed runs left in the point store ({store.root})")
    if not removed and not scratch:
        print("nothing to clean up")
    return 0


def flags() -> frozenset[str]:
    """Every --flag of every command, read from the parser itself (the generated
    reference pages name a field's flag)."""
    out: set[str] = set()

    def walk(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            out.update(s for s in action.option_strings if s.startswith("--"))
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)
    walk(build_parser())
    return frozenset(out)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="incast", description="TCP incast testbed")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("run", help="run one experiment")
    _add_scenario_args(p)
    p.add_argument("--out", help="results directory to create (default results/<time>-<name>)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on the last line")
    p.add_argument("-v", "--verbose", action="store_true", help="say what happens")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("sweep", help="run a grid of experiments; write a table and a plot")
    _add_scenario_args(p)
    p.add_argument("--grid", action="append", default=[], metavar="FIELD=V1,V2,...",
                   help="a sweep axis, e.g. senders=1,2,4,8 or rto_min=200ms,min")
    p.add_argument("--repeat", type=int, default=1, metavar="R",
                   help="runs per grid point (fresh network, seed+r each); the plot shows their spread")
    p.add_argument("--out", help="sweep directory to create (default results/sweep-<time>)")
    _add_campaign_args(p)
    p.add_argument("--resume", action="store_true",
                   help="continue the interrupted sweep at --out with its own arguments (finished points are kept)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("telemetry", help="plot queue occupancy of a run at its bottleneck port")
    p.add_argument("run_dir")
    p.add_argument("--port", help="switch port to plot (default: the bottleneck)")
    p.add_argument("--out", help="image file (default RUN_DIR/queue.png)")
    p.set_defaults(func=cmd_telemetry)

    p = sub.add_parser("compare", help="bars of summary fields for a few runs side by side (--blocks: their block times)")
    p.add_argument("run_dirs", nargs="+")
    p.add_argument("--field", action="append", metavar="NAME",
                   help="summary field (repeatable; default goodput_mbps), e.g. background_mbps")
    p.add_argument("--label", action="append", metavar="TEXT", help="one per run (default: directory names)")
    p.add_argument("--title", help="default: the first run's scenario name")
    p.add_argument("--blocks", action="store_true",
                   help="instead of bars: each run's block durations over time (stalls, a pause storm's window)")
    p.add_argument("--out", default="compare.png", help="image file (default compare.png)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("figure", help="list the papers' figures, or run one and compare it with the paper")
    p.add_argument("name", nargs="?", default="list", help="a figure (incast figure list), or list")
    p.add_argument("--quick", action="store_true", help="a small grid and few blocks (minutes)")
    p.add_argument("--out", help="directory to create (default results/figure-NAME-<time>)")
    p.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    p.add_argument("--repeat", type=int, metavar="R",
                   help="runs a point, each its own seed (default: the figure's; kept results take 6)")
    p.add_argument("--max-repeat", type=int, default=20, metavar="R",
                   help="runs a point may get while a claim it tests is undecided (6, 10, then 20; "
                        "default 20; the figure's own repeat turns it off)")
    _add_campaign_args(p)
    p.set_defaults(func=cmd_figure)

    p = sub.add_parser("catalog", help="make again the kept figures a changed setting or today's code dates "
                                       "(docs/figure-results, the scoreboard, the doc tables)")
    p.add_argument("names", nargs="*", metavar="NAME", help="these figures (default: those dated)")
    p.add_argument("--all", action="store_true", help="every figure")
    p.add_argument("--dry-run", action="store_true", help="say which figures, and why; make nothing")
    p.add_argument("--out", help="where the figures are made (default results/catalog-COMMIT)")
    p.add_argument("--jobs", type=int, metavar="N", help="runs at once (default: one per core)")
    p.add_argument("--executor", metavar="WHERE",
                   help="local (default), dask://HOST:PORT or a Dask scheduler file: where points run")
    p.set_defaults(func=cmd_catalog)

    p = sub.add_parser("lab", help="teaching labs: list them, or check a student's answers")
    p.add_argument("action", choices=["list", "check", "starter"],
                   help="list; check N [ANSWERS]; starter N [DIR] (a P4 lab's program to complete)")
    p.add_argument("number", nargs="?", type=int, help="the lab (incast lab list)")
    p.add_argument("answers", nargs="?", help="check: the filled-in answers.toml (default ./answers.toml); "
                   "starter: the directory to write incast.p4 in (default .)")
    p.set_defaults(func=cmd_lab)

    p = sub.add_parser("explain", help="classify every timeout of a run made with --capture (FAST'08 Table 3)")
    p.add_argument("run_dir")
    p.add_argument("--out", help="image file (default RUN_DIR/explain.png)")
    p.add_argument("--json", action="store_true", help="print the breakdown as JSON")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("report", help="an interactive HTML page of a run or a sweep (self-contained, offline)")
    p.add_argument("path", metavar="RUN_DIR|SWEEP_DIR")
    p.add_argument("--out", help="HTML file (default DIR/report.html; a sweep also writes runs/*/report.html)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("probe", help="show what this machine's kernel can do")
    p.set_defaults(func=cmd_probe)

    p = sub.add_parser("calibrate", help="find the highest link rate this machine emulates faithfully (cached)")
    p.add_argument("--force", action="store_true", help="measure again even if a calibration is cached")
    p.add_argument("--json", action="store_true", help="print the calibration as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="say what each trial run found")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("cleanup", help="remove what crashed or killed runs left behind")
    p.set_defaults(func=cmd_cleanup)

    p = sub.add_parser("setup", help="build the kernels runs boot (the UML kernels for virtual time; cached, "
                                     "keyed by their inputs)")
    p.add_argument("--vm", action="store_true", help="also the QEMU kernels (stock and hrtimer)")
    p.add_argument("--low-priority", action="store_true", help="compile at nice 19 (the machine is busy)")
    p.set_defaults(func=cmd_setup)

    p = sub.add_parser("paths", help="where the testbed finds what a run reads and keeps what it builds")
    p.set_defaults(func=cmd_paths)
    return ap


def cmd_setup(args) -> int:
    """kernels/build.sh, wherever the package is: a checkout or an installed wheel (its
    build script and patches are package data; its results go to the kernel cache)."""
    variants = ["--uml"] + (["--variant", "stock", "--variant", "hrtimer"] if args.vm else [])
    if not constants.KERNEL_BUILD_SH.is_file():
        raise MissingFeature(f"{constants.KERNEL_BUILD_SH} is missing: this installation carries no kernel sources")
    # One build.sh --print-dir a kernel family (the UML pair, the VM pair): each call
    # hashes the kernel's inputs.
    built = guest.kernel_dir("uml-stock", "uml-hrtimer")
    if built and (not args.vm or guest.kernel_dir()):
        print(f"kernels: built ({built})")
        return 0
    print("kernels: building (once; 6 to 18 minutes on 2 cores, then cached)", file=sys.stderr)
    cmd = ["bash", str(constants.KERNEL_BUILD_SH), *variants] + ([] if args.low_priority else ["--normal-priority"])
    r = subprocess.run(cmd)
    if r.returncode:
        raise RunFailed(f"{' '.join(cmd)} exited with {r.returncode} (its lines above say why; Debian's "
                        "linux-source-6.12, build-essential, bc, bison, flex and ccache are what it needs)")
    print(f"kernels: built ({guest.kernel_dir('uml-stock', 'uml-hrtimer')})")
    return 0


def cmd_paths(args) -> int:
    """One line a location: the package's data, the caches, and whether each is there."""
    rows = [("package", constants.PACKAGE), ("data (hosts, topologies, figures, kernels, rtl, ...)", constants.SHARE),
            ("kernel build script", constants.KERNEL_BUILD_SH), ("UML kernels", guest.kernel_dir("uml-stock", "uml-hrtimer")),
            ("VM kernels", guest.kernel_dir()), ("rtl sources", constants.RTL_DIR), ("labs", constants.LABS_DIR),
            ("builds (p4, bpf, rtl)", constants.BUILD_DIR), ("calibration", CALIBRATION_DIR), ("point store", default_store()),
            ("documentation and kept results", constants.DOCS_DIR)]
    for what, where in rows:
        state = "not built" if where is None else "" if Path(where).exists() else "  (absent)"
        print(f"{what}: {where or ''}{state}")
    return 0


def cmd_probe(args) -> int:
    f = probe()
    for line in f.summary_lines():
        print(line)
    print(f"congestion control: available {' '.join(f.cc_available)}; allowed {' '.join(f.cc_allowed)}")
    print(f"lowest rto_min: {f.lowest_rto_min_us} us -> effective floor {f.effective_rto_floor_us(f.lowest_rto_min_us)} us")
    c = calibrate.cached()
    for line in calibrate.describe(c) if c else ["not calibrated yet: incast calibrate (under a minute)"]:
        print(line)
    return 0


def cmd_calibrate(args) -> int:
    probe()     # root, tools: fail before anything runs
    def log(message):
        if args.verbose:
            print(message, file=sys.stderr)
    if not args.json and sys.stderr.isatty() and not args.verbose:
        print("calibrating (under a minute)...", file=sys.stderr)
    c = calibrate.calibrate(log, force=args.force)
    if args.json:
        print(json.dumps(c))
    else:
        for line in calibrate.describe(c):
            print(line)
    return 0


def main(argv=None) -> int:
    single_threaded_arrow()
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except IncastError as e:    # its class says the exit status and how the line starts
        print(f"incast: {e.label}{e}", file=sys.stderr)
        if e.exit_code == EXIT_FAILED and _verbose(argv):
            raise
        return e.exit_code
    except BrokenPipeError:
        # The reader went away (`incast probe | head -1`): not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("incast: interrupted; everything the run created was removed", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # a failed run: one line, then the cause for debugging
        print(f"incast: run failed: {e}", file=sys.stderr)
        if _verbose(argv):
            raise
        return EXIT_FAILED


def _verbose(argv) -> bool:
    return "--verbose" in (argv or sys.argv) or "-v" in (argv or sys.argv)


if __name__ == "__main__":
    sys.exit(main())
