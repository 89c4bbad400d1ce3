"""scripts/bench-boot.sh's summary: runs.tsv (flavour, pair, milestone, seconds) as Markdown.

Each milestone's seconds for every exk8s and kubeadm run, their medians, and exk8s ÷ kubeadm
for each pair with the median of those ratios (the figure BENCHMARKS.md reports).

    python3 bench_boot_summary.py RUNS_TSV CONTROL_PLANE WORKERS [MACHINE_CPUS]
"""

import csv
import statistics
import sys

MILESTONES = [
    ("vms-running", "every VM running"),
    ("etcd-quorum", "etcd's quorum"),
    ("apiservers-ready", "every apiserver /readyz"),
    ("nodes-ready", "every Node Ready"),
    ("coredns-available", "CoreDNS available"),
    ("first-pod-running", "a first pod Running"),
]


def main() -> None:
    path, control_plane, workers = sys.argv[1], sys.argv[2], sys.argv[3]
    machine_cpus = sys.argv[4] if len(sys.argv) > 4 else ""
    seen: dict[tuple[str, str, str], float] = {}
    with open(path, newline="", encoding="utf-8") as f:
        for flavour, pair, milestone, seconds in csv.reader(f, delimiter="\t"):
            seen[(flavour, pair, milestone)] = float(seconds)
    pairs = sorted({p for (_, p, _) in seen}, key=int)
    members = "member" if control_plane == "1" else "members"
    workers_word = "worker" if workers == "1" else "workers"
    print(f"# Boot: {control_plane} control-plane {members} and {workers} {workers_word}, exk8s and kubeadm\n")
    print("Seconds from asking; each pair ran exk8s, then kubeadm, on the same machines.\n")
    if machine_cpus:
        print(f"Every machine capped at {machine_cpus} cores (`--machine-cpus`).\n")
    print("| milestone | exk8s | kubeadm | exk8s ÷ kubeadm per pair | median ratio |")
    print("|---|---|---|---|---|")
    for key, label in MILESTONES:
        ours = [seen[("exk8s", p, key)] for p in pairs if ("exk8s", p, key) in seen]
        theirs = [seen[("kubeadm", p, key)] for p in pairs if ("kubeadm", p, key) in seen]
        ratios = [
            seen[("exk8s", p, key)] / seen[("kubeadm", p, key)]
            for p in pairs
            if ("exk8s", p, key) in seen and seen.get(("kubeadm", p, key), 0) > 0
        ]

        def cell(values: list[float]) -> str:
            if not values:
                return "not reached"
            runs = ", ".join(f"{v:.1f}" for v in values)
            return f"{runs} (median {statistics.median(values):.1f})"

        per_pair = ", ".join(f"{r:.2f}" for r in ratios) or "—"
        median = f"**{statistics.median(ratios):.2f}**" if ratios else "—"
        print(f"| {label} | {cell(ours)} | {cell(theirs)} | {per_pair} | {median} |")


if __name__ == "__main__":
    main()
