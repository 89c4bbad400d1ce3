#!/usr/bin/env bash
# scripts/bench-boot.sh [--pairs N] [--control-plane N] [--workers N] [--out DIR] [--port PORT]
#                       [--bin-dir DIR] [--agent FILE] [--only exk8s|kubeadm] [--machine-cpus C]
#
# (--only kubeadm takes the files an earlier exk8s run left in DIR/exk8s-files.)
# How long from asking for a cluster to using it: exk8s and kubeadm side by side on the same
# booted machines (scripts/dev-cluster.sh's stack), alternating exk8s, kubeadm, exk8s, ... for N
# pairs (default 3). Linux, as root; run it on an otherwise idle machine (scripts/bench.sh boot).
# With --machine-cpus C every machine gets at most C cores, as a VM's vCPUs cap it (without it the
# machines share every core of this host: machines booting side by side slow each other down, and
# one machine working alone has the whole host).
#
# Each run's milestones, in seconds from its start, each the first time a watcher saw it (it looks
# every half second from the machines' network): every VM running (the compute API); etcd's quorum
# (a member answers /health true, which it does only with a leader); every apiserver's /readyz;
# every Node Ready; CoreDNS available; a first pod (asked for once the apiserver answers) Running.
#
# exk8s starts at `exk8s clusters create` (POST /clusters) and asks for its pool of workers as soon
# as the API takes it (once the cluster is founded); each machine does the rest by itself.
# kubeadm starts when the bench asks the compute API for its machines (the same image, the agent
# masked), then does on them what kubeadm's documentation says: containerd and the kernel
# parameters on every machine (the files the exk8s run's bundle wrote there, so both use the same
# registry mirror, sandbox image and sysctls), the kubelet, kubeadm and kubectl of the same build
# with kubeadm's kubelet unit; `kubeadm init` on the first machine with an HAProxy in front of the
# apiservers (its controlPlaneEndpoint); flannel applied (exk8s's manifest); the other
# control-plane machines `kubeadm join --control-plane` one after another, the workers `kubeadm
# join` beside them. Both use the same images from the same registry.
#
# Writes DIR/runs.tsv (flavour, pair, milestone, seconds), DIR/summary.md (the medians and the
# ratio per pair), each exk8s run's first node's phases from its agent's journal
# (DIR/exk8s-N-phases.txt) and each kubeadm run's step times (DIR/kubeadm-N-steps.txt).
set -Eeuo pipefail
trap 'echo "bench-boot.sh: \"$BASH_COMMAND\" failed (line $LINENO)" >&2' ERR
caller=$PWD
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/ensure.sh
source scripts/lib/ensure.sh
# shellcheck source=scripts/lib/versions.sh
source scripts/lib/versions.sh
# shellcheck source=scripts/lib/dev-stack.sh
source scripts/lib/dev-stack.sh

pairs=3 control_plane=3 workers=2 out=target/bench/boot port=8095 bin_dir='' agent='' only=''
machine_cpus=''
usage() { sed -n '2,3p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
number() { [[ $2 =~ ^[0-9]+$ ]] || { echo "$1 needs a number, got '$2'" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || usage
  case "$1" in
    --pairs) number "$1" "$2"; pairs=$2 ;;
    --control-plane) number "$1" "$2"; control_plane=$2 ;;
    --workers) number "$1" "$2"; workers=$2 ;;
    --out) out=$2 ;;
    --port) number "$1" "$2"; port=$2 ;;
    --bin-dir) bin_dir=$2 ;;
    --agent) agent=$2 ;;
    --only) case "$2" in exk8s | kubeadm) only=$2 ;; *) echo "--only takes exk8s or kubeadm, got '$2'" >&2; exit 2 ;; esac ;;
    --machine-cpus) [[ $2 =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "--machine-cpus needs a number of cores, got '$2'" >&2; exit 2; }; machine_cpus=$2 ;;
    *) usage ;;
  esac
  shift 2
done
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$caller/$1" ;; esac; }
[ "$pairs" -ge 1 ] || { echo "--pairs must be at least 1" >&2; exit 2; }
case "$control_plane" in 1 | 3 | 5) ;; *) echo "--control-plane must be 1, 3 or 5 (etcd's quorum), got $control_plane" >&2; exit 2 ;; esac
[ "$(id -u)" = 0 ] || { echo "bench-boot.sh needs root: it boots machines (scripts/dev-cluster.sh)" >&2; exit 2; }
ensure_packages jq:jq curl:curl nsenter:util-linux haproxy:haproxy openssl:openssl \
  /usr/lib/python3/dist-packages/yaml/__init__.py:python3-yaml
