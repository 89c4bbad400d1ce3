#!/usr/bin/env bash
# Kubernetes' conformance suite against a cluster exk8s founds on booted machines. Linux
# (Debian or Ubuntu), as root.
#
#   sudo scripts/conformance.sh [--out DIR] [--procs N] [--focus REGEX] [--skip REGEX]
#                               [--control-plane N] [--workers N] [--port PORT]
#                               [--bin-dir DIR] [--agent FILE]
#
# Builds once per machine, into /var/cache/exk8s, what scripts/dev-cluster.sh builds plus the
# suite (`e2e.test` and ginkgo from k8s.io/kubernetes' module, scripts/e2e-binaries.sh) and every
# image its `[Conformance]` specs pull that can be built here (scripts/conformance-images.sh),
# served under the suite's exact names by the registry the nodes mirror registry.k8s.io from.
# Then runs scripts/dev-cluster.sh (its data in DIR/stack), founds `conformance` — a control plane
# of 3 members (--control-plane) with flannel and a pool of 2 workers (--workers) — waits for
# every node to be Ready, and runs the specs matching --focus (default every `[Conformance]` spec)
# less --skip with ginkgo, N processes at once (--procs, default 4; `[Serial]` specs run alone at
# the end), from the first control-plane machine's LAN with its admin kubeconfig.
#
# Writes DIR (default ./conformance-results): junit.xml (ginkgo's report), e2e.log (the suite's
# output), summary.md (passed, failed and skipped, each failure with the start of its reason,
# the time taken) and the stack's logs. Exits 0 when no spec failed. The stack stops at the end
# (its machines power off); DIR/stack keeps their disks until removed.
#
# --bin-dir and --agent are dev-cluster.sh's (exk8s-api, the exk8s CLI and the static agent
# taken instead of built); EXK8S_NODE_IMAGE, EXK8S_NODE_PACKAGES, EXK8S_K8S_BIN and
# EXK8S_ETCD_BIN already set are used as they are (scripts/test.sh sets them).
set -euo pipefail
caller=$PWD
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/ensure.sh
source scripts/lib/ensure.sh
# shellcheck source=scripts/lib/versions.sh
source scripts/lib/versions.sh
# shellcheck source=scripts/lib/dev-stack.sh
source scripts/lib/dev-stack.sh

out=./conformance-results procs=4 focus='\[Conformance\]' skip='' control_plane=3 workers=2
port=8090 bin_dir='' agent=''
usage() { sed -n '5,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
number() { [[ $2 =~ ^[0-9]+$ ]] || { echo "$1 needs a whole number, got '$2'" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || usage
  case "$1" in
    --out) out=$2 ;;
    --procs) number "$1" "$2"; procs=$2 ;;
    --focus) focus=$2 ;;
    --skip) skip=$2 ;;
    --control-plane) number "$1" "$2"; control_plane=$2 ;;
    --workers) number "$1" "$2"; workers=$2 ;;
    --port) number "$1" "$2"; port=$2 ;;
    --bin-dir) bin_dir=$2 ;;
    --agent) agent=$2 ;;
    *) usage ;;
  esac
  shift 2
done
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$caller/$1" ;; esac; }
out=$(absolute "$out")
[ "$procs" -ge 1 ] || { echo "--procs must be at least 1" >&2; exit 2; }
case "$control_plane" in 1 | 3 | 5) ;; *) echo "--control-plane must be 1, 3 or 5 (etcd's quorum), got $control_plane" >&2; exit 2 ;; esac
if [ "$port" -lt 1 ] || [ "$port" -gt 65533 ]; then echo "--port must be below 65534, got $port" >&2; exit 2; fi
[ "$(id -u)" = 0 ] || { echo "conformance.sh needs root: it boots machines (scripts/dev-cluster.sh)" >&2; exit 2; }
ensure_packages debootstrap:debootstrap jq:jq curl:curl python3:python3 nsenter:util-linux

started=$SECONDS
mkdir -p "$out"
log "the node image and packages, Kubernetes $k8s_version, the suite and its images (once per machine)"
image=${EXK8S_NODE_IMAGE:-$(bash scripts/node-image.sh)}
export EXK8S_NODE_IMAGE=$image
export EXK8S_NODE_PACKAGES=${EXK8S_NODE_PACKAGES:-$(bash scripts/node-packages.sh "$image")}
if [ -z "${EXK8S_ETCD_BIN:-}" ] || [ -z "${EXK8S_K8S_BIN:-}" ]; then
  bins=$(bash scripts/k8s-binaries.sh "$k8s_version" "$etcd_version")
  EXK8S_ETCD_BIN=$(sed -n 1p <<<"$bins")
  EXK8S_K8S_BIN=$(sed -n 2p <<<"$bins")
  export EXK8S_ETCD_BIN EXK8S_K8S_BIN
