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
