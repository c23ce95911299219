#!/usr/bin/env bash
# The box's kernels, as root: the UML kernels for virtual time (incast run --clock
# virtual), restored from the kernel cache when it holds them for the current inputs,
# else built (kernels/build.sh --uml: 17.9 minutes measured on 2 busy cores; setup.sh
# has usually built them already). With
# INCAST_BOX_VM_KERNELS=1 also the QEMU VM kernels (incast run --kernel; 25 minutes).
#
# The docker provider mounts the host's kernel cache when the host has one; the cache
# key includes linux-source-6.12's version, so the box restores the host's build only
# when both have the same Debian package (and kernels/ is the same).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" = 0 ] || { echo "kernels: run as root" >&2; exit 2; }

# The one package the cache key needs; kernels/build.sh installs the rest when it builds.
if ! dpkg-query -W -f='${Status}' linux-source-6.12 2>/dev/null | grep -q "install ok installed"; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends linux-source-6.12 >/dev/null ||
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends linux-source-6.12 >/dev/null; }
fi
if dir=$(kernels/build.sh --uml --print-dir); then
  echo "kernels: UML kernels restored from the cache ($dir)"
else
  echo "kernels: building the UML kernels (about 18 minutes on 2 cores)"
  kernels/build.sh --uml >/dev/null
fi
if [ "${INCAST_BOX_VM_KERNELS:-0}" = 1 ]; then
  kernels/build.sh >/dev/null
fi
# Virtual time works: a UML guest boots and runs a command.
python=/opt/incast/venv/bin/python
out=$("$python" -m incast.vm.uml --kernel uml-hrtimer --timeout 120 -- uname -r 2>&1) ||
  { echo "kernels: the UML kernel does not boot here: $out" >&2; exit 1; }
echo "kernels: virtual time works (UML $(echo "$out" | tail -1))"
