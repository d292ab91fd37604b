"""cni-dra on a real two-node cluster: kube-apiserver, kube-scheduler and
kube-controller-manager on the host, and two nodes, each in its own network, mount and UTS
namespaces with its own containerd and kubelet (scripts/e2e/cluster.py) and its own two
veth pairs as 10G NICs (requestPolicy default 1G, validRange min 100M step 100M; one of MTU
1500, one jumbo of MTU 9216; the same names on both nodes, as on real nodes). cni-dra is
installed by Helm from its chart (scripts/e2e/helm-values.yaml): one agent pod per node,
under the chart's service account with the pod's own token, limited by the node's
conflist.

Most scenarios pin their pods to the first node (``cluster.NODE``, a nodeSelector on
``kubernetes.io/hostname``); the two-node scenarios spread them. The scenarios run in
file order and share the cluster; each one removes its pods before it ends. Expected
values come from the API server's objects (official Python client), the kernel (pyroute2,
``ip``/``tc``, cgroups; a node's links are looked up in that node's netns) and the
components' own logs, and are compared with each node's books (``cni-dra status --json``
run inside that node's mount namespace), never taken from them.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from netns_tests.e2e.helpers import (  # noqa: F401
    GIB,
    NS,
    booked,
    books,
    books_match,
    check_attached,
    claim_of,
    clean_namespace,
    consistently,
    core,
    delete_cluster_objects,
    delete_pods,
    forbidden,
    ip_link,
    kernel_rates,
    make_claim,
    make_pod,
    make_template,
    node_http,
    node_link,
    node_mtu,
    nothing_held,
    on_nic,
    pod,
    pod_events,
    pod_netns,
    refused,
    resource,
    result_of,
    scheduled,
    status_entry,
    to_dict,
    wait_event,
    wait_for,
    wait_running,
)

# -- scenarios -----------------------------------------------------------------------------


def test_agent_registers_and_its_slice_is_accepted_and_kept(api, cluster):
    """The kubelet registers the agent's DRA plugin; the API server accepts its
    ResourceSlice, which outlives the kubelet's start-up wipe; conf/k8s's DeviceClass is
    stored unchanged."""
    assert cluster.node().agent_registered(), "the kubelet's log shows no connection to the plugin"
    name = f"{cluster.NODE}-{cluster.DRIVER}"
    slc = wait_for(lambda: to_dict(api, resource(api).read_resource_slice(name)), "slice published")
    devices = {d["name"]: d for d in slc["spec"]["devices"]}
    assert sorted(devices) == sorted(cluster.NICS)
    for nic, dev in devices.items():
        assert dev["allowMultipleAllocations"] is True
        assert dev["attributes"]["ifName"] == {"string": nic}
        cap = dev["capacity"]["bandwidth"]
        assert parse_quantity(cap["value"]) == 10 * GIB
        assert parse_quantity(cap["requestPolicy"]["default"]) == GIB
        assert {k: parse_quantity(v) for k, v in cap["requestPolicy"]["validRange"].items()} == {
            "min": Decimal(10) ** 8,
            "step": Decimal(10) ** 8,
        }
    node = to_dict(api, core(api).read_node(cluster.NODE))
    assert slc["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    assert slc["spec"]["nodeName"] == cluster.NODE
    # The kubelet wiped its node's slices when it started; this one was published after
    # (the agent registers after the kubelet's start) and stays.
    uid = slc["metadata"]["uid"]
    consistently(
        lambda: to_dict(api, resource(api).read_resource_slice(name))["metadata"]["uid"] == uid,
        "the slice stays",
        5,
    )
    import yaml

    want = yaml.safe_load((cluster.REPO / "conf/k8s/deviceclass.yaml").read_text())
    got = to_dict(api, resource(api).read_device_class(want["metadata"]["name"]))
    assert got["spec"]["selectors"] == want["spec"]["selectors"]


def test_both_nodes_are_ready_and_each_agent_publishes_its_own_nics(api, cluster):
    """Two honest nodes: each kubelet registered its Node (Ready, its own InternalIP on the
    bridge, hostname and machine ID) and cni-dra's plugin; each node's ResourceSlice names
    that node (nodeName, pool, owner reference) and lists exactly that node's NICs, with
    the MACs the kernel shows in that node's netns. Both nodes' NICs have the same names,
    so only the MACs tell them apart: a slice made from the other node's netns would show.
    The API server reaches each kubelet at its node's address; each kubelet and agent
    serves its default ports in its node's netns; each agent's log says it published its
    own node's slice and never names the other's."""
    seen: dict[str, dict[str, str]] = {}
    machine_ids = set()
    for n in cluster.NODES:
        assert cluster.node_ready(api, n.name), f"{n.name} not Ready"
        node_obj = to_dict(api, core(api).read_node(n.name))
        addrs = {(a["type"], a["address"]) for a in node_obj["status"]["addresses"]}
        assert {("InternalIP", n.ip), ("Hostname", n.name)} <= addrs, addrs
        assert node_obj["metadata"]["labels"]["kubernetes.io/hostname"] == n.name
        machine_ids.add(node_obj["status"]["nodeInfo"]["machineID"])
        assert n.agent_registered(), f"{n.name}: the kubelet's log shows no connection to the plugin"
        name = f"{n.name}-{cluster.DRIVER}"
        slc = wait_for(
            lambda name=name: to_dict(api, resource(api).read_resource_slice(name)), f"slice {name}"
        )
        assert (slc["spec"]["nodeName"], slc["spec"]["pool"]["name"]) == (n.name, n.name)
        assert [(o["kind"], o["uid"]) for o in slc["metadata"]["ownerReferences"]] == [
            ("Node", node_obj["metadata"]["uid"])
        ]
        kernel = {nic: node_link(cluster, n.name, nic)["mac"] for nic in cluster.NICS}
        published = {d["name"]: d["attributes"]["mac"]["string"] for d in slc["spec"]["devices"]}
        assert published == kernel, (n.name, published, kernel)
        seen[n.name] = kernel
        # the API server reaches this node's kubelet at the node's address (its serving
        # certificate checked against the CA), and the kubelet runs with this node's cgroup root
        assert core(api).connect_get_node_proxy_with_path(n.name, "healthz") == "ok"
        raw = core(api).connect_get_node_proxy_with_path(n.name, "configz", _preload_content=False).data
        configz = json.loads(raw)["kubeletconfig"]
        assert configz["cgroupRoot"] == f"/{n.cgroup}", configz["cgroupRoot"]
        # default ports, each node's own: the kubelet's healthz and the agent's metrics
        assert node_http(cluster, n.name, "http://127.0.0.1:10248/healthz").strip() == "ok"
        metrics = node_http(cluster, n.name, "http://127.0.0.1:9412/metrics")
        assert {
            f'cni_dra_device_capacity{{device="{nic}",ifname="{nic}",resource="bandwidth"}} 1e+10'
            for nic in cluster.NICS
        } <= set(metrics.splitlines()), metrics
        agent_log = cluster.agent_log(n)
        assert f"published slice {name} " in agent_log
        others = [m.name for m in cluster.NODES if m.name != n.name]
        assert not [o for o in others if f"slice {o}-{cluster.DRIVER}" in agent_log]
    (a, b) = seen.values()
    assert set(a.values()).isdisjoint(b.values()), seen
    assert len(machine_ids) == len(cluster.NODES)
    slices = [s for s in resource(api).list_resource_slice().items if s.spec.driver == cluster.DRIVER]
    assert sorted(s.spec.node_name for s in slices) == sorted(n.name for n in cluster.NODES)


def test_pod_runs_on_the_share_the_scheduler_allocated(api, cluster):
    """Pod A (4G): the scheduler's allocation is what the kubelet prepared and containerd's
    ADD attached; the pod IP is the claim's networkData."""
    make_template(api, "nic-4g", "4G")
    make_pod(api, cluster, "pod-a", template="nic-4g")
    p, claim, res = check_attached(api, cluster, "pod-a", "4G")
    wait_for(lambda: books_match(api, cluster), "cni-dra's books == the scheduler's allocations", 30)
    assert booked(cluster)[res["device"]] == 4 * GIB


