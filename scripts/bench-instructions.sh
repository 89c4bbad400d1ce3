#!/usr/bin/env bash
# scripts/bench-instructions.sh [--few N] [--many N] [--rounds N] [--out DIR]
#
# The steady measure of issuance (scripts/bench.sh instructions): instructions per bundle,
# counted by valgrind's callgrind, which gives the same count on a busy machine as on an idle
# one, where CPU seconds move by a fifth between runs. ECDSA P-256 only: an RSA key's
# generation searches for primes and costs a different count every time.
#
# The API: `exk8s-loadgen` starts `exk8s-api serve` under callgrind (SQLite, the simulators),
# founds one 3-member cluster and fetches its bundles one at a time, N_few times in one run and
# N_many in another; the API's instructions per bundle are the runs' difference over
# N_many - N_few (start-up, founding and the VMs' tokens cancel out). The floor: the same
# loadgen's `--floor-rounds` runs the issuance floor's own calls (a node's eleven certificates
# minted from fresh keys, the payload's two digests, the envelope's ed25519 signature, the
# calls `--floor` times) for N_few and N_many bundles of the fetched payload's size, also under
# callgrind, differenced the same way. Prints both and their ratio for each round (default 2,
# to show the count repeats), and writes DIR/summary.tsv.
set -Eeuo pipefail
trap 'echo "bench-instructions.sh: \"$BASH_COMMAND\" failed (line $LINENO)" >&2' ERR
caller=$PWD
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/ensure.sh
source scripts/lib/ensure.sh

few=10 many=40 rounds=2 out=target/bench/instructions
usage() { sed -n '2p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
number() { [[ $2 =~ ^[0-9]+$ ]] || { echo "$1 needs a number, got '$2'" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || usage
  case "$1" in
    --few) number "$1" "$2"; few=$2 ;;
    --many) number "$1" "$2"; many=$2 ;;
    --rounds) number "$1" "$2"; rounds=$2 ;;
    --out) out=$2 ;;
    *) usage ;;
  esac
  shift 2
done
[ "$many" -gt "$few" ] || { echo "--many ($many) must be more than --few ($few)" >&2; exit 2; }
[ "$rounds" -ge 1 ] || { echo "--rounds must be at least 1" >&2; exit 2; }
case "$out" in /*) ;; *) out=$caller/$out ;; esac

ensure_packages valgrind:valgrind jq:jq
cargo build --release --locked -p exk8s-api -p exk8s-loadgen
api=$PWD/target/release/exk8s-api
loadgen=$PWD/target/release/exk8s-loadgen
rm -rf "$out"
mkdir -p "$out"

# The API's serve under callgrind; its other commands (keys, migrate, tokens) as they are.
# Children are followed, so anything the API spawns is counted too.
cat >"$out/api-under-callgrind" <<SH
#!/bin/sh
[ "\$1" = serve ] || exec "$api" "\$@"
exec valgrind --tool=callgrind --trace-children=yes \\
  --callgrind-out-file="\$EXK8S_CALLGRIND_DIR/callgrind.out.%p" "$api" "\$@"
SH
chmod +x "$out/api-under-callgrind"

# The instructions every callgrind output in a directory counted, summed.
counted() {
  local sum=0 file n
  for file in "$1"/callgrind.out.*; do
    n=$(awk '/^summary:/ { print $2; exit }' "$file")
    [ -n "$n" ] || { echo "$file: no summary line (did the process end by itself?)" >&2; return 1; }
    sum=$((sum + n))
  done
  echo "$sum"
}

api_run() {
  local dir=$out/api-$1-$2
  mkdir -p "$dir"
  log "round $1: the API under callgrind, $2 fetches (its log: $dir/loadgen.log)"
  EXK8S_CALLGRIND_DIR=$dir "$loadgen" --api-bin "$out/api-under-callgrind" \
    --clusters ecdsa-p256=1 --nodes 3 --fetches "ecdsa-p256=$2" --concurrency 1 \
    --timeout-secs 300 --graceful-stop-secs 300 --json "$dir/loadgen.json" >"$dir/loadgen.log" 2>&1 \
    || { tail -n 20 "$dir/loadgen.log" >&2; return 1; }
  counted "$dir"
}

floor_run() {
  local dir=$out/floor-$1-$2
  mkdir -p "$dir"
  valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out.%p" \
    "$loadgen" --floor-rounds "$2" --floor-payload-bytes "$3" --fetches ecdsa-p256=1 \
    >"$dir/run.log" 2>&1 || { tail -n 20 "$dir/run.log" >&2; return 1; }
  counted "$dir"
}

printf 'round\tapi_per_bundle\tfloor_per_bundle\tratio\tpayload_bytes\n' >"$out/summary.tsv"
for round in $(seq 1 "$rounds"); do
  api_few=$(api_run "$round" "$few")
  api_many=$(api_run "$round" "$many")
  payload=$(jq '[.[] | select(.cpu != null) | .cpu.payload_bytes][0]' "$out/api-$round-$many/loadgen.json")
  [ "$payload" -gt 0 ] || { echo "the loadgen's report names no payload size" >&2; exit 1; }
  log "round $round: the floor's calls under callgrind, $few and $many bundles of $payload bytes"
  floor_few=$(floor_run "$round" "$few" "$payload")
  floor_many=$(floor_run "$round" "$many" "$payload")
  per=$(((api_many - api_few) / (many - few)))
  floor=$(((floor_many - floor_few) / (many - few)))
  ratio=$(awk -v a="$per" -v f="$floor" 'BEGIN { printf "%.2f", a / f }')
  printf '%s\t%s\t%s\t%s\t%s\n' "$round" "$per" "$floor" "$ratio" "$payload" >>"$out/summary.tsv"
  log "round $round: the API $per instructions per bundle, the floor $floor: ratio $ratio (payload $payload bytes)"
done
column -t "$out/summary.tsv"
