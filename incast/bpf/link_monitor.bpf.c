// SPDX-License-Identifier: GPL-2.0
/* The link monitor's kernel side: how well the emulated links hold their rate.
 *
 *   qdisc:qdisc_dequeue        at every watched root qdisc: the time between two
 *                              dequeues while the queue stayed backlogged, and the
 *                              bytes that left, give the rate the link was served at
 *                              while it had work (what a real port does at line rate)
 *   timer:hrtimer_expire_entry for the qdisc watchdogs of watched links: how late the
 *                              timer that releases the next frame fired
 *
 * The first `skip_first` dequeues of each backlogged stretch are left out of the busy
 * time: a token bucket that filled while the link was idle sends them back to back,
 * which would hide a link that cannot keep up behind a burst. Aggregates only (see
 * link_monitor.h); the loader reads the maps when the experiment ends.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "link_monitor.h"

#define MAX_BULK 16

char LICENSE[] SEC("license") = "GPL";

const volatile __u32 skip_first = 4;
const volatile __u64 watchdog_fn = 0;   /* address of qdisc_watchdog() (kallsyms) */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LM_MAX_LINKS);
	__type(key, struct lm_watch_key);
	__type(value, __u32);
} watch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LM_MAX_LINKS);
	__type(key, __u32);
	__type(value, struct lm_link);
} links SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct lm_watchdog);
} watchdog SEC(".maps");

static __always_inline __u32 hist_index(__u64 v)
{
	if (v < (1 << LM_SUB_BITS))
		return v;
	__u32 msb = 0;
	__u64 x = v;
	if (x >> 32) { msb += 32; x >>= 32; }
	if (x >> 16) { msb += 16; x >>= 16; }
	if (x >> 8) { msb += 8; x >>= 8; }
	if (x >> 4) { msb += 4; x >>= 4; }
	if (x >> 2) { msb += 2; x >>= 2; }
	if (x >> 1) { msb += 1; }
	__u32 sub = (v >> (msb - LM_SUB_BITS)) & ((1 << LM_SUB_BITS) - 1);
	__u32 idx = (msb - LM_SUB_BITS + 1) * (1 << LM_SUB_BITS) + sub;
	return idx < LM_HIST_BUCKETS ? idx : LM_HIST_BUCKETS - 1;
}

static __always_inline __u32 *watched(struct net_device *dev)
{
	if (!dev)
		return NULL;
	struct lm_watch_key k = {
		.netns = BPF_CORE_READ(dev, nd_net.net, ns.inum),
		.ifindex = BPF_CORE_READ(dev, ifindex),
	};
	return bpf_map_lookup_elem(&watch, &k);
}

SEC("tp_btf/qdisc_dequeue")
int BPF_PROG(on_dequeue, struct Qdisc *q, const struct netdev_queue *txq, int packets,
	     struct sk_buff *skb)
{
	if (!txq || !skb || packets <= 0)
		return 0;
	__u32 *idx = watched(BPF_CORE_READ(txq, dev));
	if (!idx)
		return 0;
	struct lm_link *st = bpf_map_lookup_elem(&links, idx);
	if (!st)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u64 bytes = 0;
	struct sk_buff *s = skb;
	for (int i = 0; i < MAX_BULK; i++) {
		if (!s || i >= packets)
			break;
		bytes += BPF_CORE_READ(s, len);
		s = BPF_CORE_READ(s, next);
	}
	/* Dequeues of one qdisc are serialized by the kernel (qdisc_run_begin): one
	 * writer per link, plain updates suffice. */
	if (st->last_ts && st->last_qlen > 0) {
		st->run += 1;
		if (st->run > skip_first) {
			__u64 gap = now - st->last_ts;
			st->busy_ns += gap;
			st->busy_packets += packets;
			st->busy_bytes += bytes;
			__u32 b = hist_index(gap);
			if (b < LM_HIST_BUCKETS)
				st->gap_hist[b] += 1;
		}
	} else {
		st->run = 0;
	}
	st->dequeues += 1;
	st->packets += packets;
	st->bytes += bytes;
	st->last_ts = now;
	st->last_qlen = BPF_CORE_READ(q, q.qlen);
	return 0;
}

SEC("tp_btf/hrtimer_expire_entry")
int BPF_PROG(on_hrtimer, struct hrtimer *t, ktime_t *now)
{
	if (!watchdog_fn || (__u64)BPF_CORE_READ(t, function) != watchdog_fn)
		return 0;
	struct qdisc_watchdog *wd = (struct qdisc_watchdog *)t;
	struct Qdisc *q = BPF_CORE_READ(wd, qdisc);
	if (!q || !watched(BPF_CORE_READ(q, dev_queue, dev)))
		return 0;
	__s64 fired = 0;
	bpf_probe_read_kernel(&fired, sizeof(fired), now);
	__s64 late = fired - BPF_CORE_READ(t, _softexpires);
	if (late < 0)
		late = 0;
	__u32 zero = 0;
	struct lm_watchdog *w = bpf_map_lookup_elem(&watchdog, &zero);
	if (!w)
		return 0;
	w->fired += 1;
	w->late_ns_sum += late;
	if ((__u64)late > w->late_ns_max)
		w->late_ns_max = late;
	__u32 b = hist_index(late);
	if (b < LM_HIST_BUCKETS)
		w->late_hist[b] += 1;
	return 0;
}