def test_scheduler_keeps_an_8g_pod_pending_until_a_share_is_released(api, cluster):
    """Both NICs hold 4G: pod B (8G) stays Pending for the scheduler, pod C (4G) runs;
    deleting A lets B run. cni-dra's books follow the scheduler at every step."""
    make_template(api, "nic-4g", "4G")
    make_pod(api, cluster, "pod-a", template="nic-4g")
    _, _, res_a = check_attached(api, cluster, "pod-a", "4G")
    nic_a = res_a["device"]
    other = next(n for n in cluster.NICS if n != nic_a)
    # C first, on the other NIC (a CEL selector on the ifName attribute)
    make_template(api, "nic-4g-other", "4G", on_nic=other)
    make_pod(api, cluster, "pod-c", template="nic-4g-other")
    _, _, res_c = check_attached(api, cluster, "pod-c", "4G")
    assert res_c["device"] == other
    wait_for(lambda: books_match(api, cluster), "books after C", 30)
    assert booked(cluster) == {nic_a: 4 * GIB, other: 4 * GIB}
    # B: 8G fits on neither NIC (6G left on each)
    make_template(api, "nic-8g", "8G")
    make_pod(api, cluster, "pod-b", template="nic-8g")

    def unschedulable() -> bool:
        b = pod(api, "pod-b")
        conds = {c["type"]: c for c in b["status"].get("conditions") or []}
        sched = conds.get("PodScheduled")
        return bool(sched and sched["status"] == "False" and sched.get("reason") == "Unschedulable")

    wait_for(unschedulable, "pod B Unschedulable", 60)

    def still_pending() -> bool:
        b = pod(api, "pod-b")
        if b["spec"].get("nodeName") or b["status"].get("phase") != "Pending" or not unschedulable():
            return False
        claims = [
            c
            for c in resource(api).list_namespaced_resource_claim(NS).items
            if any(o.name == "pod-b" for o in c.metadata.owner_references or [])
        ]
        return all(not (c.status and c.status.allocation) for c in claims)

    consistently(still_pending, "pod B Pending (not scheduled, no allocation)", 10)
    # this pod-b's events only (its UID): events outlive their pod by an hour
    uid = pod(api, "pod-b")["metadata"]["uid"]
    events = (
        core(api)
        .list_namespaced_event(NS, field_selector=f"involvedObject.name=pod-b,involvedObject.uid={uid}")
        .items
    )
    assert not [e for e in events if e.reason in ("FailedCreatePodSandBox", "Scheduled")], [
        (e.reason, e.message) for e in events
    ]
    assert books_match(api, cluster)
    # deleting A frees 4G on A's NIC: B now fits there (8G)
    delete_pods(api, "pod-a")
    _, _, res_b = check_attached(api, cluster, "pod-b", "8G")
    assert res_b["device"] == nic_a
    wait_for(lambda: books_match(api, cluster), "books after B", 30)
    assert booked(cluster) == {nic_a: 8 * GIB, other: 4 * GIB}


def test_pod_deletion_runs_del_and_releases_the_share(api, cluster):
    """Deleting pods: containerd's DEL ran (TearDown in its log, no attachment, the IP back
    in host-local), the capacity is free again, the generated claims are deleted."""
    make_template(api, "nic-4g", "4G")
    make_template(api, "nic-8g", "8G")
    make_pod(api, cluster, "pod-d", template="nic-4g")
    make_pod(api, cluster, "pod-e", template="nic-8g")
    claims = {n: check_attached(api, cluster, n, bw)[1] for n, bw in (("pod-d", "4G"), ("pod-e", "8G"))}
    ips = {n: pod(api, n)["status"]["podIP"] for n in ("pod-d", "pod-e")}
    node = cluster.node()
    ipam = node.host_path(
        f"/var/lib/cni/networks/{cluster.NETWORK}"
    )  # host-local's default dataDir, in the node
    for ip in ips.values():
        assert (ipam / ip).exists(), f"host-local does not hold {ip}"
    wait_for(lambda: books_match(api, cluster), "books", 30)
    runtime_log = node.logfile(node.runtime.name)
    torn_down = runtime_log.read_text().count(node.runtime.teardown_phrase)
    delete_pods(api, "pod-d", "pod-e")
    wait_for(lambda: not books(cluster)["attachments"], "no attachments left", 30)
    assert not books(cluster)["preparedClaims"]
    assert booked(cluster) == {n: Decimal(0) for n in cluster.NICS}
    for ip in ips.values():
        assert not (ipam / ip).exists(), f"host-local still holds {ip}"
    for c in claims.values():
        wait_for(
            lambda: (
                not [
                    x
                    for x in resource(api).list_namespaced_resource_claim(NS).items
                    if x.metadata.uid == c["metadata"]["uid"]
                ]
            ),
            f"claim {c['metadata']['name']} deleted",
            60,
        )
    assert books_match(api, cluster)
    assert runtime_log.read_text().count(node.runtime.teardown_phrase) >= torn_down + 2


