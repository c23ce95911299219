#!/usr/bin/env bash
# The Debian 12 image the Vagrant box's docker provider builds on: incast/box-base:bookworm.
#
# Made once and kept (a cache, outside the repository): `vagrant up --provider=docker`
# runs this before building the box, and it returns at once when the image for the
# current inputs exists. Two ways to make it, tried in this order:
#
#   registry     docker pull debian:bookworm (where Docker Hub is reachable)
#   debootstrap  debootstrap bookworm from the Debian archive and `docker import` it
#                (where no image registry is reachable; needs root and debootstrap)
#
# INCAST_BOX_BASE_SOURCE=registry|debootstrap picks one; INCAST_DEBIAN_MIRROR sets the
# archive (default http://deb.debian.org/debian). The image carries a label with the
# key of its inputs (this script, the way, the mirror); a changed input makes it anew.
#
# Usage: scripts/vagrant/base-image.sh [--print-key]
set -euo pipefail

image=incast/box-base:bookworm
source=${INCAST_BOX_BASE_SOURCE:-auto}
mirror=${INCAST_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${INCAST_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
# What the box's Dockerfile would install otherwise: the SSH server Vagrant logs in
# through, sudo, and rsync for the synced folder.
include=openssh-server,sudo,rsync,ca-certificates,procps,iproute2

log() { echo "base-image: $*" >&2; }

key_of() {
  { echo "way $1"; echo "mirror $mirror $security"; echo "include $include"; cat "$0"; } |
    sha256sum | cut -c1-16
}

current_key() {
  docker image inspect -f '{{ index .Config.Labels "org.incast.base-key" }}' "$image" 2>/dev/null || true
}

if [ "${1:-}" = --print-key ]; then
  current_key
  exit 0
fi

have=$(current_key)
for way in registry debootstrap; do
  if [ -n "$have" ] && [ "$have" = "$(key_of "$way")" ] &&
     { [ "$source" = auto ] || [ "$source" = "$way" ]; }; then
    log "$image is up to date ($way, key $have)"
    exit 0
  fi
done

from_registry() {
  log "docker pull debian:bookworm"
  docker pull -q debian:bookworm >/dev/null 2>&1 || return 1
  printf 'FROM debian:bookworm\nLABEL org.incast.base-key=%s\n' "$(key_of registry)" |
    docker build -q -t "$image" - >/dev/null
}

from_debootstrap() (
  [ "$(id -u)" = 0 ] || { log "debootstrap needs root"; exit 1; }
  command -v debootstrap >/dev/null || { log "debootstrap is not installed (apt-get install debootstrap)"; exit 1; }
  root=$(mktemp -d /var/tmp/incast-base.XXXXXX)
  # Whatever happens, the tree goes (a failed debootstrap may leave /proc mounted in it).
  trap 'umount -R "$root/proc" "$root/sys" 2>/dev/null || true; rm -rf --one-file-system "$root" "$root.log"' EXIT
  log "debootstrap bookworm from $mirror (a few minutes)"
  debootstrap --variant=minbase --include="$include" bookworm "$root" "$mirror" >"$root.log" 2>&1 ||
    { tail -20 "$root.log" >&2; exit 1; }
  rm -f "$root/etc/apt/sources.list"
  cat > "$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  # An image has no hostname, no host keys of its own and no package lists.
  rm -f "$root"/etc/ssh/ssh_host_* "$root/etc/hostname"
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
  log "docker import as $image"
  tar -C "$root" -c . | docker import \
    --change "LABEL org.incast.base-key=$(key_of debootstrap)" \
    --change 'CMD ["/bin/bash"]' - "$image" >/dev/null
)

case $source in
  registry) from_registry ;;
  debootstrap) from_debootstrap ;;
  auto) from_registry || { log "no image registry: making the base image with debootstrap"; from_debootstrap; } ;;
  *) log "INCAST_BOX_BASE_SOURCE must be registry, debootstrap or auto"; exit 2 ;;
esac
log "$image ready (key $(current_key))"
