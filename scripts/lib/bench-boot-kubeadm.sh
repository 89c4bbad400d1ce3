# shellcheck shell=bash
# scripts/bench-boot.sh's kubeadm run: `run_kubeadm PAIR` asks the compute API for the machines,
# prepares each as kubeadm's documentation says, runs `kubeadm init` behind an HAProxy and the
# joins, watches the milestones (beside the steps), and deletes the machines.
# shellcheck disable=SC2154 # the caller's: out, control_plane, workers, compute, kubeadm, ...

# kubeadm's kubelet unit and its drop-in, as Kubernetes' own packages install them (the
# drop-in's variables are systemd's, not the shell's).
kubeadm_kubelet_unit='[Unit]
Description=kubelet: The Kubernetes Node Agent
Documentation=https://kubernetes.io/docs/
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=/usr/bin/kubelet
Restart=always
StartLimitInterval=0
RestartSec=10

[Install]
WantedBy=multi-user.target
'
# shellcheck disable=SC2016
kubeadm_kubelet_dropin='[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
EnvironmentFile=-/etc/default/kubelet
ExecStart=
ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
'

# The preflight checks these machines fail for what they are, not for what kubeadm is asked:
# SystemVerification reads the kernel's configuration and modules, which a container of the
# host's kernel has not (/proc/config.gz, /lib/modules); every other check runs.
kubeadm_ignored=SystemVerification

# step PAIR T0 NAME COMMAND...: COMMAND, its end time noted in DIR/kubeadm-PAIR-steps.txt.
step() {
  local pair=$1 t0=$2 name=$3
  shift 3
  if ! "$@" >>"$out/kubeadm-$pair.log" 2>&1; then
    tail -n 40 "$out/kubeadm-$pair.log" >&2
    echo "kubeadm $pair: $name failed (its log: $out/kubeadm-$pair.log)" >&2
    # The watcher stops at this.
    touch "$out/kubeadm-$pair.failed"
    return 1
  fi
  printf '%s\t%s\n' "$name" "$(since "$t0")" >>"$out/kubeadm-$pair-steps.txt"
}

# kubeadm_prepare VM: what every machine needs before kubeadm: booted, the agent masked, the
# packages exk8s's agent installs, the same containerd configuration and kernel parameters as the
# exk8s run's, the kubelet, kubeadm and kubectl with kubeadm's kubelet unit.
kubeadm_prepare() {
  local vm=$1 disk files=$out/exk8s-files
  until [ -n "$(machine "$vm" | jq -r '.init_pid // empty')" ]; do sleep 0.2; done
  in_machine "$vm" systemctl is-system-running --wait >/dev/null || true
  in_machine "$vm" systemctl mask --now exk8s-agent.service exk8s-agent-sync.timer
  in_machine "$vm" sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    --no-install-recommends ca-certificates conntrack containerd containernetworking-plugins ebtables \
    ethtool iproute2 iptables socat'
  disk=$(machine "$vm" | jq -r .disk)
  cp -a "$files/containerd/." "$disk/etc/containerd/"
  cp "$files/90-exk8s-kubernetes.conf" "$disk/etc/sysctl.d/"
  cp "$files/exk8s-kubernetes.conf" "$disk/etc/modules-load.d/"
  install -m 0755 "$EXK8S_K8S_BIN/kubelet" "$EXK8S_K8S_BIN/kubectl" "$kubeadm" "$disk/usr/bin/"
  mkdir -p "$disk/etc/systemd/system/kubelet.service.d"
  printf '%s' "$kubeadm_kubelet_unit" >"$disk/etc/systemd/system/kubelet.service"
  printf '%s' "$kubeadm_kubelet_dropin" >"$disk/etc/systemd/system/kubelet.service.d/10-kubeadm.conf"
  # (kubeadm's documentation runs `sysctl --system`; a machine here may not write the kernel's
  # own keys Debian's files set, fs.protected_* and kernel.pid_max: only the node's file.)
  in_machine "$vm" sh -c 'sysctl -q -p /etc/sysctl.d/90-exk8s-kubernetes.conf && systemctl restart containerd &&
    systemctl daemon-reload && systemctl enable kubelet'
}

# kubeadm_config VM KIND: kubeadm's configuration for VM (`init`, `control-plane` or `worker`).
kubeadm_config() {
  local vm=$1 kind=$2 ip registration
  ip=$(curl -fsS "$compute/v1/vms/$vm" | jq -r .private_ipv4)
  registration="nodeRegistration:
  criSocket: unix:///run/containerd/containerd.sock
  kubeletExtraArgs:
  - name: config-dir
    value: /etc/kubernetes/kubelet.conf.d"
  case $kind in
    init)
      cat <<YAML
apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
bootstrapTokens:
- token: $kubeadm_token
  ttl: 1h0m0s
certificateKey: $kubeadm_key
localAPIEndpoint:
  advertiseAddress: $ip
  bindPort: 6443
$registration
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: $k8s_version
controlPlaneEndpoint: $kubeadm_endpoint
networking:
  podSubnet: $kubeadm_pod_cidr
dns:
  imageRepository: registry.k8s.io/coredns
  imageTag: $coredns_version
---
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
failCgroupV1: false
---
# A machine here may not write nf_conntrack_max (only the initial network namespace may), as
# kind's nodes may not: kube-proxy leaves the table's size alone, as exk8s's does.
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
conntrack:
  maxPerCore: 0
YAML
      ;;
    control-plane | worker)
      cat <<YAML
apiVersion: kubeadm.k8s.io/v1beta4
kind: JoinConfiguration
discovery:
  bootstrapToken:
    apiServerEndpoint: $kubeadm_endpoint
    token: $kubeadm_token
    caCertHashes:
    - $kubeadm_ca_hash
$registration
YAML
      [ "$kind" = worker ] || cat <<YAML
controlPlane:
  certificateKey: $kubeadm_key
  localAPIEndpoint:
    advertiseAddress: $ip
    bindPort: 6443
YAML
      ;;
  esac
}

# kubeadm_run VM KIND: kubeadm init or join on VM with its configuration.
kubeadm_run() {
  local vm=$1 kind=$2 disk verb=join
  disk=$(machine "$vm" | jq -r .disk)
  kubeadm_config "$vm" "$kind" >"$disk/root/kubeadm.yaml"
  [ "$kind" != init ] || verb=init
  local extra=()
  [ "$kind" != init ] || extra=(--upload-certs)
  in_machine "$vm" kubeadm "$verb" --config /root/kubeadm.yaml \
    --ignore-preflight-errors="$kubeadm_ignored" "${extra[@]}"
}

# kubeadm_balancer NETNS ADDRESS IPS...: HAProxy in the machines' LAN on ADDRESS:6443, every
# control-plane machine behind it (what kubeadm's documentation asks of a highly available
# control plane); its pid in `balancer`.
kubeadm_balancer() {
  local netns=$1 address=$2 i=0 ip
  shift 2
  {
    printf 'global\n  maxconn 4096\ndefaults\n  mode tcp\n  timeout connect 2s\n  timeout client 1h\n  timeout server 1h\n'
    printf 'frontend apiservers\n  bind %s:6443\n  default_backend apiservers\nbackend apiservers\n  option tcp-check\n' "$address"
    for ip in "$@"; do
      i=$((i + 1))
      printf '  server member-%s %s:6443 check inter 1s fall 1 rise 1\n' "$i" "$ip"
    done
  } >"$out/kubeadm-haproxy.cfg"
  nsenter --net="/run/netns/$netns" -- haproxy -f "$out/kubeadm-haproxy.cfg" -db >>"$out/kubeadm-haproxy.log" 2>&1 &
  balancer=$!
}