def test_pods_spread_over_both_nodes_and_each_nodes_books_match_its_allocations(api, cluster):
    """A 1G pod pinned to each node, then three 8G pods the scheduler places: a node holds
    at most two 8G shares (one per 10G NIC), so it must use both nodes. Every pod runs on
    an allocation of its node's pool, with eth0 on that NIC of that node's netns and an
    address of that node's pod subnet; each node's books (``cni-dra status`` inside the
    node) equal the scheduler's allocations on that node's pool and hold only that node's
    pods. Deleting the pods releases everything on both nodes."""
    import ipaddress

    make_template(api, "nic-1g", "1G")
    make_template(api, "nic-8g", "8G")
    pinned = {f"pod-pin-{n.index}": n.name for n in cluster.NODES}
    for name, node in pinned.items():
        make_pod(api, cluster, name, template="nic-1g", node=node)
    free = [f"pod-any-{i}" for i in range(3)]
    for name in free:
        make_pod(api, cluster, name, template="nic-8g", anywhere=True)
    placed: dict[str, str] = {}
    for name in [*pinned, *free]:
        p, _, res = check_attached(api, cluster, name, "8G" if name in free else "1G")
        placed[name] = p["spec"]["nodeName"]
        subnet = ipaddress.ip_network(cluster.node(placed[name]).pod_subnet)
        assert ipaddress.ip_address(p["status"]["podIP"]) in subnet, (name, p["status"]["podIP"], subnet)
    assert {n: placed[n] for n in pinned} == pinned
    print(f"\ne2e: placed {placed}")
    assert {placed[n] for n in free} == {n.name for n in cluster.NODES}, placed
    for n in cluster.NODES:
        wait_for(
            lambda n=n: books_match(api, cluster, n.name),
            f"{n.name}: books == the scheduler's allocations",
            30,
        )
        held = books(cluster, n.name)
        assert sorted(a["podName"] for a in held["attachments"]) == sorted(
            k for k, v in placed.items() if v == n.name
        )
        assert (
            sum(booked(cluster, n.name).values())
            == sum((8 if placed[k] == n.name else 0) * GIB for k in free) + GIB
        )
    delete_pods(api, *placed)
    for n in cluster.NODES:
        wait_for(lambda n=n: nothing_held(cluster, n.name), f"{n.name}: everything released", 60)
        assert booked(cluster, n.name) == {nic: Decimal(0) for nic in cluster.NICS}


def test_claim_is_deallocated_and_its_status_entry_removed_after_its_pod(api, cluster):
    """A ResourceClaim (2G) of one pod: the kubelet prepares it, containerd's ADD uses its
    share; after the pod is gone the kubelet unprepares it, the controller deallocates it
    (no allocation, no reservedFor) and the agent removes the share's status entry."""
    make_claim(api, "single-2g", "2G")
    make_pod(api, cluster, "pod-one", claim="single-2g")
    _, claim, res = check_attached(api, cluster, "pod-one", "2G")
    wait_for(lambda: books_match(api, cluster), "books", 30)
    delete_pods(api, "pod-one")

    def released() -> bool:
        c = to_dict(api, resource(api).read_namespaced_resource_claim("single-2g", NS))
        st = c.get("status") or {}
        return not st.get("allocation") and not st.get("reservedFor") and not st.get("devices")

    wait_for(released, "claim deallocated and its status entry gone", 60)
    assert not books(cluster)["attachments"] and not books(cluster)["preparedClaims"]
    assert booked(cluster) == {n: Decimal(0) for n in cluster.NICS}


def test_one_claim_shared_by_two_pods_is_charged_once(api, cluster):
    """A ResourceClaim (2G) used by two pods: one allocation, one shareID, both pods on
    that NIC, the share charged once (the books equal the scheduler's 2G)."""
    make_claim(api, "shared-2g", "2G")
    make_pod(api, cluster, "pod-s1", claim="shared-2g")
    wait_running(api, "pod-s1")
    make_pod(api, cluster, "pod-s2", claim="shared-2g")
    wait_running(api, "pod-s2", 45)
    claim = to_dict(api, resource(api).read_namespaced_resource_claim("shared-2g", NS))
    res = result_of(claim)
    atts = books(cluster)["attachments"]
    assert len(atts) == 2 and {a["shareID"] for a in atts} == {res["shareID"]}
    assert booked(cluster) == scheduled(api, cluster)
    uids = {pod(api, n)["metadata"]["uid"] for n in ("pod-s1", "pod-s2")}
    assert {a["podUID"] for a in atts} == uids
    assert all(on_nic(cluster, u, cluster.NODE, res["device"]) for u in uids)
    # the first pod goes: the second keeps its interface and the share; then the second goes
    delete_pods(api, "pod-s1")
    (left,) = books(cluster)["attachments"]
    assert left["podName"] == "pod-s2" and booked(cluster) == scheduled(api, cluster)
    delete_pods(api, "pod-s2")
    wait_for(
        lambda: not books(cluster)["attachments"] and not books(cluster)["preparedClaims"],
        "shared claim unprepared after its last pod",
        60,
    )


