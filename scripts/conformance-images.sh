#!/usr/bin/env bash
# scripts/conformance-images.sh K8S_VERSION NODE_REGISTRY NODE_REGISTRY_STORE
#
# NODE_REGISTRY and NODE_REGISTRY_STORE are the first two lines scripts/node-registry.sh prints
# (the registry's binary, beside which crane is, and its store). Builds, once per machine,
# release and node registry, a registry store holding everything the
# node registry holds (scripts/node-registry.sh: the control plane's images, the addons', agnhost,
# busybox and pause) plus the other images Kubernetes' conformance tests name
# (`e2e.test --list-images`, read against the `[Conformance]` specs' sources), each under the exact
# name and tag the suite pulls from registry.k8s.io:
# - e2e-test-images/jessie-dnsutils:1.7 — Debian 12 (debootstrap, minbase) with dig, the DNS
#   specs' probe image (upstream's is Debian 8 with the same tools);
# - e2e-test-images/nginx:1.14-4 and nginx:1.15-4 — Debian 12's nginx on port 80 in the
#   foreground, logging to the container's output (the tags are the suite's; the two images
#   differ, as a rollout from one to the other needs, by a file naming their tag);
# - e2e-test-images/nonroot:1.4 — the same Debian root run as user 1234;
# - e2e-test-images/kitten:1.7 and nautilus:1.7 — agnhost serving the picture and data.json of
#   test/images/{kitten,nautilus}/html (`agnhost test-webserver` from /);
# - e2e-test-images/agnhost:2.55 — the suite's "previous agnhost", which its specs use only as an
#   agnhost image other than the current one: the current agnhost with a file naming the tag;
# - e2e-test-images/nonewprivs:1.3 — test/images/nonewprivs built from the module, set-user-ID
#   root, on busybox;
# - e2e-test-images/sample-apiserver:1.29.2 — k8s.io/sample-apiserver of the release, built from
#   its module;
# - etcd:3.6.6-0 — etcd v3.6.6 built from its modules (scripts/k8s-binaries.sh).
# What cannot be built here (gcr.io's private agnhost, the registry that must not exist) stays
# out: the specs that name it are listed by scripts/conformance.sh's summary.
#
# Output, on stdout: the store's directory (serve it as the node registry's; EXK8S_NODE_REGISTRY_STORE
# names it), then ginkgo's binary. Everything else goes to stderr. Idempotent and safe when several
# callers ask at once. Needs root (debootstrap), go, and what node-registry.sh needs.
set -euo pipefail

usage="usage: conformance-images.sh K8S_VERSION NODE_REGISTRY NODE_REGISTRY_STORE"
k8s_version=${1:?$usage}
tools=$(dirname "${2:?$usage}")
node_store=${3:?$usage}
cache=${EXK8S_K8S_CACHE:-/var/cache/exk8s/k8s}
root=$(cd "$(dirname "$0")/.." && pwd)
etcd_image_version=v3.6.6

log() { printf '==> conformance-images: %s\n' "$*" >&2; }
die() { printf 'conformance-images: %s\n' "$*" >&2; exit 1; }

