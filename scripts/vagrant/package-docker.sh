#!/usr/bin/env bash
# A provisioned docker box as one image file, for a class without network:
#
#   vagrant up --provider=docker && scripts/vagrant/package-docker.sh incast-box.tar.gz
#
# The box mounts bmv2/p4c (/opt/p4) and the kernel cache from its host; an image made
# with `docker commit` would lack them (mounts are not committed). This copies what the
# box uses of them (the prefix; the UML kernels of the current inputs) into the
# container's own filesystem, commits it as incast/box:class, saves that image,
# gzipped, and removes it again. Students then need Docker and the checkout, nothing else:
#
#   docker load < incast-box.tar.gz
#   INCAST_BOX_IMAGE=incast/box:class vagrant up --provider=docker
#
# (provisioning then finds everything in place and needs no network). Run it as the
# user who ran vagrant up, from the checkout.
set -euo pipefail
out=${1:?usage: package-docker.sh OUT.tar.gz [IMAGE]}
image=${2:-incast/box:class}
here=$(cd "$(dirname "$0")/../.." && pwd)
id_file=$here/.vagrant/machines/default/docker/id
[ -f "$id_file" ] || { echo "package-docker: no docker box here (vagrant up --provider=docker first)" >&2; exit 2; }
id=$(cat "$id_file")

echo "package-docker: copying the mounted parts into the container" >&2
docker exec "$id" sh -ec '
  # A mount point shows the host directory: copy it aside, unmount it, and put the copy
  # in its place (never removing anything while the host directory is mounted there).
  own() {
    src=$1 keep=${2:-}
    mountpoint -q "$src" || return 0
    rm -rf "$src.own"
    mkdir -p "$src.own/$keep"
    cp -a "$src/$keep/." "$src.own/$keep/"
    umount "$src"
    if mountpoint -q "$src"; then echo "package-docker: $src is still mounted" >&2; exit 1; fi
    rmdir "$src"
    mv "$src.own" "$src"
  }
  own /opt/p4
  if dir=$(cd /vagrant && kernels/build.sh --uml --print-dir); then
    own /var/cache/incast/kernels "$(basename "$dir")"
  fi
  # downloaded again where needed
  for d in /var/cache/apt/archives /var/cache/incast/pip; do
    if mountpoint -q "$d"; then umount "$d"; fi
  done
  # Vagrant logs in to a new box with its insecure key (and replaces it at once); each
  # box makes host keys of its own when it starts.
  install -o vagrant -g vagrant -m 0600 /etc/incast-box/vagrant-insecure.pub /home/vagrant/.ssh/authorized_keys
  rm -f /etc/ssh/ssh_host_*
'
echo "package-docker: docker commit $id $image" >&2
docker commit "$id" "$image" >/dev/null
echo "package-docker: docker save $image | gzip > $out" >&2
docker save "$image" | gzip -1 > "$out"
# The file is the result: without the image, vagrant destroy can remove the one it
# built (which the commit would otherwise keep as its parent).
docker rmi "$image" >/dev/null
ls -l "$out" >&2