def test_standalone_pod_is_charged_but_invisible_to_the_scheduler(api, cluster):
    """A pod without a claim gets a standalone share (the requestPolicy default, 1G) on the
    same NICs. The scheduler does not see it: its allocations do not count that 1G, so the
    scheduler can hand out a NIC's full 10G while the node is charged 1G more."""
    make_pod(api, cluster, "pod-plain")
    p = wait_running(api, "pod-plain")
    uid = p["metadata"]["uid"]
    (att,) = [a for a in books(cluster)["attachments"] if a["podUID"] == uid]
    assert att.get("claim") is None and att["ifname"] == "eth0"
    assert parse_quantity(att["consumedCapacity"]["bandwidth"]) == GIB
    assert on_nic(cluster, uid, cluster.NODE, att["device"])
    assert booked(cluster)[att["device"]] == GIB
    assert scheduled(api, cluster) == {n: Decimal(0) for n in cluster.NICS}
    delete_pods(api, "pod-plain")
    wait_for(lambda: not books(cluster)["attachments"], "standalone share released", 30)


def test_conf_k8s_example_pod_gets_its_2g_share(api, cluster):
    """conf/k8s/resourceclaimtemplate.yaml and pod.yaml, applied unchanged (the pod's image
    is the locally built registry.k8s.io/pause:3.10; it names no node, so it runs on either)."""
    cluster.apply_manifest(api, cluster.REPO / "conf/k8s/resourceclaimtemplate.yaml")
    (obj,) = cluster.apply_manifest(api, cluster.REPO / "conf/k8s/pod.yaml")
    name = obj["metadata"]["name"]
    try:
        p, claim, res = check_attached(api, cluster, name, "2G")  # on whichever node the scheduler chose
        node = p["spec"]["nodeName"]
        assert res["request"] == "net1"
        wait_for(lambda: books_match(api, cluster, node), "books", 30)
    finally:
        delete_pods(api, name)
    wait_for(lambda: not books(cluster, node)["attachments"], "example share released", 30)


PROFILES = Path("conf/k8s/profiles")


def test_profile_jumbo_claim_gets_mtu_9000_on_a_jumbo_nic(api, cluster):
    """conf/k8s/profiles/resourceclaim-jumbo.yaml applied unchanged, and a pod naming the
    claim: the scheduler puts it on the only NIC whose published ``mtu`` attribute is at
    least 9000 (the bed's jumbo NIC, MTU 9216; the other has 1500), with a 2G share; the
    kernel shows the pod's eth0 as a macvlan (the conflist's type and mode: the profile
    names neither) of MTU 9000 on that NIC. The NIC's MTU is above 9000 because a macvlan
    takes its parent's MTU when nobody sets one: 9000 is the profile's, applied at ADD.
    cni-dra's record of the attachment and the claim's status ``data`` say the same."""
    (claim_obj,) = cluster.apply_manifest(api, cluster.REPO / PROFILES / "resourceclaim-jumbo.yaml")
    claim_name = claim_obj["metadata"]["name"]
    slc = to_dict(api, resource(api).read_resource_slice(f"{cluster.NODE}-{cluster.DRIVER}"))
    published = {d["name"]: d["attributes"]["mtu"]["int"] for d in slc["spec"]["devices"]}
    assert published == {n: node_mtu(cluster, cluster.NODE, n) for n in cluster.NICS}
    assert published[cluster.JUMBO_NIC] == cluster.JUMBO_MTU and sorted(published.values())[0] == 1500
    make_pod(api, cluster, "pod-jumbo", claim=claim_name)
    try:
        p, claim, res = check_attached(api, cluster, "pod-jumbo", "2G")
        assert res["device"] == cluster.JUMBO_NIC and res["request"] == "net1"
        # the scheduler copies the claim's config; it drops ``requests`` when the entry
        # covers every request of the claim (here: net1 is the only one)
        configs = claim["status"]["allocation"]["devices"]["config"]
        assert [(c["source"], c["opaque"]["parameters"].get("mtu")) for c in configs] == [("FromClaim", 9000)]
        assert configs[0].get("requests") in (None, ["net1"]), configs
        link = ip_link(p["metadata"]["uid"])
        assert (link["linkinfo"]["info_kind"], link["linkinfo"]["info_data"]["mode"], link["mtu"]) == (
            "macvlan",
            "bridge",
            9000,
        ), link
        assert node_mtu(cluster, cluster.NODE, cluster.JUMBO_NIC) == cluster.JUMBO_MTU
        # what cni-dra recorded (status --json) and wrote in the claim's status agrees
        (att,) = [a for a in books(cluster)["attachments"] if a["podUID"] == p["metadata"]["uid"]]
        prof = att["profile"]
        assert att["linkType"] == "macvlan"
        assert {k: prof.get(k) for k in ("linkType", "mode", "mtu", "fromConfig")} == {
            "linkType": "macvlan",
            "mode": "bridge",
            "mtu": 9000,
            "fromConfig": ["mtu"],
        }, prof
        assert prof["shaping"] == (att["shaping"] is not None)
        data = status_entry(claim, res["shareID"])["data"]
        assert (data["kind"], data["linkType"], data["parentInterface"], data["profile"]) == (
            "InterfaceStatus",
            "macvlan",
            cluster.JUMBO_NIC,
            prof,
        ), data
        wait_for(lambda: books_match(api, cluster), "books", 30)
    finally:
        delete_pods(api, "pod-jumbo")
    wait_for(lambda: not books(cluster)["attachments"], "jumbo share released", 30)


