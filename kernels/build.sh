#!/usr/bin/env bash
# Build the two incast VM kernels from Debian's linux-source-6.12, as root:
#
#   stock    the source as Debian ships it
#   hrtimer  the same source with kernels/patches/*.patch applied
#
# Both use the same configuration: x86_64_defconfig merged with
# kernels/config/incast-vm.config (HZ=250, virtio, 9p root, tc, BPF, tracing), and
# with kernels/config/btf.config (debug info + BTF) if INCAST_KERNEL_BTF=1.
# Results are cached outside the repository in
#
#   ${INCAST_KERNEL_CACHE:-/var/cache/incast/kernels}/<key>/{stock,hrtimer}/bzImage
#
# where <key> hashes every input (the linux-source package version, the config
# fragments, the patches, this script). With unchanged inputs a rebuild is instant.
# Compiles go through ccache (same cache for both variants), so the second kernel
# only recompiles what the patches touch. Every compile runs under nice -n 19
# ionice -c3.
#
# Usage: kernels/build.sh [--variant stock|hrtimer] [--force] [--print-dir] [--jobs N]
#   --variant V   build only V (default: both)
#   --force       rebuild even if the cached result exists
#   --print-dir   print the result directory for the current inputs and exit
#                 (no build; prints nothing else; exit 1 if not built yet)
#   --jobs N      make -jN (default 2)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${INCAST_KERNEL_CACHE:-/var/cache/incast/kernels}
jobs=${INCAST_KERNEL_JOBS:-2}
src_pkg=linux-source-6.12
src_tar=/usr/src/linux-source-6.12.tar.xz
fragments=("$here/config/incast-vm.config")
[ "${INCAST_KERNEL_BTF:-0}" = 1 ] && fragments+=("$here/config/btf.config")
variants=(stock hrtimer)
force=0
print_dir=0
orig_args=("$@")

while [ $# -gt 0 ]; do
  case $1 in
    --variant) variants=("$2"); shift 2 ;;
    --force) force=1; shift ;;
    --print-dir) print_dir=1; shift ;;
    --jobs) jobs=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
for v in "${variants[@]}"; do
  case $v in stock|hrtimer) ;; *) echo "build.sh: unknown variant $v" >&2; exit 2 ;; esac
done

log() { echo "build.sh: $*" >&2; }

# --- the cache key: every input of the build -------------------------------------
src_version=$(dpkg-query -W -f='${Version}' "$src_pkg" 2>/dev/null || true)
patches=()
while IFS= read -r p; do patches+=("$p"); done < <(find "$here/patches" -maxdepth 1 -name '*.patch' | LC_ALL=C sort)

compute_key() {
  {
    echo "source $src_pkg $src_version"
    for f in "${fragments[@]}"; do echo "fragment $(basename "$f")"; cat "$f"; done
    for p in "${patches[@]}"; do echo "patch $(basename "$p")"; cat "$p"; done
    echo "script"; cat "$here/build.sh"
  } | sha256sum | cut -c1-16
}

if [ "$print_dir" = 1 ]; then
  [ -n "$src_version" ] || exit 1
  dir=$cache/$(compute_key)
  for v in "${variants[@]}"; do [ -f "$dir/$v/bzImage" ] || exit 1; done
  echo "$dir"
  exit 0
fi

[ "$(id -u)" = 0 ] || { log "run as root (installs packages, writes $cache)"; exit 2; }

# Everything below runs at the lowest CPU and I/O priority: other work on this
# machine (timing-sensitive experiments) must not notice the build.
if [ -z "${INCAST_KERNEL_NICED:-}" ]; then
  export INCAST_KERNEL_NICED=1
  exec nice -n 19 ionice -c3 bash "$0" "${orig_args[@]}"
fi

# --- build dependencies (idempotent) ------------------------------------------------
deps=(build-essential bc bison flex libelf-dev libssl-dev dwarves ccache "$src_pkg"
      qemu-system-x86 rsync cpio xz-utils patch kmod)
missing=()
for p in "${deps[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
  src_version=$(dpkg-query -W -f='${Version}' "$src_pkg")
fi
[ -f "$src_tar" ] || { log "$src_tar is missing"; exit 1; }

key=$(compute_key)
out=$cache/$key
work=$cache/work/$src_version
mkdir -p "$cache" "$out"
exec 9>"$cache/.lock"
flock 9

