// SPDX-License-Identifier: GPL-2.0
/* Per-packet queue telemetry at the emulated switch's egress qdiscs.
 *
 * Same events as the bpftrace program in incast/telemetry.py (BPFTRACE_PROGRAM), but
 * compiled (libbpf CO-RE) and writing fixed-size binary records (qdisc_trace.h) to a BPF
 * ring buffer, so userspace only copies bytes.
 *
 *   qdisc:qdisc_enqueue  (successful enqueue at a root qdisc)  -> 'E' record
 *   qdisc:qdisc_dequeue  (each skb of a possibly bulk chain)    -> 'D' record per skb
 *   skb:kfree_skb        (reason in drop_reasons)              -> 'X' record
 *
 * Only skbs whose device lives in the network namespace with inode netns_inode count.
 *
 * Class occupancy ("packets/bytes in this class queue after the event"). The kernel
 * does not hand every tracepoint hit to BPF: on the testbed VM, hits that happen while
 * certain tasks are current never reach the program and are not counted as recursion
 * misses either. Occupancy kept as +1/-1 counters (what the bpftrace program does) then
 * drifts for the rest of the run. So occupancy is read from the kernel instead: the
 * class's leaf qdisc (handle (leaf_major_base + class):0 on the port, as
 * incast.dataplane.linux builds it) is found once per (port, class) in the device's
 * qdisc hash and its q.qlen / qstats.backlog are read at each event. The counters remain
 * as the fallback for ports without such a leaf. Missed hits are still detected: under
 * the root lock the root qdisc's q.qlen must move by exactly what the recorded events
 * (and requeues) explain; the difference is counted in stats[QT_STAT_MISSED].
 *
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
#define MAX_CLASSES 8
#define QDISC_HASH_BUCKETS 16
#define BUCKET_WALK 8

char LICENSE[] SEC("license") = "GPL";

/* Set by the loader before load (rodata). */
const volatile __u32 netns_inode = 0;
const volatile __u8 dscp_class[64] = {};
const volatile __u32 drop_reasons[QT_MAX_REASONS] = {};
const volatile __u32 n_drop_reasons = 0;
const volatile __u64 wake_bytes = 1 << 20;  /* wake the reader once this much is pending */
const volatile __u32 leaf_major_base = 0;   /* 0: no leaf lookup, counters only */

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
	__u8 cls;
	__u8 pad[3];
	__u32 ifindex;
	__u32 pad2;
};

struct port_state {
	__u32 qlen;
	__u32 requeues;
};

/* Per (ifindex, class) occupancy counters (fallback); updated under the root lock. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct occ_key);
	__type(value, struct occ_val);
} occ SEC(".maps");

/* (ifindex, class) -> address of the class's leaf Qdisc (0: none found). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct occ_key);
	__type(value, __u64);
} leaves SEC(".maps");

/* Root qdisc q.qlen / qstats.requeues after the last event seen on each port. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct port_state);
} ports SEC(".maps");

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
	__uint(max_entries, QT_NSTATS);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

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

static __always_inline __u32 qdisc_handle_at(__u64 q)
{
	__u32 h = 0;
	bpf_probe_read_kernel(&h, sizeof(h),
			      (void *)(q + bpf_core_field_offset(struct Qdisc, handle)));
	return h;
}

/* The Qdisc with this handle in dev's qdisc hash (the non-root qdiscs), or 0.
 * A global (separately verified) function: it runs once per (port, class). */
__attribute__((noinline)) __u64 scan_leaf(__u64 dev, __u32 handle)
{
	__u64 heads = dev + bpf_core_field_offset(struct net_device, qdisc_hash);
	__u64 hash_off = bpf_core_field_offset(struct Qdisc, hash);
	/* hash_min(handle, 4): the bucket hash_add_rcu() used; then the others */
	__u32 first = (handle * 0x61C88647u) >> 28;

	if (!dev)
		return 0;
	for (int i = 0; i < QDISC_HASH_BUCKETS; i++) {
		__u32 b = (first + i) & (QDISC_HASH_BUCKETS - 1);
		__u64 n = 0;
		bpf_probe_read_kernel(&n, sizeof(n), (void *)(heads + b * sizeof(struct hlist_head)));
		for (int j = 0; j < BUCKET_WALK && n; j++) {
			__u64 q = n - hash_off;
			if (qdisc_handle_at(q) == handle)
				return q;
			bpf_probe_read_kernel(&n, sizeof(n), (void *)n);  /* hlist_node.next */
		}
	}
	return 0;
}

