#!/usr/bin/env bash
# Lays out the mirror of everything a booted node downloads, as upstream lays it out, and the
# artifact catalog that pins it:
#   scripts/node-mirror.sh DIR PORT
# DIR/debian           Debian's packages (EXK8S_NODE_PACKAGES, scripts/node-packages.sh)
# DIR/release/<k8s>/bin/linux/amd64/{kubelet,kubectl}   as dl.k8s.io (EXK8S_K8S_BIN)
# DIR/etcd-io/etcd/releases/download/<etcd>/etcd-<etcd>-linux-amd64.tar.gz   as GitHub (EXK8S_ETCD_BIN)
#                      and, when EXK8S_K8S_NEXT_BIN and EXK8S_ETCD_NEXT_BIN are set, the next
#                      release's too (what an upgrade downloads)
# DIR/helm-<helm>-linux-amd64.tar.gz   as get.helm.sh (EXK8S_NODE_HELM, scripts/node-registry.sh)
# DIR/artifacts.toml   the catalog for `exk8s-api dev --artifact-catalog`, every URL at
#                      http://127.0.0.1:PORT/ (where each machine reaches the mirror)
# Serve DIR on 127.0.0.1:PORT with any static file server (python3 -m http.server).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/lib/versions.sh
source "$here/lib/versions.sh"

die() {
  echo "node-mirror.sh: $*" >&2
  exit 2
}
[ $# -eq 2 ] || die "usage: scripts/node-mirror.sh DIR PORT"
dir=$1 port=$2
if ! [[ $port =~ ^[0-9]+$ ]] || [ "$port" -lt 1 ] || [ "$port" -gt 65535 ]; then
  die "PORT must be a port number, got '$port'"
fi
need() {
  local name=$1 what=$2 value=${!1:-}
  [ -n "$value" ] || die "$name is not set: $what"
  [ -e "$value" ] || die "$name=$value does not exist: $what"
}
need EXK8S_K8S_BIN "the Kubernetes binaries' directory (scripts/k8s-binaries.sh prints it)"
need EXK8S_ETCD_BIN "etcd's binaries' directory (scripts/k8s-binaries.sh prints it)"
need EXK8S_NODE_HELM "the helm binary (scripts/node-registry.sh prints it)"
need EXK8S_NODE_PACKAGES "the Debian package mirror (scripts/node-packages.sh prints it)"

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
catalog=()
# entry NAME VERSION PATH: one pinned artifact, PATH below DIR.
entry() {
  local sum
  sum=$(sha256sum "$dir/$3" | cut -d' ' -f1)
  catalog+=("[[artifact]]" "name = \"$1\"" "version = \"$2\"" "url = \"http://127.0.0.1:$port/$3\"" "sha256 = \"$sum\"" "")
}

# kubernetes VERSION BIN_DIR: kubelet and kubectl as dl.k8s.io lays them out.
kubernetes() {
  local release=release/$1/bin/linux/amd64 name
  mkdir -p "$dir/$release"
  for name in kubelet kubectl; do
    ln -sfn "$2/$name" "$dir/$release/$name"
    entry "$name" "$1" "$release/$name"
  done
}

# tarball PATH TOP SOURCE...: DIR/PATH holding TOP/<basename of each SOURCE>.
tarball() {
  local path=$1 top=$2 staging
  shift 2
  staging=$(mktemp -d)
  mkdir -p "$staging/$top" "$(dirname "$dir/$path")"
  cp "$@" "$staging/$top/"
  # gzip's fastest level: every test's stack lays out its own mirror, and a tarball's size on
  # loopback costs less than the default level's CPU (about 3 s per etcd tarball).
  tar -C "$staging" -I 'gzip -1' -cf "$dir/$path.partial" "$top"
  mv "$dir/$path.partial" "$dir/$path"
  rm -rf "$staging"
}
# etcd VERSION BIN_DIR: its release tarball as GitHub lays it out.
etcd() {
  local path=etcd-io/etcd/releases/download/$1/etcd-$1-linux-amd64.tar.gz
  tarball "$path" "etcd-$1-linux-amd64" "$2"/{etcd,etcdctl,etcdutl}
  entry etcd "$1" "$path"
}
kubernetes "$k8s_version" "$EXK8S_K8S_BIN"
etcd "$etcd_version" "$EXK8S_ETCD_BIN"
if [ -n "${EXK8S_K8S_NEXT_BIN:-}${EXK8S_ETCD_NEXT_BIN:-}" ]; then
  need EXK8S_K8S_NEXT_BIN "the next release's Kubernetes binaries (scripts/k8s-binaries.sh $k8s_next $etcd_next)"
  need EXK8S_ETCD_NEXT_BIN "the next release's etcd binaries (scripts/k8s-binaries.sh $k8s_next $etcd_next)"
  kubernetes "$k8s_next" "$EXK8S_K8S_NEXT_BIN"
  etcd "$etcd_next" "$EXK8S_ETCD_NEXT_BIN"
fi
helm_path=helm-$helm_version-linux-amd64.tar.gz
tarball "$helm_path" linux-amd64 "$EXK8S_NODE_HELM"
entry helm "$helm_version" "$helm_path"

ln -sfn "$EXK8S_NODE_PACKAGES" "$dir/debian"
printf '%s\n' "${catalog[@]}" >"$dir/artifacts.toml.partial"
mv "$dir/artifacts.toml.partial" "$dir/artifacts.toml"
