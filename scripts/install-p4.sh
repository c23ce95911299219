#!/usr/bin/env bash
# bmv2 (simple_switch) and p4c (p4c-bm2-ss) for the P4 data plane and labs 5-7 (--grpc: and lab 9), as root.
#
# In this order, stopping at the first that gives recent enough tools (bmv2 >= 1.15.1,
# p4c >= 1.2.3.7; the project is tested with bmv2 1.15.5 and p4c 1.2.3.7):
#
#   1. tools already there: on PATH, or built before under the prefix (then only the
#      libraries they need are installed and they are linked into /usr/local/bin)
#   2. p4lang's packages (Open Build Service, home:p4lang) for this distribution,
#      where a repository exists for it and offers recent enough versions (not with
#      --grpc: they lack the patches below)
#   3. the pinned releases built from source into the prefix: bmv2 1.15.5, then p4c
#      v1.2.3.7 with its p4runtime submodule; sources cloned from GitHub at those tags,
#      or taken from --src DIR (DIR/behavioral-model and DIR/p4c, source trees of the
#      same releases, p4c's with control-plane/p4runtime filled in). Only what the
#      testbed runs is built: bmv2's simple_switch and simple_switch_CLI (no psa_switch,
#      pna_nic, simple_router, l2_switch, tests), p4c's p4c-bm2-ss (no p4c-bm2-psa, p4c
#      driver, p4test, tests). Each step's time, CPU time and load are printed; the times
#      measured on 2 cores are in docs/setup.md.
#
# Usage: scripts/install-p4.sh [--prefix DIR] [--src DIR] [--from auto|packages|source]
#                              [--jobs N] [--no-link] [--grpc] [--dry-run]
#   --prefix DIR   where a source build installs (default /opt/p4)
#   --src DIR      build from these sources instead of cloning them
#   --from WAY     packages: only p4lang's packages; source: only a source build
#   --jobs N       make -jN (default: the number of CPUs)
#   --no-link      do not link simple_switch, simple_switch_CLI, p4c and p4c-bm2-ss
#                  (and simple_switch_grpc) into /usr/local/bin (they are then only
#                  in DIR/bin)
#   --grpc         also bmv2's P4Runtime server, simple_switch_grpc, beside
#                  simple_switch: PI (p4lang/PI at the pinned commit PI_COMMIT below,
#                  with the submodules that commit records; with --src, DIR/PI with
#                  them filled in), only its P4Runtime gRPC server and the libraries
#                  under it, then bmv2 configured --with-pi --with-thrift (the server
#                  also answers simple_switch_CLI, for debugging, and for a testbed
#                  run on a build without the patches). gRPC and protobuf are the
#                  distribution's (Debian 12: 1.51.1 and 3.21.12). PI and bmv2 get the
#                  patches in
#                  scripts/p4-patches/ (P4Runtime register reads and writes; the
#                  egress queues from a file at start, simple_switch_grpc
#                  --queue-config), so that the testbed programs a switch through
#                  P4Runtime alone. Tools already there count only with
#                  simple_switch_grpc built with these patches (the prefix's
#                  share/incast-p4/patches names them by their hash); a prefix
#                  without it gets PI and bmv2 built again (not p4c, when it is
#                  there at the pinned release)
#   --dry-run      print what would be installed, built and written, and stop
# The prefix is made known to ld.so and Python by /etc/ld.so.conf.d/NAME.conf and
# /usr/lib/python3/dist-packages/NAME.pth, NAME being incast-p4 for /opt/p4 and
# incast-p4_<prefix> for another prefix (/opt/p4-grpc: incast-p4_grpc), so that a
# second prefix leaves the first one's files alone.
# Compiles run under nice -n 19 ionice -c3. The build tree (/var/tmp/NAME-build)
# is removed after a successful build; run again after an interruption, the build resumes
# there (a bmv2 of the pinned release already under the prefix is not built again).
set -euo pipefail

