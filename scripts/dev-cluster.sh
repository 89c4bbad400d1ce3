#!/usr/bin/env bash
# A real local cluster: the dev stack with every VM it makes booted under systemd-nspawn, as an
# image builder and a cloud would do it. Linux (Debian or Ubuntu), as root.
#
#   sudo scripts/dev-cluster.sh [--data-dir DIR] [--port PORT] [--bin-dir DIR] [--agent FILE]
#
# Once per machine, into /var/cache/exk8s (the first run takes a while; later ones seconds):
# the node image (Debian 12 with systemd, debootstrap), the Debian packages a node installs,
# Kubernetes and etcd built from their Go modules, and a registry holding the control plane's
# images. Then, each run: the static agent is baked into a copy of the node image as
# packaging/bake-image.sh bakes it (its agent.toml naming this stack, the mirror as its apt
# source, the registry as containerd's mirror of registry.k8s.io), the package and artifact
# mirror and the registry are served on 127.0.0.1:PORT+1 and PORT+2, and `exk8s-api dev
# --machines nspawn` runs on 127.0.0.1:PORT (default 8080) with its data in DIR (default
# ./exk8s-dev-machines) until Ctrl-C, which powers the machines off (their disks stay).
#
# --bin-dir DIR takes exk8s-api from DIR instead of building target/release, --agent FILE bakes
# FILE instead of building the static agent (tests/tests/boot_cluster/readme.rs runs the
# README's commands with the suite's own builds), and each of EXK8S_NODE_IMAGE,
# EXK8S_NODE_PACKAGES, EXK8S_ETCD_BIN, EXK8S_K8S_BIN and EXK8S_NODE_REGISTRY (with
# EXK8S_NODE_REGISTRY_STORE and EXK8S_NODE_HELM) already set is used as it is, not built
# (scripts/test.sh sets them).
set -euo pipefail
caller=$PWD
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/ensure.sh
source scripts/lib/ensure.sh
# shellcheck source=scripts/lib/versions.sh
source scripts/lib/versions.sh

data=./exk8s-dev-machines port=8080 bin_dir='' agent=''
while [ $# -gt 0 ]; do
  case "$1" in
    --data-dir) data=${2:?--data-dir needs a directory}; shift 2 ;;
    --port) port=${2:?--port needs a number}; shift 2 ;;
    --bin-dir) bin_dir=${2:?--bin-dir needs a directory}; shift 2 ;;
    --agent) agent=${2:?--agent needs a file}; shift 2 ;;
    *) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
# Paths given are the caller's, not the repository's.
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$caller/$1" ;; esac; }
data=$(absolute "$data")
[ -z "$bin_dir" ] || bin_dir=$(absolute "$bin_dir")
[ -z "$agent" ] || agent=$(absolute "$agent")
if [ -n "$bin_dir" ] && [ ! -x "$bin_dir/exk8s-api" ]; then
  echo "--bin-dir $bin_dir: no exk8s-api in it" >&2
  exit 2
fi
if [ -n "$agent" ] && [ ! -x "$agent" ]; then
  echo "--agent $agent: not an executable file" >&2
  exit 2
fi
if ! [[ $port =~ ^[0-9]+$ ]] || [ "$port" -lt 1 ] || [ "$port" -gt 65533 ]; then
  echo "--port must be a port number below 65534, got '$port'" >&2
  exit 2
fi
[ "$(id -u)" = 0 ] || { echo "dev-cluster.sh needs root: network namespaces, cgroups and systemd-nspawn" >&2; exit 2; }
mirror_port=$((port + 1)) registry_port=$((port + 2))
ensure_packages systemd-nspawn:systemd-container nsenter:util-linux ip:iproute2 python3:python3 \
  jq:jq
# What the registry's images are made with (scripts/node-registry.sh): a C compiler, static
# libc, make and bzip2 (pause, flanneld, BusyBox), objdump, and the test images' curl, netcat
# and dig.
ensure_packages cc:gcc /usr/lib/x86_64-linux-gnu/libc.a:libc6-dev make:make bzip2:bzip2 \
  objdump:binutils file:file curl:curl nc.openbsd:netcat-openbsd dig:bind9-dnsutils

