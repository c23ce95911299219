#!/usr/bin/env bash
# Build the incast kernels from Debian's linux-source-6.12, as root:
#
#   stock        the source as Debian ships it                 (QEMU VM: bzImage)
#   hrtimer      the same source with kernels/patches/*.patch  (QEMU VM: bzImage)
#   uml-stock    User-Mode Linux, kernels/patches-um/*.patch   (virtual time: linux)
#   uml-hrtimer  UML, kernels/patches-um/ + kernels/patches/   (virtual time: linux)
#
# The VM kernels use x86_64_defconfig merged with kernels/config/incast-vm.config
# (HZ=250, virtio, 9p root, tc, BPF, tracing), and with kernels/config/btf.config
# (debug info + BTF) if INCAST_KERNEL_BTF=1. The UML kernels are lean: ARCH=um's
# allnoconfig with kernels/config/incast-uml.config as its KCONFIG_ALLCONFIG (only
# what a guest uses: time-travel, hostfs, HZ=250, namespaces, veth, bridge, the tc
# the testbed uses); patches-um lets ARCH=um choose HZ.
# Results are cached outside the repository in
#
#   ${INCAST_KERNEL_CACHE:-/var/cache/incast/kernels}/<key>/<variant>/{bzImage,linux}
#
# where <key> hashes every input of the variant's family (the linux-source package
# version, the config fragments, the patches, this script). With unchanged inputs a
# rebuild is instant.
# Compiles go through ccache (same cache for both variants), so the second kernel
# only recompiles what the patches touch. Every compile runs under nice -n 19
# ionice -c3, unless --normal-priority (or INCAST_KERNEL_PRIORITY=normal) says
# that nothing on the machine needs the CPU more (scripts/setup.sh does).
#
# Usage: kernels/build.sh [--variant V]... [--uml] [--force] [--print-dir] [--jobs N]
#                         [--normal-priority]
#   --variant V   build V (repeatable; default: stock and hrtimer)
#   --uml         the same as --variant uml-stock --variant uml-hrtimer
#   --force       rebuild even if the cached result exists
#   --print-dir   print the result directory for the current inputs and exit
#                 (no build; prints nothing else; exit 1 if not built yet)
#   --jobs N      make -jN (default 2)
#   --normal-priority  build at the caller's CPU and I/O priority, not at the lowest
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${INCAST_KERNEL_CACHE:-/var/cache/incast/kernels}
jobs=${INCAST_KERNEL_JOBS:-2}
priority=${INCAST_KERNEL_PRIORITY:-low}
src_pkg=linux-source-6.12
src_tar=/usr/src/linux-source-6.12.tar.xz
vm_fragments=("$here/config/incast-vm.config")
[ "${INCAST_KERNEL_BTF:-0}" = 1 ] && vm_fragments+=("$here/config/btf.config")
um_fragments=("$here/config/incast-uml.config")
variants=()
force=0
print_dir=0
orig_args=("$@")

while [ $# -gt 0 ]; do
  case $1 in
    --variant) variants+=("$2"); shift 2 ;;
    --uml) variants+=(uml-stock uml-hrtimer); shift ;;
    --force) force=1; shift ;;
    --print-dir) print_dir=1; shift ;;
    --jobs) jobs=$2; shift 2 ;;
    --normal-priority) priority=normal; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ ${#variants[@]} -gt 0 ] || variants=(stock hrtimer)
for v in "${variants[@]}"; do
  case $v in stock|hrtimer|uml-stock|uml-hrtimer) ;; *) echo "build.sh: unknown variant $v" >&2; exit 2 ;; esac
done

log() { echo "build.sh: $*" >&2; }

# --- the cache key: every input of the build -------------------------------------
src_version=$(dpkg-query -W -f='${Version}' "$src_pkg" 2>/dev/null || true)
patch_list() { find "$here/$1" -maxdepth 1 -name '*.patch' | LC_ALL=C sort; }
patches=()
while IFS= read -r p; do patches+=("$p"); done < <(patch_list patches)
um_patches=()
while IFS= read -r p; do um_patches+=("$p"); done < <(patch_list patches-um)

