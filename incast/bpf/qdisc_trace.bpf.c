// SPDX-License-Identifier: GPL-2.0
/* Per-packet queue telemetry at the emulated switch's egress qdiscs.
 *
 * Same semantics as the bpftrace program in incast/telemetry.py (BPFTRACE_PROGRAM), but
 * compiled (libbpf CO-RE) and writing fixed-size binary records (qdisc_trace.h) to a BPF
 * ring buffer, so userspace only copies bytes.
 *
 *   qdisc:qdisc_enqueue  (successful enqueue at a root qdisc)  -> 'E' record
 *   qdisc:qdisc_dequeue  (each skb of a possibly bulk chain)    -> 'D' record per skb
 *   skb:kfree_skb        (reason in drop_reasons)              -> 'X' record
 *
 * Only skbs whose device lives in the network namespace with inode netns_inode count.
 * Each probe exists twice: as a BTF raw tracepoint (tp_btf/, typed arguments read with
 * plain loads; preferred) and as a classic tracepoint (tracepoint/, reads through
 * bpf_probe_read_kernel); the loader enables one set.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include "qdisc_trace.h"

#define ETH_P_IP 0x0800

char LICENSE[] SEC("license") = "GPL";

/* Set by the loader before load (rodata). */
const volatile __u32 netns_inode = 0;
const volatile __u8 dscp_class[64] = {};
const volatile __u32 drop_reasons[QT_MAX_REASONS] = {};
const volatile __u32 n_drop_reasons = 0;
const volatile __u64 wake_bytes = 1 << 20;  /* wake the reader once this much is pending */

struct occ_key {
	__u32 ifindex;
	__u32 cls;
};

struct occ_val {
	__s64 packets;
	__s64 bytes;
};

struct skb_val {
	__u64 ts;
	__u32 len;
	__u32 cls;
};

/* Per (ifindex, class) queue occupancy; updated under the qdisc root lock. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct occ_key);
	__type(value, struct occ_val);
} occ SEC(".maps");

/* Enqueue time, length and class of each skb in a traced queue, keyed by skb address. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct skb_val);
} skbs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 << 20);      /* the loader resizes it (--ringbuf-mb) */
} rb SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, QT_NSTATS + 1);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

#define QT_STAT_SKB_UNTRACKED QT_NSTATS   /* skbs map full at enqueue (not a lost record) */

/* A field read: a plain (BTF-checked) load in tp_btf programs, a CO-RE probe read in
 * classic tracepoint programs. `btf` is a compile-time constant after inlining. */
#define LD(btf, direct, ...) ((btf) ? (direct) : BPF_CORE_READ(__VA_ARGS__))

static __always_inline void stat_add(__u32 idx, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &idx);
	if (v)
		*v += n;
}

struct pkt {
	__u32 len;
	__u32 saddr;
	__u32 daddr;
	__u32 cls;
};

/* len, IPv4 addresses and class (DSCP table; 0 if not IPv4) of skb. */
static __always_inline void parse(bool btf, struct sk_buff *skb, struct pkt *p)
{
	struct iphdr ip;
	unsigned char *head = LD(btf, skb->head, skb, head);
	__u16 nh = LD(btf, skb->network_header, skb, network_header);
	__be16 proto = LD(btf, skb->protocol, skb, protocol);

	p->len = LD(btf, skb->len, skb, len);
	p->saddr = 0;
	p->daddr = 0;
	p->cls = 0;
	if (proto != bpf_htons(ETH_P_IP))
		return;
	if (bpf_probe_read_kernel(&ip, sizeof(ip), head + nh))
		return;
	p->saddr = ip.saddr;
	p->daddr = ip.daddr;
	p->cls = dscp_class[(ip.tos >> 2) & 63];
}

static __always_inline bool in_netns(bool btf, struct net_device *dev)
{
	if (!dev)
		return false;
	return LD(btf, dev->nd_net.net->ns.inum, dev, nd_net.net, ns.inum) == netns_inode;
}

static __always_inline struct occ_val *occ_get(struct occ_key *k)
{
	struct occ_val *o = bpf_map_lookup_elem(&occ, k);
	if (o)
		return o;
	struct occ_val zero = {};
	bpf_map_update_elem(&occ, k, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&occ, k);
}

static __always_inline void emit(char kind, __u64 now, __u64 sojourn, __u32 ifindex,
				 const struct pkt *p, const struct occ_val *o,
				 __u32 qlen, __u32 backlog)
{
	struct qt_record *r = bpf_ringbuf_reserve(&rb, sizeof(*r), 0);
	if (!r) {
		stat_add(QT_STAT_RB_LOST, 1);
		return;
	}
	r->ts_ns = now;
	r->sojourn_ns = sojourn;
	r->ifindex = ifindex;
	r->packets = o ? (__s32)o->packets : 0;
	r->bytes = o ? (__s32)o->bytes : 0;
	r->port_packets = qlen;
	r->port_bytes = backlog;
	r->pkt_len = p->len;
	r->saddr = p->saddr;
	r->daddr = p->daddr;
	r->kind = kind;
	r->queue = p->cls;
	r->pad0 = 0;
	r->pad1 = 0;
	/* Wake the reader only when enough is pending: it also polls on a timer. */
	__u64 flags = bpf_ringbuf_query(&rb, BPF_RB_AVAIL_DATA) >= wake_bytes ?
		      BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
	bpf_ringbuf_submit(r, flags);
}