BMV2_MIN=1.15.1
P4C_MIN=1.2.3.7
BMV2_TAG=1.15.5
P4C_TAG=v1.2.3.7
BMV2_GIT=https://github.com/p4lang/behavioral-model.git
P4C_GIT=https://github.com/p4lang/p4c.git
# PI: bmv2 pins none (its CI builds PI's main); this is main of 2026-06-28, after
# v0.1.2, with p4runtime ec4eb5e (v1.4.0-rc.5+40, a superset of p4c v1.2.3.7's),
# gnmi 9c8d9e9, uthash bf15263 and googletest f5edb4f (configure --with-proto wants
# it, though only PI's tests use it). Not proto/openconfig/public (sysrepo only).
PI_COMMIT=f96af95e090619491e3abf2df69df340c2c9cb46
PI_GIT=https://github.com/p4lang/PI.git
PI_SUBMODULES=(proto/p4runtime proto/openconfig/gnmi third_party/uthash third_party/googletest)
# Our patches to PI and bmv2 (git format-patch, applied in name order to the tree of
# the directory they are in), and with --grpc their hash (below): a prefix records the
# hash it was built with, and a different one (patches added or changed) builds PI
# and bmv2 again.
PATCHES=$(cd "$(dirname "$0")" && pwd)/p4-patches
patch_files() { (cd "$PATCHES" && find . -name '*.patch' -not -name '.*' | LC_ALL=C sort); }
OBS=https://download.opensuse.org/repositories

prefix=/opt/p4
src=
from=auto
jobs=$(nproc)
link=1
grpc=0
dry_run=0
while [ $# -gt 0 ]; do
  case $1 in
    --prefix|--src|--from|--jobs)
      [ $# -ge 2 ] || { echo "install-p4: $1 needs a value" >&2; exit 2; } ;;
  esac
  case $1 in
    --prefix) prefix=$(realpath -ms "$2"); shift 2 ;;
    --src) src=$(cd "$2" && pwd); shift 2 ;;
    --from) from=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --no-link) link=0; shift ;;
    --grpc) grpc=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-p4: unknown argument $1" >&2; exit 2 ;;
  esac
done
case $from in auto|packages|source) ;; *) echo "install-p4: --from auto, packages or source" >&2; exit 2 ;; esac
case $jobs in ''|0|*[!0-9]*) echo "install-p4: --jobs takes a number of jobs, not $jobs" >&2; exit 2 ;; esac
patch_key=
if [ "$grpc" = 1 ]; then
  [ -d "$PATCHES/PI" ] && [ -d "$PATCHES/behavioral-model" ] ||
    { echo "install-p4: --grpc needs $PATCHES/PI and $PATCHES/behavioral-model" >&2; exit 2; }
  # The Vagrantfile computes the same hash (the files in byte order of their paths).
  patch_key=$(cd "$PATCHES" && patch_files | xargs cat | sha256sum | cut -c1-16)
fi
# What the prefix's ld.so.conf.d and .pth files and the build tree are named after. "_"
# sorts after ".", and ld.so.conf.d and Python read their files in sorted order: the
# default prefix comes first, and another one only adds what it lacks (the same bmv2
# Python modules in two prefixes are the default's).
if [ "$prefix" = /opt/p4 ]; then
  tag=incast-p4
else
  tag=incast-p4_$(printf '%s' "$prefix" | sed 's|^/opt/||; s|^p4-||; s|[^A-Za-z0-9.-]|-|g; s|^[-.]*||')
fi
ldconf=/etc/ld.so.conf.d/$tag.conf
patch_mark=$prefix/share/incast-p4/patches
pth=/usr/lib/python3/dist-packages/$tag.pth
work=/var/tmp/$tag-build

log() { echo "install-p4: $*" >&2; }