# Per variant: its family (vm or um), its fragments, its patches, its image.
family() { case $1 in uml-*) echo um ;; *) echo vm ;; esac; }
image_of() { case $1 in uml-*) echo linux ;; *) echo bzImage ;; esac; }
fragments_of() { if [ "$(family "$1")" = um ]; then printf '%s\n' "${um_fragments[@]}"; else printf '%s\n' "${vm_fragments[@]}"; fi; }
patches_of() {
  case $1 in
    stock) ;;
    hrtimer) printf '%s\n' "${patches[@]}" ;;
    uml-stock) printf '%s\n' "${um_patches[@]}" ;;
    uml-hrtimer) printf '%s\n' "${um_patches[@]}" "${patches[@]}" ;;
  esac
}

# The key of a family: the VM kernels and the UML kernels are cached apart, so a
# change to one family's fragment does not rebuild the other.
compute_key() {
  local fam=$1 f p
  {
    echo "source $src_pkg $src_version"
    if [ "$fam" = um ]; then
      echo "family um"
      for f in "${um_fragments[@]}"; do echo "fragment $(basename "$f")"; cat "$f"; done
      for p in "${um_patches[@]}"; do echo "patch-um $(basename "$p")"; cat "$p"; done
    else
      for f in "${vm_fragments[@]}"; do echo "fragment $(basename "$f")"; cat "$f"; done
    fi
    for p in "${patches[@]}"; do echo "patch $(basename "$p")"; cat "$p"; done
    echo "script"; cat "$here/build.sh"
  } | sha256sum | cut -c1-16
}

if [ "$print_dir" = 1 ]; then
  [ -n "$src_version" ] || exit 1
  dir=
  for v in "${variants[@]}"; do
    d=$cache/$(compute_key "$(family "$v")")
    [ -f "$d/$v/$(image_of "$v")" ] || exit 1
    [ -z "$dir" ] || [ "$dir" = "$d" ] || { echo "build.sh: --print-dir: variants of two families" >&2; exit 2; }
    dir=$d
  done
  echo "$dir"
  exit 0
fi

[ "$(id -u)" = 0 ] || { log "run as root (installs packages, writes $cache)"; exit 2; }

# Everything below runs at the lowest CPU and I/O priority: other work on this
# machine (timing-sensitive experiments) must not notice the build. With
# --normal-priority it runs at the caller's (a set-up, where nothing else runs).
case $priority in
  low) lower=(nice -n 19 ionice -c3) ;;
  normal) lower=() ;;
  *) echo "build.sh: INCAST_KERNEL_PRIORITY is low or normal, not $priority" >&2; exit 2 ;;
esac
if [ "$priority" = low ] && [ -z "${INCAST_KERNEL_NICED:-}" ]; then
  export INCAST_KERNEL_NICED=1
  exec "${lower[@]}" bash "$0" "${orig_args[@]}"
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

work=$cache/work/$src_version
mkdir -p "$cache"
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
# make's arguments for a variant (ARCH=um for UML; ccache for both).
set_make_args() {
  local arch=x86_64
  [ "$(family "$1")" = um ] && arch=um
  make_args=(-j"$jobs" ARCH="$arch" CC="ccache gcc" HOSTCC="ccache gcc")
}

