#!/usr/bin/env bash
# Runs every benchmark behind BENCHMARKS.md. Not part of the test run: it takes minutes.
# Run it on an otherwise idle machine.
#
#   scripts/bench.sh            # everything
#   scripts/bench.sh pki|load|poll|streams|storm|fleet|found|agent|profile|compare|levers|floor|boot|instructions
#   (boot: issue 67's measure, as root — exk8s and kubeadm founding the same shape on the same
#   booted machines, alternating, [PAIRS=n] pairs (default 3) of [CONTROL_PLANE=n] (default 3)
#   members and [WORKERS=n] (default 2) workers: scripts/bench-boot.sh; not part of `all`)
#   (instructions: issue 67's steady measure, the API's instructions per bundle ÷ the floor's
#   calls', counted by callgrind: scripts/bench-instructions.sh; not part of `all`)
#   (floor: issue 48's ratio, the API's CPU per bundle ÷ the cryptography's on this machine,
#   ECDSA and RSA-2048 on SQLite and PostgreSQL; OLD=<commit> [PAIRS=n] adds that commit's API,
#   alternating; not part of `all`)
#   (compare: OLD=<commit> [PAIRS=n] [POLLS=n] scripts/bench.sh compare — that commit's API
#   against this one's, n pairs (default 2) alternating, on the same PostgreSQL, each run's
#   fetches followed by POLLS signed day-2 polls (default none); not part of `all`)
#   (levers: what the three design decisions issue 21 names would give, measured with the
#   temporary switches in bench/issue21-levers.patch; [ROUNDS=n], default 3; not part of `all`)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/ensure.sh
source scripts/lib/ensure.sh

what=${1:-all}
out=target/bench
mkdir -p "$out"
if [ "$what" = boot ]; then
  exec bash scripts/bench-boot.sh --pairs "${PAIRS:-3}" --control-plane "${CONTROL_PLANE:-3}" \
    --workers "${WORKERS:-2}" --out "$out/boot"
fi
if [ "$what" = instructions ]; then
  exec bash scripts/bench-instructions.sh --out "$out/instructions"
fi
ensure_packages jq:jq hyperfine:hyperfine curl:curl /usr/bin/time:time
cargo build --release --locked -p exk8s-api -p exk8s-agent -p exk8s-loadgen
api=target/release/exk8s-api
loadgen=target/release/exk8s-loadgen

if [ "$what" = all ] || [ "$what" = pki ]; then
  log "PKI: founding and per-bundle minting, ecdsa-p256 vs rsa-2048"
  cargo bench -p exk8s-api --bench pki -- --noplot
  log "one bundle's CPU after minting, stage by stage (render, serialise, sign, digest)"
  cargo bench -p exk8s-api --bench bundle -- --noplot
fi

if [ "$what" = all ] || [ "$what" = load ]; then
  ensure_postgres
  pg_db=exk8s_bench_load
  psql -h 127.0.0.1 -U postgres -q -c "DROP DATABASE IF EXISTS $pg_db" -c "CREATE DATABASE $pg_db"
  # The rsa-2048 set is 32 fetches by one cluster's 3 VMs at once, straight after founding:
  # more key generation than two cores do within the deadline, so some are refused cleanly
  # (503 + Retry-After, counted in the "clean" column); anything else fails the run.
  log "bundle issuance under load: PostgreSQL, ecdsa-p256 and rsa-2048 in the same run"
  "$loadgen" --api-bin "$api" --database-url "postgres://postgres@127.0.0.1:5432/$pg_db" \
    --clusters ecdsa-p256=4,rsa-2048=1 --fetches ecdsa-p256=10000,rsa-2048=32 --concurrency 64 \
    --allow-clean-errors --json "$out/load-postgres.json"
  log "bundle issuance under load: SQLite, ecdsa-p256 and rsa-2048 in the same run"
  "$loadgen" --api-bin "$api" \
    --clusters ecdsa-p256=4,rsa-2048=1 --fetches ecdsa-p256=10000,rsa-2048=32 --concurrency 64 \
    --allow-clean-errors --json "$out/load-sqlite.json"
