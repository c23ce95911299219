/* Shared between qdisc_trace.bpf.c (kernel side) and qdisc_trace.c (loader).
 *
 * THE record layout. incast/qdisc_recorder.py mirrors it as RECORD_DTYPE; change both
 * together (QdiscRecorder.start checks RECORD_DTYPE's size against
 * `qdisc-trace --record-size`).
 *
 * One record per queue event, 56 bytes, little-endian, no padding between fields:
 *
 *   offset size field         meaning
 *        0    8 ts_ns         bpf_ktime_get_ns() (CLOCK_MONOTONIC) at the event
 *        8    8 sojourn_ns    dequeue: now - enqueue time of this skb; else 0
 *       16    4 ifindex       device of the egress qdisc (in the traced netns)
 *       20    4 packets (s32) packets in the class queue after the event: the class's
 *                             leaf qdisc q.qlen if the port has one, else a counter
 *       24    4 bytes   (s32) bytes in the class queue after the event (leaf
 *                             qstats.backlog, else a counter)
 *       28    4 port_packets  root qdisc q.qlen after the event (enqueue/dequeue: the
 *                             traced qdisc; drop: skb->dev->qdisc). A bulk dequeue
 *                             reports each skb of the chain with the skbs behind it
 *                             added back (the state just after that skb left)
 *       32    4 port_bytes    root qdisc qstats.backlog (same rules)
 *       36    4 pkt_len       skb->len
 *       40    4 saddr         IPv4 source as read from the header (network order
 *                             bytes; 0 if not IPv4)
 *       44    4 daddr         IPv4 destination (same)
 *       48    1 kind          'E' enqueue, 'D' dequeue, 'X' drop
 *       49    1 queue         class queue (DSCP table lookup; 0 if not IPv4; dequeue:
 *                             the class recorded at enqueue)
 *       50    2 pad0
 *       52    4 pad1
 */
#ifndef QDISC_TRACE_H
#define QDISC_TRACE_H

#define QT_MAX_BULK 16      /* longest dequeue chain walked (as incast.telemetry.MAX_BULK) */
#define QT_MAX_REASONS 8    /* drop reasons the kfree_skb probe accepts */

/* indexes of the per-CPU counter array "stats" */
#define QT_STAT_RB_LOST 0       /* bpf_ringbuf_reserve failed: record lost */
#define QT_STAT_TRUNC_CHAINS 1  /* dequeue chains longer than QT_MAX_BULK */
#define QT_STAT_TRUNC_PKTS 2    /* skbs of those chains past QT_MAX_BULK (records lost) */
#define QT_STAT_UNTRACKED 3     /* enqueued skbs that did not fit in the skb map */
#define QT_STAT_MISSED 4        /* root-qlen changes no recorded event explains */
#define QT_NSTATS 5

struct qt_record {
	__u64 ts_ns;
	__u64 sojourn_ns;
	__u32 ifindex;
	__s32 packets;
	__s32 bytes;
	__u32 port_packets;
	__u32 port_bytes;
	__u32 pkt_len;
	__u32 saddr;
	__u32 daddr;
	__u8 kind;
	__u8 queue;
	__u16 pad0;
	__u32 pad1;
};

#define QT_RECORD_SIZE 56

#endif
