#!/usr/bin/env bash
# Install everything the testbed needs on Debian 12, as root. Idempotent.
#   - Debian packages: Mininet, iproute2/tc, ethtool, bpftrace, Python libraries
#   - a venv (/opt/incast/venv) on Debian's python3 that also sees apt's python3-*
#     packages, with the pinned extras from requirements.txt and this checkout
#     installed in editable mode
#   - /usr/local/bin/incast
#   - the User-Mode Linux kernels for virtual time (kernels/build.sh --uml): built
#     once, several minutes, then cached; --no-kernels leaves them out
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${INCAST_VENV:-/opt/incast/venv}
with_p4=0
p4_src=
with_kernels=1
with_synth=0
usage="usage: setup.sh [--p4] [--p4-src DIR] [--synth] [--no-kernels]"
while [ $# -gt 0 ]; do
  case "$1" in
    --p4) with_p4=1 ;;   # also p4c and bmv2 with its P4Runtime server (scripts/install-p4.sh --grpc)
    --p4-src)            # ... built from the source trees in DIR (install-p4.sh --src)
      [ $# -ge 2 ] && [ -d "$2" ] || { echo "setup: --p4-src needs a directory of sources ($usage)" >&2; exit 2; }
      with_p4=1; p4_src=$2; shift ;;
    --synth) with_synth=1 ;;   # also Yosys (pyosys) and nextpnr-ice40, for rtl/synth/synth.sh
    --no-kernels) with_kernels=0 ;;   # not the UML kernels (virtual time then skips)
    *) echo "$usage" >&2; exit 2 ;;
  esac
  shift
done

[ "$(id -u)" = 0 ] || { echo "setup: run as root" >&2; exit 2; }

# How long each step took (a first set-up takes minutes; say where they went).
step_start=$SECONDS
took() { echo "setup: $1 took $((SECONDS - step_start)) s"; step_start=$SECONDS; }

apt_packages=(
  ca-certificates util-linux mininet iproute2 ethtool bridge-utils iputils-ping net-tools procps psmisc kmod
  bpftrace tcpdump memcached chromium
  tshark   # reads the switches' INT telemetry reports with scripts/wireshark/int-report.lua
  verilator g++ make   # the hardware switch's model (rtl/, --switch rtl, tests/test_rtl_switch.py)
  git   # incast catalog keeps a result only from a clean commit on main (a checkout without git: a tarball)
  python3 python3-venv python3-pip python3-scapy python3-matplotlib python3-pandas
  python3-numpy python3-scipy python3-pytest python3-tqdm python3-pyroute2
)
# The switch's synthesis: nextpnr-ice40 places the iCE40 netlist (Yosys itself comes
# from PyPI below: Debian's is too old to synthesize 16 ports in hours).
if [ "$with_synth" = 1 ]; then apt_packages+=(nextpnr-ice40); fi
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  took "Debian packages"
fi

if [ "$with_p4" = 1 ]; then
  # p4c and bmv2: tools already there, else p4lang's packages where recent enough,
  # else the pinned releases built from source (scripts/install-p4.sh says how). With
  # simple_switch_grpc: the bmv2 plane programs its switches over P4Runtime where it is.
  "$here/scripts/install-p4.sh" --grpc ${p4_src:+--src "$p4_src"}
  took "bmv2 and p4c"
fi

# tracefs is where bpftrace finds the tracepoints; some minimal systems do not mount it.
if [ ! -d /sys/kernel/tracing/events ] && [ ! -d /sys/kernel/debug/tracing/events ]; then
  mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
fi

stamp="$venv/.incast-requirements"
if [ ! -x "$venv/bin/python" ] || ! cmp -s "$here/requirements.txt" "$stamp"; then
  echo "setup: creating $venv"
  rm -rf "$venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  # pip trusts the machine's CA store (so a site's TLS-inspecting proxy that the
  # machine trusts works too), not only the bundle it ships.
  "$venv/bin/pip" install -q --disable-pip-version-check --cert /etc/ssl/certs/ca-certificates.crt \
    -r "$here/requirements.txt"
  cp "$here/requirements.txt" "$stamp"
fi
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation -e "$here"
if [ "$with_synth" = 1 ]; then
  "$venv/bin/pip" install -q --disable-pip-version-check --cert /etc/ssl/certs/ca-certificates.crt \
    -r "$here/rtl/synth/requirements.txt"
fi
ln -sf "$venv/bin/incast" /usr/local/bin/incast
# The compiled queue-telemetry recorder (libbpf); without it telemetry uses bpftrace.
"$here/scripts/build-bpf.sh" || echo "setup: telemetry recorder not built; telemetry will use bpftrace" >&2
took "Python environment and telemetry recorder"

# The User-Mode Linux kernels (incast run --clock virtual): a lean configuration,
# cached under /var/cache/incast/kernels by the hash of their inputs, so this is
# instant once built. At normal priority: nothing else of the testbed runs during a
# set-up. A failed build does not fail the set-up: everything but virtual time works
# without these kernels (runs that need them say so, their tests skip saying why), and
# kernels/build.sh --uml can be run again on its own; the message below says so.
if [ "$with_kernels" = 1 ]; then
  if dir=$("$here/kernels/build.sh" --uml --print-dir 2>/dev/null); then
    echo "setup: UML kernels for virtual time: built ($dir)"
  else
    # Their source, linux-source-6.12, comes to Debian 12 through its security suite,
    # which an installed system lists and a minimal root made by debootstrap does not.
    # (apt-cache's output is read whole: under pipefail, `apt-cache | grep -q` fails
    # whenever grep's early exit cuts apt-cache off with SIGPIPE.)
    has_source() { grep -q 'Candidate: [^(]' <<<"$(apt-cache policy linux-source-6.12 2>/dev/null)"; }
    if ! has_source && grep -q '^VERSION_CODENAME=bookworm' /etc/os-release; then
      apt-get update -qq || true
      if ! has_source && ! grep -rqs 'debian-security' /etc/apt/sources.list /etc/apt/sources.list.d/; then
        echo "setup: adding Debian 12's security suite to apt's sources (linux-source-6.12 is there):" \
             "/etc/apt/sources.list.d/incast-bookworm-security.list"
        echo "deb http://deb.debian.org/debian-security bookworm-security main" \
          > /etc/apt/sources.list.d/incast-bookworm-security.list
        apt-get update -qq
      fi
    fi
    echo "setup: building the UML kernels for virtual time (uml-stock, uml-hrtimer): once," \
         "6 to 18 minutes on 2 cores (idle or busy), then cached"
    if "$here/kernels/build.sh" --uml --normal-priority >/dev/null; then
      echo "setup: UML kernels built ($("$here/kernels/build.sh" --uml --print-dir))"
      took "UML kernels"
    else
      echo "setup: WARNING: the UML kernels did not build (see the lines above);" \
           "everything but virtual time (--clock virtual) works, and its tests skip." \
           "Try again with: kernels/build.sh --uml" >&2
    fi
  fi
fi
echo "setup: ok ($(incast probe | head -1))"
