#!/usr/bin/env bash
# cni-dra demo (what `make demo` runs after `make install`).
#
# Two veth pairs stand in for the node's NICs eth-a and eth-b (10G each, shared by
# bandwidth as KEP-5075 consumable capacity). Pods are network namespaces; every
# ADD/DEL goes through the installed /opt/cni/bin/cni-dra exactly as a container
# runtime calls it: CNI_* variables in the environment, the config on stdin, the
# result (or error) JSON on stdout.
#
#   pod1 asks 4G  -> eth-a (both empty: tie broken by name)
#   pod2 asks 3G  -> eth-a under best-fit (least-allocated would pick eth-b: shown
#                    on a scratch copy of the state)
#   pod3 asks 10G -> eth-b
#   pod4 asks 8G  -> refused: CNI error naming the request and what each NIC has left
#   pod3 deleted; pod5 has a prepared ResourceClaim allocated on eth-b (6G, shareID)
#                 -> claim mode: its macvlan lands on eth-b, status shows the shareID
#   all pods deleted -> capacity back to 0 consumed; everything made is removed.
#
# Refuses to start if any link or netns it would create already exists; cleans up
# on any exit, including Ctrl-C. `ip` is used only to create/delete the demo's
# namespaces and veths and to show links to you; checks read `cni-dra status --json`.
set -euo pipefail

CNI_DRA=${CNI_DRA_EXE:-/opt/cni/bin/cni-dra}
CNI_PATH=${CNI_PATH:-/opt/cni/bin}
PY=/usr/bin/python3
NICS=(eth-a eth-b)
LINKS=(eth-a eth-a-peer eth-b eth-b-peer)
PODS=(pod1 pod2 pod3 pod4 pod5)
NS_PREFIX=cni-dra-demo
SCRATCH_NS=$NS_PREFIX-scratch
SUBNET=192.0.2.0/24 # TEST-NET-1: documentation addresses, never routed
DRIVER=net.cni-dra.dev
POOL=demo-node

if [[ -t 1 ]]; then B=$'\e[1m' G=$'\e[32m' R=$'\e[31m' D=$'\e[2m' N=$'\e[0m'; else B='' G='' R='' D='' N=''; fi
step() { printf '\n%s== %s ==%s\n' "$B" "$*" "$N"; }
info() { printf '   %s\n' "$*"; }
ok() { printf '   %s✓ %s%s\n' "$G" "$*" "$N"; }
die() { printf '%sdemo: %s%s\n' "$R" "$*" "$N" >&2; exit 1; }

pod_uid() { # stable, readable pod UIDs: pod3 -> 00000000-0000-4000-8000-000000000003
    printf '00000000-0000-4000-8000-%012d' "${1#pod}"
}
netns_path() { printf '/var/run/netns/%s-%s' "$NS_PREFIX" "$1"; }

# ---------------------------------------------------------------------------
# Preconditions: root, the installed plugin, and none of our names in use.
[[ $(id -u) -eq 0 ]] || die "run as root (it creates network namespaces and links)"
[[ -x $CNI_DRA ]] || die "$CNI_DRA not found: run 'make install' first"
[[ -x $CNI_PATH/host-local ]] || die "$CNI_PATH/host-local not found: run 'make install' first"

taken=()
for l in "${LINKS[@]}"; do [[ -e /sys/class/net/$l ]] && taken+=("link $l"); done
for p in "${PODS[@]}" scratch; do
    [[ -e /var/run/netns/$NS_PREFIX-$p ]] && taken+=("netns $NS_PREFIX-$p")