#define NO_LEAF (~0ULL)

/* A kernel pointer as a plain number (global functions take scalars only). */
#define ADDR(p) ({ __u64 __a = 0; bpf_probe_read_kernel(&__a, sizeof(__a), &(p)); __a; })

/* Occupancy of class cls on a port from its leaf qdisc, packed (packets << 32 | bytes),
 * or NO_LEAF. A global function, verified once. */
__attribute__((noinline)) __u64 leaf_occ(__u64 dev, __u32 ifindex, __u32 cls)
{
	if (!leaf_major_base || cls >= MAX_CLASSES)
		return NO_LEAF;
	__u32 handle = (leaf_major_base + cls) << 16;
	struct occ_key k = { .ifindex = ifindex, .cls = cls };
	__u64 *cached = bpf_map_lookup_elem(&leaves, &k);
	__u64 q;

	if (cached && *cached && qdisc_handle_at(*cached) == handle) {
		q = *cached;
	} else if (cached && !*cached) {
		return NO_LEAF;         /* looked for before: no such leaf */
	} else {
		q = scan_leaf(dev, handle);
		bpf_map_update_elem(&leaves, &k, &q, BPF_ANY);
		if (!q)
			return NO_LEAF;
	}
	__u32 pkts = 0, bytes = 0;
	bpf_probe_read_kernel(&pkts, sizeof(pkts),
			      (void *)(q + bpf_core_field_offset(struct Qdisc, q.qlen)));
	bpf_probe_read_kernel(&bytes, sizeof(bytes),
			      (void *)(q + bpf_core_field_offset(struct Qdisc, qstats.backlog)));
	return ((__u64)pkts << 32) | bytes;
}

/* Count root-qlen changes the recorded events do not explain (missed tracepoint hits).
 * Called under the root qdisc lock with the root's q.qlen after the event. */
static __always_inline void check_port(__u32 ifindex, __u32 qlen, __u32 requeues, int delta)
{
	struct port_state *st = bpf_map_lookup_elem(&ports, &ifindex);
	if (st) {
		__s64 expect = (__s64)st->qlen + delta + (__s64)(requeues - st->requeues);
		__s64 diff = (__s64)qlen - expect;
		if (diff)
			stat_add(QT_STAT_MISSED, diff > 0 ? diff : -diff);
		st->qlen = qlen;
		st->requeues = requeues;
	} else {
		struct port_state ns = { .qlen = qlen, .requeues = requeues };
		bpf_map_update_elem(&ports, &ifindex, &ns, BPF_ANY);
	}
}