static __always_inline int on_enqueue(bool btf, struct Qdisc *q, struct sk_buff *skb,
				      __u32 ifindex)
{
	if (!skb || !in_netns(btf, LD(btf, skb->dev, skb, dev)))
		return 0;
	struct pkt p;
	parse(btf, skb, &p);
	struct occ_key k = { .ifindex = ifindex, .cls = p.cls };
	struct occ_val *o = occ_get(&k);
	if (!o)
		return 0;
	o->packets += 1;
	o->bytes += p.len;
	__u64 now = bpf_ktime_get_ns();
	__u64 key = (__u64)skb;
	struct skb_val sv = { .ts = now, .len = p.len, .cls = p.cls };
	if (bpf_map_update_elem(&skbs, &key, &sv, BPF_ANY))
		stat_add(QT_STAT_SKB_UNTRACKED, 1);
	emit('E', now, 0, ifindex, &p, o,
	     LD(btf, q->q.qlen, q, q.qlen), LD(btf, q->qstats.backlog, q, qstats.backlog));
	return 0;
}

static __always_inline int on_dequeue(bool btf, struct Qdisc *q, struct sk_buff *skb,
				      int packets, __u32 ifindex)
{
	if (!skb || !in_netns(btf, LD(btf, skb->dev, skb, dev)))
		return 0;
	__u32 qlen = LD(btf, q->q.qlen, q, q.qlen);
	__u32 backlog = LD(btf, q->qstats.backlog, q, qstats.backlog);
	struct sk_buff *s = skb;
	for (int i = 0; i < QT_MAX_BULK; i++) {
		if (!s || i >= packets)
			break;
		__u64 key = (__u64)s;
		struct skb_val *sv = bpf_map_lookup_elem(&skbs, &key);
		if (sv) {
			__u64 now = bpf_ktime_get_ns();
			struct pkt p;
			parse(btf, s, &p);
			p.cls = sv->cls;
			struct occ_key k = { .ifindex = ifindex, .cls = sv->cls };
			struct occ_val *o = occ_get(&k);
			if (o) {
				o->packets -= 1;
				o->bytes -= sv->len;
			}
			emit('D', now, now - sv->ts, ifindex, &p, o, qlen, backlog);
			bpf_map_delete_elem(&skbs, &key);
		}
		s = LD(btf, s->next, s, next);
	}
	if (packets > QT_MAX_BULK) {
		stat_add(QT_STAT_TRUNC_CHAINS, 1);
		stat_add(QT_STAT_TRUNC_PKTS, packets - QT_MAX_BULK);
	}
	return 0;
}

static __always_inline bool wanted_reason(__u32 reason)
{
	for (int i = 0; i < QT_MAX_REASONS; i++) {
		if (i >= n_drop_reasons)
			return false;
		if (drop_reasons[i] == reason)
			return true;
	}
	return false;
}

static __always_inline int on_drop(bool btf, struct sk_buff *skb, __u32 reason)
{
	if (!skb || !wanted_reason(reason))
		return 0;
	struct net_device *dev = LD(btf, skb->dev, skb, dev);
	if (!in_netns(btf, dev))
		return 0;
	__u64 now = bpf_ktime_get_ns();
	struct pkt p;
	parse(btf, skb, &p);
	__u32 ifindex = LD(btf, dev->ifindex, dev, ifindex);
	struct occ_key k = { .ifindex = ifindex, .cls = p.cls };
	struct occ_val *o = bpf_map_lookup_elem(&occ, &k);
	struct Qdisc *q = LD(btf, dev->qdisc, dev, qdisc);
	__u32 qlen = 0, backlog = 0;
	if (q) {
		qlen = LD(btf, q->q.qlen, q, q.qlen);
		backlog = LD(btf, q->qstats.backlog, q, qstats.backlog);
	}
	emit('X', now, 0, ifindex, &p, o, qlen, backlog);
	return 0;
}

static __always_inline __u32 txq_ifindex(bool btf, const struct netdev_queue *txq)
{
	if (!txq)
		return 0;
	struct net_device *dev = LD(btf, txq->dev, txq, dev);
	if (!dev)
		return 0;
	return LD(btf, dev->ifindex, dev, ifindex);
}

/* ---- BTF raw tracepoints ---- */

SEC("tp_btf/qdisc_enqueue")
int BPF_PROG(btf_enqueue, struct Qdisc *q, const struct netdev_queue *txq, struct sk_buff *skb)
{
	return on_enqueue(true, q, skb, txq_ifindex(true, txq));
}

SEC("tp_btf/qdisc_dequeue")
int BPF_PROG(btf_dequeue, struct Qdisc *q, const struct netdev_queue *txq, int packets,
	     struct sk_buff *skb)
{
	return on_dequeue(true, q, skb, packets, txq_ifindex(true, txq));
}

SEC("tp_btf/kfree_skb")
int BPF_PROG(btf_kfree_skb, struct sk_buff *skb, void *location, enum skb_drop_reason reason)
{
	return on_drop(true, skb, reason);
}

/* ---- classic tracepoints (fallback) ---- */

SEC("tracepoint/qdisc/qdisc_enqueue")
int tp_enqueue(struct trace_event_raw_qdisc_enqueue *ctx)
{
	return on_enqueue(false, ctx->qdisc, (struct sk_buff *)ctx->skbaddr, ctx->ifindex);
}

SEC("tracepoint/qdisc/qdisc_dequeue")
int tp_dequeue(struct trace_event_raw_qdisc_dequeue *ctx)
{
	return on_dequeue(false, ctx->qdisc, (struct sk_buff *)ctx->skbaddr, ctx->packets,
			  ctx->ifindex);
}

SEC("tracepoint/skb/kfree_skb")
int tp_kfree_skb(struct trace_event_raw_kfree_skb *ctx)
{
	return on_drop(false, (struct sk_buff *)ctx->skbaddr, ctx->reason);
}