def test_profile_ipvlan_l3_reaches_add(api, cluster):
    """conf/k8s/profiles/deviceclass-ipvlan-l3.yaml and resourceclaimtemplate-ipvlan-l3.yaml
    applied unchanged, and a pod of that template: the class's profile (ipvlan, mode l3)
    passes prepare and reaches ADD. This host's kernel has no ipvlan (the ipvlan lane of
    ``make test`` runs under user-mode-linux, which checks the ipvlan l3 link itself), so
    ADD must refuse rather than silently make the conflist's macvlan: the pod never runs,
    its sandbox fails with an event saying the kernel does not support link kind ipvlan,
    and no attachment is left. On a kernel with ipvlan, the pod's eth0 is an ipvlan in mode l3 on the
    allocated NIC."""
    from cni_dra.netlink.sublink import link_kind_supported

    classes, templates = ("cni-dra-ipvlan-l3",), ("nic-share-ipvlan-l3",)
    try:
        cluster.apply_manifest(api, cluster.REPO / PROFILES / "deviceclass-ipvlan-l3.yaml")
        (tpl,) = cluster.apply_manifest(api, cluster.REPO / PROFILES / "resourceclaimtemplate-ipvlan-l3.yaml")
        assert tpl["metadata"]["name"] == templates[0]
        make_pod(api, cluster, "pod-ipvlan", template=templates[0])
        if link_kind_supported("ipvlan"):
            p, _, res = check_attached(api, cluster, "pod-ipvlan", "1G")
            link = ip_link(p["metadata"]["uid"])
            assert (link["linkinfo"]["info_kind"], link["linkinfo"]["info_data"]["mode"]) == (
                "ipvlan",
                "l3",
            ), link
        else:
            p = pod(api, "pod-ipvlan")
            uid = p["metadata"]["uid"]

            def refused() -> str | None:
                now = pod(api, "pod-ipvlan")
                if now["status"].get("phase") == "Running":
                    kind = ip_link(uid)["linkinfo"]["info_kind"]
                    raise AssertionError(
                        f"pod-ipvlan runs with a {kind} eth0: ADD did not apply the class's ipvlan"
                    )
                return next(
                    (m for r, m in pod_events(api, p) if r == "FailedCreatePodSandBox" and "ipvlan" in m),
                    None,
                )

            msg = wait_for(refused, "pod-ipvlan: a FailedCreatePodSandBox event about ipvlan", 90)
            print(f"\ne2e profile: pod-ipvlan: FailedCreatePodSandBox: {msg}")
            p = pod(api, "pod-ipvlan")
            assert p["status"].get("phase") == "Pending" and not p["status"].get("podIP"), p["status"]
            # prepare took the claim (the profile is valid on this node); ADD refused the link
            claim = claim_of(api, p)
            assert (
                f'plugin type="cni-dra" failed (add): failed to create ipvlan eth0 on {result_of(claim)["device"]}: '
                "the kernel does not support link kind ipvlan"
            ) in msg, msg
            assert [c["uid"] for c in books(cluster)["preparedClaims"] if c["podUID"] == uid] == [
                claim["metadata"]["uid"]
            ]
            assert [
                (c["source"], c["opaque"]["parameters"]["linkType"], c["opaque"]["parameters"]["mode"])
                for c in claim["status"]["allocation"]["devices"]["config"]
            ] == [("FromClass", "ipvlan", "l3")]
            assert not [a for a in books(cluster)["attachments"] if a["podUID"] == uid]
    finally:
        delete_pods(api, "pod-ipvlan")
        delete_cluster_objects(api, classes=classes, templates=templates)
    wait_for(
        lambda: not books(cluster)["attachments"] and not books(cluster)["preparedClaims"],
        "ipvlan claim unprepared",
        60,
    )


def test_profile_the_node_forbids_fails_at_prepare(api, cluster):
    """A claim whose config fixes the MAC (macvlan, 02:00:00:00:00:42) on a node whose
    conflist does not allow it (``profiles.allowMac`` defaults to false): the scheduler
    allocates it, the agent's NodePrepareResources refuses it, and the pod never starts;
    its event names the claim, the request, the field, the limit and the config entry.
    Nothing is stored: no prepared claim, no attachment, nothing charged."""
    before = books(cluster)
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "fixed-mac", "namespace": NS},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "net1",
                        "exactly": {
                            "deviceClassName": "cni-dra-shared-nic",
                            "capacity": {"requests": {"bandwidth": "1G"}},
                        },
                    }
                ],
                "config": [
                    {
                        "requests": ["net1"],
                        "opaque": {
                            "driver": cluster.DRIVER,
                            "parameters": {
                                "apiVersion": "net.cni-dra.dev/v1alpha1",
                                "kind": "InterfaceConfig",
                                "linkType": "macvlan",
                                "mac": "02:00:00:00:00:42",
                            },
                        },
                    }
                ],
            }
        },
    }
    resource(api).create_namespaced_resource_claim(NS, body)
    make_pod(api, cluster, "pod-mac", claim="fixed-mac")
    try:
        msg = wait_event(
            api,
            "pod-mac",
            "FailedPrepareDynamicResources",
            "failed to prepare claim default/fixed-mac request 'net1': mac 02:00:00:00:00:42 is fixed, "
            "which this node does not allow (profiles.allowMac: false), "
            "asked by config[0] (FromClaim",
        )
        assert "InvalidConfigError (CNI code 7)" in msg, msg
        print(f"\ne2e profile: pod-mac: FailedPrepareDynamicResources: {msg}")
        p = pod(api, "pod-mac")
        assert p["status"].get("phase") == "Pending" and not p["status"].get("podIP"), p["status"]
        # the scheduler allocated and reserved it; the node took nothing
        claim = to_dict(api, resource(api).read_namespaced_resource_claim("fixed-mac", NS))
        assert result_of(claim)["device"] in cluster.NICS
        assert [r["uid"] for r in claim["status"]["reservedFor"]] == [p["metadata"]["uid"]]
        after = books(cluster)
        assert not [
            c
            for c in after["preparedClaims"]
            if c["uid"] == claim["metadata"]["uid"] or c["podUID"] == p["metadata"]["uid"]
        ]
        assert after["attachments"] == before["attachments"] == []
        assert booked(cluster) == {n: Decimal(0) for n in cluster.NICS}
        assert not (claim.get("status") or {}).get("devices"), "no networkData for a claim the node refused"
    finally:
        delete_pods(api, "pod-mac")


