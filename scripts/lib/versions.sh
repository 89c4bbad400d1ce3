# shellcheck shell=bash
# The releases a node runs by default, as the renderer pins them (api/src/render/input.rs) and
# tests/src/bins.rs names them: sourced by the scripts that build, serve and test them.
# shellcheck disable=SC2034
k8s_version=v1.35.3
etcd_version=v3.6.10
helm_version=v3.19.2
coredns_version=v1.12.1
flannel_version=v0.28.4
# The sandbox image containerd runs (pause).
pause_version=3.10
# The tags Kubernetes' end-to-end suite names for pause and busybox (e2e.test --list-images).
pause_e2e_version=3.10.1
busybox_e2e_version=1.37.0-1
# The next minor's release, which the upgrade tests go to.
k8s_next=v1.36.3
etcd_next=v3.6.14
# The previous release of exk8s itself, as a commit of this repository (a commit id survives
# where a tag may not): its exk8s-api and exk8s-agent run beside this one's in
# tests/tests/skew.rs (scripts/previous-release.sh builds them). The first commit with the
# migration policy (docs/upgrading-exk8s.md, "Migrations"); its agent predates the announcement
# of the formats it reads.
previous_release=793705ceb4547d47aa652c04dfa312c1435f73d0
# Cluster API, whose core controller and CRDs drive exk8s-capi in tests/tests/capi/
# (scripts/capi-binaries.sh builds them): its k8s.io modules are the next minor's (v0.36).
cluster_api_version=v1.14.2
