// SPDX-License-Identifier: GPL-2.0
/* qdisc-trace: loads qdisc_trace.bpf.c and copies its ring buffer records (qdisc_trace.h)
 * to a file, unformatted.
 *
 *   qdisc-trace --netns-inode N --dscp-table c0,...,c63 --drop-reasons 64,65,66 \
 *               --out FILE [--ringbuf-mb 64] [--leaf-major-base 0x10]
 *               [--mode auto|tp_btf|tracepoint] [-v]
 *   qdisc-trace --record-size      prints the record size and exits
 *
 * --leaf-major-base B: class c of a port is the leaf qdisc with handle (B+c):0; its
 * q.qlen/backlog are the class occupancy. 0 (default) keeps counters only.
 *
 * stdout protocol (line-buffered, flushed):
 *   ATTACHED <tp_btf|tracepoint>   which probe kind is in use
 *   READY                          probes are attached; events are being recorded
 *   ... on SIGINT/SIGTERM: detach, drain the ring buffer, then
 *   TRUNCATED <chains> <packets>   dequeue chains longer than QT_MAX_BULK
 *   UNTRACKED <n>                  enqueued skbs that did not fit in the skb map
 *   MISSED <n>                     queue events the kernel did not hand to the probes
 *                                  (root q.qlen changes no recorded event explains)
 *   RINGBUF_LOST <n>               records dropped because the ring buffer was full
 *   LOST <n>                       RINGBUF_LOST + truncated packets + MISSED
 *   RECORDS <n>                    records written to FILE
 * exit 0. On failure: "qdisc-trace: error: ..." on stderr (with libbpf's reason), exit 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <getopt.h>
#include <sys/resource.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/types.h>

#include "qdisc_trace.h"
#include "qdisc_trace.skel.h"

_Static_assert(sizeof(struct qt_record) == QT_RECORD_SIZE, "record layout changed");

#define OUTBUF_SIZE (8u << 20)

static volatile sig_atomic_t stop_requested;
static int out_fd = -1;
static char *outbuf;
static size_t outlen;
static unsigned long long records;
static int write_errno;

/* libbpf's warnings (verifier logs included), kept so an error can say why. */
#define LOG_MAX (256u << 10)
static char *libbpf_log;
static size_t libbpf_log_len;
static bool verbose;

static void log_clear(void)
{
	libbpf_log_len = 0;
	if (libbpf_log)
		libbpf_log[0] = 0;
}

static int on_libbpf_print(enum libbpf_print_level level, const char *fmt, va_list ap)
{
	char *msg = NULL;
	int n;
	if (level == LIBBPF_DEBUG && !verbose)
		return 0;
	n = vasprintf(&msg, fmt, ap);
	if (n < 0)
		return 0;
	if (verbose)
		fputs(msg, stderr);
	if (level == LIBBPF_WARN) {
		if (!libbpf_log)
			libbpf_log = calloc(1, LOG_MAX + 1);
		if (libbpf_log) {
			size_t add = (size_t)n;
			if (add > LOG_MAX) {    /* keep the tail */
				memmove(msg, msg + add - LOG_MAX, LOG_MAX + 1);
				add = LOG_MAX;
			}
			if (libbpf_log_len + add > LOG_MAX) {
				size_t drop = libbpf_log_len + add - LOG_MAX;
				memmove(libbpf_log, libbpf_log + drop, libbpf_log_len - drop + 1);
				libbpf_log_len -= drop;
			}
			memcpy(libbpf_log + libbpf_log_len, msg, add + 1);
			libbpf_log_len += add;
		}
	}
	free(msg);
	return 0;
}

/* The line of text ending just before *end (exclusive), trimmed; moves *end to its start. */
static size_t prev_line(const char *buf, const char **end, const char **start)
{
	const char *e = *end;
	while (e > buf && (e[-1] == '\n' || e[-1] == ' '))
		e--;
	const char *b = e;
	while (b > buf && b[-1] != '\n')
		b--;
	*start = b;
	*end = b;
	return e - b;
}

/* Why loading failed, in one line: libbpf's "BPF program load failed" line plus the
 * verifier's last complaint, or else libbpf's most specific warning. */
