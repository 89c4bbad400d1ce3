#!/usr/bin/env bash
# Runs every cargo-fuzz target for SECONDS each (default 60), then a longer schemathesis pass.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# The seed corpus in fuzz/corpus/<target>/ is read, never written: new inputs go to
# target/fuzz-corpus/<target>/. A crash is copied to fuzz/regressions/<target>/ — commit it with
# the fix; `cargo test -p exk8s-fuzz` replays it from then on — and the script fails.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/ensure.sh
source scripts/lib/ensure.sh

seconds=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(envelope payload bundle_path create_cluster_body)
fi

if ! rustup toolchain list | grep -q '^nightly'; then
  log "installing the nightly toolchain (cargo-fuzz needs -Zsanitizer)"
  rustup toolchain install nightly --profile minimal
fi
if ! have cargo-fuzz; then
  log "installing cargo-fuzz"
  cargo install --locked cargo-fuzz
fi

# The workspace's release profile strips symbols and runs thin LTO: fine for shipped binaries,
# wrong for fuzzing (crash traces need symbols; LTO over instrumented code takes minutes per
# target). Override both for these builds only.
export CARGO_PROFILE_RELEASE_STRIP=none CARGO_PROFILE_RELEASE_LTO=false

log "building the fuzz targets (nightly, AddressSanitizer)"
cargo +nightly fuzz build --features fuzz

failed=()
for target in "${targets[@]}"; do
  work="target/fuzz-corpus/$target"
  mkdir -p "$work" "fuzz/regressions/$target"
  log "fuzzing $target for ${seconds}s"
  before=$(find "fuzz/artifacts/$target" -type f 2>/dev/null | sort || true)
  if ! cargo +nightly fuzz run --features fuzz "$target" "$work" "fuzz/corpus/$target" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1; then
    failed+=("$target")
  fi
  after=$(find "fuzz/artifacts/$target" -type f 2>/dev/null | sort || true)
  for crash in $(comm -13 <(echo "$before") <(echo "$after")); do
    cp "$crash" "fuzz/regressions/$target/"
    echo "saved $crash as fuzz/regressions/$target/$(basename "$crash")" >&2
  done
done

log "schemathesis, longer, random seed"
bash scripts/api-fuzz.sh "${EXK8S_FUZZ_API_EXAMPLES:-100}" || failed+=(schemathesis)

if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzzing found problems in: ${failed[*]}" >&2
  exit 1
fi
log "every target ran ${seconds}s without a crash"
