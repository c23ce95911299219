/* Shared between link_monitor.bpf.c (kernel side) and link_monitor.c (loader).
 *
 * The link monitor measures, per emulated link (a root qdisc that paces a switch port
 * or a host NIC), how fast the link was served while it had a backlog, and how late
 * the kernel timers that pace the links (the qdisc watchdog hrtimers) fired. It keeps
 * aggregates in BPF maps only: nothing per packet reaches user space, so it can run in
 * every experiment.
 *
 * Histograms are log-linear over nanoseconds: values below 2^LM_SUB_BITS ns have a
 * bucket each; above, each power of two is split into 2^LM_SUB_BITS buckets (so a
 * bucket is at most 1/2^LM_SUB_BITS of its value wide). incast/fidelity.py decodes
 * them with the same scheme (bucket_bounds()).
 */
#ifndef LINK_MONITOR_H
#define LINK_MONITOR_H

#define LM_MAX_LINKS 1024
#define LM_SUB_BITS 3
#define LM_HIST_BUCKETS 320     /* covers up to 2^40 ns */

struct lm_link {
	__u64 dequeues;         /* dequeue calls that returned packets */
	__u64 packets;          /* packets dequeued */
	__u64 bytes;            /* skb->len of the packets dequeued */
	__u64 busy_ns;          /* time between dequeues while the queue stayed backlogged */
	__u64 busy_packets;     /* packets dequeued at the end of those intervals */
	__u64 busy_bytes;       /* their skb->len */
	__u64 last_ts;          /* time of the last dequeue */
	__u32 last_qlen;        /* root q.qlen after the last dequeue */
	__u32 run;              /* consecutive dequeues with a backlog behind them */
	__u64 gap_hist[LM_HIST_BUCKETS];        /* busy intervals, ns */
};

struct lm_watchdog {
	__u64 fired;            /* watchdog expiries of watched links */
	__u64 late_ns_sum;
	__u64 late_ns_max;
	__u64 late_hist[LM_HIST_BUCKETS];
};

struct lm_watch_key {
	__u32 netns;            /* inode of the device's network namespace */
	__u32 ifindex;
};

#endif