def test_bandwidth_annotations_lower_a_pods_rate_and_never_raise_it(api, cluster):
    """A pod of a 1G share annotated ``kubernetes.io/egress-bandwidth: 100M`` and
    ``kubernetes.io/ingress-bandwidth: 5G``: containerd hands both to cni-dra (its conflist
    declares the ``bandwidth`` capability, as the shipped ones do) under Go's field names
    (``EgressRate``...). The kernel shapes what the pod sends to 100M and what it receives
    to the 1G share (the annotation lowers, never raises), and cni-dra's record says the same."""
    make_template(api, "nic-1g", "1G")
    make_pod(
        api,
        cluster,
        "pod-bw",
        template="nic-1g",
        annotations={"kubernetes.io/egress-bandwidth": "100M", "kubernetes.io/ingress-bandwidth": "5G"},
    )
    p, _, res = check_attached(api, cluster, "pod-bw", "1G")
    uid = p["metadata"]["uid"]
    allocated = int(parse_quantity(res["consumedCapacity"]["bandwidth"]))
    assert allocated == 10**9
    egress = int(parse_quantity(p["metadata"]["annotations"]["kubernetes.io/egress-bandwidth"]))
    assert kernel_rates(uid) == {"egress": egress, "ingress": allocated}
    (att,) = [a for a in books(cluster)["attachments"] if a["podUID"] == uid]
    assert {d: att["shaping"][d]["rateBps"] for d in ("egress", "ingress")} == {
        "egress": egress,
        "ingress": allocated,
    }
    delete_pods(api, "pod-bw")


def test_a_pod_whose_claims_give_one_interface_two_results_is_refused_at_prepare(api, cluster):
    """A pod with two claims of one template (each a 1G request named net1): ADD could pick
    neither for any interface (two results named net1, none eth0), so the agent's
    NodePrepareResources refuses both and names them; the pod stays Pending with a
    FailedPrepareDynamicResources event, its sandbox is never made, and cni-dra holds
    nothing for it (no prepared claim, no attachment, nothing charged), although the
    scheduler allocated both."""
    make_template(api, "nic-1g", "1G")
    p = make_pod(api, cluster, "pod-two", templates=("nic-1g", "nic-1g"))
    uid = p["metadata"]["uid"]
    msg = wait_event(
        api,
        "pod-two",
        "FailedPrepareDynamicResources",
        "interface 'net1' would have 2 allocation results of net.cni-dra.dev to choose from",
    )
    print(f"\ne2e: pod-two: FailedPrepareDynamicResources: {msg}")
    assert "ClaimError (CNI code 101): failed to prepare claims default/pod-two-nic-" in msg, msg
    names = [st["resourceClaimName"] for st in pod(api, "pod-two")["status"]["resourceClaimStatuses"]]
    claims = [to_dict(api, resource(api).read_namespaced_resource_claim(n, NS)) for n in names]
    assert len(claims) == 2
    for c in claims:  # the scheduler allocated and reserved both
        assert result_of(c)["request"] == "net1" and result_of(c)["device"] in cluster.NICS
        assert [r["uid"] for r in c["status"]["reservedFor"]] == [uid]
        assert f"claim default/{c['metadata']['name']} request 'net1'" in msg, msg

    def refused_and_nothing_held() -> bool:
        now = pod(api, "pod-two")
        held = books(cluster)
        return (
            now["status"].get("phase") == "Pending"
            and not now["status"].get("podIP")
            and not [e for e in pod_events(api, now) if e[0] == "FailedCreatePodSandBox"]
            and not held["attachments"]
            and not held["preparedClaims"]
            and booked(cluster) == {n: Decimal(0) for n in cluster.NICS}
        )

    consistently(refused_and_nothing_held, "pod-two Pending, no sandbox, nothing prepared or charged", 10)
    delete_pods(api, "pod-two")


