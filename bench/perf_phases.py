#!/usr/bin/env python3
"""Where the API's CPU goes per bundle, by phase, from a `perf record --call-graph dwarf` of
the API process alone (`scripts/bench.sh profile`).

Reads `perf script` output on stdin. Each sample is put in the first phase whose marker is a
frame of its stack (the markers are the issuer's own functions, so the phases follow the code:
minting, rendering, serialising, the certificates' facts, signing), else by its thread (sqlx's
SQLite workers, the key pool), else by what the async worker was doing. A sample whose user
stack could not be unwound counts as "kernel, caller unknown". Prints each phase's share and,
with --ms-per-bundle, its milliseconds per bundle.
"""

import argparse
import collections
import sys

# (phase, markers): the first phase with a marker in the stack takes the sample.
BY_FRAME = [
    ("minting: keys and certificates (the floor's)", ["BundleCerts::mint_from", "KeyPool", "keypool::"]),
    ("signing the envelope (the floor's ed25519, base64)", ["sign_to_json"]),
    ("rendering files, manifests, plan", ["render::render_bundle", "render::render_worker_bundle"]),
    ("serialising the payload body", ["PayloadBody::of", "PayloadBody::finish"]),
    ("reading the certificates' facts", ["pki::facts::facts"]),
    ("SQLite engine and its I/O (sqlx worker threads)", ["sqlx_sqlite::connection::worker"]),
    ("sqlx client side and pool (async)", ["sqlx_core::", "sqlx_sqlite::", "sqlx::"]),
    # Before HTTP: the handler runs inside hyper's dispatcher.
    ("issuance handler, auth, loading (async)", ["exk8s_api::"]),
    ("HTTP: hyper, axum, sockets (async)", ["hyper::proto", "hyper_util", "axum::serve", "tokio::net"]),
    ("tokio scheduling, parking, wakeups", ["tokio::runtime"]),
]


def phase_of(frames):
    for name, markers in BY_FRAME:
        for frame in frames:
            if any(m in frame for m in markers):
                return name
    if frames and all(f.endswith("([kernel.kallsyms])") for f in frames):
        return "kernel, caller unknown"
    return "other"


def samples(lines):
    frames, header = [], None
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            if header is not None:
                yield header, frames
            frames, header = [], None
        elif not line.startswith((" ", "\t")):
            header = line
        else:
            frames.append(line.strip())
    if header is not None:
        yield header, frames


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms-per-bundle", type=float, help="the API's CPU per bundle, measured")
    args = parser.parse_args()
    counts = collections.Counter(phase_of(frames) for _, frames in samples(sys.stdin))
    total = sum(counts.values())
    if total == 0:
        sys.exit("perf_phases: no samples on stdin")
    print(f"{total} samples of the API process")
    for name, n in counts.most_common():
        share = n / total
        ms = f"  {share * args.ms_per_bundle:5.2f} ms" if args.ms_per_bundle else ""
        print(f"  {share * 100:5.1f} %{ms}  {name}")


if __name__ == "__main__":
    main()
