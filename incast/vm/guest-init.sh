#!/bin/bash
# PID 1 of an incast guest: a QEMU VM (incast/vm/qemu.py) or User-Mode Linux
# (incast/vm/uml.py), both booted with init=/bin/bash -- <this file>. The root
# filesystem is the host's, read-only (9p or hostfs); everything writable is tmpfs,
# except the results directory (mounted at /run/incast-vm/results), where the host left
#   command.sh  the command to run (bash script)
#   cwd         the directory to run it in (a path of the host's filesystem)
# and where this script writes
#   output.txt      the command's stdout and stderr
#   exit-status     its exit status (written last: its presence means "done")
#   guest.txt       kernel release, command line, timing
# then powers the guest off. If anything here fails, PID 1 exits, the kernel
# panics and the emulator exits too.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root TERM=dumb LANG=C.UTF-8

mnt() { mountpoint -q "$3" 2>/dev/null || mount -t "$1" -o "$2" "$1" "$3"; }

mnt proc nosuid,nodev,noexec /proc
mnt sysfs nosuid,nodev,noexec /sys
mnt devtmpfs mode=0755 /dev
mkdir -p /dev/pts /dev/shm
mnt devpts gid=5,mode=620,ptmxmode=666 /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /run/netns /run/lock /run/incast-vm/results /run/incast-vm/host/tmp /run/incast-vm/host/var/tmp
# Keep the host's /tmp and /var/tmp reachable (read-only) before tmpfs covers them: the
# caller's directory may be there (a checkout under /tmp).
mount --bind /tmp /run/incast-vm/host/tmp
mount --bind /var/tmp /run/incast-vm/host/var/tmp
for d in /tmp /var/tmp; do mount -t tmpfs -o mode=1777 tmpfs "$d"; done
mnt tracefs nosuid,nodev,noexec /sys/kernel/tracing
mnt debugfs nosuid,nodev,noexec /sys/kernel/debug
mnt bpf mode=0700 /sys/fs/bpf
mnt cgroup2 nosuid,nodev,noexec /sys/fs/cgroup

results=/run/incast-vm/results
# QEMU shares the results directory over 9p (tag "results"); User-Mode Linux names the
# host directory on its command line (incast.results=DIR) and it is mounted over hostfs.
host_results=$(tr ' ' '\n' < /proc/cmdline | sed -n 's/^incast\.results=//p')
if [ -n "$host_results" ]; then
  mount -t hostfs -o "$host_results" none "$results"
else
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=none results "$results"
fi

hostname incast-vm 2>/dev/null || echo incast-vm > /proc/sys/kernel/hostname
ip link set lo up 2>/dev/null

{
  echo "kernel-release: $(uname -r)"
  echo "cmdline: $(cat /proc/cmdline)"
  echo "nproc: $(nproc)"
  echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null)"
  echo "start: $(date +%s.%N)"
} > "$results/guest.txt"

cwd=$(cat "$results/cwd" 2>/dev/null || echo /)
case "$cwd" in
  /tmp/*|/var/tmp/*)   # covered by tmpfs: bring the host's directory back at its path
    mkdir -p "$cwd" && mount --bind "/run/incast-vm/host$cwd" "$cwd" ;;
esac
cd "$cwd" 2>/dev/null || cd /
bash "$results/command.sh" > "$results/output.txt" 2>&1 < /dev/null
rc=$?
echo "end: $(date +%s.%N)" >> "$results/guest.txt"
echo "$rc" > "$results/exit-status.tmp" && mv "$results/exit-status.tmp" "$results/exit-status"
sync
umount "$results" 2>/dev/null

# Power off (ACPI); if that does not happen, reboot, which QEMU (-no-reboot) turns into an exit.
echo 1 > /proc/sys/kernel/sysrq
echo o > /proc/sysrq-trigger
sleep 10
# (UML restarts itself on a reboot: there, power off by the syscall instead.)
[ -n "$host_results" ] && poweroff -f
echo b > /proc/sysrq-trigger
