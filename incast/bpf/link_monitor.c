// SPDX-License-Identifier: GPL-2.0
/* link-monitor: loads link_monitor.bpf.c and reports how the watched links were served.
 *
 *   link-monitor --watch NETNS_INODE:IFINDEX [--watch ...] [--skip-first N]
 *                [--watchdog-fn ADDR]
 *
 * Link i is the i-th --watch. --watchdog-fn is the address of the kernel's
 * qdisc_watchdog() (from /proc/kallsyms); without it timer lateness is not measured.
 *
 * stdout: "READY" once the probes are attached; on SIGINT/SIGTERM one JSON object:
 *   {"links": [{"dequeues", "packets", "bytes", "busy_ns", "busy_packets",
 *               "busy_bytes", "gap_hist": {bucket: count}}, ...],
 *    "watchdog": {"fired", "late_ns_sum", "late_ns_max", "late_hist": {bucket: count}}}
 * then exit 0. On failure: "link-monitor: error: ..." on stderr, exit 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/types.h>

#include "link_monitor.h"
#include "link_monitor.skel.h"

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
	(void)sig;
	stop_requested = 1;
}

static void fail(const char *fmt, ...)
{
	va_list ap;
	fputs("link-monitor: error: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static int on_libbpf_print(enum libbpf_print_level level, const char *fmt, va_list ap)
{
	return level == LIBBPF_DEBUG ? 0 : vfprintf(stderr, fmt, ap);
}

static void print_hist(const char *name, const __u64 *h)
{
	int first = 1;
	printf("\"%s\": {", name);
	for (int i = 0; i < LM_HIST_BUCKETS; i++) {
		if (!h[i])
			continue;
		printf("%s\"%d\": %llu", first ? "" : ", ", i, (unsigned long long)h[i]);
		first = 0;
	}
	printf("}");
}

int main(int argc, char **argv)
{
	struct lm_watch_key keys[LM_MAX_LINKS];
	unsigned n = 0, skip = 4;
	unsigned long long wd_fn = 0;
	static const struct option opts[] = {
		{"watch", required_argument, NULL, 'w'},
		{"skip-first", required_argument, NULL, 's'},
		{"watchdog-fn", required_argument, NULL, 'f'},
		{0},
	};
	int c;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'w':
			if (n == LM_MAX_LINKS)
				fail("at most %d links", LM_MAX_LINKS);
			if (sscanf(optarg, "%u:%u", &keys[n].netns, &keys[n].ifindex) != 2)
				fail("--watch %s: expected NETNS_INODE:IFINDEX", optarg);
			n++;
			break;
		case 's':
			skip = strtoul(optarg, NULL, 0);
			break;
		case 'f':
			wd_fn = strtoull(optarg, NULL, 0);
			break;
		default:
			fail("usage: link-monitor --watch NETNS:IFINDEX... [--skip-first N] [--watchdog-fn ADDR]");
		}
	}
	if (!n)
		fail("nothing to watch (give --watch NETNS_INODE:IFINDEX)");
	libbpf_set_print(on_libbpf_print);

	struct link_monitor_bpf *skel = link_monitor_bpf__open();
	if (!skel)
		fail("cannot open the BPF object: %s", strerror(errno));
	skel->rodata->skip_first = skip;
	skel->rodata->watchdog_fn = wd_fn;
	if (!wd_fn)
		bpf_program__set_autoload(skel->progs.on_hrtimer, false);
	if (link_monitor_bpf__load(skel))
		fail("cannot load the BPF programs (see libbpf's messages above)");
	for (__u32 i = 0; i < n; i++)
		if (bpf_map__update_elem(skel->maps.watch, &keys[i], sizeof(keys[i]), &i, sizeof(i), BPF_ANY))
			fail("cannot watch %u:%u: %s", keys[i].netns, keys[i].ifindex, strerror(errno));
	if (link_monitor_bpf__attach(skel))
		fail("cannot attach to qdisc:qdisc_dequeue / timer:hrtimer_expire_entry: %s", strerror(errno));

	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	printf("READY\n");
	fflush(stdout);
	while (!stop_requested)
		pause();
	link_monitor_bpf__detach(skel);

	printf("{\"links\": [");
	for (__u32 i = 0; i < n; i++) {
		struct lm_link l;
		if (bpf_map__lookup_elem(skel->maps.links, &i, sizeof(i), &l, sizeof(l), 0))
			fail("cannot read link %u: %s", i, strerror(errno));
		printf("%s{\"dequeues\": %llu, \"packets\": %llu, \"bytes\": %llu, \"busy_ns\": %llu, "
		       "\"busy_packets\": %llu, \"busy_bytes\": %llu, ", i ? ", " : "",
		       (unsigned long long)l.dequeues, (unsigned long long)l.packets,
		       (unsigned long long)l.bytes, (unsigned long long)l.busy_ns,
		       (unsigned long long)l.busy_packets, (unsigned long long)l.busy_bytes);
		print_hist("gap_hist", l.gap_hist);
		printf("}");
	}
	int ncpu = libbpf_num_possible_cpus();
	if (ncpu <= 0)
		fail("cannot count CPUs");
	struct lm_watchdog *per_cpu = calloc(ncpu, sizeof(*per_cpu));
	struct lm_watchdog w = {0};
	__u32 zero = 0;
	if (!per_cpu || bpf_map__lookup_elem(skel->maps.watchdog, &zero, sizeof(zero), per_cpu,
					     ncpu * sizeof(*per_cpu), 0))
		fail("cannot read the watchdog statistics: %s", strerror(errno));
	for (int cpu = 0; cpu < ncpu; cpu++) {
		w.fired += per_cpu[cpu].fired;
		w.late_ns_sum += per_cpu[cpu].late_ns_sum;
		if (per_cpu[cpu].late_ns_max > w.late_ns_max)
			w.late_ns_max = per_cpu[cpu].late_ns_max;
		for (int b = 0; b < LM_HIST_BUCKETS; b++)
			w.late_hist[b] += per_cpu[cpu].late_hist[b];
	}
	printf("], \"watchdog\": {\"fired\": %llu, \"late_ns_sum\": %llu, \"late_ns_max\": %llu, ",
	       (unsigned long long)w.fired, (unsigned long long)w.late_ns_sum,
	       (unsigned long long)w.late_ns_max);
	print_hist("late_hist", w.late_hist);
	printf("}}\n");
	fflush(stdout);
	link_monitor_bpf__destroy(skel);
	return 0;
}