static const char *libbpf_reason(void)
{
	static char reason[1024];
	const char *buf = libbpf_log ? libbpf_log : "";
	const char *failed = NULL, *why = NULL, *last = NULL;
	size_t failed_n = 0, why_n = 0, last_n = 0;

	const char *mark = NULL;
	for (const char *p = strstr(buf, "-- END PROG LOAD LOG --"); p;
	     p = strstr(p + 1, "-- END PROG LOAD LOG --"))
		mark = p;
	if (mark) {
		const char *end = mark, *b;
		size_t n;
		while ((n = prev_line(buf, &end, &b)) > 0 || end > buf) {
			if (!n)
				continue;
			if (!strncmp(b, "processed ", 10) || !strncmp(b, "verification time", 17) ||
			    !strncmp(b, "stack depth", 11) || !strncmp(b, "libbpf:", 7))
				continue;
			why = b;
			why_n = n;
			break;
		}
	}
	for (const char *p = buf; *p;) {
		const char *nl = strchr(p, '\n');
		size_t n = nl ? (size_t)(nl - p) : strlen(p);
		if (!strncmp(p, "libbpf: ", 8)) {
			if (memmem(p, n, "load failed", 11) || memmem(p, n, "failed to attach", 16)) {
				failed = p + 8;
				failed_n = n - 8;
			}
			if (!memmem(p, n, "failed to load object", 21) &&
			    !memmem(p, n, "failed to load BPF skeleton", 27)) {
				last = p + 8;
				last_n = n - 8;
			}
		}
		p = nl ? nl + 1 : p + n;
	}
	if (!failed) {
		failed = last;
		failed_n = last_n;
	}
	if (!failed && !why)
		return "no libbpf message";
	snprintf(reason, sizeof(reason), "%.*s%s%.*s", (int)(failed ? failed_n : 0),
		 failed ? failed : "", failed && why ? ": " : "", (int)(why ? why_n : 0),
		 why ? why : "");
	return reason;
}

