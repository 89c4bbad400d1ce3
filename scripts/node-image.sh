#!/usr/bin/env bash
# scripts/node-image.sh
#
# Builds, once per machine, the root file system of a node image: Debian 12 (bookworm) made by
# debootstrap from Debian's own packages, with systemd as its init, as an image builder starts a
# VM image before baking exk8s-agent into it (packaging/bake-image.sh). Nothing of exk8s is in
# it: the tests bake the agent into a copy of it, and the agent installs a node's prerequisites
# itself.
#
# Output: $EXK8S_NODE_IMAGE_CACHE/<name>/root (default cache /var/cache/exk8s/node-image), its
# path printed on stdout; everything else goes to stderr. The name carries a digest of this
# script, so a changed package list builds a new root. Idempotent (a finished build leaves a
# stamp) and safe when several callers ask at once (flock). Needs root, debootstrap and a
# Debian mirror (EXK8S_DEBIAN_MIRROR, default the one apt uses here, else deb.debian.org).
set -euo pipefail

cache=${EXK8S_NODE_IMAGE_CACHE:-/var/cache/exk8s/node-image}
suite=bookworm
# What a cloud's minimal Debian 12 image has that minbase lacks: systemd as init, D-Bus
# (systemctl talks to it), CA certificates, iproute2, and what the agent's own steps call
# (dpkg-query and apt-get are in minbase).
packages=systemd,systemd-sysv,dbus,ca-certificates,iproute2,procps,gpgv

log() { printf '==> node-image: %s\n' "$*" >&2; }
die() { printf 'node-image: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "building a root file system needs root"
command -v debootstrap >/dev/null || die "debootstrap is not installed (Debian package debootstrap)"
command -v flock >/dev/null || die "flock is not installed (util-linux)"

mirror=${EXK8S_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
  mirror=${mirror:-http://deb.debian.org/debian}
fi

digest=$(sha256sum "$0" | cut -c1-12)
dir=$cache/$suite-$digest
mkdir -p "$cache" 2>/dev/null || die "cannot create the cache $cache (set EXK8S_NODE_IMAGE_CACHE)"

exec {fd}>"$dir.lock"
flock "$fd"
if [ -f "$dir/.done" ]; then
  log "cached in $dir/root"
else
  rm -rf "$dir"
  mkdir -p "$dir"
  started=$SECONDS
  log "debootstrap $suite (minbase + $packages) from $mirror"
  if ! debootstrap --variant=minbase --include="$packages" "$suite" "$dir/root" "$mirror" \
    >"$dir/debootstrap.log" 2>&1; then
    tail -n 30 "$dir/debootstrap.log" >&2
    die "debootstrap failed (its log: $dir/debootstrap.log)"
  fi
  # The loopback names every cloud image's /etc/hosts carries (debootstrap writes none):
  # containerd's port-forward dials `localhost` inside a pod's namespace.
  printf '%s\n' '127.0.0.1 localhost' '::1 localhost ip6-localhost ip6-loopback' \
    'ff02::1 ip6-allnodes' 'ff02::2 ip6-allrouters' >"$dir/root/etc/hosts"
  # An image carries no machine identity: each machine gets its own at first boot.
  : >"$dir/root/etc/machine-id"
  rm -f "$dir/root/var/lib/dbus/machine-id"
  apt_clean=("$dir/root/var/cache/apt/archives/"*.deb)
  rm -f "${apt_clean[@]}"
  touch "$dir/.done"
  log "built in $((SECONDS - started)) s into $dir/root"
fi
flock -u "$fd"
exec {fd}>&-
printf '%s\n' "$dir/root"
