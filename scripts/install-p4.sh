#!/usr/bin/env bash
# bmv2 (simple_switch) and p4c (p4c-bm2-ss) for the P4 data plane and labs 5-7, as root.
#
# In this order, stopping at the first that gives recent enough tools (bmv2 >= 1.15.1,
# p4c >= 1.2.3.7; the project is tested with bmv2 1.15.5 and p4c 1.2.3.7):
#
#   1. tools already there: on PATH, or built before under the prefix (then only the
#      libraries they need are installed and they are linked into /usr/local/bin)
#   2. p4lang's packages (Open Build Service, home:p4lang) for this distribution,
#      where a repository exists for it and offers recent enough versions
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
#                              [--jobs N] [--no-link]
#   --prefix DIR   where a source build installs (default /opt/p4)
#   --src DIR      build from these sources instead of cloning them
#   --from WAY     packages: only p4lang's packages; source: only a source build
#   --jobs N       make -jN (default: the number of CPUs)
#   --no-link      do not link simple_switch, simple_switch_CLI, p4c and p4c-bm2-ss
#                  into /usr/local/bin (they are then only in DIR/bin)
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
OBS=https://download.opensuse.org/repositories

prefix=/opt/p4
src=
from=auto
jobs=$(nproc)
link=1
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
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-p4: unknown argument $1" >&2; exit 2 ;;
  esac
done
case $from in auto|packages|source) ;; *) echo "install-p4: --from auto, packages or source" >&2; exit 2 ;; esac
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
pth=/usr/lib/python3/dist-packages/$tag.pth
work=/var/tmp/$tag-build
[ "$(id -u)" = 0 ] || { echo "install-p4: run as root" >&2; exit 2; }

log() { echo "install-p4: $*" >&2; }
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

# Both tools, found as `which` finds them (the prefix's bin first), recent enough?
tools_ok() {
  local ss p4c
  ss=$(PATH="$prefix/bin:$PATH" command -v simple_switch || true)
  p4c=$(PATH="$prefix/bin:$PATH" command -v p4c-bm2-ss || true)
  [ -n "$ss" ] && [ -n "$p4c" ] || return 1
  at_least "$(version_of "$ss")" "$BMV2_MIN" && at_least "$(version_of "$p4c")" "$P4C_MIN"
}

report() {
  local ss p4c
  ss=$(PATH="$prefix/bin:$PATH" command -v simple_switch)
  p4c=$(PATH="$prefix/bin:$PATH" command -v p4c-bm2-ss)
  log "ok: $ss $(version_of "$ss"), $p4c $(version_of "$p4c") ($1)"
}

# --- the build dependencies, and the libraries a built prefix needs at run time ----
build_deps=(g++ make autoconf automake libtool pkg-config cmake bison flex libfl-dev
  thrift-compiler libthrift-dev libnanomsg-dev libpcap-dev libgmp-dev libssl-dev
  libboost-dev libboost-program-options-dev libboost-system-dev libboost-filesystem-dev
  libboost-thread-dev libboost-iostreams-dev libxxhash-dev
  libjsoncpp-dev libevent-dev libgc-dev protobuf-compiler libprotobuf-dev
  python3 python3-thrift python3-six git ca-certificates)
# Debian 12's names (the box's distribution); elsewhere the build dependencies above
# provide the same libraries.
runtime_deps=(libthrift-0.17.0 libnanomsg5 libpcap0.8 libgmp10 libssl3
  libboost-program-options1.74.0 libboost-system1.74.0 libboost-filesystem1.74.0
  libboost-thread1.74.0 libboost-iostreams1.74.0 libxxhash0 libjsoncpp25 libgc1
  libprotobuf32 cpp python3 python3-thrift python3-six)

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
    for t in simple_switch simple_switch_CLI p4c p4c-bm2-ss; do
      if [ -x "$prefix/bin/$t" ]; then ln -sf "$prefix/bin/$t" "/usr/local/bin/$t"; fi
    done
  fi
}

missing_libs() {
  local f
  for f in "$prefix/bin/simple_switch" "$prefix/bin/p4c-bm2-ss"; do
    ldd "$f" 2>/dev/null | awk '/not found/ {print $1}'
  done | sort -u
}

# --- 1. already there ---------------------------------------------------------------
if [ -x "$prefix/bin/simple_switch" ] && [ -x "$prefix/bin/p4c-bm2-ss" ]; then
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
      log "  installed, but the tools do not report recent enough versions"
      apt-get remove -y -qq p4lang-bmv2 p4lang-p4c >/dev/null 2>&1 || true
    else
      log "  p4lang-bmv2 ${bmv2:-none}, p4lang-p4c ${p4c:-none}: need >= $BMV2_MIN and >= $P4C_MIN"
    fi
    rm -f "$list" "$key"
    apt-get update -qq >/dev/null 2>&1 || true
  done
  return 1
}

