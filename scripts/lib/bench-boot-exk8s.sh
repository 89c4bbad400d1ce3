# shellcheck shell=bash
# scripts/bench-boot.sh's exk8s run: `run_exk8s PAIR` founds a cluster through the CLI, asks for
# its pool as soon as the API takes it, watches the milestones, keeps the files kubeadm's run
# takes from it (DIR/exk8s-files) and its first node's phases, and deletes it.
# shellcheck disable=SC2154 # the caller's: out, control_plane, workers, compute, kubeadm, ...

run_exk8s() {
  local pair=$1 name=bench-$1 t0 id vms first netns disk
  log "exk8s $pair: founding $name ($control_plane control-plane $(plural "$control_plane" member), $workers $(plural "$workers" worker))"
  t0=$(now)
  exk8s -o json clusters create "$name" --control-plane "$control_plane" --image 1 \
    --instance-type dev.small --subnet 1 --pod-network flannel >"$out/exk8s-$pair-cluster.json"
  id=$(jq -r '.cluster_id // .id' "$out/exk8s-$pair-cluster.json")
  [[ $id =~ ^[0-9]+$ ]] || { cat "$out/exk8s-$pair-cluster.json" >&2; echo "no cluster id in the answer" >&2; exit 1; }
  # The pool, as soon as the API takes it: it does once the cluster is founded.
  if [ "$workers" -gt 0 ]; then
    until exk8s node-pools create "$name" workers --count "$workers" --image 1 \
      --instance-type dev.small --subnet 1 >/dev/null 2>"$out/exk8s-$pair-pool.err"; do
      grep -q 'not founded' "$out/exk8s-$pair-pool.err" || { cat "$out/exk8s-$pair-pool.err" >&2; exit 1; }
      sleep 0.2
    done
    log "exk8s $pair: pool asked for at $(since "$t0") s"
  fi
  until [ "$(exk8s -o json nodes "$name" | jq length)" = $((control_plane + workers)) ]; do sleep 0.2; done
  mapfile -t vms < <(exk8s -o json nodes "$name" |
    jq -r 'sort_by(.role != "control-plane", .vm_id) | .[].vm_id')
  first=${vms[0]}
  until [ "$(machine "$first" | jq -r '.netns // empty')" != '' ]; do sleep 0.2; done
  netns=$(machine "$first" | jq -r .netns)
  disk=$(machine "$first" | jq -r .disk)
  watch exk8s "$pair" "$t0" "$netns" "$disk/etc/exk8s/kubeconfig/admin.kubeconfig" \
    "$disk/etc/exk8s/pki/etcd-ca.pem" "$disk/etc/exk8s/pki/etcd-healthcheck-client.pem" \
    "$disk/etc/exk8s/pki/etcd-healthcheck-client-key.pem" "${vms[@]}"
  in_machine "$first" journalctl -u exk8s-agent.service -o short-unix --no-pager |
    grep -E 'phase [a-z-]+: ' >"$out/exk8s-$pair-phases.txt" || true
  # What kubeadm's machines take from this run: the same containerd configuration (the
  # registry's mirror, the sandbox image), kernel parameters, and flannel.
  rm -rf "$out/exk8s-files"
  mkdir -p "$out/exk8s-files"
  cp -a "$disk/etc/containerd" "$out/exk8s-files/containerd"
  cp "$disk/etc/sysctl.d/90-exk8s-kubernetes.conf" "$disk/etc/modules-load.d/exk8s-kubernetes.conf" \
    "$disk/etc/exk8s/manifests/flannel.yaml" "$out/exk8s-files/"
  log "exk8s $pair: deleting $name"
  exk8s clusters delete "$name" --yes >/dev/null
  wait_no_vms
}