fi

if [ "$what" = all ] || [ "$what" = poll ]; then
  ensure_postgres
  pg_db=exk8s_bench_poll
  psql -h 127.0.0.1 -U postgres -q -c "DROP DATABASE IF EXISTS $pg_db" -c "CREATE DATABASE $pg_db"
  # Each of the 30 VMs registers a node key with one fetch, then the polls go round them.
  log "day-2 polls (signed GET /nodes/{vm}/generation): PostgreSQL"
  "$loadgen" --api-bin "$api" --database-url "postgres://postgres@127.0.0.1:5432/$pg_db" \
    --clusters ecdsa-p256=10 --fetches ecdsa-p256=30 --polls 20000 --concurrency 64 \
    --json "$out/poll-postgres.json"
  log "day-2 polls (signed GET /nodes/{vm}/generation): SQLite"
  "$loadgen" --api-bin "$api" \
    --clusters ecdsa-p256=10 --fetches ecdsa-p256=30 --polls 20000 --concurrency 64 \
    --json "$out/poll-sqlite.json"
fi

if [ "$what" = all ] || [ "$what" = streams ]; then
  # Signed day-2 polls with no event stream open, then with 1,000 open and unread on one
  # cluster (one operator token), alternating, on SQLite (the default store). Each stream holds
  # a socket in the API and one here: the soft file limit goes up to the hard one.
  ulimit -n "$(ulimit -Hn)"
  if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt 2200 ]; then
    echo "1,000 streams need about 2,100 open files; this shell may open $(ulimit -n)" >&2
    exit 1
  fi
  for round in 1 2; do
    for streams in 0 1000; do
      log "day-2 polls with $streams open event streams (round $round): SQLite"
      "$loadgen" --api-bin "$api" --api-arg=--event-streams-per-token=0 \
        --clusters ecdsa-p256=10 --fetches ecdsa-p256=30 --polls 20000 --concurrency 64 \
        --streams "$streams" --json "$out/streams-$streams-$round.json"
    done
  done
fi

if [ "$what" = all ] || [ "$what" = storm ]; then
  ensure_postgres
  pg_db=exk8s_bench_storm
  psql -h 127.0.0.1 -U postgres -q -c "DROP DATABASE IF EXISTS $pg_db" -c "CREATE DATABASE $pg_db"
  log "boot storm baseline: the ecdsa-p256 cluster's traffic alone"
  "$loadgen" --api-bin "$api" --database-url "postgres://postgres@127.0.0.1:5432/$pg_db" \
    --clusters ecdsa-p256=1 --workers 29 --fetches ecdsa-p256=3000 --concurrency 32 \
    --json "$out/storm-baseline.json"
  psql -h 127.0.0.1 -U postgres -q -c "DROP DATABASE $pg_db" -c "CREATE DATABASE $pg_db"
  log "boot storm: 32 VMs of one rsa-2048 cluster (3 control-plane + 29 workers) fetching at once,"
  log "beside an ecdsa-p256 cluster's traffic, default deadline, after the key pool filled"
  "$loadgen" --api-bin "$api" --database-url "postgres://postgres@127.0.0.1:5432/$pg_db" \
    --clusters ecdsa-p256=1,rsa-2048=1 --workers 29 --fetches ecdsa-p256=3000,rsa-2048=32 \
    --concurrency 32 --together --await-key-pool --json "$out/storm.json"
  log "abandoned storm: 64 rsa-4096 fetches whose clients leave after 1 s (key pool off: this"
  log "measures that abandoned work stops), then ecdsa-p256 fetches at normal latency"
  "$loadgen" --api-bin "$api" --clusters rsa-4096=1,ecdsa-p256=1 --fetches rsa-4096=64,ecdsa-p256=200 \
    --concurrency 64 --timeout-secs 1 --allow-hung --allow-clean-errors --idle-check \
    --api-arg=--key-pool-max=0 --json "$out/abandoned.json"