if [ "$from" != source ]; then
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
if [ "$(cat "$work/.sources" 2>/dev/null)" != "$sources" ]; then
  rm -rf "$work"
  mkdir -p "$work"
  if [ -n "$src" ]; then
    for d in behavioral-model p4c; do
      [ -d "$src/$d" ] || { log "--src $src has no $d/"; exit 2; }
    done
    [ -f "$src/p4c/control-plane/p4runtime/proto/p4/v1/p4runtime.proto" ] ||
      { log "$src/p4c/control-plane/p4runtime is empty (p4c's p4runtime submodule)"; exit 2; }
    log "sources from $src"
    # -H: DIR/behavioral-model may be a symbolic link, which is copied as the tree it
    # points to (the build must not happen in that tree)
    cp -aH "$src/behavioral-model" "$src/p4c" "$work/"
  else
    log "cloning bmv2 $BMV2_TAG and p4c $P4C_TAG"
    git clone -q --depth 1 --branch "$BMV2_TAG" "$BMV2_GIT" "$work/behavioral-model"
    git clone -q --depth 1 --branch "$P4C_TAG" "$P4C_GIT" "$work/p4c"
    git -C "$work/p4c" submodule -q update --init control-plane/p4runtime
  fi
  echo "$sources" > "$work/.sources"
else
  log "resuming the build in $work"
fi

# bmv2: simple_switch with its Thrift server and nanomsg notifications (the testbed's
# switch), simple_switch_CLI and the Python modules it imports (runtime_CLI, bmpy_utils,
# bm_runtime, sswitch_runtime). configure has no switch for single targets, so make
# runs in the directories these come from, in dependency order; the other targets
# (psa_switch, pna_nic, simple_router, l2_switch), bmv2's tests and its client
# libraries (bm_apps) are not built. No PI (no P4Runtime server: the testbed programs
# the switch over Thrift; do not pass --without-pi, which configure takes as
# --with-pi); the logging macros and the event logger cost the switch time on every
# packet, and the testbed uses neither (its telemetry is packets on port 510, and
# --notifications-addr works without the event logger). --disable-static: libtool
# would compile every file twice, once more for static libraries nothing uses
# (simple_switch is linked from the position-independent objects either way).
bmv2_build_dirs=(thrift_src proto src/BMI src/bm_sim src/bm_runtime targets/simple_switch tools)
bmv2_install_dirs=(thrift_src third_party include targets/simple_switch tools)
t0=$(date +%s)
if [ -x "$prefix/bin/simple_switch" ] && at_least "$(version_of "$prefix/bin/simple_switch")" "$BMV2_TAG"; then
  log "bmv2: $BMV2_TAG is already installed under $prefix"
else
  bsrc=$work/behavioral-model
  blog=$work/bmv2.log
  log "bmv2: configure, make -j$jobs, install (log: $blog)"
  step "bmv2 configure" "$blog" in_dir "$bsrc" sh -c 'nice -n 19 ionice -c3 ./autogen.sh &&
    nice -n 19 ionice -c3 ./configure --prefix="$1" PYTHON=/usr/bin/python3 \
      --disable-logging-macros --disable-elogger --disable-static CXXFLAGS="-O3 -g0"' sh "$prefix"
  step "bmv2 make" "$blog" in_dir "$bsrc" sh -c 'j=$1; shift
    for d; do nice -n 19 ionice -c3 make -j"$j" -C "$d" || exit; done' sh "$jobs" "${bmv2_build_dirs[@]}"
  step "bmv2 install" "$blog" in_dir "$bsrc" sh -c 'for d; do make -C "$d" install || exit; done' \
    sh "${bmv2_install_dirs[@]}"
  log "bmv2: installed in $(($(date +%s) - t0)) s"
fi
t1=$(date +%s)

# p4c: only p4c-bm2-ss (the v1model back end) and the P4 include files it reads
# (core.p4, v1model.p4, compiled in as $prefix/share/p4c/p4include). `make install`
# would build every target first, so the two are installed by hand. A unity build
# (sources compiled ten to a unit, as one of p4c's CI builds does) saves parsing the IR
# headers again for every file. CMAKE_DISABLE_FIND_PACKAGE_BMV2: the tests that would want
# the switch found just above are not configured.
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
t2=$(date +%s)
log "p4c: installed in $((t2 - t1)) s"

post_install
tools_ok || { log "built, but the tools do not report bmv2 >= $BMV2_MIN and p4c >= $P4C_MIN"; exit 1; }
rm -rf "$work"
report "built from source in $((t2 - t0)) s"