fi
e2e_test=$(bash scripts/e2e-binaries.sh "$k8s_version" | sed -n 3p)
registry=$(bash scripts/node-registry.sh "$EXK8S_K8S_BIN")
EXK8S_NODE_REGISTRY=$(sed -n 1p <<<"$registry")
EXK8S_NODE_HELM=$(sed -n 3p <<<"$registry")
export EXK8S_NODE_REGISTRY EXK8S_NODE_HELM
images=$(bash scripts/conformance-images.sh "$k8s_version" "$EXK8S_NODE_REGISTRY" "$(sed -n 2p <<<"$registry")")
EXK8S_NODE_REGISTRY_STORE=$(sed -n 1p <<<"$images")
export EXK8S_NODE_REGISTRY_STORE
ginkgo=$(sed -n 2p <<<"$images")

if [ -z "$bin_dir" ]; then
  log "exk8s-api and the exk8s CLI (release)"
  cargo build --locked --release -p exk8s-api -p exk8s-cli
  bin_dir=$PWD/target/release
fi
bin_dir=$(absolute "$bin_dir")
[ -x "$bin_dir/exk8s" ] || { echo "--bin-dir $bin_dir: no exk8s in it" >&2; exit 2; }
stack_args=(--bin-dir "$bin_dir")
[ -z "$agent" ] || stack_args+=(--agent "$(absolute "$agent")")
trap stop_dev_stack EXIT
start_dev_stack "$out" "$port" "${stack_args[@]}"

export EXK8S_CONFIG=$out/cli/config.toml
exk8s() { "$bin_dir/exk8s" "$@"; }
exk8s login --api "http://127.0.0.1:$port" <"$out/stack/operator.token"
log "founding 'conformance': $control_plane control-plane members and $workers workers"
exk8s clusters create conformance --control-plane "$control_plane" --image 1 --instance-type dev.small \
  --subnet 1 --pod-network flannel --wait
if [ "$workers" -gt 0 ]; then
  exk8s node-pools create conformance workers --count "$workers" --image 1 --instance-type dev.small --subnet 1
fi
first=$(exk8s -o json nodes conformance | jq -r '[.[] | select(.role == "control-plane")] | sort_by(.vm_id) | .[0].vm_id')
[[ $first =~ ^[0-9]+$ ]] || { exk8s nodes conformance >&2; echo "no control-plane node listed" >&2; exit 1; }
machine=$(curl -fsS "http://127.0.0.1:$port/sim/compute/sim/machines/$first")
netns=$(jq -r .netns <<<"$machine")
kubeconfig=$(jq -r .disk <<<"$machine")/etc/exk8s/kubeconfig/admin.kubeconfig
on_lan() { nsenter --net="/run/netns/$netns" -- "$@"; }
kubectl() { on_lan "$EXK8S_K8S_BIN/kubectl" --kubeconfig "$kubeconfig" "$@"; }

want=$((control_plane + workers))
log "waiting for $want nodes Ready"
deadline=$((SECONDS + 1800))
until [ "$(kubectl get nodes -o json 2>/dev/null | jq '[.items[] | select(.status.conditions[] | .type == "Ready" and .status == "True")] | length')" = "$want" ]; do
  [ $SECONDS -lt $deadline ] || { kubectl get nodes -o wide >&2 || true; exk8s nodes conformance >&2; echo "the nodes were not all Ready in 30 minutes" >&2; exit 1; }
  sleep 5
done
kubectl get nodes -o wide
kubectl version
log "ready after $((SECONDS - started)) s; running the suite ($procs processes, focus $focus${skip:+, skip $skip})"

suite_started=$SECONDS
ginkgo_args=(--procs="$procs" --focus="$focus" --no-color --timeout=8h --junit-report=junit.xml
  --output-dir="$out")
[ -z "$skip" ] || ginkgo_args+=(--skip="$skip")
status=0
on_lan "$ginkgo" "${ginkgo_args[@]}" "$e2e_test" -- --kubeconfig="$kubeconfig" --provider=skeleton \
  --kubectl-path="$EXK8S_K8S_BIN/kubectl" --report-dir="$out" >"$out/e2e.log" 2>&1 || status=$?
took=$((SECONDS - suite_started))
python3 scripts/lib/junit_summary.py "$out/junit.xml" "$k8s_version" "$took" "$control_plane" "$workers" \
  "$procs" >"$out/summary.md"
cat "$out/summary.md"
log "the suite ended ($status) in $took s; its output: $out/e2e.log"
exit "$status"
