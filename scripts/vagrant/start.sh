#!/bin/sh
# The box container's command: its name in /etc/hosts, host keys, then the SSH server
# (in the foreground; the container lives as long as it does).
set -e
grep -qw "$(hostname)" /etc/hosts || echo "127.0.1.1 $(hostname)" >> /etc/hosts
ssh-keygen -A >/dev/null
exec /usr/sbin/sshd -D -e -o ListenAddress=127.0.0.1 -p "${INCAST_BOX_SSH_PORT:-2222}"
