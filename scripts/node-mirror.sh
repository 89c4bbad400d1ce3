#!/usr/bin/env bash
# Lays out the mirror of everything a booted node downloads, as upstream lays it out, and the
# artifact catalog that pins it:
#   scripts/node-mirror.sh DIR PORT
# DIR/debian           Debian's packages (EXK8S_NODE_PACKAGES, scripts/node-packages.sh)
# DIR/release/<k8s>/bin/linux/amd64/{kubelet,kubectl}   as dl.k8s.io (EXK8S_K8S_BIN)
# DIR/etcd-io/etcd/releases/download/<etcd>/etcd-<etcd>-linux-amd64.tar.gz   as GitHub (EXK8S_ETCD_BIN)
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

release=release/$k8s_version/bin/linux/amd64
mkdir -p "$dir/$release"
for name in kubelet kubectl; do
  ln -sfn "$EXK8S_K8S_BIN/$name" "$dir/$release/$name"
  entry "$name" "$k8s_version" "$release/$name"
done

# tarball PATH TOP SOURCE...: DIR/PATH holding TOP/<basename of each SOURCE>.
tarball() {
  local path=$1 top=$2 staging
  shift 2
  staging=$(mktemp -d)
  mkdir -p "$staging/$top" "$(dirname "$dir/$path")"
  cp "$@" "$staging/$top/"
  tar -C "$staging" -czf "$dir/$path.partial" "$top"
  mv "$dir/$path.partial" "$dir/$path"
  rm -rf "$staging"
}
etcd_path=etcd-io/etcd/releases/download/$etcd_version/etcd-$etcd_version-linux-amd64.tar.gz
tarball "$etcd_path" "etcd-$etcd_version-linux-amd64" "$EXK8S_ETCD_BIN"/{etcd,etcdctl,etcdutl}
entry etcd "$etcd_version" "$etcd_path"
helm_path=helm-$helm_version-linux-amd64.tar.gz
tarball "$helm_path" linux-amd64 "$EXK8S_NODE_HELM"
entry helm "$helm_version" "$helm_path"

ln -sfn "$EXK8S_NODE_PACKAGES" "$dir/debian"
printf '%s\n' "${catalog[@]}" >"$dir/artifacts.toml.partial"
mv "$dir/artifacts.toml.partial" "$dir/artifacts.toml"
