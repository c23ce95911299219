#!/usr/bin/env bash
# Build the compiled queue-telemetry recorder (libbpf CO-RE + BPF ring buffer) as root
# on Debian 12. Idempotent: installs the missing build packages, then runs make, which
# rebuilds only what changed. Output: build/bpf/qdisc-trace at the repository root.
#   scripts/build-bpf.sh            build (or do nothing if up to date)
#   scripts/build-bpf.sh clean      remove build/bpf
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

apt_packages=(clang llvm libbpf-dev bpftool libelf-dev zlib1g-dev make gcc)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || { echo "build-bpf: need root to install ${missing[*]}" >&2; exit 2; }
  echo "build-bpf: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  }
fi

if [ ! -r /sys/kernel/btf/vmlinux ]; then
  echo "build-bpf: /sys/kernel/btf/vmlinux is missing: the kernel needs CONFIG_DEBUG_INFO_BTF" >&2
  exit 1
fi

exec make -s -C "$here/incast/bpf" BUILD="$here/build/bpf" "$@"