out=$(absolute "$out")
mkdir -p "$out"

log "the node image and packages, Kubernetes $k8s_version and kubeadm, the registry (once per machine)"
image=${EXK8S_NODE_IMAGE:-$(bash scripts/node-image.sh)}
export EXK8S_NODE_IMAGE=$image
export EXK8S_NODE_PACKAGES=${EXK8S_NODE_PACKAGES:-$(bash scripts/node-packages.sh "$image")}
bins=$(bash scripts/k8s-binaries.sh "$k8s_version" "$etcd_version")
EXK8S_ETCD_BIN=$(sed -n 1p <<<"$bins")
EXK8S_K8S_BIN=$(sed -n 2p <<<"$bins")
export EXK8S_ETCD_BIN EXK8S_K8S_BIN
kubeadm=$(bash scripts/k8s-binaries.sh "$k8s_version" "$etcd_version" --kubeadm | sed -n 4p)
bash scripts/e2e-binaries.sh "$k8s_version" --agnhost >/dev/null
registry=$(bash scripts/node-registry.sh "$EXK8S_K8S_BIN")
EXK8S_NODE_REGISTRY=$(sed -n 1p <<<"$registry")
EXK8S_NODE_HELM=$(sed -n 3p <<<"$registry")
export EXK8S_NODE_REGISTRY EXK8S_NODE_HELM
# The conformance store adds the etcd image kubeadm's static pod runs (etcd:3.6.6-0).
images=$(bash scripts/conformance-images.sh "$k8s_version" "$EXK8S_NODE_REGISTRY" "$(sed -n 2p <<<"$registry")")
EXK8S_NODE_REGISTRY_STORE=$(sed -n 1p <<<"$images")
export EXK8S_NODE_REGISTRY_STORE

if [ -z "$bin_dir" ]; then
  log "exk8s-api and the exk8s CLI (release)"
  cargo build --locked --release -p exk8s-api -p exk8s-cli
  bin_dir=$PWD/target/release
fi
bin_dir=$(absolute "$bin_dir")
stack_args=(--bin-dir "$bin_dir")
[ -z "$agent" ] || stack_args+=(--agent "$(absolute "$agent")")

if [ -n "$machine_cpus" ]; then
  # exk8s-api dev --machine-cpus, through dev-cluster.sh.
  export EXK8S_DEV_MACHINE_CPUS=$machine_cpus
  log "every machine capped at $machine_cpus cores"
fi
balancer=''
# shellcheck disable=SC2317 # called by the trap
stop_all() {
  [ -z "$balancer" ] || kill "$balancer" 2>/dev/null || true
  stop_dev_stack
}
trap stop_all EXIT
start_dev_stack "$out" "$port" "${stack_args[@]}"
api=http://127.0.0.1:$port
export EXK8S_CONFIG=$out/cli/config.toml
exk8s() { "$bin_dir/exk8s" "$@"; }
exk8s login --api "$api" <"$out/stack/operator.token" >/dev/null
compute=$api/sim/compute