# --- the build dependencies, and the libraries a built prefix needs at run time ----
build_deps=(g++ make autoconf automake libtool pkg-config cmake bison flex libfl-dev
  thrift-compiler libthrift-dev libnanomsg-dev libpcap-dev libgmp-dev libssl-dev
  libboost-dev libboost-program-options-dev libboost-system-dev libboost-filesystem-dev
  libboost-thread-dev libboost-iostreams-dev libxxhash-dev
  libjsoncpp-dev libevent-dev libgc-dev protobuf-compiler libprotobuf-dev
  libgtest-dev   # p4c's lib/source_file.h includes gtest/gtest_prod.h (its gtest submodule, absent from --src trees)
  python3 python3-thrift python3-six git ca-certificates)
# Debian 12's names (the box's distribution); elsewhere the build dependencies above
# provide the same libraries.
runtime_deps=(libthrift-0.17.0 libnanomsg5 libpcap0.8 libgmp10 libssl3
  libboost-program-options1.74.0 libboost-system1.74.0 libboost-filesystem1.74.0
  libboost-thread1.74.0 libboost-iostreams1.74.0 libxxhash0 libjsoncpp25 libgc1
  libprotobuf32 cpp python3 python3-thrift python3-six)
# The programs a prefix must have (each at its minimum version) to count as installed.
programs=(simple_switch p4c-bm2-ss)
if [ "$grpc" = 1 ]; then
  # gRPC's C++ library and protoc plugin (they bring absl, re2 and c-ares). Not
  # libmicrohttpd-dev: PI would build its HTTP demo.
  build_deps+=(libgrpc++-dev libgrpc-dev protobuf-compiler-grpc)
  runtime_deps+=(libgrpc++1.51 libgrpc29)
  programs+=(simple_switch_grpc)
fi

# bmv2: simple_switch with its Thrift server and nanomsg notifications (the testbed's
# switch), simple_switch_CLI and the Python modules it imports (runtime_CLI, bmpy_utils,
# bm_runtime, sswitch_runtime). configure has no switch for single targets, so make
# runs in the directories these come from, in dependency order; the other targets
# (psa_switch, pna_nic, simple_router, l2_switch), bmv2's tests and its client
# libraries (bm_apps) are not built. No PI without --grpc (no P4Runtime server: the
# testbed programs the switch over Thrift; do not pass --without-pi, which configure
# takes as --with-pi); the logging macros and the event logger cost the switch time on
# every packet, and the testbed uses neither (its telemetry is packets on port 510, and
# --notifications-addr works without the event logger). --disable-static: libtool
# would compile every file twice, once more for static libraries nothing uses
# (simple_switch is linked from the position-independent objects either way).
bmv2_configure=(--prefix="$prefix" PYTHON=/usr/bin/python3 --disable-logging-macros
  --disable-elogger --disable-static "CXXFLAGS=-O3 -g0")
bmv2_build_dirs=(thrift_src proto src/BMI src/bm_sim src/bm_runtime targets/simple_switch tools)
bmv2_install_dirs=(thrift_src third_party include targets/simple_switch tools)
# PI: the C core (libpi, libpip4info), the C++ frontend and the P4Runtime protos and
# gRPC server (libpifeproto, libpigrpcserver, ...). Without its CLI, its nanomsg RPC
# and its own bmv2 target (bmv2's PI/ below is the one simple_switch_grpc uses), sysrepo,
# static libraries, tests, and Python stubs: with grpc_python_plugin present (in
# protobuf-compiler-grpc) PI and bmv2 would install top-level p4/ and google/ packages
# into the prefix's site-packages, which the .pth puts on python3's path (a regular
# google/ package there hides the namespace package google.protobuf is installed
# in). -g0, as for bmv2.
pi_configure=(--prefix="$prefix" --with-proto --without-internal-rpc --without-cli
  --without-bmv2 --without-sysrepo --disable-static PYTHON=/usr/bin/python3
  ac_cv_path_GRPC_PY_PLUGIN= ac_cv_lib_microhttpd_MHD_start_daemon=no
  "CFLAGS=-O2 -g0" "CXXFLAGS=-O2 -g0")