def test_each_agents_token_writes_only_its_own_nodes_slices_and_claim_status(api, cluster, tmp_path):
    """The chart's RBAC and admission policy, installed unchanged, and the tokens the two
    agent pods run with (the projected service-account token the kubelet wrote for each
    pod, bound to the pod and so to its node; the API server's SelfSubjectReview names that
    pod and node). In both directions, node A's
    token gets 403 on creating a slice of node B and on updating or deleting B's agent's
    slice, which stays as it was; it creates, updates and deletes a slice of its own node,
    may update and delete its agent's slice (dry run: the slice stays), and gets 403 for a
    slice for no single node. And for a claim allocated on node B (a pod pinned there), A's
    token is refused a change of ``status.devices`` (the API server answers 422 Invalid:
    its validation asks the authorizer for ``arbitrary-node:patch`` of
    ``resourceclaims/driver``, which the role does not grant, since the claim is not on
    A's node) while B's may (dry run: the agent's entry stays as it wrote it)."""
    tokens = {n.name: cluster.agent_client(n, tmp_path / f"{n.name}.kubeconfig", api) for n in cluster.NODES}
    for n in cluster.NODES:
        review = client.AuthenticationV1Api(tokens[n.name]).create_self_subject_review({})
        user = review.status.user_info
        assert user.username == "system:serviceaccount:kube-system:cni-dra"
        assert user.extra["authentication.kubernetes.io/node-name"] == [n.name]
        assert user.extra["authentication.kubernetes.io/pod-name"] == [
            cluster.agent_pod(api, n.name).metadata.name
        ]

    def scratch(slice_name: str, node: str | None) -> dict:
        spec: dict[str, Any] = {
            "driver": "scratch.cni-dra.dev",
            "devices": [],
            "pool": {"name": slice_name, "generation": 1, "resourceSliceCount": 1},
        }
        spec.update({"nodeName": node} if node else {"allNodes": True})
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name},
            "spec": spec,
        }

    pairs = [(a, b) for a in cluster.NODES for b in cluster.NODES if a is not b]
    made = [f"cde2e-scratch-{a.index}" for a in cluster.NODES]
    try:
        # the API server's admission sees the policy shortly after it is created
        first, second = pairs[0]
        wait_for(
            lambda: forbidden(
                lambda: resource(tokens[first.name]).create_resource_slice(
                    scratch("cde2e-scratch-probe", second.name), dry_run="All"
                )
            ),
            "the admission policy in force",
            30,
        )
        for a, b in pairs:
            mine = resource(tokens[a.name])
            theirs = f"{b.name}-{cluster.DRIVER}"
            not_that_node = (
                f"cni-dra's service account on node '{a.name}' may write only that node's "
                f"ResourceSlices, not those of node '{b.name}'"
            )
            before = to_dict(api, resource(api).read_resource_slice(theirs))
            refused(
                lambda: mine.create_resource_slice(scratch(f"cde2e-scratch-{a.index}-foreign", b.name)),
                why=not_that_node,
            )
            changed = {**before, "metadata": {**before["metadata"], "labels": {"cde2e/taken": "yes"}}}
            refused(lambda: mine.replace_resource_slice(theirs, changed), why=not_that_node)
            refused(lambda: mine.delete_resource_slice(theirs), why=not_that_node)
            after = to_dict(api, resource(api).read_resource_slice(theirs))
            assert (after["metadata"]["uid"], after["metadata"]["resourceVersion"]) == (
                before["metadata"]["uid"],
                before["metadata"]["resourceVersion"],
            )
            # its own node's: a scratch slice for real, the agent's own slice in a dry run
            own = f"cde2e-scratch-{a.index}"
            mine.create_resource_slice(scratch(own, a.name))
            obj = to_dict(api, resource(api).read_resource_slice(own))
            obj["spec"]["pool"]["generation"] = 2
            assert mine.replace_resource_slice(own, obj).spec.pool.generation == 2
            mine.delete_resource_slice(own)
            agents = to_dict(api, resource(api).read_resource_slice(f"{a.name}-{cluster.DRIVER}"))
            relabelled = {**agents, "metadata": {**agents["metadata"], "labels": {"cde2e/probe": "yes"}}}
            mine.replace_resource_slice(agents["metadata"]["name"], relabelled, dry_run="All")
            mine.delete_resource_slice(agents["metadata"]["name"], dry_run="All")
            refused(
                lambda: mine.create_resource_slice(scratch(f"cde2e-scratch-{a.index}-all", None)),
                why=f"on node '{a.name}' may write only that node's ResourceSlices, not a slice for no "
                "single node (allNodes, nodeSelector or perDeviceNodeSelection)",
            )
        assert not [
            s
            for s in resource(api).list_resource_slice().items
            if s.metadata.name.startswith("cde2e-scratch-")
        ]
    finally:
        for name in made:
            try:
                resource(api).delete_resource_slice(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
    # claim status: a claim allocated on each node
    make_template(api, "nic-1g", "1G")
    for n in cluster.NODES:
        make_pod(api, cluster, f"pod-tok-{n.index}", template="nic-1g", node=n.name)
    on = {n.name: check_attached(api, cluster, f"pod-tok-{n.index}", "1G")[1:] for n in cluster.NODES}
    for a in cluster.NODES:
        for b in cluster.NODES:
            claim, res = on[b.name]
            body = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {
                    "name": claim["metadata"]["name"],
                    "namespace": NS,
                    "uid": claim["metadata"]["uid"],
                },
                "status": {
                    "devices": [
                        {
                            "driver": res["driver"],
                            "pool": res["pool"],
                            "device": res["device"],
                            "shareID": res["shareID"],
                            "conditions": [
                                {
                                    "type": "cde2e-probe",
                                    "status": "True",
                                    "reason": "Probe",
                                    "message": "probe",
                                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                                }
                            ],
                        }
                    ]
                },
            }

            def write(a=a, body=body) -> None:
                resource(tokens[a.name]).patch_namespaced_resource_claim_status(
                    body["metadata"]["name"],
                    NS,
                    body,
                    field_manager="cde2e-probe",
                    force=True,
                    dry_run="All",
                    _content_type="application/apply-patch+yaml",
                )

            if a is b:
                write()
                continue
            # the API server judges it in the claim's validation: 422 Invalid, with the
            # authorizer's 403 as a FieldValueForbidden cause on status.devices
            with pytest.raises(ApiException) as err:
                write()
            assert err.value.status == 422, (err.value.status, err.value.body)
            (cause,) = json.loads(err.value.body)["details"]["causes"]
            assert (cause["reason"], cause["field"]) == ("FieldValueForbidden", "status.devices"), cause
            assert (
                'changing status.devices requires resource="resourceclaims/driver", '
                'verb="[arbitrary-node:patch]" permission'
            ) in cause["message"], cause
            assert (
                'User "system:serviceaccount:kube-system:cni-dra" cannot arbitrary-node:patch resource '
                '"resourceclaims/driver"'
            ) in cause["message"], cause
    for claim, res in on.values():
        now = to_dict(api, resource(api).read_namespaced_resource_claim(claim["metadata"]["name"], NS))
        entry = status_entry(now, res["shareID"])
        assert [c["type"] for c in entry["conditions"]] == [
            c["type"] for c in status_entry(claim, res["shareID"])["conditions"]
        ] and "cde2e-probe" not in [c["type"] for c in entry["conditions"]]
    delete_pods(api, *(f"pod-tok-{n.index}" for n in cluster.NODES))
    for c in tokens.values():
        c.close()


def test_a_pods_rate_is_the_share_the_scheduler_gave_it(api, cluster, tmp_path):
    """Bandwidth shaping against the real scheduler: pod-slow holds 300M and pod-fast 1G of
    one NIC; TCP between them (the host's iperf3 run in each pod's netns) gets pod-slow's
    consumedCapacity both ways (its egress, then its ingress), within ±10 % (tbf counts
    whole frames: goodput is about 4.4 % below the rate at MTU 1500)."""
    from netns_tests.traffic import IPERF3, TOLERANCE, Client, IperfServer, M, median_bps

    if IPERF3 is None:
        pytest.fail("iperf3 is not installed (make deps installs it)")
    nic = sorted(cluster.NICS)[0]
    make_template(api, "rate-300m", "300M", on_nic=nic)
    make_template(api, "rate-1g", "1G", on_nic=nic)
    make_pod(api, cluster, "pod-slow", template="rate-300m")
    make_pod(api, cluster, "pod-fast", template="rate-1g")
    slow, _, res = check_attached(api, cluster, "pod-slow", "300M")
    fast, _, _ = check_attached(api, cluster, "pod-fast", "1G")
    allocated = int(parse_quantity(res["consumedCapacity"]["bandwidth"]))
    assert allocated == 300 * M
    (att,) = [a for a in books(cluster)["attachments"] if a["podUID"] == slow["metadata"]["uid"]]
    assert {d: att["shaping"][d]["rateBps"] for d in ("egress", "ingress")} == {
        "egress": allocated,
        "ingress": allocated,
    }
    server_ip = fast["status"]["podIP"]
    with IperfServer(pod_netns(fast["metadata"]["uid"]), server_ip, tmp_path):
        for reverse in (False, True):
            bps = median_bps(Client(pod_netns(slow["metadata"]["uid"]), server_ip, reverse=reverse))
            direction = "ingress" if reverse else "egress"
            print(f"\ne2e shaping: pod-slow {direction}: {bps / M:.1f} Mbit/s for {allocated // M}M")
            assert abs(bps / allocated - 1) <= TOLERANCE, (
                f"{direction}: {bps / M:.1f} Mbit/s for {allocated // M}M"
            )
    delete_pods(api, "pod-slow", "pod-fast")