fi

if [ "$what" = all ] || [ "$what" = fleet ]; then
  ensure_postgres
  for fleet in 0 9990; do
    pg_db=exk8s_bench_fleet_$fleet
    psql -h 127.0.0.1 -U postgres -q -c "DROP DATABASE IF EXISTS $pg_db" -c "CREATE DATABASE $pg_db"
    log "fleet size: 10 ecdsa-p256 clusters fetched from after $fleet idle ones (then ANALYZE, as"
    log "autovacuum would), and GET /clusters walked once cold (reported apart), then 5 times, in"
    log "pages of 500"
    "$loadgen" --api-bin "$api" --database-url "postgres://postgres@127.0.0.1:5432/$pg_db" \
      --fleet "$fleet" --analyze --clusters ecdsa-p256=10 --fetches ecdsa-p256=10000 \
      --concurrency 64 --list-walks 5 --json "$out/fleet-$fleet.json"
  done
  pg_db=exk8s_bench_fleet_booted
  psql -h 127.0.0.1 -U postgres -q -c "DROP DATABASE IF EXISTS $pg_db" -c "CREATE DATABASE $pg_db"
  log "fleet size, booted: the same 10,000 clusters with every node's bundle certificates recorded"
  log "(14 a node: 23,000 rows a page of 500), GET /clusters walked once cold, then 20 times"
  "$loadgen" --api-bin "$api" --database-url "postgres://postgres@127.0.0.1:5432/$pg_db" \
    --fleet 9990 --analyze --clusters ecdsa-p256=10 --fetches ecdsa-p256=2000 \
    --concurrency 64 --boot-fleet --list-walks 20 --json "$out/fleet-booted.json"
fi

if [ "$what" = all ] || [ "$what" = found ]; then
  log "founding latency (zero-latency simulators), 1 and 3 nodes, SQLite"
  "$loadgen" --api-bin "$api" --clusters ecdsa-p256=50 --nodes 1 --fetches ecdsa-p256=0 --json "$out/found-1.json"
  "$loadgen" --api-bin "$api" --clusters ecdsa-p256=50 --nodes 3 --fetches ecdsa-p256=0 --json "$out/found-3.json"
fi