[[ $k8s_version =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "Kubernetes version must look like v1.35.3, got '$k8s_version'"
sample_version=v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}
[ -d "$node_store/docker/registry/v2/repositories" ] || die "$node_store is not a registry store (scripts/node-registry.sh prints it)"
[ "$(id -u)" -eq 0 ] || die "the Debian root of the test images is made by debootstrap, which needs root"
command -v debootstrap >/dev/null || die "debootstrap is not installed (Debian package debootstrap)"
command -v go >/dev/null || die "go is not installed (sample-apiserver, nonewprivs and ginkgo build from their Go modules)"
release_src=$cache/$k8s_version/src
[ -f "$release_src/go.mod" ] || die "no $release_src/go.mod: run scripts/k8s-binaries.sh $k8s_version first"
e2e=$cache/$k8s_version-e2e
[ -x "$e2e/bin/e2e.test" ] || die "no $e2e/bin/e2e.test: run scripts/e2e-binaries.sh $k8s_version first"
agnhost_version=$(cat "$cache/$k8s_version-agnhost/agnhost-version")
if [ ! -x "$tools/registry" ] || [ ! -x "$tools/crane" ]; then
  die "no registry or crane in $tools (scripts/node-registry.sh prints the registry's path)"
fi

# shellcheck source=scripts/lib/scratch-registry.sh
source "$root/scripts/lib/scratch-registry.sh"
# shellcheck source=scripts/lib/cache.sh
source "$root/scripts/lib/cache.sh"

# The binaries: sample-apiserver and nonewprivs from the release's modules, ginkgo at the
# version e2e.test links (its CLI runs the suite's processes in parallel).
bins=$cache/$k8s_version-conformance
build_bins() {
  local dir=$1
  mkdir -p "$dir/src" "$dir/bin"
  cp "$release_src/go.mod" "$release_src/go.sum" "$dir/src/"
  log "building sample-apiserver $sample_version, nonewprivs and ginkgo"
  (
    cd "$dir/src"
    gomod mod edit -require="k8s.io/sample-apiserver@$sample_version"
    gomod build -trimpath -ldflags "-s -w" -o "$dir/bin/sample-apiserver" k8s.io/sample-apiserver
    gomod build -trimpath -ldflags "-s -w" -o "$dir/bin/nnp" k8s.io/kubernetes/test/images/nonewprivs
    gomod build -trimpath -ldflags "-s -w" -o "$dir/bin/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
    local module
    module=$(gomod list -m -f '{{.Dir}}' k8s.io/kubernetes)
    cp -r "$module/test/images/kitten/html" "$dir/kitten"
    cp -r "$module/test/images/nautilus/html" "$dir/nautilus"
    chmod -R u+w "$dir/kitten" "$dir/nautilus"
  )
  "$dir/bin/ginkgo" version >/dev/null || die "ginkgo does not run"
  "$dir/bin/sample-apiserver" --help >/dev/null 2>&1 || die "sample-apiserver does not run"
}
with_lock "$bins" build_bins

etcd_bin=$(bash "$root/scripts/k8s-binaries.sh" "$k8s_version" "$etcd_image_version" | sed -n 1p)
[ -x "$etcd_bin/etcd" ] || die "no etcd $etcd_image_version in $etcd_bin"

# The Debian root of jessie-dnsutils, nginx and nonroot.
mirror=${EXK8S_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
  mirror=${mirror:-http://deb.debian.org/debian}
fi
debian=$cache/conformance-debian-$(sha256sum "$0" | cut -c1-12)
build_debian() {
  local dir=$1
  log "debootstrap bookworm (minbase + bind9-dnsutils, nginx-light) from $mirror"
  if ! debootstrap --variant=minbase --include=bind9-dnsutils,nginx-light bookworm "$dir/root" "$mirror" \
    >"$dir/debootstrap.log" 2>&1; then
    tail -n 30 "$dir/debootstrap.log" >&2
    die "debootstrap failed (its log: $dir/debootstrap.log)"
  fi
  rm -rf "$dir/root/var/cache/apt/archives/"*.deb "$dir/root/var/lib/apt/lists/"*
  # nginx in the foreground logs to the container's output, as upstream's image does.
  ln -sfn /dev/stdout "$dir/root/var/log/nginx/access.log"
  ln -sfn /dev/stderr "$dir/root/var/log/nginx/error.log"
  : >"$dir/root/etc/machine-id"
  # No device nodes (a container's /dev is the runtime's; a machine's containerd may not make them).
  tar --sort=name --numeric-owner --mtime=@0 --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
    -C "$dir/root" -cf "$dir/root.tar" .
}
with_lock "$debian" build_debian

digest=$( (sha256sum "$0" "$root/scripts/lib/scratch-registry.sh" "$debian/root.tar" "$bins/bin/"* "$etcd_bin/etcd" "$e2e/bin/agnhost"
  echo "$node_store") | sha256sum | cut -c1-12)
store=$cache/conformance-registry-$k8s_version-$digest
fill_store() {
  local dir=$1 work=$1.work port
  rm -rf "$work"
  mkdir -p "$work"
  log "copying the node registry's store"
  cp -a --reflink=auto "$node_store" "$dir/data"
  scratch_registry_start "$tools/registry" "$dir/data" "$work"
  port=$scratch_registry_port
  local at=127.0.0.1:$port
  crane() { "$tools/crane" --insecure "$@" >/dev/null 2>>"$work/crane.log" || die "crane $1 failed: $(tail -n 3 "$work/crane.log")"; }
  # mutate REF ARGS…: REF's configuration changed, under the same tag.
  mutate() { crane mutate "$1" -t "$1" "${@:2}"; }
  # layer NAME FILE DEST [MODE]: $work/NAME.tar, holding FILE at DEST.
  layer() {
    local tree=$work/$1.tree
    mkdir -p "$tree/$(dirname "$3")"
    cp "$2" "$tree/$3"
    chmod "${4:-0755}" "$tree/$3"
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$tree" -cf "$work/$1.tar" .
  }
  # tag_layer TAG: $work/tag.tar, a file naming TAG, which makes images of one base differ.
  tag_layer() {
    echo "$1" >"$work/tag.content"
    rm -rf "$work/tag.tree"
    layer tag "$work/tag.content" etc/exk8s-test-image 0644
  }
  local env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

  tag_layer jessie-dnsutils:1.7
  crane append -f "$debian/root.tar" -f "$work/tag.tar" -t "$at/e2e-test-images/jessie-dnsutils:1.7"
  mutate "$at/e2e-test-images/jessie-dnsutils:1.7" --set-platform linux/amd64 --env "$env" --cmd bash
  log "  e2e-test-images/jessie-dnsutils:1.7 (Debian 12 with dig)"
  local tag
  for tag in 1.14-4 1.15-4; do
    tag_layer "nginx:$tag"
    crane append -f "$debian/root.tar" -f "$work/tag.tar" -t "$at/e2e-test-images/nginx:$tag"
    mutate "$at/e2e-test-images/nginx:$tag" --set-platform linux/amd64 --env "$env" \
      --entrypoint nginx,-g,'daemon off;' --exposed-ports 80
    log "  e2e-test-images/nginx:$tag (Debian 12's nginx)"
  done
  tag_layer nonroot:1.4
  crane append -f "$debian/root.tar" -f "$work/tag.tar" -t "$at/e2e-test-images/nonroot:1.4"
  mutate "$at/e2e-test-images/nonroot:1.4" --set-platform linux/amd64 --env "$env" --user 1234 --cmd sh
  log "  e2e-test-images/nonroot:1.4 (user 1234)"

  local agnhost=$at/e2e-test-images/agnhost:$agnhost_version picture
  for picture in kitten nautilus; do
    local tree=$work/$picture
    mkdir -p "$tree"
    cp "$bins/$picture/"* "$tree/"
    chmod 0644 "$tree/"*
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$tree" -cf "$tree.tar" .
    crane append -b "$agnhost" -f "$tree.tar" -t "$at/e2e-test-images/$picture:1.7"
    mutate "$at/e2e-test-images/$picture:1.7" --set-platform linux/amd64 --cmd test-webserver
    log "  e2e-test-images/$picture:1.7 (agnhost $agnhost_version serving its picture)"
  done
  tag_layer agnhost:2.55
  crane append -b "$agnhost" -f "$work/tag.tar" -t "$at/e2e-test-images/agnhost:2.55"
  log "  e2e-test-images/agnhost:2.55 (agnhost $agnhost_version, another image)"

  layer nnp "$bins/bin/nnp" usr/local/bin/nnp 4755
  crane append -b "$at/e2e-test-images/busybox:1.37.0-1" -f "$work/nnp.tar" -t "$at/e2e-test-images/nonewprivs:1.3"
  mutate "$at/e2e-test-images/nonewprivs:1.3" --set-platform linux/amd64 --cmd nnp \
    --env PATH=/usr/local/bin:/bin
  log "  e2e-test-images/nonewprivs:1.3 (nnp set-user-ID root)"
  layer sample-apiserver "$bins/bin/sample-apiserver" sample-apiserver
  crane append -f "$work/sample-apiserver.tar" -t "$at/e2e-test-images/sample-apiserver:1.29.2"
  mutate "$at/e2e-test-images/sample-apiserver:1.29.2" --set-platform linux/amd64 --entrypoint /sample-apiserver
  log "  e2e-test-images/sample-apiserver:1.29.2 (k8s.io/sample-apiserver $sample_version)"
  layer etcd "$etcd_bin/etcd" usr/local/bin/etcd
  crane append -f "$work/etcd.tar" -t "$at/etcd:3.6.6-0"
  mutate "$at/etcd:3.6.6-0" --set-platform linux/amd64 --entrypoint /usr/local/bin/etcd
  log "  etcd:3.6.6-0 (etcd $etcd_image_version)"

  scratch_registry_stop
  rm -rf "$work"
}
with_lock "$store" fill_store

echo "$store/data"
echo "$bins/bin/ginkgo"