# plural N WORD: WORD, with an s unless N is 1.
plural() { if [ "$1" = 1 ]; then echo "$2"; else echo "$2s"; fi; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
machine() { curl -fsS "$compute/sim/machines/$1"; }
# in_machine VM COMMAND...: COMMAND inside the machine (every namespace of its PID 1).
in_machine() {
  local pid
  pid=$(machine "$1" | jq -r .init_pid)
  shift
  nsenter --target="$pid" --all -- "$@"
}

# Returns once no machine is left (a run's machines are gone before the next one starts; the
# bench is the host's only user of systemd-nspawn).
wait_no_vms() {
  local deadline=$((SECONDS + 600))
  # The compute API says terminated before the machine has powered off: its systemd-nspawn too.
  until [ "$(curl -fsS "$compute/v1/vms" | jq '[.[] | select(.state != "terminated")] | length')" = 0 ] &&
    ! pgrep -x systemd-nspawn >/dev/null; do
    [ $SECONDS -lt $deadline ] || { echo "machines still up 10 minutes after their deletion" >&2; exit 1; }
    sleep 1
  done
}

# watch FLAVOUR PAIR T0 NETNS KUBECONFIG ETCD_CA ETCD_CERT ETCD_KEY VMS...: the milestones, each
# once, into runs.tsv and on the terminal; returns once every one is seen (or after 15 minutes,
# or once DIR/FLAVOUR-PAIR.failed says the run failed).
watch() {
  local flavour=$1 pair=$2 t0=$3 netns=$4 kubeconfig=$5 etcd_ca=$6 etcd_cert=$7 etcd_key=$8
  shift 8
  local vms=("$@") want=$((control_plane + workers)) seen=' ' ips=() vm
  on_lan() { nsenter --net="/run/netns/$netns" -- "$@"; }
  kubectl() { on_lan "$EXK8S_K8S_BIN/kubectl" --kubeconfig "$kubeconfig" --request-timeout=2s "$@"; }
  mark() {
    [[ $seen == *" $1 "* ]] && return 0
    seen+="$1 "
    local at
    at=$(since "$t0")
    printf '%s\t%s\t%s\t%s\n' "$flavour" "$pair" "$1" "$at" >>"$out/runs.tsv"
    log "$flavour $pair: $1 at $at s"
  }
  local deadline=$((SECONDS + 900)) asked=''
  while [ $SECONDS -lt $deadline ]; do
    # What drives the run (kubeadm's steps) failed: nothing more will come.
    [ ! -e "$out/$flavour-$pair.failed" ] || return 1
    if [[ $seen != *" vms-running "* ]]; then
      local running=0
      for vm in "${vms[@]}"; do
        [ "$(curl -fsS "$compute/v1/vms/$vm" | jq -r .state)" = running ] && running=$((running + 1))
      done
      [ "$running" -lt "${#vms[@]}" ] || mark vms-running
    fi
    if [ "${#ips[@]}" -lt "$control_plane" ]; then
      ips=()
      for vm in "${vms[@]:0:$control_plane}"; do
        ips+=("$(curl -fsS "$compute/v1/vms/$vm" | jq -r '.private_ipv4 // empty')")
      done
    fi
    if [[ $seen != *" etcd-quorum "* ]] && [ -s "$etcd_cert" ]; then
      for ip in "${ips[@]}"; do
        if on_lan curl -fsS --max-time 1 --cacert "$etcd_ca" --cert "$etcd_cert" --key "$etcd_key" \
          "https://$ip:2379/health" 2>/dev/null | grep -q '"health":"true"'; then
          mark etcd-quorum
          break
        fi
      done
    fi
    if [[ $seen != *" apiservers-ready "* ]]; then
      local ready=0
      for ip in "${ips[@]}"; do
        [ "$(on_lan curl -ksS --max-time 1 "https://$ip:6443/readyz" 2>/dev/null)" = ok ] && ready=$((ready + 1))
      done
      [ "$ready" -lt "$control_plane" ] || mark apiservers-ready
    fi
    if [ -s "$kubeconfig" ] && kubectl get --raw /readyz >/dev/null 2>&1; then
      if [ -z "$asked" ] && kubectl -n default get serviceaccount default >/dev/null 2>&1; then
        kubectl -n default run bench-first --image="registry.k8s.io/pause:$pause_version" --restart=Never \
          >/dev/null 2>&1 && asked=yes
      fi
      if [[ $seen != *" nodes-ready "* ]] &&
        [ "$(kubectl get nodes -o json 2>/dev/null | jq '[.items[] | select(.status.conditions[] | .type == "Ready" and .status == "True")] | length')" = "$want" ]; then
        mark nodes-ready
      fi
      if [[ $seen != *" coredns-available "* ]] &&
        [ "$(kubectl -n kube-system get deployment coredns -o json 2>/dev/null | jq -r '.status.conditions[]? | select(.type == "Available") | .status')" = True ]; then
        mark coredns-available
      fi
      if [ -n "$asked" ] && [ "$(kubectl -n default get pod bench-first -o jsonpath='{.status.phase}' 2>/dev/null)" = Running ]; then
        mark first-pod-running
      fi
    fi
    [[ $seen == *" first-pod-running "* && $seen == *" nodes-ready "* && $seen == *" coredns-available "* ]] && return 0
    sleep 0.5
  done
  log "$flavour $pair: not every milestone within 15 minutes (seen:$seen)"
  return 1
}

# shellcheck source=scripts/lib/bench-boot-exk8s.sh
source scripts/lib/bench-boot-exk8s.sh
# shellcheck source=scripts/lib/bench-boot-kubeadm.sh
source scripts/lib/bench-boot-kubeadm.sh

: >"$out/runs.tsv"
for pair in $(seq 1 "$pairs"); do
  [ "$only" = kubeadm ] || run_exk8s "$pair"
  [ "$only" = exk8s ] || run_kubeadm "$pair"
done
python3 scripts/lib/bench_boot_summary.py "$out/runs.tsv" "$control_plane" "$workers" "$machine_cpus" >"$out/summary.md"
cat "$out/summary.md"
