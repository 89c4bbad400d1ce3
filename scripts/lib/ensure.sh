# shellcheck shell=bash
# Helpers for scripts/*.sh: install what is missing, idempotently, on a Debian machine.
# Sourced, not run.

log() { printf '\n==> %s\n' "$*" >&2; }

have() { command -v "$1" >/dev/null 2>&1; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif have sudo; then sudo "$@"; else
    echo "need root (or sudo) to run: $*" >&2
    return 1
  fi
}

_apt_updated=0
# ensure_packages CMD:PACKAGE ... — installs PACKAGE when CMD is not on PATH.
ensure_packages() {
  local missing=() spec cmd pkg
  for spec in "$@"; do
    cmd=${spec%%:*}
    pkg=${spec#*:}
    if ! have "$cmd"; then missing+=("$pkg"); fi
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing Debian packages: ${missing[*]}"
  if [ "$_apt_updated" -eq 0 ]; then
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    _apt_updated=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# ensure_rust_components — rustfmt and clippy for the active toolchain.
ensure_rust_components() {
  if ! have cargo; then
    echo "cargo is not installed; install Rust with rustup first" >&2
    return 1
  fi
  local component
  for component in rustfmt clippy; do
    if ! rustup component list --installed 2>/dev/null | grep -q "^${component}"; then
      log "installing rust component ${component}"
      rustup component add "${component}"
    fi
  done
}

# ensure_venv_tool PYPI_PACKAGE COMMAND — installs a Python tool into the repository's .venv.
ensure_venv_tool() {
  local package=$1 command=$2
  if [ ! -x .venv/bin/python ]; then
    log "creating .venv for Python validators"
    python3 -m venv .venv || {
      ensure_packages python3-venv:python3-venv
      python3 -m venv .venv
    }
  fi
  if [ ! -x ".venv/bin/${command}" ]; then
    log "installing ${package} into .venv"
    .venv/bin/python -m pip install --quiet --disable-pip-version-check "${package}"
  fi
}