run_kubeadm() {
  local pair=$1 t0 vms=() ips=() i total=$((control_plane + workers)) lan cidr gateway first disk
  [ -f "$out/exk8s-files/flannel.yaml" ] || { echo "kubeadm's run takes the exk8s run's files: none in $out/exk8s-files" >&2; exit 1; }
  : >"$out/kubeadm-$pair.log"
  rm -f "$out/kubeadm-$pair.failed"
  : >"$out/kubeadm-$pair-steps.txt"
  kubeadm_token=$(printf 'b%05d.%016d' "$pair" "$RANDOM$RANDOM" | cut -c1-23)
  kubeadm_key=$("$kubeadm" certs certificate-key)
  # The pod network flannel is told (its ConfigMap's net-conf.json), which kubeadm's must match.
  kubeadm_pod_cidr=$(/usr/bin/python3 -c 'import json, sys, yaml
for doc in yaml.safe_load_all(open(sys.argv[1])):
    if doc and doc.get("kind") == "ConfigMap" and "net-conf.json" in doc.get("data", {}):
        print(json.loads(doc["data"]["net-conf.json"])["Network"])' "$out/exk8s-files/flannel.yaml")
  [ -n "$kubeadm_pod_cidr" ] || { echo "no pod network in exk8s's flannel.yaml" >&2; exit 1; }
  # exk8s's flannel reaches the apiservers through the node's own balancer (127.0.0.1:7445)
  # before kube-proxy runs; kubeadm's nodes have none: flannel as upstream ships it, through the
  # `kubernetes` Service.
  /usr/bin/python3 -c 'import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
for d in docs:
    if d.get("kind") == "DaemonSet":
        for c in d["spec"]["template"]["spec"].get("containers", []):
            c["env"] = [e for e in c.get("env", []) if not e["name"].startswith("KUBERNETES_SERVICE_")]
yaml.safe_dump_all(docs, sys.stdout)' "$out/exk8s-files/flannel.yaml" >"$out/kubeadm-flannel.yaml"
  cidr=$(curl -fsS "$compute/v1/subnets/1" | jq -r .cidr)
  gateway=${cidr%.*/*}.1
  kubeadm_endpoint=$gateway:6443
  log "kubeadm $pair: $control_plane control-plane $(plural "$control_plane" machine) and $workers $(plural "$workers" worker), through the compute API"
  t0=$(now)
  for i in $(seq 1 "$total"); do
    vms+=("$(curl -fsS -X POST "$compute/v1/vms" -H 'content-type: application/json' -d "$(jq -n \
      --arg name "kubeadm-$pair-$i" --arg token "bench-kubeadm-$pair-$i-$RANDOM" --arg pair "$pair" \
      '{name: $name, image_id: 1, instance_type: "dev.small", zone_id: 1, subnet_id: 1,
        security_group_ids: [], allocate_public_ipv4: false, ssh_pubkey: null,
        root_volume_size_gib: 20, userdata: "", tags: {bench: ("kubeadm-" + $pair)},
        client_token: $token}')" | jq -r .id)")
  done
  for i in "${vms[@]:0:$control_plane}"; do
    ips+=("$(curl -fsS "$compute/v1/vms/$i" | jq -r .private_ipv4)")
  done
  first=${vms[0]}
  until [ -n "$(machine "$first" | jq -r '.init_pid // empty')" ]; do sleep 0.2; done
  lan=$(machine "$first" | jq -r .netns)
  lan=${lan%-vm*}-lan
  kubeadm_balancer "$lan" "$gateway" "${ips[@]}"
  disk=$(machine "$first" | jq -r .disk)
  {
    local pids=() vm
    for vm in "${vms[@]}"; do
      step "$pair" "$t0" "prepared $vm" kubeadm_prepare "$vm" &
      pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i"; done
    step "$pair" "$t0" "kubeadm init" kubeadm_run "$first" init
    kubeadm_ca_hash=sha256:$(openssl x509 -pubkey -in "$disk/etc/kubernetes/pki/ca.crt" |
      openssl pkey -pubin -outform der | sha256sum | cut -d' ' -f1)
    step "$pair" "$t0" "flannel applied" in_machine "$first" kubectl --kubeconfig /etc/kubernetes/admin.conf \
      apply -f - <"$out/kubeadm-flannel.yaml"
    local workers_pids=()
    for vm in "${vms[@]:$control_plane}"; do
      step "$pair" "$t0" "joined $vm (worker)" kubeadm_run "$vm" worker &
      workers_pids+=($!)
    done
    for vm in "${vms[@]:1:$((control_plane - 1))}"; do
      step "$pair" "$t0" "joined $vm (control plane)" kubeadm_run "$vm" control-plane
    done
    for i in "${workers_pids[@]}"; do wait "$i"; done
  } &
  local steps=$!
  watch kubeadm "$pair" "$t0" "$(machine "$first" | jq -r .netns)" "$disk/etc/kubernetes/admin.conf" \
    "$disk/etc/kubernetes/pki/etcd/ca.crt" "$disk/etc/kubernetes/pki/etcd/healthcheck-client.crt" \
    "$disk/etc/kubernetes/pki/etcd/healthcheck-client.key" "${vms[@]}" || true
  wait "$steps" || { echo "kubeadm $pair: a step failed (above)" >&2; exit 1; }
  log "kubeadm $pair: deleting its machines"
  kill "$balancer" 2>/dev/null || true
  balancer=''
  for i in "${vms[@]}"; do curl -fsS -X DELETE "$compute/v1/vms/$i" >/dev/null; done
  wait_no_vms
}