export CCACHE_DIR=$cache/ccache
export CCACHE_BASEDIR=$cache/work
export CCACHE_NOHASHDIR=1
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-10G}
export CCACHE_SLOPPINESS=time_macros,include_file_mtime,include_file_ctime
# A fixed identity keeps version strings (and so ccache hits) reproducible.
export KBUILD_BUILD_TIMESTAMP="$src_version"
export KBUILD_BUILD_USER=incast
export KBUILD_BUILD_HOST=incast-testbed
make_args=(-j"$jobs" ARCH=x86_64 CC="ccache gcc" HOSTCC="ccache gcc")

# A source tree per variant, kept between builds; it is made anew (extracted,
# patched) whenever its patch set changes, and ccache turns the full rebuild that
# follows into a rebuild of only the files that changed.
prepare_tree() {
  local v=$1 tree=$work/$1 want
  if [ "$v" = hrtimer ]; then
    want=$(for p in "${patches[@]}"; do sha256sum < "$p"; done | sha256sum | cut -c1-16)
  else
    want=none
  fi
  if [ -f "$tree/.incast-patches" ] && [ "$(cat "$tree/.incast-patches")" = "$want" ]; then
    return
  fi
  log "$v: extracting $src_tar"
  rm -rf "$tree" "$work/.extract-$v"
  mkdir -p "$work/.extract-$v"
  tar -xf "$src_tar" -C "$work/.extract-$v"
  mv "$work/.extract-$v/linux-source-6.12" "$tree"
  rmdir "$work/.extract-$v"
  if [ "$v" = hrtimer ]; then
    for p in "${patches[@]}"; do
      log "$v: applying $(basename "$p")"
      patch -d "$tree" -p1 --quiet --forward < "$p"
    done
  fi
  echo "$want" > "$tree/.incast-patches"
}

build_variant() {
  local v=$1 tree=$work/$1 t0 t1
  if [ "$force" = 0 ] && [ -f "$out/$v/bzImage" ]; then
    log "$v: cached $out/$v/bzImage"
    return
  fi
  t0=$(date +%s)
  prepare_tree "$v"
  local names=() f
  for f in "${fragments[@]}"; do cp "$f" "$tree/incast-$(basename "$f")"; names+=("incast-$(basename "$f")"); done
  (
    cd "$tree"
    scripts/kconfig/merge_config.sh -m arch/x86/configs/x86_64_defconfig "${names[@]}" >/dev/null
    make "${make_args[@]}" olddefconfig >/dev/null
    # Every fragment line must survive olddefconfig (the last fragment naming a
    # symbol wins): a dropped line means a missing dependency.
    cat "${names[@]}" | grep -E '^(CONFIG_|# CONFIG_)' |
      awk '{ sym = ($1 == "#") ? $2 : substr($1, 1, index($1, "=") - 1); last[sym] = $0 }
           END { for (s in last) print last[s] }' |
      while IFS= read -r line; do
        grep -qxF "$line" .config || { echo "build.sh: config line lost: $line" >&2; exit 1; }
      done
    log "$v: make bzImage (log: $out/$v/build.log)"
    mkdir -p "$out/$v"
    if ! nice -n 19 ionice -c3 make "${make_args[@]}" LOCALVERSION="-incast-$v" bzImage \
         > "$out/$v/build.log" 2>&1; then
      tail -30 "$out/$v/build.log" >&2
      exit 1
    fi
  )
  cp "$tree/arch/x86/boot/bzImage" "$out/$v/bzImage.tmp"
  cp "$tree/.config" "$out/$v/config"
  cp "$tree/System.map" "$out/$v/System.map"
  make -s -C "$tree" LOCALVERSION="-incast-$v" kernelrelease > "$out/$v/kernel.release"
  t1=$(date +%s)
  echo "$((t1 - t0))" > "$out/$v/build-seconds"
  mv "$out/$v/bzImage.tmp" "$out/$v/bzImage"
  log "$v: built $out/$v/bzImage ($(cat "$out/$v/kernel.release")) in $((t1 - t0)) s"
}

for v in "${variants[@]}"; do
  build_variant "$v"
done

{
  echo "source: $src_pkg $src_version"
  for f in "${fragments[@]}"; do echo "fragment: $(basename "$f") $(sha256sum < "$f" | cut -c1-16)"; done
  for p in "${patches[@]}"; do echo "patch: $(basename "$p") $(sha256sum < "$p" | cut -c1-16)"; done
  echo "script: $(sha256sum < "$here/build.sh" | cut -c1-16)"
} > "$out/inputs"
ccache -s > "$out/ccache-stats" 2>/dev/null || true
echo "$out"