static __always_inline void emit(char kind, __u64 now, __u64 sojourn, __u32 ifindex,
				 const struct pkt *p, __s32 pkts, __s32 bytes,
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
	r->packets = pkts;
	r->bytes = bytes;
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

static __always_inline int on_enqueue(bool btf, struct Qdisc *q, __u64 qdev,
				      struct sk_buff *skb, __u32 ifindex)
{
	if (!skb || !in_netns(btf, LD(btf, skb->dev, skb, dev)))
		return 0;
	__u32 qlen = LD(btf, q->q.qlen, q, q.qlen);
	__u32 backlog = LD(btf, q->qstats.backlog, q, qstats.backlog);
	check_port(ifindex, qlen, LD(btf, q->qstats.requeues, q, qstats.requeues), 1);

	struct pkt p;
	parse(btf, skb, &p);
	if (qlen == 1) {
		/* Alone in the port: the class counters restart from zero (whatever they
		 * held left without an event we saw), as the bpftrace program does. */
		for (__u32 c = 0; c < MAX_CLASSES; c++) {
			struct occ_key rk = { .ifindex = ifindex, .cls = c };
			struct occ_val *ro = bpf_map_lookup_elem(&occ, &rk);
			if (ro) {
				ro->packets = 0;
				ro->bytes = 0;
			}
		}
	}
	struct occ_key k = { .ifindex = ifindex, .cls = p.cls };
	struct occ_val *o = occ_get(&k);
	if (o) {
		o->packets += 1;
		o->bytes += p.len;
	}
	__s32 pkts, bytes;
	__u64 leaf = leaf_occ(qdev, ifindex, p.cls);
	if (leaf != NO_LEAF) {
		pkts = leaf >> 32;
		bytes = (__u32)leaf;
	} else {
		pkts = o ? o->packets : 0;
		bytes = o ? o->bytes : 0;
	}
	__u64 now = bpf_ktime_get_ns();
	__u64 key = (__u64)skb;
	struct skb_val sv = { .ts = now, .len = p.len, .cls = p.cls, .ifindex = ifindex };
	if (bpf_map_update_elem(&skbs, &key, &sv, BPF_ANY))
		stat_add(QT_STAT_UNTRACKED, 1);
	emit('E', now, 0, ifindex, &p, pkts, bytes, qlen, backlog);
	return 0;
}

struct chain_item {
	__u64 ts;       /* enqueue time (tracked skbs) */
	__u32 len;      /* skb->len now */
	__u32 cls;      /* enqueue class if tracked, else the DSCP rule's */
	__u32 saddr;
	__u32 daddr;
	__u32 tracked;  /* has an enqueue record: gets a dequeue record */
	__u32 trk_len;  /* len at enqueue (what the counters added) */
	__s32 pkts;     /* class occupancy just after this skb left */
	__s32 bytes;
	__u32 port_pkts;        /* root occupancy just after this skb left */
	__u32 port_bytes;
};

struct chain {
	struct chain_item items[QT_MAX_BULK];
};

/* Per-CPU scratch for a dequeue chain (too big for the BPF stack). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct chain);
} scratch SEC(".maps");

static __always_inline int on_dequeue(bool btf, struct Qdisc *q, __u64 qdev,
				      struct sk_buff *skb, int packets, __u32 ifindex)
{
	if (!skb || !in_netns(btf, LD(btf, skb->dev, skb, dev)))
		return 0;
	__u32 qlen = LD(btf, q->q.qlen, q, q.qlen);
	__u32 backlog = LD(btf, q->qstats.backlog, q, qstats.backlog);
	check_port(ifindex, qlen, LD(btf, q->qstats.requeues, q, qstats.requeues), -packets);

	__u32 zero = 0;
	struct chain *ch = bpf_map_lookup_elem(&scratch, &zero);
	if (!ch)
		return 0;
	struct chain_item *items = ch->items;

	/* Pass 1: the chain's skbs (a bulk dequeue links them by ->next) and their
	 * enqueue entries. */
	struct sk_buff *s = skb;
	int n = 0;
	for (int i = 0; i < QT_MAX_BULK; i++) {
		if (!s || i >= packets)
			break;
		struct pkt p;
		parse(btf, s, &p);
		__u64 key = (__u64)s;
		struct skb_val *sv = bpf_map_lookup_elem(&skbs, &key);
		items[i].len = p.len;
		items[i].saddr = p.saddr;
		items[i].daddr = p.daddr;
		items[i].cls = p.cls < MAX_CLASSES ? p.cls : 0;
		items[i].tracked = 0;
		if (sv && sv->ifindex == ifindex && sv->cls < MAX_CLASSES) {
			items[i].tracked = 1;
			items[i].ts = sv->ts;
			items[i].trk_len = sv->len;
			items[i].cls = sv->cls;
			bpf_map_delete_elem(&skbs, &key);
			/* The whole chain leaves the counters before pass 2 reads them,
			 * as it has already left the kernel's. */
			struct occ_key k = { .ifindex = ifindex, .cls = sv->cls };
			struct occ_val *o = occ_get(&k);
			if (o) {
				o->packets -= 1;
				o->bytes -= sv->len;
			}
		}
		n = i + 1;
		s = LD(btf, s->next, s, next);
	}
	if (packets > QT_MAX_BULK) {
		stat_add(QT_STAT_TRUNC_CHAINS, 1);
		stat_add(QT_STAT_TRUNC_PKTS, packets - QT_MAX_BULK);
	}

	/* Pass 2, backwards: the kernel's counters (and ours) already reflect the whole
	 * chain; the state just after skb i left adds back the skbs behind it. */
	__s32 all_p[MAX_CLASSES] = {}, all_b[MAX_CLASSES] = {};
	__s32 trk_p[MAX_CLASSES] = {}, trk_b[MAX_CLASSES] = {};
	__u32 rest_p = 0, rest_b = 0;
	for (int i = QT_MAX_BULK - 1; i >= 0; i--) {
		if (i >= n)
			continue;
		__u32 c = items[i].cls & (MAX_CLASSES - 1);
		items[i].port_pkts = qlen + rest_p;
		items[i].port_bytes = backlog + rest_b;
		if (items[i].tracked) {
			struct occ_key k = { .ifindex = ifindex, .cls = c };
			struct occ_val *o = bpf_map_lookup_elem(&occ, &k);
			__u64 leaf = leaf_occ(qdev, ifindex, c);
			if (leaf != NO_LEAF) {
				items[i].pkts = (__s32)(leaf >> 32) + all_p[c];
				items[i].bytes = (__s32)(__u32)leaf + all_b[c];
			} else {
				items[i].pkts = (o ? o->packets : 0) + trk_p[c];
				items[i].bytes = (o ? o->bytes : 0) + trk_b[c];
			}
			trk_p[c] += 1;
			trk_b[c] += items[i].trk_len;
		}
		all_p[c] += 1;
		all_b[c] += items[i].len;
		rest_p += 1;
		rest_b += items[i].len;
	}

	/* Pass 3: the records, in chain order. */
	__u64 now = bpf_ktime_get_ns();
	for (int i = 0; i < QT_MAX_BULK; i++) {
		if (i >= n)
			break;
		if (!items[i].tracked)
			continue;
		struct pkt p = { .len = items[i].len, .saddr = items[i].saddr,
				 .daddr = items[i].daddr, .cls = items[i].cls };
		emit('D', now, now - items[i].ts, ifindex, &p, items[i].pkts, items[i].bytes,
		     items[i].port_pkts, items[i].port_bytes);
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
	struct Qdisc *q = LD(btf, dev->qdisc, dev, qdisc);
	__u32 qlen = 0, backlog = 0;
	if (q) {
		qlen = LD(btf, q->q.qlen, q, q.qlen);
		backlog = LD(btf, q->qstats.backlog, q, qstats.backlog);
	}
	__s32 pkts = 0, bytes = 0;
	__u64 leaf = leaf_occ(ADDR(skb->dev), ifindex, p.cls);
	if (leaf != NO_LEAF) {
		pkts = leaf >> 32;
		bytes = (__u32)leaf;
	} else {
		struct occ_key k = { .ifindex = ifindex, .cls = p.cls };
		struct occ_val *o = bpf_map_lookup_elem(&occ, &k);
		if (o) {
			pkts = o->packets;
			bytes = o->bytes;
		}
	}
	emit('X', now, 0, ifindex, &p, pkts, bytes, qlen, backlog);
	return 0;
}

static __always_inline __u32 txq_ifindex(bool btf, const struct netdev_queue *txq)
{
	if (!txq)
		return 0;
	struct net_device *dev = LD(btf, txq->dev, txq, dev);
	return dev ? LD(btf, dev->ifindex, dev, ifindex) : 0;
}

/* ---- BTF raw tracepoints ---- */

SEC("tp_btf/qdisc_enqueue")
int BPF_PROG(btf_enqueue, struct Qdisc *q, const struct netdev_queue *txq, struct sk_buff *skb)
{
	if (!txq)
		return 0;
	return on_enqueue(true, q, ADDR(txq->dev), skb, txq_ifindex(true, txq));
}

SEC("tp_btf/qdisc_dequeue")
int BPF_PROG(btf_dequeue, struct Qdisc *q, const struct netdev_queue *txq, int packets,
	     struct sk_buff *skb)
{
	if (!txq)
		return 0;
	return on_dequeue(true, q, ADDR(txq->dev), skb, packets, txq_ifindex(true, txq));
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
	const struct netdev_queue *txq = ctx->txq;
	if (!txq)
		return 0;
	return on_enqueue(false, ctx->qdisc, ADDR(txq->dev), (struct sk_buff *)ctx->skbaddr,
			  ctx->ifindex);
}

SEC("tracepoint/qdisc/qdisc_dequeue")
int tp_dequeue(struct trace_event_raw_qdisc_dequeue *ctx)
{
	const struct netdev_queue *txq = ctx->txq;
	if (!txq)
		return 0;
	return on_dequeue(false, ctx->qdisc, ADDR(txq->dev), (struct sk_buff *)ctx->skbaddr,
			  ctx->packets, ctx->ifindex);
}

SEC("tracepoint/skb/kfree_skb")
int tp_kfree_skb(struct trace_event_raw_kfree_skb *ctx)
{
	return on_drop(false, (struct sk_buff *)ctx->skbaddr, ctx->reason);
}
