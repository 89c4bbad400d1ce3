#!/usr/bin/env bash
# scripts/node-registry.sh K8S_BIN_DIR [K8S_BIN_DIR…]
# scripts/node-registry.sh --tools
#
# Builds, once per machine and release, what a booted machine downloads besides Debian's
# packages and the Kubernetes and etcd binaries (scripts/k8s-binaries.sh):
# - the registry it pulls its control plane's images from, as an air-gapped cluster pulls from
#   its own mirror of registry.k8s.io: a real registry (distribution's `registry`, built from its
#   Go module, with its filesystem storage only) whose storage holds the images a control-plane node's static pods and
#   containerd's sandbox name — kube-apiserver, kube-controller-manager, kube-scheduler:<release>
#   from the Go-built binaries in each K8S_BIN_DIR (one per release: an upgrade pulls both), and
#   pause:<pause_version> from
#   tests/tools/pause.c, and the addons' coredns/coredns:<pinned> from CoreDNS's Go module and
#   flannel-io/flannel:<pinned> (ghcr.io's name) from flannel's, with iptables as below, and
#   the workloads' and the end-to-end suite's e2e-test-images/agnhost:<its VERSION> (from
#   scripts/e2e-binaries.sh), e2e-test-images/busybox and pause under the suite's tags —
#   each a linux/amd64 image of one layer with the binary in /usr/local/bin, pushed by `crane`
#   (go-containerregistry, built from its Go module) — and kube-proxy:<release> (the binary
#   scripts/k8s-binaries.sh builds beside K8S_BIN_DIR, with Debian's iptables and conntrack from
#   the node packages EXK8S_NODE_PACKAGES names and the libraries they load from the node image
#   EXK8S_NODE_IMAGE names: scripts/node-packages.sh and node-image.sh print them);
# - helm, at the version the renderer pins (api/src/render/input.rs), CoreDNS and flanneld from
#   their Go modules (helm, flanneld, the registry and crane in the newest release's module:
#   below).
# Go and these tools are test tools: nothing built here ships.
#
# Output, on stdout: the registry's binary, its storage directory and helm, one per line (serve
# the storage with `registry serve` and a configuration naming it; tests/src/registry.rs does).
# With --tools, only CoreDNS and BusyBox are built (nothing printed): what needs neither Kubernetes
# binaries nor the node image, started early. Everything else goes to stderr. Idempotent (a finished build leaves a stamp)
# and safe when several callers ask at once (flock). Needs go, cc (static libc) and python3.
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: node-registry.sh K8S_BIN_DIR [K8S_BIN_DIR…] | --tools" >&2; exit 2; }
cache=${EXK8S_K8S_CACHE:-/var/cache/exk8s/k8s}
registry_version=v3.0.0
crane_version=v0.22.1
root=$(cd "$(dirname "$0")/.." && pwd)
# helm_version, the release the renderer pins.
# shellcheck source=scripts/lib/versions.sh
source "$root/scripts/lib/versions.sh"