# A source tree per variant, kept between builds; it is made anew (extracted,
# patched) whenever its patch set changes, and ccache turns the full rebuild that
# follows into a rebuild of only the files that changed.
prepare_tree() {
  local v=$1 tree=$work/$1 want
  local mine=()
  while IFS= read -r p; do [ -n "$p" ] && mine+=("$p"); done < <(patches_of "$v")
  if [ ${#mine[@]} -gt 0 ]; then
    want=$(for p in "${mine[@]}"; do sha256sum < "$p"; done | sha256sum | cut -c1-16)
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
  for p in "${mine[@]}"; do
    log "$v: applying $(basename "$p")"
    patch -d "$tree" -p1 --quiet --forward < "$p"
  done
  echo "$want" > "$tree/.incast-patches"
}

build_variant() {
  local v=$1 tree=$work/$1 t0 t1 out image defconfig target built
  out=$cache/$(compute_key "$(family "$v")")
  image=$(image_of "$v")
  if [ "$(family "$v")" = um ]; then
    defconfig= target=linux built=linux    # allnoconfig + the fragments
  else
    defconfig=arch/x86/configs/x86_64_defconfig target=bzImage built=arch/x86/boot/bzImage
  fi
  if [ "$force" = 0 ] && [ -f "$out/$v/$image" ]; then
    log "$v: cached $out/$v/$image"
    results+=("$out")
    return
  fi
  t0=$(date +%s)
  set_make_args "$v"
  prepare_tree "$v"
  local names=() f frags=()
  while IFS= read -r f; do frags+=("$f"); done < <(fragments_of "$v")
  for f in "${frags[@]}"; do cp "$f" "$tree/incast-$(basename "$f")"; names+=("incast-$(basename "$f")"); done
  (
    cd "$tree"
    if [ -n "$defconfig" ]; then
      scripts/kconfig/merge_config.sh -m "$defconfig" "${names[@]}" >/dev/null
    else
      # Lean: every option with a prompt off but what the fragments turn on.
      cat "${names[@]}" > incast-allconfig
      make "${make_args[@]}" KCONFIG_ALLCONFIG=incast-allconfig allnoconfig >/dev/null
    fi
    make "${make_args[@]}" olddefconfig >/dev/null
    # Every fragment line must survive olddefconfig (the last fragment naming a
    # symbol wins): a dropped line means a missing dependency.
    cat "${names[@]}" | grep -E '^(CONFIG_|# CONFIG_)' |
      awk '{ sym = ($1 == "#") ? $2 : substr($1, 1, index($1, "=") - 1); last[sym] = $0 }
           END { for (s in last) print last[s] }' |
      while IFS= read -r line; do
        grep -qxF "$line" .config || { echo "build.sh: config line lost: $line" >&2; exit 1; }
      done
    log "$v: make $target (log: $out/$v/build.log)"
    mkdir -p "$out/$v"
    if ! "${lower[@]}" make "${make_args[@]}" LOCALVERSION="-incast-$v" "$target" \
         > "$out/$v/build.log" 2>&1; then
      tail -30 "$out/$v/build.log" >&2
      exit 1
    fi
  )
  cp "$tree/$built" "$out/$v/$image.tmp"
  cp "$tree/.config" "$out/$v/config"
  cp "$tree/System.map" "$out/$v/System.map"
  make -s -C "$tree" "${make_args[@]}" LOCALVERSION="-incast-$v" kernelrelease > "$out/$v/kernel.release"
  t1=$(date +%s)
  echo "$((t1 - t0))" > "$out/$v/build-seconds"
  mv "$out/$v/$image.tmp" "$out/$v/$image"
  log "$v: built $out/$v/$image ($(cat "$out/$v/kernel.release")) in $((t1 - t0)) s"
  results+=("$out")
  {
    echo "source: $src_pkg $src_version"
    for f in "${frags[@]}"; do echo "fragment: $(basename "$f") $(sha256sum < "$f" | cut -c1-16)"; done
    while IFS= read -r p; do [ -n "$p" ] && echo "patch: $(basename "$p") $(sha256sum < "$p" | cut -c1-16)"; done < <(patches_of "$v")
    echo "script: $(sha256sum < "$here/build.sh" | cut -c1-16)"
  } > "$out/$v/inputs"
  ccache -s > "$out/$v/ccache-stats" 2>/dev/null || true
}

results=()
for v in "${variants[@]}"; do
  build_variant "$v"
done
printf '%s\n' "${results[@]}" | awk '!seen[$0]++'
