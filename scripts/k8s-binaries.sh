#!/usr/bin/env bash
# scripts/k8s-binaries.sh K8S_VERSION [ETCD_VERSION] [--kubeadm]
#
# Builds, once per machine and version, the real Kubernetes and etcd binaries the tests run:
# kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kubectl from the Go module
# k8s.io/kubernetes, and etcd, etcdctl and etcdutl from etcd's modules. Go is a test tool here:
# nothing built by this script ships, and no Go code lives in the repository (the scratch module
# is generated under the cache).
#
# Both upstream go.mod files `replace` their in-tree modules (./staging/..., ../api), which makes
# `go install mod@version` refuse them. The way around it is a scratch main module that requires
# the release and replaces each in-tree module with its published version (k8s.io/api v0.35.3 for
# Kubernetes v1.35.3; go.etcd.io/etcd/api/v3 v3.6.10 for etcd v3.6.10).
#
# Output: $EXK8S_K8S_CACHE/<k8s version>/bin/* and $EXK8S_K8S_CACHE/etcd-<etcd version>/bin/*
# (default cache /var/cache/exk8s/k8s). Prints etcd's and Kubernetes' bin directories on stdout,
# then kube-proxy's binary (and, with --kubeadm, kubeadm's), one per line;
# everything else goes to stderr. Idempotent (a finished build leaves a stamp and is not
# repeated) and safe when several callers ask at once (flock per version).
set -euo pipefail

k8s_version=${1:?usage: k8s-binaries.sh K8S_VERSION [ETCD_VERSION] [--kubeadm]}
etcd_version=${2:-v3.6.10}
kubeadm=no
case "${3:-}" in
  '') ;;
  --kubeadm) kubeadm=yes ;;
  *) echo "k8s-binaries.sh: the third argument may only be --kubeadm, got '$3'" >&2; exit 2 ;;
esac
cache=${EXK8S_K8S_CACHE:-/var/cache/exk8s/k8s}

log() { printf '==> k8s-binaries: %s\n' "$*" >&2; }
die() { printf 'k8s-binaries: %s\n' "$*" >&2; exit 1; }