if [ "$what" = all ] || [ "$what" = agent ]; then
  log "agent verify+apply of one node's bundle vs the seed's bash shim (bench/seed-shim-apply.sh)"
  work=$(mktemp -d)
  shm=$(mktemp -d -p /dev/shm)
  trap 'kill "$dev_pid" 2>/dev/null || true; rm -rf "$work" "$shm"' EXIT
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  base="http://127.0.0.1:$port"
  "$api" dev --listen "127.0.0.1:$port" --data-dir "$work/dev" >/dev/null 2>&1 &
  dev_pid=$!
  for _ in $(seq 100); do curl -sf "$base/healthz" >/dev/null && break; sleep 0.1; done
  token=$(cat "$work/dev/operator.token")
  curl -sf -X POST "$base/clusters" -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
    -H 'Prefer: wait=300' \
    -d '{"control_plane_count": 3, "control_plane_image_id": 1, "control_plane_instance_type": "bench", "subnet_id": 1}' >/dev/null
  imds=$(curl -sf "$base/sim/imds/101/token")
  access=$(curl -sf -H "X-exc-imds-token: $imds" "$base/sim/imds/101/latest/identity/access-token" | jq -r .access_token)
  curl -sf -H "X-exc-imds-token: $imds" -H "Authorization: Bearer $access" -H "X-Exk8s-Nonce: bench-nonce-0000000000" \
    "$base/bootstrap/101" > "$work/bundle.json"
  # The same files in the seed's bundle shape: {"files": {"<path>": "<content>"}}.
  jq -r .payload "$work/bundle.json" | base64 -d \
    | jq '{files: (.files | map({(.path): (.content | @base64d)}) | add)}' > "$work/seed-bundle.json"
  files=$(jq '.files | length' "$work/seed-bundle.json")
  echo "bundle of node 101: $files files, $(stat -c %s "$work/bundle.json") bytes"
  keys="$work/dev/trusted-keys"
  agent=target/release/exk8s-agent
  for where in "$shm" "$work"; do
    label=$([ "$where" = "$shm" ] && echo tmpfs || echo disk)
    hyperfine --warmup 3 --min-runs 20 --export-json "$out/agent-$label.json" \
      --prepare "rm -rf $where/agent-root $where/shim-root" \
      -n "exk8s-agent apply ($label)" "EXK8S_CONFIG=/nonexistent $agent --keys-dir $keys apply --bundle $work/bundle.json --root $where/agent-root" \
      -n "seed shim ($label)" "bench/seed-shim-apply.sh $work/seed-bundle.json $where/shim-root"
  done
  log "static agent: size and peak RSS"
  bash scripts/build-static-agent.sh
  rm -rf "$work/rss-root"
  /usr/bin/time -v env EXK8S_CONFIG=/nonexistent target/x86_64-unknown-linux-musl/release/exk8s-agent \
    --keys-dir "$keys" apply --bundle "$work/bundle.json" --root "$work/rss-root" 2>&1 >/dev/null \
    | grep -E 'Maximum resident set size|Elapsed'
fi

