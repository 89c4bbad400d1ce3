# shellcheck shell=bash
# Build-once caches shared by the scripts that fill /var/cache/exk8s (k8s-binaries.sh,
# node-registry.sh). The caller defines `log MESSAGE`.

# with_lock DIR FUNCTION: runs `FUNCTION DIR` once per DIR (made empty first), under an
# exclusive lock on DIR.lock, unless DIR/.done says an earlier run finished; safe when several
# callers ask at once.
with_lock() {
  local dir=$1 fn=$2 fd
  exec {fd}>"$dir.lock"
  flock "$fd"
  if [ -f "$dir/.done" ]; then
    log "$(basename "$dir"): cached in $dir"
  else
    rm -rf "$dir"
    mkdir -p "$dir"
    local started=$SECONDS
    "$fn" "$dir"
    touch "$dir/.done"
    log "$(basename "$dir"): made in $((SECONDS - started)) s in $dir"
  fi
  flock -u "$fd"
  exec {fd}>&-
}