if [ "$grpc" = 1 ]; then
  # bmv2's PI/ (libbmpi, PI's target implementation) and services/ (a gRPC dataplane
  # interface simple_switch_grpc links), then simple_switch_grpc, which configure sets
  # up as a sub-project with these arguments. PI/ comes before targets/: simple_switch's
  # libsimpleswitch_runner links libbmpi --with-pi. bmv2 looks for PI's headers and
  # libraries in the prefix only through CPPFLAGS and LDFLAGS; -isystem, because
  # automake puts CPPFLAGS last and an -I there would put headers installed in the
  # prefix before bmv2's own third_party ones.
  bmv2_configure+=(--with-pi --with-thrift "CPPFLAGS=-isystem $prefix/include"
    "LDFLAGS=-L$prefix/lib" ac_cv_path_GRPC_PY_PLUGIN=)
  bmv2_build_dirs=(thrift_src proto src/BMI src/bm_sim src/bm_runtime PI
    targets/simple_switch services targets/simple_switch_grpc tools)
  bmv2_install_dirs=(thrift_src third_party include PI services targets/simple_switch
    targets/simple_switch_grpc tools)
fi

# --src DIR: the trees it must hold (checked before anything is installed).
check_src() {
  local d f
  for d in behavioral-model p4c $([ "$grpc" = 1 ] && echo PI); do
    [ -d "$src/$d" ] || { log "--src $src has no $d/"; exit 2; }
  done
  [ -f "$src/p4c/control-plane/p4runtime/proto/p4/v1/p4runtime.proto" ] ||
    { log "$src/p4c/control-plane/p4runtime is empty (p4c's p4runtime submodule)"; exit 2; }
  [ "$grpc" = 1 ] || return 0
  # a file of each submodule PI_SUBMODULES names
  for f in proto/p4runtime:proto/p4/v1/p4runtime.proto proto/openconfig/gnmi:proto/gnmi/gnmi.proto \
           third_party/uthash:src/uthash.h third_party/googletest:googletest/src/gtest.cc; do
    d=${f%%:*}
    [ -f "$src/PI/$d/${f#*:}" ] || { log "$src/PI/$d is empty (PI's $d submodule)"; exit 2; }
  done
}
if [ -n "$src" ]; then check_src; fi

if [ "$dry_run" = 1 ]; then
  echo "prefix: $prefix"
  echo "programs: ${programs[*]}"
  echo "link into /usr/local/bin: $([ "$link" = 1 ] && echo yes || echo no)"
  echo "ld.so: $ldconf"
  echo "python: $pth"
  echo "build tree: $work"
  echo "from: $from"
  echo "sources: ${src:-git clones}"
  echo "apt build: ${build_deps[*]}"
  echo "apt runtime: ${runtime_deps[*]}"
  if [ "$grpc" = 1 ]; then
    echo "PI $PI_COMMIT: configure ${pi_configure[*]}"
    echo "patches ($patch_key): $(patch_files | tr '\n' ' ')"
  fi
  echo "bmv2 $BMV2_TAG: configure ${bmv2_configure[*]}"
  echo "bmv2 make: ${bmv2_build_dirs[*]}"
  echo "bmv2 install: ${bmv2_install_dirs[*]}"
  echo "p4c $P4C_TAG: make p4c-bm2-ss"
  echo "jobs: $jobs"
  exit 0
fi
[ "$(id -u)" = 0 ] || { echo "install-p4: run as root" >&2; exit 2; }

export DEBIAN_FRONTEND=noninteractive
# Waits for another apt or dpkg (a provisioning running beside this one) to finish.
apt_install() {
  local get=(apt-get -o DPkg::Lock::Timeout=1800)
  "${get[@]}" install -y -qq --no-install-recommends "$@" >/dev/null ||
    { "${get[@]}" update -qq && "${get[@]}" install -y -qq --no-install-recommends "$@" >/dev/null; }
}
# The first version number in a tool's --version output ("1.15.5-unknown",
# "p4c 1.2.3.7 (SHA: ...)"), or nothing.
version_of() { "$1" --version 2>&1 | grep -oE '[0-9]+(\.[0-9]+){2,3}' | head -1 || true; }
at_least() { [ -n "$1" ] && dpkg --compare-versions "$1" ge "$2"; }

