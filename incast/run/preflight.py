"""Before anything is built: does this machine have what the scenario needs?

The hosts' needs are checked here; the data plane and the workload say their own
(``require()`` of each), so a new one brings its checks along.
"""
from __future__ import annotations

from incast import clock as clocks
from incast import dataplane, vm, workload
from incast.errors import MissingFeature
from incast.machine.probe import Features
from incast.vm import guest


def require(features: Features, scenario) -> list[str]:
    """Raise MissingFeature naming what the scenario needs and the machine lacks: the
    hosts' needs here, the data plane's and the workload's from their own require().

    Returns notes worth telling the user (e.g. rto_min rounding)."""
    notes = dataplane.get(scenario.dataplane).require(features, scenario)
    notes += workload.get(scenario.workload.kind).require(features, scenario)
    if not features.qdiscs.get("tbf"):
        raise MissingFeature("the kernel lacks the tbf qdisc (CONFIG_NET_SCH_TBF), which paces every host's NIC")
    if scenario.link.needs_netem and not features.qdiscs.get("netem"):
        raise MissingFeature("link.delay/jitter/loss need the netem qdisc, which this kernel lacks (CONFIG_NET_SCH_NETEM)")
    for label, t in scenario.tcp.all_settings():
        if t.cc not in features.cc_available:
            raise MissingFeature(f"{label}.cc {t.cc!r} is not available in this kernel "
                                 f"(available: {' '.join(features.cc_available)})")
        if (t.hrtimer_rto or t.rto_random_pct or t.delack_us) and not features.hrtimer_rto:
            raise MissingFeature(f"{label}: hrtimer_rto/rto_random_pct/delack_us need the hrtimer kernel "
                                 "(kernels/; run with --kernel hrtimer)")
        rto = t.rto_min
        if rto != "min" and not features.hrtimer_rto:
            if not features.rto_min_us_sysctl and rto % 1000:
                raise MissingFeature(f"{label}.rto_min below ms resolution needs net.ipv4.tcp_rto_min_us "
                                     "(Linux >= 6.11)")
            floor = features.effective_rto_floor_us(rto)
            if floor != rto:
                notes.append(f"{label}.rto_min {rto} us is rounded by HZ={features.hz} timers to {floor} us")
    return notes


def host_missing(scenario) -> list[str]:
    """What this machine lacks before the scenario can start, as reasons (empty: it can
    start here), asked without a kernel to probe: the guest kernel and its runner where
    the scenario runs in one, and the data plane's tools. require() asks the rest of
    the kernel the run is on."""
    why = []
    if scenario.kernel != "host":
        clock = clocks.named(scenario.clock)
        runner = vm.runner(clock)
        if runner.missing():
            why.append(runner.missing())
        variant = runner.variant(scenario.kernel)
        if guest.kernel_dir(variant) is None:
            why.append(f"the {variant} kernel is not built for the current inputs: run {clock.guest_build_hint}")
    plane = dataplane.get(scenario.dataplane).host_missing(scenario)
    if plane:
        why.append(plane)
    return why