static void fail(const char *fmt, ...)
{
	va_list ap;
	fputs("qdisc-trace: error: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void on_signal(int sig)
{
	(void)sig;
	stop_requested = 1;
}

static void flush_out(void)
{
	size_t off = 0;
	while (off < outlen) {
		ssize_t n = write(out_fd, outbuf + off, outlen - off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			write_errno = errno;
			break;
		}
		off += n;
	}
	outlen = 0;
}

static int on_record(void *ctx, void *data, size_t size)
{
	(void)ctx;
	if (size != QT_RECORD_SIZE)
		return 0;
	if (outlen + QT_RECORD_SIZE > OUTBUF_SIZE)
		flush_out();
	memcpy(outbuf + outlen, data, QT_RECORD_SIZE);
	outlen += QT_RECORD_SIZE;
	records++;
	return 0;
}

static void parse_list(const char *arg, const char *what, unsigned long *vals, int max,
		       int *n, unsigned long maxval)
{
	const char *p = arg;
	*n = 0;
	while (*p) {
		char *end;
		errno = 0;
		unsigned long v = strtoul(p, &end, 10);
		if (end == p || errno || v > maxval || (*end && *end != ','))
			fail("bad %s %s", what, arg);
		if (*n >= max)
			fail("too many %s (at most %d): %s", what, max, arg);
		vals[(*n)++] = v;
		p = *end ? end + 1 : end;
	}
}

enum mode { MODE_AUTO, MODE_BTF, MODE_TP };

/* Open, configure, load and attach one set of programs. NULL (with the reason in err)
 * if that fails. */
static struct qdisc_trace_bpf *load(bool btf, __u32 inode, const unsigned long *dscp,
				    const unsigned long *reasons, int n_reasons,
				    __u32 rb_bytes, __u32 leaf_base, char *err, size_t errlen)
{
	struct qdisc_trace_bpf *skel = qdisc_trace_bpf__open();
	int rc;
	if (!skel) {
		snprintf(err, errlen, "opening the BPF object failed: %s (%s)", strerror(errno),
			 libbpf_reason());
		return NULL;
	}
	skel->rodata->netns_inode = inode;
	for (int i = 0; i < 64; i++)
		skel->rodata->dscp_class[i] = dscp[i];
	for (int i = 0; i < n_reasons; i++)
		skel->rodata->drop_reasons[i] = reasons[i];
	skel->rodata->n_drop_reasons = n_reasons;
	skel->rodata->wake_bytes = rb_bytes / 8;
	skel->rodata->leaf_major_base = leaf_base;
	bpf_map__set_max_entries(skel->maps.rb, rb_bytes);

	bpf_program__set_autoload(skel->progs.btf_enqueue, btf);
	bpf_program__set_autoload(skel->progs.btf_dequeue, btf);
	bpf_program__set_autoload(skel->progs.btf_kfree_skb, btf);
	bpf_program__set_autoload(skel->progs.tp_enqueue, !btf);
	bpf_program__set_autoload(skel->progs.tp_dequeue, !btf);
	bpf_program__set_autoload(skel->progs.tp_kfree_skb, !btf);

	log_clear();
	rc = qdisc_trace_bpf__load(skel);
	if (rc) {
		snprintf(err, errlen, "loading the %s programs failed: %s (%s)",
			 btf ? "tp_btf" : "tracepoint", strerror(-rc), libbpf_reason());
		qdisc_trace_bpf__destroy(skel);
		return NULL;
	}
	log_clear();
	rc = qdisc_trace_bpf__attach(skel);
	if (rc) {
		snprintf(err, errlen, "attaching the %s programs failed: %s (%s)",
			 btf ? "tp_btf" : "tracepoint", strerror(-rc), libbpf_reason());
		qdisc_trace_bpf__destroy(skel);
		return NULL;
	}
	return skel;
}

static unsigned long long sum_stat(struct qdisc_trace_bpf *skel, __u32 idx)
{
	int ncpu = libbpf_num_possible_cpus();
	if (ncpu <= 0)
		return 0;
	__u64 *vals = calloc(ncpu, sizeof(*vals));
	unsigned long long sum = 0;
	if (vals && !bpf_map_lookup_elem(bpf_map__fd(skel->maps.stats), &idx, vals))
		for (int i = 0; i < ncpu; i++)
			sum += vals[i];
	free(vals);
	return sum;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: qdisc-trace --netns-inode N --dscp-table c0,...,c63 --drop-reasons R1,R2,...\n"
		"                   --out FILE [--ringbuf-mb 64] [--leaf-major-base 0x10]\n"
		"                   [--mode auto|tp_btf|tracepoint] [-v]\n"
		"       qdisc-trace --record-size\n");
	exit(1);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "netns-inode", required_argument, NULL, 'n' },
		{ "dscp-table", required_argument, NULL, 'd' },
		{ "drop-reasons", required_argument, NULL, 'r' },
		{ "out", required_argument, NULL, 'o' },
		{ "ringbuf-mb", required_argument, NULL, 'b' },
		{ "mode", required_argument, NULL, 'm' },
		{ "leaf-major-base", required_argument, NULL, 'l' },
		{ "record-size", no_argument, NULL, 's' },
		{ "verbose", no_argument, NULL, 'v' },
		{ 0 },
	};
	unsigned long inode = 0, dscp[64] = { 0 }, reasons[QT_MAX_REASONS];
	unsigned long rb_mb = 64, leaf_base = 0;
	int n_dscp = 0, n_reasons = 0, c;
	bool have_inode = false, have_dscp = false;
	const char *out = NULL;
	enum mode mode = MODE_AUTO;

	while ((c = getopt_long(argc, argv, "v", opts, NULL)) != -1) {
		char *end;
		switch (c) {
		case 'n':
			errno = 0;
			inode = strtoul(optarg, &end, 10);
			if (*end || errno || !inode || inode > UINT32_MAX)
				fail("bad --netns-inode %s", optarg);
			have_inode = true;
			break;
		case 'd':
			parse_list(optarg, "--dscp-table", dscp, 64, &n_dscp, 255);
			if (n_dscp != 64)
				fail("--dscp-table needs 64 entries, got %d", n_dscp);
			have_dscp = true;
			break;
		case 'r':
			parse_list(optarg, "--drop-reasons", reasons, QT_MAX_REASONS, &n_reasons,
				   UINT32_MAX);
			break;
		case 'o':
			out = optarg;
			break;
		case 'b':
			errno = 0;
			rb_mb = strtoul(optarg, &end, 10);
			if (*end || errno || rb_mb < 1 || rb_mb > 2048)
				fail("bad --ringbuf-mb %s (1..2048)", optarg);
			break;
		case 'l':
			errno = 0;
			leaf_base = strtoul(optarg, &end, 0);
			if (*end || errno || leaf_base > 0xfff0)
				fail("bad --leaf-major-base %s", optarg);
			break;
		case 'm':
			if (!strcmp(optarg, "auto"))
				mode = MODE_AUTO;
			else if (!strcmp(optarg, "tp_btf"))
				mode = MODE_BTF;
			else if (!strcmp(optarg, "tracepoint"))
				mode = MODE_TP;
			else
				fail("bad --mode %s (auto, tp_btf or tracepoint)", optarg);
			break;
		case 's':
			printf("%d\n", QT_RECORD_SIZE);
			return 0;
		case 'v':
			verbose = true;
			break;
		default:
			usage();
		}
	}
	if (optind != argc || !have_inode || !out)
		usage();
	if (!have_dscp)
		memset(dscp, 0, sizeof(dscp));
	if (!n_reasons)
		fail("--drop-reasons is empty: no qdisc drop reasons for skb:kfree_skb");

	/* ring buffer size: a power of two number of pages */
	__u32 rb_bytes = 1u << 20;
	while ((rb_bytes >> 20) < rb_mb)
		rb_bytes <<= 1;

	libbpf_set_print(on_libbpf_print);
	/* Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; harmless otherwise. */
	struct rlimit rl = { RLIM_INFINITY, RLIM_INFINITY };
	setrlimit(RLIMIT_MEMLOCK, &rl);

	struct sigaction sa = { .sa_handler = on_signal };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	outbuf = malloc(OUTBUF_SIZE);
	if (!outbuf)
		fail("out of memory");
	out_fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (out_fd < 0)
		fail("cannot create %s: %s", out, strerror(errno));

	char err_btf[2048] = "", err_tp[2048] = "";
	struct qdisc_trace_bpf *skel = NULL;
	bool btf = false;
	if (mode != MODE_TP) {
		skel = load(true, inode, dscp, reasons, n_reasons, rb_bytes, leaf_base, err_btf,
			    sizeof(err_btf));
		btf = skel != NULL;
		if (!skel && mode == MODE_AUTO)
			fprintf(stderr, "qdisc-trace: %s; falling back to classic tracepoints\n", err_btf);
	}
	if (!skel && mode != MODE_BTF)
		skel = load(false, inode, dscp, reasons, n_reasons, rb_bytes, leaf_base, err_tp,
			    sizeof(err_tp));
	if (!skel)
		fail("%s", mode == MODE_BTF ? err_btf : err_tp);

	struct ring_buffer *rb = ring_buffer__new(bpf_map__fd(skel->maps.rb), on_record, NULL, NULL);
	if (!rb)
		fail("ring_buffer__new failed: %s (%s)", strerror(errno), libbpf_reason());

	printf("ATTACHED %s\nREADY\n", btf ? "tp_btf" : "tracepoint");
	fflush(stdout);

	while (!stop_requested) {
		/* The BPF side wakes us only when wake_bytes are pending; the timeout picks
		 * up the rest. consume() because poll() reads only rings that woke it. */
		int n = ring_buffer__poll(rb, 20);
		if (n < 0 && n != -EINTR)
			fail("ring_buffer__poll failed: %s", strerror(-n));
		n = ring_buffer__consume(rb);
		if (n < 0 && n != -EINTR)
			fail("ring_buffer__consume failed: %s", strerror(-n));
		if (write_errno)
			fail("writing %s: %s", out, strerror(write_errno));
	}

	/* No new events after detach; then take everything that is still queued. */
	qdisc_trace_bpf__detach(skel);
	ring_buffer__consume(rb);
	/* A program that was running during detach may still commit a record it reserved
	 * (consume stops at an uncommitted one): look once more after it surely finished. */
	usleep(10000);
	while (ring_buffer__consume(rb) > 0)
		;
	flush_out();
	if (write_errno)
		fail("writing %s: %s", out, strerror(write_errno));
	if (close(out_fd))
		fail("closing %s: %s", out, strerror(errno));

	unsigned long long rb_lost = sum_stat(skel, QT_STAT_RB_LOST);
	unsigned long long chains = sum_stat(skel, QT_STAT_TRUNC_CHAINS);
	unsigned long long tpkts = sum_stat(skel, QT_STAT_TRUNC_PKTS);
	unsigned long long untracked = sum_stat(skel, QT_STAT_UNTRACKED);
	unsigned long long missed = sum_stat(skel, QT_STAT_MISSED);
	printf("TRUNCATED %llu %llu\n", chains, tpkts);
	printf("UNTRACKED %llu\n", untracked);
	printf("MISSED %llu\n", missed);
	printf("RINGBUF_LOST %llu\n", rb_lost);
	printf("LOST %llu\n", rb_lost + tpkts + missed);
	printf("RECORDS %llu\n", records);
	fflush(stdout);
	ring_buffer__free(rb);
	qdisc_trace_bpf__destroy(skel);
	return 0;
}