log() { printf '==> node-registry: %s\n' "$*" >&2; }
die() { printf 'node-registry: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "go is not installed (the registry and crane build from their Go modules)"
command -v cc >/dev/null || die "cc is not installed (gcc and libc6-dev build the pause binary)"
command -v file >/dev/null || die "file is not installed (it checks that BusyBox is static)"
command -v make >/dev/null || die "make is not installed (BusyBox builds from its source)"
command -v bzip2 >/dev/null || die "bzip2 is not installed (BusyBox's source is a .tar.bz2)"
command -v objdump >/dev/null || die "objdump is not installed (binutils: kube-proxy's image takes the libraries it names)"
mkdir -p "$cache" 2>/dev/null || die "cannot create the cache $cache (set EXK8S_K8S_CACHE to a writable directory)"

# shellcheck source=scripts/lib/scratch-registry.sh
source "$(dirname "$0")/lib/scratch-registry.sh"
# shellcheck source=scripts/lib/cache.sh
source "$(dirname "$0")/lib/cache.sh"

# CoreDNS, at the version the renderer pins, from its Go module: its own main and plugin list
# (plugin.cfg, in its order), less the plugins that bring a cloud's SDK or another service's
# client and that no cluster's Corefile names (route53, azure, clouddns, etcd, trace, geoip,
# grpc) — a third of its packages to compile. `coredns -plugins` must list every other one.
coredns_left_out='route53|azure|clouddns|etcd|trace|geoip|grpc'
coredns=$cache/coredns-lean-$coredns_version
build_coredns() {
  local dir=$1
  mkdir -p "$dir/src" "$dir/bin"
  log "building CoreDNS $coredns_version (every plugin but $coredns_left_out)"
  (
    cd "$dir/src"
    gomod mod init exk8s.test/coredns >/dev/null 2>&1
    gomod mod edit -go=1.25 -require="github.com/coredns/coredns@$coredns_version"
    gomod mod download github.com/coredns/coredns
    local module kept
    module=$(gomod list -m -f '{{.Dir}}' github.com/coredns/coredns)
    # plugin.cfg's lines are `directive:package`, a bare package being one of CoreDNS's own.
    kept=$(grep -E '^[a-z0-9_]+:' "$module/plugin.cfg" | grep -Ev "^($coredns_left_out):")
    [ -n "$kept" ] || die "no plugin read from $module/plugin.cfg"
    {
      echo '// CoreDNS main with the plugins of plugin.cfg but those scripts/node-registry.sh leaves out.'
      echo 'package main'
      echo
      echo 'import ('
      echo '	"github.com/coredns/coredns/core/dnsserver"'
      echo '	"github.com/coredns/coredns/coremain"'
      awk -F: '{ p = ($2 ~ /\//) ? $2 : "github.com/coredns/coredns/plugin/" $2; print "\t_ \"" p "\"" }' <<<"$kept"
      echo ')'
      echo
      echo 'func init() {'
      echo '	dnsserver.Directives = []string{'
      awk -F: '{ print "\t\t\"" $1 "\"," }' <<<"$kept"
      echo '	}'
      echo '}'
      echo
      echo 'func main() { coremain.Run() }'
    } >main.go
    gomod build -trimpath -ldflags "-s -w" -o "$dir/bin/coredns" .
  )
  local out
  out=$("$dir/bin/coredns" -version 2>&1)
  [[ $out == *"CoreDNS-${coredns_version#v}"* ]] || die "coredns -version says '$out', not $coredns_version"
  out=$("$dir/bin/coredns" -plugins 2>&1)
  local plugin
  for plugin in errors health ready kubernetes prometheus forward cache loop reload loadbalance; do
    grep -qx "$plugin" <<<"$out" || die "coredns -plugins does not list $plugin: $out"
  done
}
with_lock "$coredns" build_coredns

# BusyBox at the suite's version, from its source as Debian archives it (its checksum pinned),
# configured as upstream's image is (`make defconfig`), static; less `tc`, which no longer
# builds against current kernel headers. Debian's own busybox-static is configured otherwise:
# its shell drops the environment's entries whose names are no shell's (`data-1=…`), which two
# conformance specs pass through `sh -c env`.
busybox_version=${busybox_e2e_version%-*}
busybox_sha256=3311dff32e746499f4df0d5df04d7eb396382d7e108bb9250e7b519b837043a4
debian_mirror=${EXK8S_DEBIAN_MIRROR:-}
if [ -z "$debian_mirror" ]; then
  debian_mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
  debian_mirror=${debian_mirror:-http://deb.debian.org/debian}
fi
build_busybox() {
  local dir=$1 tarball=$1/busybox_$busybox_version.orig.tar.bz2
  log "building BusyBox $busybox_version (defconfig, static) from $debian_mirror's source"
  curl -fsS -o "$tarball" "$debian_mirror/pool/main/b/busybox/busybox_$busybox_version.orig.tar.bz2" ||
    die "could not download BusyBox $busybox_version's source from $debian_mirror"
  echo "$busybox_sha256  $tarball" | sha256sum -c --quiet - || die "BusyBox's source does not match its pinned checksum"
  tar -xjf "$tarball" -C "$dir"
  (
    cd "$dir/busybox-$busybox_version"
    make defconfig >"$dir/build.log" 2>&1
    sed -i 's/^# CONFIG_STATIC is not set$/CONFIG_STATIC=y/; s/^CONFIG_TC=y$/# CONFIG_TC is not set/' .config
    make -j"$(nproc)" >>"$dir/build.log" 2>&1 || { tail -n 20 "$dir/build.log" >&2; die "BusyBox did not build (its log: $dir/build.log)"; }
  )
  mkdir -p "$dir/bin"
  cp "$dir/busybox-$busybox_version/busybox" "$dir/bin/busybox"
  rm -rf "$dir/busybox-$busybox_version" "$tarball"
  file -L "$dir/bin/busybox" | grep -q 'statically linked' || die "the BusyBox built is not static"
  local said
  said=$("$dir/bin/busybox" 2>&1 || true)
  [[ $said == "BusyBox v$busybox_version "* ]] || die "the BusyBox built says '${said%%$'\n'*}', not $busybox_version"
}
with_lock "$cache/busybox-$busybox_version" build_busybox
busybox=$cache/busybox-$busybox_version/bin/busybox
[ "$1" != --tools ] || exit 0

# Each release's binaries: its control plane's, and its kube-proxy beside them.
releases=()
declare -A bins=()
for bin_dir in "$@"; do
  [ -x "$bin_dir/kube-apiserver" ] || die "$bin_dir holds no kube-apiserver (run scripts/k8s-binaries.sh)"
  release=$("$bin_dir/kube-apiserver" --version | awk '{print $2}')
  [[ $release =~ ^v1\.[0-9]+\.[0-9]+$ ]] || die "kube-apiserver --version says '$release'"
  [ -z "${bins[$release]:-}" ] || die "$release is named twice"
  [ -x "$cache/$release-kube-proxy/bin/kube-proxy" ] ||
    die "no $cache/$release-kube-proxy/bin/kube-proxy (scripts/k8s-binaries.sh builds it)"
  releases+=("$release")
  bins[$release]=$bin_dir
done
# The tools built from Go modules that use Kubernetes' client libraries (helm, flanneld) or much of
# what they use (the registry, crane), built in a copy of the scratch module of the newest
# release named (the last K8S_BIN_DIR: scripts/k8s-binaries.sh made it) with every module that
# release's build selected pinned to its version: each package they share with it is then one
# Go's build cache holds already (helm compiled alone took 133 CPU-seconds, beside the release
# 15; flanneld 131 and 34). They run against these newer client libraries (their own go.mod
# asks for 0.34 and 0.32): the sources are the pinned releases', and the booted clusters prove
# what the tests need of them. The registry is distribution's cmd/registry with the one storage
# driver the tests use (filesystem): its cloud drivers' SDKs are half of its packages to
# compile. Flannel's Tencent backend names a release of Tencent's SDK the proxy does not serve;
# a newer patch of the same minor builds. Its UDP backend is cgo: linked statically, as
# upstream does.
newest=${releases[${#releases[@]}-1]}
newest_src=$(dirname "${bins[$newest]}")/src
[ -f "$newest_src/go.mod" ] || die "no $newest_src/go.mod: the tools build in Kubernetes $newest's scratch module (scripts/k8s-binaries.sh makes it)"
tools=$cache/node-tools-fs-$registry_version-$crane_version-$helm_version-$flannel_version-on-$newest
build_tools() {
  local dir=$1
  log "building distribution's registry $registry_version (filesystem storage), crane $crane_version, helm $helm_version and flanneld $flannel_version in Kubernetes $newest's module"
  mkdir -p "$dir/src/registry" "$dir/bin"
  cat >"$dir/src/registry/main.go" <<'GO'
// distribution's cmd/registry, with only the filesystem storage driver.
package main

import (
	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
)

func main() {
	_ = registry.RootCmd.Execute()
}
GO
  cp "$newest_src/go.mod" "$newest_src/go.sum" "$dir/src/"
  (
    cd "$dir/src"
    local -a pins
    mapfile -t pins < <(gomod list -m -f '{{if not (or .Main .Replace)}}-replace={{.Path}}={{.Path}}@{{.Version}}{{end}}' all | grep .)
    [ "${#pins[@]}" -gt 0 ] || die "no module listed in $newest_src's build"
    gomod mod edit -module=exk8s.test/node-tools "${pins[@]}" \
      -require="github.com/distribution/distribution/v3@$registry_version" \
      -require="github.com/google/go-containerregistry@$crane_version" \
      -require="helm.sh/helm/v3@$helm_version" \
      -require="github.com/flannel-io/flannel@$flannel_version" \
      -require=github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/common@v1.3.211
    gomod build -trimpath -ldflags "-s -w" -o "$dir/bin/registry" ./registry
    gomod build -trimpath -ldflags "-s -w" -o "$dir/bin/crane" github.com/google/go-containerregistry/cmd/crane
    gomod build -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version" \
      -o "$dir/bin/helm" helm.sh/helm/v3/cmd/helm
    CGO_ENABLED=1 GOFLAGS="-mod=mod -gcflags=all=-dwarf=false" GOTOOLCHAIN=local go build -trimpath -tags netgo,osusergo \
      -ldflags "-s -w -extldflags -static -X github.com/flannel-io/flannel/pkg/version.Version=$flannel_version" \
      -o "$dir/bin/flanneld" github.com/flannel-io/flannel
  )
  local out
  out=$("$dir/bin/helm" version --template '{{.Version}}')
  [ "$out" = "$helm_version" ] || die "helm version says '$out', not $helm_version"
  out=$("$dir/bin/flanneld" --version 2>&1)
  [ "$out" = "$flannel_version" ] || die "flanneld --version says '$out', not $flannel_version"
}
with_lock "$tools" build_tools
# agnhost, the workloads' and the conformance tests' image, from the first release
# (scripts/e2e-binaries.sh builds it); busybox, theirs too, is built above.
agnhost=$cache/${releases[0]}-agnhost
[ -x "$agnhost/bin/agnhost" ] || die "no $agnhost/bin/agnhost (scripts/e2e-binaries.sh ${releases[0]} --agnhost builds it)"
agnhost_version=$(cat "$agnhost/agnhost-version")
# Porter's TLS pair, which upstream's agnhost image carries, from the release's module (kept:
# the module itself need not stay in Go's cache).
porter=$cache/${releases[0]}-porter
copy_porter() {
  local dir=$1 module
  module=$(cd "$cache/${releases[0]}/src" && gomod mod download -json k8s.io/kubernetes |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
  cp "$module/test/images/agnhost/porter/localhost.crt" \
    "$module/test/images/agnhost/porter/localhost.key" "$dir/"
  chmod 0644 "$dir"/localhost.*
}
with_lock "$porter" copy_porter

curl=$(command -v curl) || die "curl is not installed (the agnhost image carries it)"
dash=$(command -v dash) || die "dash is not installed (the agnhost image's shell)"
netcat=$(command -v nc.openbsd) || die "nc.openbsd is not installed (netcat-openbsd: the agnhost image carries it)"
dig=$(command -v dig) || die "dig is not installed (bind9-dnsutils: the agnhost image carries it)"
getent=$(command -v getent) || die "getent is not installed (libc-bin: the agnhost image carries it)"

node_image=${EXK8S_NODE_IMAGE:-}
node_packages=${EXK8S_NODE_PACKAGES:-}
[ -x "$node_image/sbin/init" ] || die "EXK8S_NODE_IMAGE must name the node image (scripts/node-image.sh): the kube-proxy image takes its libraries"
[ -f "$node_packages/Packages" ] || die "EXK8S_NODE_PACKAGES must name the node packages (scripts/node-packages.sh): the kube-proxy image takes iptables from them"

# The storage depends on the binaries, the pause source, the packages and this script.
digest=$( (sha256sum "$0" "$(dirname "$0")/lib/scratch-registry.sh" "$root/tests/tools/pause.c" "$coredns/bin/coredns" "$tools/bin/flanneld" \
  "$agnhost/bin/agnhost" "$porter/localhost.crt" "$porter/localhost.key" "$busybox" "$curl" "$netcat" "$dash" \
  "$dig" "$getent" \
  "$node_packages"/iptables_*.deb "$node_packages"/conntrack_*.deb
  for release in "${releases[@]}"; do
    sha256sum "${bins[$release]}"/kube-{apiserver,controller-manager,scheduler} \
      "$cache/$release-kube-proxy/bin/kube-proxy"
  done
  echo "$pause_version") |
  sha256sum | cut -c1-12)
store=$cache/registry-$(IFS=-; echo "${releases[*]}")-$digest
fill_store() {
  local dir=$1 work=$1.work port
  rm -rf "$work"
  mkdir -p "$work"
  scratch_registry_start "$tools/bin/registry" "$dir/data" "$work"
  port=$scratch_registry_port
  # image NAME:TAG FILE: FILE as /usr/local/bin/<its name>, the image's entrypoint.
  image() {
    local ref=127.0.0.1:$port/$1 file=$2 layer
    layer=$work/layer-$(basename "$2")
    mkdir -p "$layer/usr/local/bin"
    cp "$file" "$layer/usr/local/bin/"
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$layer" -cf "$layer.tar" usr
    "$tools/bin/crane" append --insecure -f "$layer.tar" -t "$ref" >/dev/null 2>>"$work/crane.log"
    "$tools/bin/crane" mutate --insecure "$ref" -t "$ref" \
      --set-platform linux/amd64 --entrypoint "/usr/local/bin/$(basename "$file")" \
      --env PATH=/usr/local/bin:/usr/bin:/bin >/dev/null 2>>"$work/crane.log"
    log "  $1"
  }
  cc -Os -static -o "$work/pause" "$root/tests/tools/pause.c"
  image "pause:$pause_version" "$work/pause"
  local component release
  for release in "${releases[@]}"; do
    for component in kube-apiserver kube-controller-manager kube-scheduler; do
      image "$component:$release" "${bins[$release]}/$component"
    done
    iptables_image "$work" "$port" "kube-proxy:$release" "$cache/$release-kube-proxy/bin/kube-proxy"
  done
  image "coredns/coredns:$coredns_version" "$coredns/bin/coredns"
  iptables_image "$work" "$port" "flannel-io/flannel:$flannel_version" "$tools/bin/flanneld"
  busybox_image "$work" "$port"
  agnhost_image "$work" "$port"
  # The pause tag the end-to-end suite names (its own pods' sandbox-less containers).
  "$tools/bin/crane" copy --insecure "127.0.0.1:$port/pause:$pause_version" \
    "127.0.0.1:$port/pause:$pause_e2e_version" >/dev/null 2>>"$work/crane.log"
  log "  pause:$pause_e2e_version"
  scratch_registry_stop
  rm -rf "$work"
}

# iptables_image WORK PORT NAME:TAG BINARY: an image as upstream's distroless-iptables ones
# (kube-proxy's, flannel's) are made: the Go-built BINARY, its entrypoint, and Debian's iptables
# (nft) and conntrack with exactly the libraries they load — the packages from the node
# packages mirror, the libraries they need from the node image.
iptables_image() {
  local work=$1 port=$2 ref=127.0.0.1:$2/$3 binary=$4 deb lib
  local layer=$work/iptables-${3//[:\/]/-}
  mkdir -p "$layer/usr/local/bin" "$layer/usr/sbin"
  cp "$binary" "$layer/usr/local/bin/"
  for deb in "$node_packages"/iptables_*.deb "$node_packages"/conntrack_*.deb \
    "$node_packages"/libip6tc2_*.deb "$node_packages"/libnetfilter-conntrack3_*.deb \
    "$node_packages"/libnfnetlink0_*.deb "$node_packages"/libnftnl11_*.deb; do
    [ -f "$deb" ] || die "no $deb in the node packages (scripts/node-packages.sh)"
    dpkg-deb -x "$deb" "$layer"
  done
  local tool
  for tool in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
    ln -sfn xtables-nft-multi "$layer/usr/sbin/$tool"
  done
  # Every shared library the binaries need, found in the layer or else the node image.
  local -a queue=("$layer"/usr/sbin/xtables-nft-multi "$layer"/usr/sbin/conntrack \
    "$layer"/usr/lib/x86_64-linux-gnu/xtables/*.so)
  local -A seen=()
  while [ ${#queue[@]} -gt 0 ]; do
    local file=${queue[0]}
    queue=("${queue[@]:1}")
    for lib in $(objdump -p "$file" 2>/dev/null | awk '$1 == "NEEDED" {print $2}'); do
      [ -z "${seen[$lib]:-}" ] || continue
      seen[$lib]=1
      local found=""
      for dir in lib/x86_64-linux-gnu usr/lib/x86_64-linux-gnu; do
        if [ -e "$layer/$dir/$lib" ]; then found=$layer/$dir/$lib; break; fi
        if [ -e "$node_image/$dir/$lib" ]; then
          mkdir -p "$layer/usr/lib/x86_64-linux-gnu"
          cp -L "$node_image/$dir/$lib" "$layer/usr/lib/x86_64-linux-gnu/$lib"
          found=$layer/usr/lib/x86_64-linux-gnu/$lib
          break
        fi
      done
      [ -n "$found" ] || die "$3's image: $lib (needed by $(basename "$file")) is in neither the packages nor the node image"
      queue+=("$found")
    done
  done
  mkdir -p "$layer/lib64" "$layer/lib"
  cp -L "$node_image/lib64/ld-linux-x86-64.so.2" "$layer/lib64/"
  ln -sfn usr/lib/x86_64-linux-gnu "$layer/lib/x86_64-linux-gnu" 2>/dev/null || true
  mkdir -p "$layer/run" "$layer/tmp" "$layer/var/run"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$layer" -cf "$layer.tar" .
  "$tools/bin/crane" append --insecure -f "$layer.tar" -t "$ref" >/dev/null 2>>"$work/crane.log"
  "$tools/bin/crane" mutate --insecure "$ref" -t "$ref" --set-platform linux/amd64 \
    --entrypoint "/usr/local/bin/$(basename "$binary")" \
    --env PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin >/dev/null 2>>"$work/crane.log"
  log "  $3 (with iptables and conntrack)"
}
# busybox_layer DIR: the BusyBox built above in DIR/bin, with a link per applet.
busybox_layer() {
  local layer=$1 applet
  mkdir -p "$layer/bin" "$layer/etc" "$layer/tmp"
  cp "$busybox" "$layer/bin/busybox"
  for applet in $("$busybox" --list); do
    [ "$applet" = busybox ] || ln -sfn busybox "$layer/bin/$applet"
  done
}

# agnhost_image WORK PORT: e2e-test-images/agnhost:<its VERSION>, laid out as upstream's:
# /agnhost the entrypoint (`pause` by default) and its link /agnhost-2, porter's TLS pair
# /localhost.crt and /localhost.key from the module (a readiness probe of the suite reads the
# former), /uploads, the image's own user-defined-in-image (1000) in group-defined-in-image
# (50000), a shell and the tools the suite runs in it (`sh -c 'curl …'`, `nc -v -t …`, the DNS
# specs' `dig` and `getent hosts`): busybox's applets, and Debian's dash as `sh`, curl, OpenBSD's
# netcat (busybox's nc lacks the options the suite passes), dig and getent with exactly the
# libraries they load (this machine's, found by ldd; glibc's own hosts lookups need no module).
agnhost_image() {
  local work=$1 ref=127.0.0.1:$2/e2e-test-images/agnhost:$agnhost_version layer=$1/agnhost lib
  busybox_layer "$layer"
  mkdir -p "$layer/usr/local/bin" "$layer/usr/bin" "$layer/lib/x86_64-linux-gnu" "$layer/lib64"
  cp "$agnhost/bin/agnhost" "$layer/agnhost"
  ln -sfn /agnhost "$layer/usr/local/bin/agnhost"
  ln -sfn agnhost "$layer/agnhost-2"
  cp "$porter/localhost.crt" "$porter/localhost.key" "$layer/"
  mkdir -p "$layer/uploads"
  printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' \
    'user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh' >"$layer/etc/passwd"
  printf '%s\n' 'root:x:0:' 'user-defined-in-image:x:1000:' \
    'group-defined-in-image:x:50000:user-defined-in-image' >"$layer/etc/group"
  cp "$curl" "$layer/usr/bin/curl"
  cp "$netcat" "$layer/usr/bin/nc"
  # A shell that finds commands on PATH: a busybox sh may run its own applets first (a
  # standalone shell), so its `nc` would win over netcat.
  rm -f "$layer/bin/nc" "$layer/bin/sh"
  cp "$dash" "$layer/bin/sh"
  cp "$dig" "$getent" "$layer/usr/bin/"
  for lib in $(ldd "$curl" "$netcat" "$dash" "$dig" "$getent" | awk '$3 ~ /^\// {print $3}' | sort -u); do
    cp -L "$lib" "$layer/lib/x86_64-linux-gnu/"
  done
  cp -L /lib64/ld-linux-x86-64.so.2 "$layer/lib64/"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$layer" -cf "$layer.tar" .
  "$tools/bin/crane" append --insecure -f "$layer.tar" -t "$ref" >/dev/null 2>>"$work/crane.log"
  "$tools/bin/crane" mutate --insecure "$ref" -t "$ref" --set-platform linux/amd64 \
    --entrypoint /agnhost --cmd pause --env PATH=/usr/local/bin:/usr/bin:/bin \
    >/dev/null 2>>"$work/crane.log"
  log "  e2e-test-images/agnhost:$agnhost_version (with busybox, dash, curl, netcat, dig and getent)"
}

# busybox_image WORK PORT: e2e-test-images/busybox:<the suite's tag>, the BusyBox of its version
# with a link per applet in /bin, as upstream's image (no entrypoint; `sh` by default).
busybox_image() {
  local work=$1 ref=127.0.0.1:$2/e2e-test-images/busybox:$busybox_e2e_version layer=$1/busybox
  busybox_layer "$layer"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$layer" -cf "$layer.tar" .
  "$tools/bin/crane" append --insecure -f "$layer.tar" -t "$ref" >/dev/null 2>>"$work/crane.log"
  "$tools/bin/crane" mutate --insecure "$ref" -t "$ref" --set-platform linux/amd64 \
    --cmd sh --env PATH=/bin >/dev/null 2>>"$work/crane.log"
  log "  e2e-test-images/busybox:$busybox_e2e_version (BusyBox $busybox_version from its source)"
}
with_lock "$store" fill_store

echo "$tools/bin/registry"
echo "$store/data"
echo "$tools/bin/helm"
