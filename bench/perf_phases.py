#!/usr/bin/env python3
"""Where the API's CPU goes per bundle, by phase, from a `perf record --call-graph dwarf` of
the API process alone (`scripts/bench.sh profile`).

Reads `perf script` output on stdin. Each sample is put in the first phase whose marker is a
frame of its stack (the markers are the issuer's own functions, so the phases follow the code:
minting, rendering, serialising, the certificates' facts, signing), else by its thread (sqlx's
SQLite workers, the key pool), else by what the async worker was doing. A sample whose user
stack could not be unwound counts as "kernel, caller unknown". Prints each phase's share and,
with --ms-per-bundle, its milliseconds per bundle.

With --floor-ms (the floor the load generator timed alone, on one warm thread) it also prints
the floor's own work as this process did it — every sample in the minting, or in SHA-256 or
ed25519 wherever called — against the floor, and the least ratio the process could reach if
every phase but that work, HTTP and the scheduler cost nothing: the bound a ratio target must
clear to be reachable at all.
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


# The floor's calls (loadgen/src/floor.rs): the minting (keys, certificates), the digests and
# the ed25519 signature, wherever the issuer makes them.
FLOOR_MARKERS = ["BundleCerts::mint_from", "KeyPool", "keypool::", "sha2::", "ed25519_dalek", "curve25519_dalek"]
# What any request costs around the handler, however little it did.
TRANSPORT = ("HTTP: hyper, axum, sockets (async)", "tokio scheduling, parking, wakeups")


def is_floor(frames):
    return any(m in frame for frame in frames for m in FLOOR_MARKERS)


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
    parser.add_argument("--floor-ms", type=float, help="the floor per bundle, timed alone")
    args = parser.parse_args()
    if args.floor_ms is not None and args.ms_per_bundle is None:
        sys.exit("perf_phases: --floor-ms needs --ms-per-bundle")
    counts = collections.Counter()
    floor_samples = 0
    for _, frames in samples(sys.stdin):
        counts[phase_of(frames)] += 1
        floor_samples += is_floor(frames)
    total = sum(counts.values())
    if total == 0:
        sys.exit("perf_phases: no samples on stdin")
    print(f"{total} samples of the API process")
    for name, n in counts.most_common():
        share = n / total
        ms = f"  {share * args.ms_per_bundle:5.2f} ms" if args.ms_per_bundle else ""
        print(f"  {share * 100:5.1f} %{ms}  {name}")
    if args.floor_ms:
        per = args.ms_per_bundle / total
        inside = floor_samples * per
        transport = sum(counts[name] for name in TRANSPORT) * per
        print(
            f"the floor's work in this process: {inside:.2f} ms per bundle, "
            f"{inside / args.floor_ms:.2f} x the floor timed alone ({args.floor_ms:.2f} ms)"
        )
        print(f"everything else: {args.ms_per_bundle - inside:.2f} ms, of which HTTP and scheduling {transport:.2f} ms")
        print(
            f"least ratio reachable (everything else but HTTP and scheduling at zero): "
            f"{(inside + transport) / args.floor_ms:.2f}; measured: {args.ms_per_bundle / args.floor_ms:.2f}"
        )


if __name__ == "__main__":
    main()