def test_agent_restart_keeps_pods_and_republishes(api, cluster):
    """The agent's container is killed (SIGKILL, as an OOM kill) while a pod runs: the
    kubelet sees the plugin go and restarts the container in the same pod (back-off 10 s,
    inside the kubelet's 30 s grace for the driver's slices), which registers again and
    keeps the slice published; the pod keeps its interface, the books still match, and
    deleting the pod still releases everything."""
    make_template(api, "nic-4g", "4G")
    make_pod(api, cluster, "pod-r", template="nic-4g")
    p, _, res = check_attached(api, cluster, "pod-r", "4G")
    uid = p["metadata"]["uid"]
    name = f"{cluster.NODE}-{cluster.DRIVER}"
    node = cluster.node()
    agent = cluster.agent_pod(api, node.name)
    restarts = agent.status.container_statuses[0].restart_count
    kubelet_log = node.logfile("kubelet")
    offset = len(kubelet_log.read_bytes())
    cid = agent.status.container_statuses[0].container_id.split("://", 1)[1]
    ctr = f"{cluster.binaries()['containerd_bin']}/ctr"
    node.run(ctr, "-n", "k8s.io", "tasks", "kill", "--signal", "SIGKILL", cid)

    def kubelet_saw(word: str) -> bool:
        tail = kubelet_log.read_bytes()[offset:].decode(errors="replace")
        return any(f'driverName="{cluster.DRIVER}"' in ln and word in ln for ln in tail.splitlines())

    wait_for(lambda: kubelet_saw("connected=false"), "the kubelet lost the plugin", 30)
    assert on_nic(cluster, uid, node.name, res["device"])
    wait_for(
        lambda: (
            (q := cluster.agent_pod(api, node.name))
            and q.metadata.uid == agent.metadata.uid
            and q.status.container_statuses[0].restart_count > restarts
        ),
        "the agent container restarted",
        90,
    )
    wait_for(lambda: kubelet_saw("connected=true"), "the kubelet registered the plugin again", 60)
    slc = wait_for(lambda: to_dict(api, resource(api).read_resource_slice(name)), "slice published", 60)
    assert sorted(d["name"] for d in slc["spec"]["devices"]) == sorted(cluster.NICS)
    assert on_nic(cluster, uid, node.name, res["device"])
    wait_for(lambda: books_match(api, cluster), "books after restart", 30)
    delete_pods(api, "pod-r")
    wait_for(
        lambda: not books(cluster)["attachments"] and not books(cluster)["preparedClaims"],
        "everything released after the restart",
        60,
    )
    assert booked(cluster) == {n: Decimal(0) for n in cluster.NICS}


def test_kubelet_restart_keeps_pods_and_the_slice_comes_back(api, cluster):
    """The kubelet restarts while a pod runs: it wipes its node's slices at start and
    registers the plugin again; the slice is published again, the pod keeps its interface
    and its share, and deleting it afterwards releases everything."""
    make_template(api, "nic-4g", "4G")
    make_pod(api, cluster, "pod-k", template="nic-4g")
    p, claim, res = check_attached(api, cluster, "pod-k", "4G")
    uid = p["metadata"]["uid"]
    name = f"{cluster.NODE}-{cluster.DRIVER}"
    before = to_dict(api, resource(api).read_resource_slice(name))["metadata"]["uid"]
    node = cluster.node()
    prepared_before = cluster.agent_log(node).count(f"prepared claim default/{claim['metadata']['name']}")
    kubelet_log = node.logfile("kubelet")
    offset = len(kubelet_log.read_bytes())
    node.restart("kubelet")  # in the node's namespaces, as it was started

    def registered_again() -> bool:
        tail = kubelet_log.read_bytes()[offset:].decode(errors="replace")
        return f'driverName="{cluster.DRIVER}"' in tail and "connected=true" in tail

    wait_for(registered_again, "the restarted kubelet registered the plugin again", 90)
    wait_for(lambda: cluster.node_ready(api), "Node Ready after the kubelet restart", 90)
    # the start-up wipe deleted the slice; the agent published it again (a new object)
    slc = wait_for(
        lambda: (
            (s := to_dict(api, resource(api).read_resource_slice(name)))
            and s["metadata"]["uid"] != before
            and s
        ),
        "slice wiped and published again",
        120,
    )
    assert slc["spec"]["nodeName"] == cluster.NODE and len(slc["spec"]["devices"]) == len(cluster.NICS)
    assert pod(api, "pod-k")["status"]["phase"] == "Running"
    assert on_nic(cluster, uid, node.name, res["device"])
    wait_for(lambda: books_match(api, cluster), "books after the kubelet restart", 30)
    prepared_after = cluster.agent_log(node).count(f"prepared claim default/{claim['metadata']['name']}")
    # the kubelet keeps prepared claims in its checkpoint: a running pod's claim is not
    # prepared again after a restart (and would be idempotent if it were)
    assert prepared_after == prepared_before
    delete_pods(api, "pod-k")
    wait_for(
        lambda: not books(cluster)["attachments"] and not books(cluster)["preparedClaims"],
        "everything released after the kubelet restart",
        60,
    )
    assert booked(cluster) == {n: Decimal(0) for n in cluster.NICS}