min_version() { case $1 in p4c*) echo "$P4C_MIN" ;; *) echo "$BMV2_MIN" ;; esac; }
# With --grpc, was the prefix's PI and bmv2 built with today's patches?
patched() { [ "$grpc" = 0 ] || [ "$(cat "$patch_mark" 2>/dev/null)" = "$patch_key" ]; }
# The programs, found as `which` finds them (the prefix's bin first), recent enough
# (and with --grpc, simple_switch_grpc the prefix's, patched)?
tools_ok() {
  local t f
  for t in "${programs[@]}"; do
    f=$(PATH="$prefix/bin:$PATH" command -v "$t" || true)
    [ -n "$f" ] && at_least "$(version_of "$f")" "$(min_version "$t")" || return 1
    if [ "$t" = simple_switch_grpc ]; then [ "$f" = "$prefix/bin/$t" ] && patched || return 1; fi
  done
}

report() {
  local t f found=()
  for t in "${programs[@]}"; do
    f=$(PATH="$prefix/bin:$PATH" command -v "$t")
    found+=("$f $(version_of "$f")")
  done
  log "ok: $(IFS=,; echo "${found[*]}" | sed 's/,/, /g') ($1)"
}

# ld.so, Python and /usr/local/bin see the prefix (idempotent).
post_install() {
  echo "$prefix/lib" > "$ldconf"
  ldconfig
  # bmv2's Python modules (the CLIs import them), for Debian's python3 and the venvs
  # that see its packages.
  local site
  for site in "$prefix"/lib/python3*/site-packages; do
    if [ -d "$site" ]; then echo "$site" > "$pth"; fi
  done
  # bmv2's CLIs say `#!/usr/bin/env python3`, which in an activated venv is the venv's
  # Python; they need Debian's (python3-thrift, the .pth above).
  if [ -w "$prefix/bin" ]; then
    local f
    for f in "$prefix"/bin/*; do
      [ -f "$f" ] && head -c 64 "$f" | grep -q '^#!/usr/bin/env python3' || continue
      sed -i '1s|^#!/usr/bin/env python3$|#!/usr/bin/python3|' "$f"
    done
  fi
  if [ "$link" = 1 ]; then
    local t
    for t in simple_switch simple_switch_CLI simple_switch_grpc p4c p4c-bm2-ss; do
      if [ -x "$prefix/bin/$t" ]; then ln -sf "$prefix/bin/$t" "/usr/local/bin/$t"; fi
    done
  fi
}

missing_libs() {
  local t
  for t in "${programs[@]}"; do
    ldd "$prefix/bin/$t" 2>/dev/null | awk '/not found/ {print $1}'
  done | sort -u
}

# --- 1. already there ---------------------------------------------------------------
prefix_has() { local t; for t; do [ -x "$prefix/bin/$t" ] || return 1; done; }
if prefix_has "${programs[@]}"; then
  # A prefix built before (or mounted from a host that built it): its libraries.
  if . /etc/os-release && [ "$ID:$VERSION_ID" = debian:12 ]; then
    apt_install "${runtime_deps[@]}"
  else
    apt_install "${build_deps[@]}"
  fi
  post_install
  if [ -n "$(missing_libs)" ]; then
    log "$prefix was built elsewhere: missing libraries $(missing_libs | tr '\n' ' ')"
  elif tools_ok; then
    report "built before in $prefix"
    exit 0
  fi
fi
if [ "$from" != source ] && tools_ok; then
  report "already installed"
  exit 0
fi

# --- 2. p4lang's packages -------------------------------------------------------------
# The Open Build Service projects p4lang publishes to, for this distribution; the newest
# project first. Each is tried with its own package lists only, and left configured
# only if it offers recent enough versions.
obs_dirs() {
  . /etc/os-release
  case "$ID:$VERSION_ID" in
    debian:11|debian:12|debian:13) echo "home:/p4lang/Debian_$VERSION_ID" ;;
    ubuntu:22.04) echo "home:/p4lang:/latest/xUbuntu_22.04"; echo "home:/p4lang/xUbuntu_22.04" ;;
    ubuntu:*) echo "home:/p4lang/xUbuntu_$VERSION_ID" ;;
  esac
}

try_packages() {
  local dir url list key bmv2 p4c
  apt_install curl gpg ca-certificates
  for dir in $(obs_dirs); do
    url="$OBS/$dir"
    list=/etc/apt/sources.list.d/incast-p4lang.list
    key=/etc/apt/trusted.gpg.d/incast-p4lang.gpg
    log "trying p4lang's packages: $url"
    if ! curl -fsSL --connect-timeout 20 --max-time 60 "$url/Release.key" 2>/dev/null | gpg --dearmor > "$key.tmp" 2>/dev/null ||
       [ ! -s "$key.tmp" ]; then
      log "  unreachable"
      rm -f "$key.tmp"
      continue
    fi
    mv "$key.tmp" "$key"
    echo "deb $url/ /" > "$list"
    if ! apt-get update -qq -o Dir::Etc::sourcelist="$list" -o Dir::Etc::sourceparts=- \
           -o APT::Get::List-Cleanup=0 >/dev/null 2>&1; then
      log "  its package lists do not load"
      rm -f "$list" "$key"
      continue
    fi
    bmv2=$(apt-cache policy p4lang-bmv2 | awk '/Candidate:/ {print $2}')
    p4c=$(apt-cache policy p4lang-p4c | awk '/Candidate:/ {print $2}')
    if at_least "${bmv2%%[-+~]*}" "$BMV2_MIN" && at_least "${p4c%%[-+~]*}" "$P4C_MIN"; then
      log "  p4lang-bmv2 $bmv2, p4lang-p4c $p4c: installing"
      if apt-get install -y -qq p4lang-bmv2 p4lang-p4c >/dev/null && tools_ok; then
        return 0
      fi
      log "  installed, but not all of ${programs[*]} are there in recent enough versions"
      apt-get remove -y -qq p4lang-bmv2 p4lang-p4c >/dev/null 2>&1 || true
    else
      log "  p4lang-bmv2 ${bmv2:-none}, p4lang-p4c ${p4c:-none}: need >= $BMV2_MIN and >= $P4C_MIN"
    fi
    rm -f "$list" "$key"
    apt-get update -qq >/dev/null 2>&1 || true
  done
  return 1
}

if [ "$grpc" = 1 ] && [ "$from" != source ]; then
  # p4lang's packages are not built with scripts/p4-patches/
  [ "$from" = packages ] && { log "--grpc needs PI and bmv2 with scripts/p4-patches/, which p4lang's packages lack"; exit 1; }
  log "--grpc: building PI and bmv2 with scripts/p4-patches/ (p4lang's packages lack them)"
elif [ "$from" != source ]; then
  if try_packages; then
    report "p4lang's packages"
    exit 0
  fi
  [ "$from" = packages ] && { log "no recent enough p4lang packages for this distribution"; exit 1; }
  log "no recent enough p4lang packages here: building bmv2 $BMV2_TAG and p4c $P4C_TAG from source"
fi

# --- 3. the pinned releases, from source --------------------------------------------
niced() { nice -n 19 ionice -c3 "$@"; }
in_dir() { cd "$1" && shift && "$@"; }
load() { cut -d' ' -f1-3 /proc/loadavg; }
# step NAME LOG CMD...: runs CMD with its output appended to LOG and prints how long it
# took (wall clock and CPU, children included) and the load average at its end, which
# says how much else ran beside it.
step() {
  local name=$1 logf=$2 times real user sys TIMEFORMAT='%R %U %S'
  shift 2
  times=$(mktemp)
  if ! { time { ( "$@" ) >>"$logf" 2>&1; }; } 2>"$times"; then
    rm -f "$times"
    tail -30 "$logf" >&2
    log "$name failed (log: $logf)"
    exit 1
  fi
  read -r real user sys < "$times" || true
  rm -f "$times"
  log "$name: ${real%.*} s, CPU $(( ${user%.*} + ${sys%.*} )) s, load average $(load)"
}

t=$(date +%s)
apt_install "${build_deps[@]}"
log "build dependencies (apt): $(($(date +%s) - t)) s, load average $(load)"
# An interrupted build resumes: the trees stay while they hold the same releases from
# the same place (make redoes only what is missing); anything else starts afresh.
sources="bmv2 $BMV2_TAG p4c $P4C_TAG from ${src:-$BMV2_GIT $P4C_GIT}"
if [ "$grpc" = 1 ]; then sources+=", PI $PI_COMMIT${src:+ from $src/PI}, patches $patch_key"; fi
if [ "$(cat "$work/.sources" 2>/dev/null)" != "$sources" ]; then
  rm -rf "$work"
  mkdir -p "$work"
  if [ -n "$src" ]; then
    log "sources from $src"
    # -H: DIR/behavioral-model may be a symbolic link, which is copied as the tree it
    # points to (the build must not happen in that tree)
    cp -aH "$src/behavioral-model" "$src/p4c" "$work/"
    if [ "$grpc" = 1 ]; then cp -aH "$src/PI" "$work/"; fi
  else
    log "cloning bmv2 $BMV2_TAG and p4c $P4C_TAG"
    git clone -q --depth 1 --branch "$BMV2_TAG" "$BMV2_GIT" "$work/behavioral-model"
    git clone -q --depth 1 --branch "$P4C_TAG" "$P4C_GIT" "$work/p4c"
    git -C "$work/p4c" submodule -q update --init control-plane/p4runtime
    if [ "$grpc" = 1 ]; then
      log "cloning PI at $PI_COMMIT"
      git clone -q "$PI_GIT" "$work/PI"
      git -C "$work/PI" checkout -q "$PI_COMMIT"
      git -C "$work/PI" submodule -q update --init "${PI_SUBMODULES[@]}"
    fi
  fi
  if [ "$grpc" = 1 ]; then
    for d in PI behavioral-model; do
      # A --src tree checked out as a submodule or a worktree has a .git file pointing
      # at a repository the copy does not have, which git apply would refuse: without
      # it, git apply patches the tree it is run in (a clone's top, or a plain copy).
      if [ -f "$work/$d/.git" ]; then rm "$work/$d/.git"; fi
      for f in $(patch_files | grep "^\./$d/"); do
        log "patching $d: ${f#./$d/}"
        (cd "$work/$d" && git apply --whitespace=nowarn "$PATCHES/$f")
      done
    done
  fi
  echo "$sources" > "$work/.sources"
else
  log "resuming the build in $work"
fi

# bmv2 (and with --grpc PI before it), configured and built as said at the top
# (bmv2_configure, pi_configure); not again when the prefix has the pinned release of
# each program bmv2 is to give.
bmv2_there() {
  local t
  patched || return 1
  for t in "${programs[@]}"; do
    case $t in p4c*) continue ;; esac
    at_least "$(version_of "$prefix/bin/$t")" "$BMV2_TAG" || return 1
  done
}
t0=$(date +%s)
if bmv2_there; then
  log "bmv2: $BMV2_TAG is already installed under $prefix"
else
  if [ "$grpc" = 1 ]; then
    psrc=$work/PI
    pilog=$work/PI.log
    log "PI: configure, make -j$jobs, install (log: $pilog)"
    # configure must have left grpc_python_plugin out (no Python stubs, see above).
    step "PI configure" "$pilog" in_dir "$psrc" sh -c 'nice -n 19 ionice -c3 ./autogen.sh &&
      nice -n 19 ionice -c3 ./configure "$@" && grep -qx "GRPC_PY_PLUGIN = " proto/Makefile' \
      sh "${pi_configure[@]}"
    step "PI make" "$pilog" in_dir "$psrc" niced make -j"$jobs"
    step "PI install" "$pilog" in_dir "$psrc" make install
    log "PI: installed in $(($(date +%s) - t0)) s"
  fi
  tb=$(date +%s)
  bsrc=$work/behavioral-model
  blog=$work/bmv2.log
  log "bmv2: configure, make -j$jobs, install (log: $blog)"
  step "bmv2 configure" "$blog" in_dir "$bsrc" sh -c 'nice -n 19 ionice -c3 ./autogen.sh &&
    nice -n 19 ionice -c3 ./configure "$@"' sh "${bmv2_configure[@]}"
  step "bmv2 make" "$blog" in_dir "$bsrc" sh -c 'j=$1; shift
    for d; do nice -n 19 ionice -c3 make -j"$j" -C "$d" || exit; done' sh "$jobs" "${bmv2_build_dirs[@]}"
  step "bmv2 install" "$blog" in_dir "$bsrc" sh -c 'for d; do make -C "$d" install || exit; done' \
    sh "${bmv2_install_dirs[@]}"
  log "bmv2: installed in $(($(date +%s) - tb)) s"
  if [ "$grpc" = 1 ]; then mkdir -p "${patch_mark%/*}" && echo "$patch_key" > "$patch_mark"; fi
fi
t1=$(date +%s)

# p4c: only p4c-bm2-ss (the v1model back end) and the P4 include files it reads
# (core.p4, v1model.p4, compiled in as $prefix/share/p4c/p4include). `make install`
# would build every target first, so the two are installed by hand. A unity build
# (sources compiled ten to a unit, as one of p4c's CI builds does) saves parsing the IR
# headers again for every file. CMAKE_DISABLE_FIND_PACKAGE_BMV2: the tests that would want
# the switch found just above are not configured.
# A p4c of the pinned release already under the prefix (--grpc added to a prefix built
# without it) is not built again.
if at_least "$(version_of "$prefix/bin/p4c-bm2-ss")" "${P4C_TAG#v}"; then
  log "p4c: $P4C_TAG is already installed under $prefix"
else
  pbuild=$work/p4c/build
  plog=$work/p4c.log
  mkdir -p "$pbuild"
  log "p4c: cmake, make -j$jobs p4c-bm2-ss, install (log: $plog)"
  step "p4c cmake" "$plog" in_dir "$pbuild" niced cmake .. -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_UNITY_BUILD=ON \
    -DENABLE_BMV2=ON -DENABLE_EBPF=OFF -DENABLE_UBPF=OFF -DENABLE_DPDK=OFF -DENABLE_P4TEST=OFF \
    -DENABLE_GTESTS=OFF -DENABLE_P4C_GRAPHS=OFF -DENABLE_DOCS=OFF -DENABLE_TEST_TOOLS=OFF \
    -DPYTHON_EXECUTABLE=/usr/bin/python3 -DCMAKE_DISABLE_FIND_PACKAGE_BMV2=ON
  step "p4c make" "$plog" in_dir "$pbuild" niced make -j"$jobs" p4c-bm2-ss
  step "p4c install" "$plog" in_dir "$pbuild" sh -c 'install -D -m 0755 backends/bmv2/p4c-bm2-ss "$1/bin/p4c-bm2-ss" &&
    mkdir -p "$1/share/p4c" && rm -rf "$1/share/p4c/p4include" && cp -r ../p4include "$1/share/p4c/"' sh "$prefix"
  log "p4c: installed in $(($(date +%s) - t1)) s"
fi
t2=$(date +%s)

post_install
tools_ok || { log "built, but not all of ${programs[*]} report bmv2 >= $BMV2_MIN and p4c >= $P4C_MIN"; exit 1; }
rm -rf "$work"
report "built from source in $((t2 - t0)) s"
