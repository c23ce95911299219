"""Whose TCP a profile runs (tcp.era): this kernel's as it comes ("modern"), or this
kernel turned back, per network namespace, as near as it goes to the Linux of the
papers' clusters. Each era's name and what it sets, in one place: the scenario model
takes its names from here, hostconfig applies its sysctls. Why, and what cannot be
turned back: docs/tcp-profiles.md.
"""
from __future__ import annotations

# The papers' Linux (SIGCOMM'09 ran 2.6.28) where this kernel can be turned back to it
# per network namespace: each line undoes what a later release brought (the release in
# brackets). docs/tcp-profiles.md has the table, the measurements, and what cannot be
# turned back (FACK, rate-halving, 2.6.28's F-RTO and RTT estimator, ...).
LINUX_2_6_28_SYSCTLS = {
    # No tail loss probe [3.10]: a lost tail waits for the RTO.
    "net.ipv4.tcp_early_retrans": "0",
    # No RACK [4.4], nor the early retransmit [3.5] it took over: a segment is lost
    # when tcp_reordering segments above it were SACKed.
    "net.ipv4.tcp_recovery": "0",
    # F-RTO was on in 2.6.28 too (2, the default since 2.6.24); the algorithm behind
    # the value is RFC 5682's [3.10], not 2.6.28's RFC 4138 one.
    "net.ipv4.tcp_frto": "2",
    # The receiver sends every duplicate ACK at once: no SACK compression [4.19] ...
    "net.ipv4.tcp_comp_sack_nr": "0",
    # ... and no ACK held back while a socket's backlog is processed [6.7].
    "net.ipv4.tcp_backlog_ack_defer": "0",
    # No TCP small queues [3.6]: a window goes to the NIC's queue at once. TSQ's limit is
    # the smaller of this and ~1 ms of data at the pacing rate, which the ratios [4.1]
    # raise to their most (1000%: ten windows per srtt); reno paces nothing, so nothing
    # else moves.
    "net.ipv4.tcp_limit_output_bytes": "2147483647",
    "net.ipv4.tcp_pacing_ss_ratio": "1000",
    "net.ipv4.tcp_pacing_ca_ratio": "1000",
    # No autocorking [3.14]: a write's last, short segment leaves at once.
    "net.ipv4.tcp_autocorking": "0",
    # The reordering a connection may learn stops at 2.6.28's TCP_MAX_REORDERING.
    "net.ipv4.tcp_max_reordering": "127",
    # Already this kernel's defaults, pinned: DSACK on, no linear timeouts for thin
    # streams [2.6.34].
    "net.ipv4.tcp_dsack": "1",
    "net.ipv4.tcp_thin_linear_timeouts": "0",
}
# FAST'08's Procurve cluster ran 2.6.18 SMP and WREN'09's 2.6.18.8: 2.6.28's TCP but
# for F-RTO, off by default until 2.6.24 (tcp_frto = 0: every timeout is taken as
# real, its window cut never undone). The rest that changed between the two (the
# congestion-control framework's default, cubic since 2.6.19; tcp_abc's byte counting,
# off by default in both) is set by tcp.cc or was off in both.
LINUX_2_6_18_SYSCTLS = {**LINUX_2_6_28_SYSCTLS, "net.ipv4.tcp_frto": "0"}
ERA_SYSCTLS = {"modern": {}, "linux-2.6.28": LINUX_2_6_28_SYSCTLS, "linux-2.6.18": LINUX_2_6_18_SYSCTLS}
TCP_ERAS = tuple(ERA_SYSCTLS)
# Read back from every host whatever its era, so that results show the loss-recovery
# settings a run had.
ERA_KNOBS = sorted({name for table in ERA_SYSCTLS.values() for name in table})
