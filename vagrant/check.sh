#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The pod-to-pod matrix of `meshctl lab check`, on the VMs: one test pod per node, every pod pings
# every other, and the path is read from counters: the source node's kilo0 TX rising means
# "tunnel"; otherwise "direct" inside a location and "via-leader" across locations (the packets
# went over the private network to the location's leader). Prints one JSON line per pair
# ({"src","dst","ok","path","rtt_ms"}) and exits 1 if any pair failed.
set -euo pipefail
export KUBECONFIG=/etc/rancher/k3s/k3s.yaml
kubectl() { k3s kubectl "$@"; }
IMAGE=${MESHCTL_CHECK_IMAGE:-busybox:1.36}
COUNT=${MESHCTL_CHECK_COUNT:-3}

kubectl apply -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: meshctl-check, namespace: default}
spec:
  selector: {matchLabels: {app: meshctl-check}}
  template:
    metadata: {labels: {app: meshctl-check}}
    spec:
      tolerations: [{operator: Exists}]
      terminationGracePeriodSeconds: 1
      containers: [{name: c, image: $IMAGE, command: [sleep, "86400"]}]
YAML
kubectl rollout status daemonset/meshctl-check --timeout=180s >/dev/null

# node -> (test pod, pod IP, location, agent pod)
declare -A POD IP LOC AGENT
while read -r pod node ip; do POD[$node]=$pod; IP[$node]=$ip; done < <(
  kubectl get pods -l app=meshctl-check -o jsonpath='{range .items[*]}{.metadata.name} {.spec.nodeName} {.status.podIP}{"\n"}{end}')
while read -r node loc; do LOC[$node]=$loc; done < <(
  kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.labels.topology\.kubernetes\.io/region}{"\n"}{end}')
while read -r pod node; do AGENT[$node]=$pod; done < <(
  kubectl -n meshctl get pods -l app.kubernetes.io/name=meshctl -o jsonpath='{range .items[*]}{.metadata.name} {.spec.nodeName}{"\n"}{end}')

tx() { kubectl -n meshctl exec "${AGENT[$1]}" -c agent -- cat /sys/class/net/kilo0/statistics/tx_packets 2>/dev/null || echo 0; }

failed=0
for src in $(printf '%s\n' "${!POD[@]}" | sort); do
  for dst in $(printf '%s\n' "${!POD[@]}" | sort); do
    [ "$src" = "$dst" ] && continue
    before=$(tx "$src")
    out=$(kubectl exec "${POD[$src]}" -- ping -c "$COUNT" -W 2 "${IP[$dst]}" 2>&1 || true)
    after=$(tx "$src")
    rtt=$(sed -n 's#.*= [0-9.]*/\([0-9.]*\)/.*#\1#p' <<<"$out")
    ok=false; [ -n "$rtt" ] && ok=true || failed=1
    if [ $((after - before)) -ge "$COUNT" ]; then path=tunnel
    elif [ "${LOC[$src]}" = "${LOC[$dst]}" ]; then path=direct
    else path=via-leader; fi
    printf '{"src": "%s", "dst": "%s", "ok": %s, "path": "%s", "rtt_ms": %s}\n' \
      "$src" "$dst" "$ok" "$path" "${rtt:-null}"
  done
done
exit $failed