done
if ((${#taken[@]})); then
    die "refusing to start: already exists: ${taken[*]} (remove them, or let a previous demo finish)"
fi

# ---------------------------------------------------------------------------
# Cleanup: only what this run made, whatever way it ends.
TMP=
MADE_NETNS=()
MADE_LINKS=()
ADDED=() # "pod" entries currently ADDed (real state)
cleanup() {
    local rc=$? p
    trap - EXIT INT TERM
    set +e
    if ((${#ADDED[@]})); then
        printf '\n%scleanup: DEL %s%s\n' "$D" "${ADDED[*]}" "$N"
        for p in "${ADDED[@]}"; do cni DEL "$p" "$(netconf 1G best-fit)" >/dev/null 2>&1; done
    fi
    for p in "${MADE_NETNS[@]}"; do ip netns del "$p" 2>/dev/null; done
    for p in "${MADE_LINKS[@]}"; do ip link del "$p" 2>/dev/null; done
    [[ -n $TMP ]] && rm -rf "$TMP"
    if ((rc == 0)); then
        printf '\n%scleanup: removed all demo namespaces, links and files%s\n' "$D" "$N"
    else
        printf '\n%sdemo stopped (exit %d); removed all demo namespaces, links and files%s\n' "$R" "$rc" "$N" >&2
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

TMP=$(mktemp -d /tmp/cni-dra-demo.XXXXXX)
STATE_DIR=$TMP/state
INVENTORY=$TMP/resourceslice.yaml
IPAM_DIR=$TMP/ipam

# ---------------------------------------------------------------------------
# Helpers.

# netconf BANDWIDTH POLICY [STATE_DIR [IPAM_DIR]] -> the plugin config (JSON) on stdout.
# BANDWIDTH "-" leaves out capacity (claim mode takes the amount from the claim).
netconf() {
    local capacity=
    [[ $1 != - ]] && capacity="\"capacity\": {\"requests\": {\"bandwidth\": \"$1\"}},"
    cat <<EOF
{
  "cniVersion": "1.1.0",
  "name": "cni-dra-demo",
  "type": "cni-dra",
  "driver": "$DRIVER",
  "stateDir": "${3:-$STATE_DIR}",
  "inventory": "$INVENTORY",
  "linkType": "macvlan",
  "mode": "bridge",
  $capacity
  "selectionPolicy": "$2",
  "ipam": {"type": "host-local", "ranges": [[{"subnet": "$SUBNET"}]], "dataDir": "${4:-$IPAM_DIR}"}
}
EOF
}

# cni COMMAND POD CONFIG [NETNS_PATH]: run the plugin as a runtime does; its stdout
# is ours, its exit code is returned.
cni() {
    local pod=$2 ns=${4:-$(netns_path "$2")}
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
        CNI_COMMAND="$1" CNI_CONTAINERID="ctr-$pod" CNI_NETNS="$ns" CNI_IFNAME=net1 \
        CNI_PATH="$CNI_PATH" CNI_DRA_LOG_FILE="$TMP/plugin.log" \
        CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=demo;K8S_POD_NAME=$pod;K8S_POD_INFRA_CONTAINER_ID=ctr-$pod;K8S_POD_UID=$(pod_uid "$pod")" \
        "$CNI_DRA" <<<"$3"
}

status_json() { "$CNI_DRA" status --state-dir "${1:-$STATE_DIR}" --inventory "$INVENTORY" --json; }

# device_of POD [STATE_DIR]: the NIC (device name) of POD's attachment per status.
device_of() {
    status_json "${2:-}" | "$PY" -c '
import json, sys
cid = sys.argv[1]
for a in json.load(sys.stdin)["attachments"]:
    if a["containerID"] == cid:
        print(a["device"]); break
' "ctr-$1"
}

# remaining: "eth-a 6G, eth-b 10G" (consumed / remaining per NIC) from status.
capacity_line() {
    status_json | "$PY" -c '
import json, sys
print(", ".join(
    "%s: consumed %s, remaining %s" % (d["name"], d["consumed"].get("bandwidth", "0"), d["remaining"].get("bandwidth", "0"))
    for d in json.load(sys.stdin)["devices"]))'
}

first_ip() { "$PY" -c 'import json,sys; r=json.load(sys.stdin); print(", ".join(i["address"] for i in r.get("ips", [])) or "(none)")'; }
# show_json TEXT: indented if it is JSON, as is otherwise.
show_json() { "$PY" -m json.tool <<<"$1" 2>/dev/null || printf '%s\n' "$1"; }

make_pod_netns() {
    ip netns add "$NS_PREFIX-$1"
    MADE_NETNS+=("$NS_PREFIX-$1")
}

# add POD BANDWIDTH POLICY EXPECTED_NIC
add() {
    local pod=$1 bw=$2 policy=$3 want=$4 out rc dev
    if [[ $bw == - ]]; then
        step "$pod: ADD with a prepared claim (no bandwidth in the config)"
    else
        step "$pod: ADD asking bandwidth $bw, selectionPolicy $policy"
    fi
    make_pod_netns "$pod"
    out=$(cni ADD "$pod" "$(netconf "$bw" "$policy")") && rc=0 || rc=$?
    if ((rc != 0)); then
        show_json "$out" | sed 's/^/   /'
        die "$pod: ADD failed with exit $rc"
    fi
    ADDED+=("$pod")
    dev=$(device_of "$pod")
    info "CNI result: $(printf '%s' "$out" | "$PY" -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))')"
    info "IP: $(printf '%s' "$out" | first_ip)"
    info "link in the pod: $(ip -n "$NS_PREFIX-$pod" -br link show net1)"
    info "($want on the host is if$(cat "/sys/class/net/$want/ifindex"))"
    [[ $dev == "$want" ]] || die "$pod landed on '$dev', expected $want"
    ok "$pod -> $dev   ($(capacity_line))"
}

del() {
    local pod=$1 out rc
    step "$pod: DEL"
    out=$(cni DEL "$pod" "$(netconf 1G best-fit)") && rc=0 || rc=$?
    ((rc == 0)) || die "$pod: DEL failed with exit $rc: $out"
    local kept=()
    for p in "${ADDED[@]}"; do [[ $p != "$pod" ]] && kept+=("$p"); done
    ADDED=("${kept[@]+"${kept[@]}"}")
    ok "deleted   ($(capacity_line))"
}

# ---------------------------------------------------------------------------
step "setup: two veth pairs stand in for NICs ${NICS[*]}; inventory, state and IPAM in $TMP"
for nic in "${NICS[@]}"; do
    ip link add "$nic" type veth peer name "$nic-peer"
    MADE_LINKS+=("$nic")
    ip link set "$nic" up
    ip link set "$nic-peer" up
done
mkdir -p "$STATE_DIR" "$IPAM_DIR"

cat >"$INVENTORY" <<EOF
# The node's NICs as DRA devices (resource.k8s.io/v1 ResourceSlice).
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata:
  name: $POOL-$DRIVER
spec:
  driver: $DRIVER
  nodeName: $POOL
  pool: {name: $POOL, generation: 1, resourceSliceCount: 1}
  devices:
EOF
for nic in "${NICS[@]}"; do
    cat >>"$INVENTORY" <<EOF
    - name: $nic
      allowMultipleAllocations: true
      attributes:
        ifName: {string: $nic}
      capacity:
        bandwidth:
          value: 10G
          requestPolicy:
            default: 1G
            validRange: {min: 100M, step: 100M}
EOF
done
info "inventory ($INVENTORY):"
sed 's/^/     /' "$INVENTORY"
ok "$(capacity_line)"

add pod1 4G best-fit eth-a

# What least-allocated would do for pod2, on a scratch copy of the state so the
# real books stay untouched.
step "pod2 (3G) under least-allocated instead: on a scratch copy of the state, then undone"
cp -a "$STATE_DIR" "$TMP/state-scratch"
cp -a "$IPAM_DIR" "$TMP/ipam-scratch"
ip netns add "$SCRATCH_NS"
MADE_NETNS+=("$SCRATCH_NS")
scratch_conf=$(netconf 3G least-allocated "$TMP/state-scratch" "$TMP/ipam-scratch")
out=$(cni ADD pod2 "$scratch_conf" "/var/run/netns/$SCRATCH_NS") && rc=0 || rc=$?
((rc == 0)) || die "scratch ADD failed with exit $rc: $out"
dev=$(device_of pod2 "$TMP/state-scratch")
cni DEL pod2 "$scratch_conf" "/var/run/netns/$SCRATCH_NS" >/dev/null || die "scratch DEL failed"
[[ $dev == eth-b ]] || die "least-allocated picked '$dev', expected eth-b"
ok "least-allocated would put pod2 on $dev (the NIC with the most left); best-fit packs eth-a"

add pod2 3G best-fit eth-a
add pod3 10G best-fit eth-b

step "pod4: ADD asking bandwidth 8G (no NIC has 8G left)"
make_pod_netns pod4
out=$(cni ADD pod4 "$(netconf 8G best-fit)") && rc=0 || rc=$?
((rc != 0)) || { ADDED+=(pod4); die "pod4 was admitted, but no NIC has 8G left"; }
info "exit code $rc, CNI error:"
show_json "$out" | sed 's/^/     /'
ok "refused; nothing charged   ($(capacity_line))"

del pod3

step "pod5: prepared claim (as the kubelet plugin would write it) allocated on eth-b, 6G"
SHARE_ID=$(cat /proc/sys/kernel/random/uuid)
CLAIM=$TMP/pod5-claim.json
cat >"$CLAIM" <<EOF
{
  "apiVersion": "resource.k8s.io/v1",
  "kind": "ResourceClaim",
  "metadata": {"name": "pod5-net", "namespace": "demo", "uid": "$(cat /proc/sys/kernel/random/uuid)"},
  "spec": {"devices": {"requests": [{
    "name": "net1",
    "exactly": {"deviceClassName": "$DRIVER", "allocationMode": "ExactCount", "count": 1,
                "capacity": {"requests": {"bandwidth": "6G"}}}
  }]}},
  "status": {
    "allocation": {"devices": {"results": [{
      "request": "net1", "driver": "$DRIVER", "pool": "$POOL", "device": "eth-b",
      "consumedCapacity": {"bandwidth": "6G"}, "shareID": "$SHARE_ID"
    }]}},
    "reservedFor": [{"resource": "pods", "name": "pod5", "uid": "$(pod_uid pod5)"}]
  }
}
EOF
info "claim result: device eth-b, consumedCapacity bandwidth 6G, shareID $SHARE_ID"
info "\$ cni-dra claims prepare --pod-uid $(pod_uid pod5) $CLAIM"
CNI_DRA_STATE_DIR=$STATE_DIR CNI_DRA_INVENTORY=$INVENTORY "$CNI_DRA" claims prepare --pod-uid "$(pod_uid pod5)" "$CLAIM" | sed 's/^/   /'
add pod5 - best-fit eth-b
got_share=$(status_json | "$PY" -c '
import json, sys
print(next(a.get("shareID") or "" for a in json.load(sys.stdin)["attachments"] if a["containerID"] == "ctr-pod5"))')
[[ $got_share == "$SHARE_ID" ]] || die "pod5 shareID in status is '$got_share', expected $SHARE_ID"
ok "claim mode: pod5 on eth-b with the claim's shareID $got_share"

step "cni-dra status"
"$CNI_DRA" status --state-dir "$STATE_DIR" --inventory "$INVENTORY" | sed 's/^/   /'

step "the demo's links on the host"
ip -br link show type veth | grep -E '^eth-(a|b)' | sed 's/^/   /' || true

for pod in pod1 pod2 pod5; do del "$pod"; done
info "pod5's 6G stays reserved on eth-b by its prepared claim until the kubelet unprepares it:"
info "\$ cni-dra claims unprepare --pod-uid $(pod_uid pod5)"
CNI_DRA_STATE_DIR=$STATE_DIR CNI_DRA_INVENTORY=$INVENTORY "$CNI_DRA" claims unprepare --pod-uid "$(pod_uid pod5)" | sed 's/^/   /'

step "capacity back"
status_json | "$PY" -c '
import json, sys
s = json.load(sys.stdin)
bad = [d["name"] for d in s["devices"] if d["consumed"].get("bandwidth", "0") != "0"]
print("   attachments:", len(s["attachments"]))
sys.exit(1 if bad or s["attachments"] else 0)' || die "capacity not fully returned"
ok "$(capacity_line)"