log "the node image, its Debian packages, Kubernetes $k8s_version and etcd $etcd_version, the registry (once per machine)"
image=${EXK8S_NODE_IMAGE:-$(bash scripts/node-image.sh)}
EXK8S_NODE_PACKAGES=${EXK8S_NODE_PACKAGES:-$(bash scripts/node-packages.sh "$image")}
if [ -z "${EXK8S_ETCD_BIN:-}" ] || [ -z "${EXK8S_K8S_BIN:-}" ]; then
  bins=$(bash scripts/k8s-binaries.sh "$k8s_version" "$etcd_version")
  EXK8S_ETCD_BIN=$(sed -n 1p <<<"$bins")
  EXK8S_K8S_BIN=$(sed -n 2p <<<"$bins")
fi
export EXK8S_NODE_IMAGE=$image EXK8S_NODE_PACKAGES
if [ -n "${EXK8S_NODE_REGISTRY:-}" ]; then
  registry_bin=$EXK8S_NODE_REGISTRY
  registry_store=${EXK8S_NODE_REGISTRY_STORE:?EXK8S_NODE_REGISTRY_STORE goes with EXK8S_NODE_REGISTRY}
  EXK8S_NODE_HELM=${EXK8S_NODE_HELM:?EXK8S_NODE_HELM goes with EXK8S_NODE_REGISTRY}
else
  # agnhost, the workloads' test image the registry serves (with the end-to-end suite).
  bash scripts/e2e-binaries.sh "$k8s_version" --agnhost >/dev/null
  registry=$(bash scripts/node-registry.sh "$EXK8S_K8S_BIN")
  registry_bin=$(sed -n 1p <<<"$registry")
  registry_store=$(sed -n 2p <<<"$registry")
  EXK8S_NODE_HELM=$(sed -n 3p <<<"$registry")
fi
export EXK8S_NODE_PACKAGES EXK8S_ETCD_BIN EXK8S_K8S_BIN EXK8S_NODE_HELM

if [ -z "$bin_dir" ]; then
  log "exk8s-api and the exk8s CLI (release)"
  cargo build --locked --release -p exk8s-api -p exk8s-cli
  bin_dir=target/release
fi
if [ -z "$agent" ]; then
  log "exk8s-agent (static)"
  agent=$(bash scripts/build-static-agent.sh | tail -1 | cut -d: -f1)
fi
api=$bin_dir/exk8s-api

mkdir -p "$data"
data=$(cd "$data" && pwd)
if [ ! -f "$data/signing.key" ]; then
  "$api" keys generate --out "$data/signing.key" >/dev/null
fi
mkdir -p "$data/image-keys"
"$api" keys public --signing-key "$data/signing.key" >"$data/image-keys/exk8s-dev.pub"

log "the mirror of what nodes download, on 127.0.0.1:$mirror_port"
bash scripts/node-mirror.sh "$data/mirror" "$mirror_port"

log "baking the node image for this stack into $data/image"
rm -rf "$data/image" "$data/image.partial"
cp -a --reflink=auto "$image" "$data/image.partial"
cat >"$data/image-agent.toml" <<TOML
api_url = "http://127.0.0.1:$port"
imds_url = "http://169.254.169.254"
insecure_http = true
TOML
bash packaging/bake-image.sh "$data/image.partial" --agent "$agent" \
  --keys-dir "$data/image-keys" --config "$data/image-agent.toml"
echo "deb [trusted=yes] http://127.0.0.1:$mirror_port/debian ./" >"$data/image.partial/etc/apt/sources.list"
for upstream in registry.k8s.io ghcr.io; do
  mkdir -p "$data/image.partial/etc/containerd/certs.d/$upstream"
  cat >"$data/image.partial/etc/containerd/certs.d/$upstream/hosts.toml" <<TOML
server = "https://$upstream"

[host."http://127.0.0.1:$registry_port"]
  capabilities = ["pull", "resolve"]
TOML
done
mv "$data/image.partial" "$data/image"

cat >"$data/registry.yml" <<YAML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $registry_store
  maintenance:
    readonly:
      enabled: true
http:
  addr: 127.0.0.1:$registry_port
YAML
python3 -m http.server --bind 127.0.0.1 "$mirror_port" --directory "$data/mirror" \
  >"$data/mirror.log" 2>&1 &
mirror_pid=$!
"$registry_bin" serve "$data/registry.yml" >"$data/registry.log" 2>&1 &
registry_pid=$!
trap 'kill "$mirror_pid" "$registry_pid" 2>/dev/null || true' EXIT

log "exk8s-api dev --machines nspawn on 127.0.0.1:$port (Ctrl-C stops it and powers the machines off)"
"$api" dev --listen "127.0.0.1:$port" --data-dir "$data" \
  --machines nspawn --node-image "$data/image" --machine-forward "$mirror_port,$registry_port" \
  --artifact-catalog "$data/mirror/artifacts.toml"