if [ "$what" = profile ]; then
  # STORE=sqlite profiles the embedded default store (the load generator's temporary SQLite
  # database) instead of PostgreSQL. The API process alone is sampled with DWARF call stacks
  # (perf, cpu-clock, 199 Hz) while the load runs, so every sample is put in the phase of
  # issuance it was taken in (bench/perf_phases.py: minting, signing, rendering, serialising,
  # the certificates' facts, SQLite, the handler, HTTP, tokio), and each phase's share is
  # turned into milliseconds per bundle with the load generator's own CPU count.
  store=${STORE:-postgres}
  log "profile of bundle issuance on $store (perf, DWARF stacks of the API process) with a symbolized release API"
  CARGO_PROFILE_RELEASE_STRIP=none CARGO_PROFILE_RELEASE_DEBUG=line-tables-only \
    cargo build --release --locked -p exk8s-api --target-dir target/profile
  db_args=()
  if [ "$store" = postgres ]; then
    ensure_postgres
    psql -h 127.0.0.1 -U postgres -q -c "DROP DATABASE IF EXISTS exk8s_bench_prof" -c "CREATE DATABASE exk8s_bench_prof"
    db_args=(--database-url postgres://postgres@127.0.0.1:5432/exk8s_bench_prof)
  fi
  "$loadgen" --api-bin target/profile/release/exk8s-api "${db_args[@]}" --floor \
    --bundle-route /bootstrap/control-plane \
    --clusters ecdsa-p256=4 --fetches ecdsa-p256=8000 --concurrency 32 > "$out/profile-load.txt" 2>&1 &
  load=$!
  # The API server the load generator started (its child running `serve`, not a migration).
  api_pid=
  for _ in $(seq 1 120); do
    api_pid=$(pgrep -P "$load" -f 'exk8s-api serve' || true)
    [ -n "$api_pid" ] && break
    sleep 0.5
  done
  [ -n "$api_pid" ] || { cat "$out/profile-load.txt"; echo "no API process to profile" >&2; exit 1; }
  sleep 8 # past founding, into the fetches
  perf record -o "$out/issuance.perf" -p "$api_pid" -e cpu-clock -F 199 --call-graph dwarf,32768 \
    -- sleep 12
  wait "$load"
  grep -E 'CPU per bundle' "$out/profile-load.txt"
  ms=$(grep -oE 'CPU per bundle: API [0-9.]+' "$out/profile-load.txt" | awk '{print $NF}')
  floor=$(grep -oE 'floor [0-9.]+ ms' "$out/profile-load.txt" | awk '{print $2}')
  if [ -z "$ms" ] || [ -z "$floor" ]; then
    cat "$out/profile-load.txt"
    echo "the load generator reported no CPU per bundle or no floor" >&2
    exit 1
  fi
  perf script -i "$out/issuance.perf" -F comm,tid,ip,sym,dso 2>/dev/null \
    | python3 bench/perf_phases.py --ms-per-bundle "$ms" --floor-ms "$floor"
fi

if [ "$what" = compare ]; then
  ensure_postgres
  old_rev=$(git rev-parse --short "${OLD:-HEAD~1}")
  log "side by side: $old_rev against the working tree, ecdsa-p256, PostgreSQL, c=64, ${PAIRS:-2} pairs, new then old"
  git worktree remove --force "$out/old-src" 2>/dev/null || true
  git worktree add --detach "$out/old-src" "$old_rev"
  (cd "$out/old-src" && cargo build --release --locked -p exk8s-api --target-dir ../../old-target)
  old_api=target/old-target/release/exk8s-api
  pg_db=exk8s_bench_compare
  runs=()
  for pair in $(seq 1 "${PAIRS:-2}"); do runs+=("new-$pair" "old-$pair"); done
  for run in "${runs[@]}"; do
    bin=$([ "${run%-*}" = new ] && echo "$api" || echo "$old_api")
    psql -h 127.0.0.1 -U postgres -q -c "DROP DATABASE IF EXISTS $pg_db" -c "CREATE DATABASE $pg_db"
    log "$run ($([ "${run%-*}" = new ] && echo working tree || echo "$old_rev"))"
    "$loadgen" --api-bin "$bin" --database-url "postgres://postgres@127.0.0.1:5432/$pg_db" \
      --clusters ecdsa-p256=4 --fetches ecdsa-p256=10000 --polls "${POLLS:-0}" --concurrency 64 \
      --json "$out/compare-$run.json"
  done
  git worktree remove --force "$out/old-src"
fi

if [ "$what" = floor ]; then
  # Issue 48's ratio: the API's own CPU per bundle (its process and key helpers, from /proc)
  # against the cryptography a bundle needs, timed on this machine before each run with the
  # issuer's crates (`exk8s-loadgen --floor`); PostgreSQL's CPU beside it. ECDSA P-256 and
  # RSA-2048, SQLite and PostgreSQL. With OLD=<commit>, that commit's API too, alternating
  # (new, then old) for ${PAIRS:-2} pairs: both builds' ratios, measured by this loadgen.
  ensure_postgres
  bins=("new:$api")
  if [ -n "${OLD:-}" ]; then
    old_rev=$(git rev-parse --short "$OLD")
    git worktree remove --force "$out/old-src" 2>/dev/null || true
    git worktree add --detach "$out/old-src" "$old_rev"
    (cd "$out/old-src" && cargo build --release --locked -p exk8s-api --target-dir ../../old-target)
    git worktree remove --force "$out/old-src"
    bins+=("$old_rev:target/old-target/release/exk8s-api")
  fi
  pg_db=exk8s_bench_floor
  # Builds before the role-neutral `/bootstrap/{vm}` serve only the alias (the same handler):
  # with OLD, both builds are measured through it.
  route=/bootstrap
  [ -z "${OLD:-}" ] || route=/bootstrap/control-plane
  for pair in $(seq 1 "${PAIRS:-2}"); do
    for entry in "${bins[@]}"; do
      build=${entry%%:*}
      bin=${entry#*:}
      for store in sqlite postgres; do
        # Every run on a fresh database: each starts its own simulator, whose VM ids start
        # again at 101.
        db_args=()
        fresh_db() {
          if [ "$store" = postgres ]; then
            psql -h 127.0.0.1 -U postgres -q -c "DROP DATABASE IF EXISTS $pg_db" -c "CREATE DATABASE $pg_db"
            db_args=(--database-url "postgres://postgres@127.0.0.1:5432/$pg_db")
          fi
        }
        log "floor, pair $pair: $build on $store"
        # RSA-2048: 16 fetches once its clusters' key pool is full, as VMs booting after a
        # founding find it (the pool's keys were made before the measured window).
        fresh_db
        "$loadgen" --api-bin "$bin" "${db_args[@]}" --floor --bundle-route "$route" \
          --clusters ecdsa-p256=4 --fetches ecdsa-p256=5000 --concurrency 32 \
          --json "$out/floor-$build-$store-ecdsa-$pair.json" | grep -E 'CPU per bundle'
        fresh_db
        "$loadgen" --api-bin "$bin" "${db_args[@]}" --floor --bundle-route "$route" \
          --clusters rsa-2048=1 --fetches rsa-2048=16 --concurrency 4 --allow-clean-errors \
          --json "$out/floor-$build-$store-rsa-$pair.json" | grep -E 'CPU per bundle'
      done
    done
  done
fi

if [ "$what" = levers ]; then
  # bench/issue21-levers.patch adds three switches, read from the environment, to a copy of
  # f3b3a76 (it applies to later commits while the files it touches keep their shape):
  # PROTO_DIGEST_SIG signs PAE(type, hex SHA-256 of the payload) instead of the payload, in the
  # API and in the verifier; PROTO_ONE_KEY makes one fresh leaf key per bundle and uses it for
  # all eleven leaves; PROTO_NO_VERIFY makes the load generator check only the body's length.
  # Each run's machine CPU per bundle comes from /proc/stat (user, nice, system, irq, softirq).
  ensure_postgres
  log "issue 21's design levers: ecdsa-p256, PostgreSQL, c=64, 4 clusters, 10,000 fetches, ${ROUNDS:-3} rounds"
  git worktree remove --force "$out/levers-src" 2>/dev/null || true
  git worktree add --detach "$out/levers-src" HEAD
  git -C "$out/levers-src" apply "$PWD/bench/issue21-levers.patch"
  (cd "$out/levers-src" && cargo build --release --locked -p exk8s-api -p exk8s-loadgen \
    --target-dir ../../levers-target)
  lbin=target/levers-target/release
  busy() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat; }
  ticks=$(getconf CLK_TCK)
  for round in $(seq 1 "${ROUNDS:-3}"); do
    for variant in none sig keys sig+keys client all; do
      case $variant in
        none) switches=() ;;
        sig) switches=(PROTO_DIGEST_SIG=1) ;;
        keys) switches=(PROTO_ONE_KEY=1) ;;
        sig+keys) switches=(PROTO_DIGEST_SIG=1 PROTO_ONE_KEY=1) ;;
        client) switches=(PROTO_NO_VERIFY=1) ;;
        all) switches=(PROTO_DIGEST_SIG=1 PROTO_ONE_KEY=1 PROTO_NO_VERIFY=1) ;;
      esac
      psql -h 127.0.0.1 -U postgres -q -c "DROP DATABASE IF EXISTS exk8s_bench_levers" \
        -c "CREATE DATABASE exk8s_bench_levers"
      before=$(busy)
      result=$(env "${switches[@]}" "$lbin/exk8s-loadgen" --api-bin "$lbin/exk8s-api" \
        --database-url postgres://postgres@127.0.0.1:5432/exk8s_bench_levers \
        --clusters ecdsa-p256=4 --fetches ecdsa-p256=10000 --concurrency 64 | grep -E '^fetch')
      after=$(busy)
      echo "round $round, levers: $variant, machine CPU per bundle $(( (after - before) * 1000000 / ticks / 10000 )) µs"
      echo "  $result"
    done
  done
  git worktree remove --force "$out/levers-src"
fi
