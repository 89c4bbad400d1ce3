#!/usr/bin/env bash
# scripts/node-packages.sh IMAGE_ROOT
#
# Builds, once per machine and node image, a local Debian package repository holding every
# package a node's bundle asks for (the renderer's list: api/src/render/plan.rs) with the
# dependencies the node image lacks: what a machine booted here installs with apt-get, as a VM
# installs from its cloud's Debian mirror. The packages are Debian's own, downloaded through a
# throw-away copy of IMAGE_ROOT (scripts/node-image.sh) so the set is exactly what that image
# needs; the index is a flat repository (`deb [trusted=yes] URL ./`).
#
# Output: <image's directory>-packages-<digest>/ beside the image (Packages and the .debs),
# its path printed on stdout; everything else goes to stderr. Idempotent and safe when several
# callers ask at once (flock). Needs root, chroot and dpkg-scanpackages (dpkg-dev).
set -euo pipefail

image=${1:?usage: node-packages.sh IMAGE_ROOT}
# The renderer's packages (api/src/render/plan.rs, PACKAGES).
packages=(ca-certificates conntrack containerd containernetworking-plugins ebtables ethtool
  iproute2 iptables socat)

log() { printf '==> node-packages: %s\n' "$*" >&2; }
die() { printf 'node-packages: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "downloading through a chroot needs root"
[ -x "$image/usr/bin/apt-get" ] || die "$image is no node image (run scripts/node-image.sh)"
command -v dpkg-scanpackages >/dev/null || die "dpkg-scanpackages is not installed (dpkg-dev)"

digest=$( (sha256sum "$0"; printf '%s\n' "$image") | sha256sum | cut -c1-12)
dir=$(dirname "$image")-packages-$digest
exec {fd}>"$dir.lock"
flock "$fd"
if [ -f "$dir/.done" ]; then
  log "cached in $dir"
else
  rm -rf "$dir" "$dir.chroot"
  started=$SECONDS
  cp -a --reflink=auto "$image" "$dir.chroot"
  cp /etc/resolv.conf "$dir.chroot/etc/resolv.conf"
  log "downloading ${packages[*]} and what the image lacks of their dependencies"
  # shellcheck disable=SC2016 # "$@" is the chroot shell's: the package names after `sh`.
  if ! chroot "$dir.chroot" /usr/bin/env DEBIAN_FRONTEND=noninteractive sh -c \
    'apt-get update -q && apt-get install -y -q --download-only --no-install-recommends "$@"' \
    sh "${packages[@]}" >"$dir.log" 2>&1; then
    tail -n 30 "$dir.log" >&2
    rm -rf "$dir.chroot"
    die "downloading the packages failed (the log: $dir.log)"
  fi
  mkdir -p "$dir"
  mv "$dir.chroot"/var/cache/apt/archives/*.deb "$dir/"
  rm -rf "$dir.chroot"
  (cd "$dir" && dpkg-scanpackages --multiversion . /dev/null >Packages 2>/dev/null)
  [ -s "$dir/Packages" ] || die "no package index was written in $dir"
  touch "$dir/.done"
  log "$(find "$dir" -name '*.deb' | wc -l) packages in $((SECONDS - started)) s into $dir"
fi
flock -u "$fd"
exec {fd}>&-
printf '%s\n' "$dir"