[[ $k8s_version =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "Kubernetes version must look like v1.35.3, got '$k8s_version'"
k8s_minor=${BASH_REMATCH[1]}
k8s_patch=${BASH_REMATCH[2]}
[[ $etcd_version =~ ^v3\.[0-9]+\.[0-9]+$ ]] || die "etcd version must look like v3.6.10, got '$etcd_version'"
command -v go >/dev/null || die "go is not installed (the tests build Kubernetes from its Go modules)"
command -v flock >/dev/null || die "flock is not installed (util-linux)"

mkdir -p "$cache" 2>/dev/null || die "cannot create the cache $cache (set EXK8S_K8S_CACHE to a writable directory)"

build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)

# shellcheck source=scripts/lib/cache.sh
source "$(dirname "$0")/lib/cache.sh"
export "${go_env[@]}"

build_kubernetes() {
  local dir=$1 src=$1/src
  mkdir -p "$src" "$dir/bin"
  log "building Kubernetes $k8s_version (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl)"
  (
    cd "$src"
    go mod init exk8s.test/k8s-binaries >/dev/null 2>&1
    go mod edit -go=1.25
    go mod edit -require="k8s.io/kubernetes@$k8s_version"
    # Every in-tree module Kubernetes replaces (k8s.io/api => ./staging/src/k8s.io/api, ...) is
    # published as v0.<minor>.<patch>.
    local upstream staging
    upstream=$(go mod download -json "k8s.io/kubernetes@$k8s_version" | sed -n 's/^\s*"GoMod": "\(.*\)",*$/\1/p')
    [ -f "$upstream" ] || die "the module proxy did not serve k8s.io/kubernetes@$k8s_version"
    staging=$(sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$upstream")
    [ -n "$staging" ] || die "no staging replaces found in k8s.io/kubernetes@$k8s_version's go.mod"
    local m
    for m in $staging; do
      go mod edit -replace="$m=$m@v0.$k8s_minor.$k8s_patch"
    done
    local pkg=k8s.io/component-base/version ldflags
    ldflags="-s -w"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
      ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
      ldflags+=" -X $pkg.gitCommit=0000000000000000000000000000000000000000"
    done
    # One go build for the five: the package graph is loaded once and the links run side by
    # side (five builds in a row loaded it five times).
    log "  go build kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl"
    go build -trimpath -ldflags "$ldflags" -o "$dir/bin/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl
  )
  local cmd out
  for cmd in kube-apiserver kube-controller-manager kube-scheduler kubelet; do
    out=$("$dir/bin/$cmd" --version 2>&1)
    [[ $out == *"Kubernetes $k8s_version"* ]] || die "$cmd --version says '$out', not Kubernetes $k8s_version"
  done
  out=$("$dir/bin/kubectl" version --client 2>&1)
  [[ $out == *"$k8s_version"* ]] || die "kubectl version --client says '$out', not $k8s_version"
}

build_etcd() {
  local dir=$1 src=$1/src
  mkdir -p "$src" "$dir/bin"
  log "building etcd $etcd_version (etcd, etcdctl, etcdutl)"
  (
    cd "$src"
    go mod init exk8s.test/etcd-binaries >/dev/null 2>&1
    go mod edit -go=1.25
    local m
    for m in server etcdctl etcdutl api client/pkg client/v3 pkg; do
      case $m in
        client/v3) m=go.etcd.io/etcd/client/v3 ;;
        *) m=go.etcd.io/etcd/$m/v3 ;;
      esac
      go mod edit -require="$m@$etcd_version" -replace="$m=$m@$etcd_version"
    done
    local ldflags="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=release-$etcd_version"
    log "  go build etcd etcdctl etcdutl"
    go build -trimpath -ldflags "$ldflags" -o "$dir/bin/etcd" go.etcd.io/etcd/server/v3
    go build -trimpath -ldflags "$ldflags" -o "$dir/bin/etcdctl" go.etcd.io/etcd/etcdctl/v3
    go build -trimpath -ldflags "$ldflags" -o "$dir/bin/etcdutl" go.etcd.io/etcd/etcdutl/v3
  )
  local want=${etcd_version#v} cmd out
  for cmd in etcd etcdctl etcdutl; do
    out=$("$dir/bin/$cmd" --version 2>&1 || "$dir/bin/$cmd" version 2>&1)
    [[ $out == *"$want"* ]] || die "$cmd --version says '$out', not $want"
  done
}

# One more command of the release, built in a copy of its scratch module into a cache of its
# own (the release's binaries above are cached already on machines that built them before it
# was asked for): kube-proxy, for the addon image a cluster's nodes run
# (scripts/node-registry.sh), and kubeadm, which only the boot benchmark runs
# (scripts/bench-boot.sh), built when asked for.
build_command() {
  local cmd=$1 dir=$2 release=$cache/$k8s_version
  mkdir -p "$dir/src" "$dir/bin"
  cp "$release/src/go.mod" "$release/src/go.sum" "$dir/src/"
  log "building $cmd $k8s_version"
  (
    cd "$dir/src"
    local pkg ldflags="-s -w"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
      ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
      ldflags+=" -X $pkg.gitCommit=0000000000000000000000000000000000000000"
    done
    go build -trimpath -ldflags "$ldflags" -o "$dir/bin/$cmd" "k8s.io/kubernetes/cmd/$cmd"
  )
  local out
  case $cmd in
    kubeadm) out=$("$dir/bin/kubeadm" version -o short 2>&1) ;;
    *) out=$("$dir/bin/$cmd" --version 2>&1) ;;
  esac
  [[ $out == *"$k8s_version"* ]] || die "$cmd says '$out' of its version, not Kubernetes $k8s_version"
}
build_kube_proxy() { build_command kube-proxy "$1"; }
build_kubeadm() { build_command kubeadm "$1"; }

with_lock "$cache/etcd-$etcd_version" build_etcd
with_lock "$cache/$k8s_version" build_kubernetes
with_lock "$cache/$k8s_version-kube-proxy" build_kube_proxy
echo "$cache/etcd-$etcd_version/bin"
echo "$cache/$k8s_version/bin"
echo "$cache/$k8s_version-kube-proxy/bin/kube-proxy"
if [ "$kubeadm" = yes ]; then
  with_lock "$cache/$k8s_version-kubeadm" build_kubeadm
  echo "$cache/$k8s_version-kubeadm/bin/kubeadm"
fi
