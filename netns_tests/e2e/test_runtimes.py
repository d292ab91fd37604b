"""What differs between container runtimes, and several interfaces per pod through Multus,
on the real two-node bed (scripts/e2e/cluster.py).

``make e2e`` runs this file twice: in the containerd session (with every other scenario)
and in a CRI-O session (``CNI_DRA_E2E_RUNTIME=cri-o``) whose second node calls Multus
(``CNI_DRA_E2E_MULTUS=1``; the first node keeps cni-dra's conflist as its only network).
A scenario that needs what one runtime does (CRI-O's GC at start-up) or Multus is skipped
elsewhere, and says why. The runtime-specific scenarios use the first node; the Multus
ones the second.

Expected values come from the API server, the kernel, the runtime's and kubelet's logs and
each node's books (``cni-dra status --json`` inside the node), as in test_cluster.py, whose
helpers these scenarios share.
"""

from __future__ import annotations

import json
import os
import time
from decimal import Decimal
from pathlib import Path

import pytest
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
    core,
    delete_pods,
    ip_json,
    kernel_rates,
    make_pod,
    make_template,
    nothing_held,
    pod,
    pod_events,
    resource,
    scheduled,
    to_dict,
    wait_event,
    wait_for,
    wait_running,
)


def crio_only(cluster) -> None:
    if cluster.RUNTIME != "cri-o":
        pytest.skip(f"what CRI-O does; this session runs {cluster.RUNTIME}")


def multus_only(cluster) -> None:
    if not cluster.MULTUS:
        pytest.skip("needs Multus (CNI_DRA_E2E_MULTUS=1: make e2e's CRI-O session)")


def node_ready_condition(api, name: str) -> dict:
    n = to_dict(api, core(api).read_node(name))
    (ready,) = [c for c in n["status"]["conditions"] if c["type"] == "Ready"]
    return ready


def restart_runtime(api, cluster, node) -> None:
    """Stop the node's runtime (SIGTERM, as a service manager does) and start it again in the
    node's namespaces; wait for its socket and for the Node to be Ready."""
    rt = node.runtime
    node.restart(rt.name)
    wait_for(lambda: rt.ready(node), f"{node.name}: {rt.name} socket after the restart", 60)
    wait_for(
        lambda: cluster.node_ready(api, node.name), f"{node.name} Ready after the {rt.name} restart", 120
    )


def ipam_held(cluster, node, network: str) -> set[str]:
    """Addresses host-local holds for ``network`` on ``node`` (its files in the default dataDir)."""
    d = node.host_path(f"/var/lib/cni/networks/{network}")
    return {f.name for f in d.iterdir() if f.name[0].isdigit()} if d.exists() else set()


def node_links(node) -> set[str]:
    return {link["ifname"] for link in json.loads(node.run("ip", "-j", "link", "show").stdout or "[]")}


# -- every runtime ----------------------------------------------------------------------------


def test_pod_with_a_claim_gets_its_share_through_this_runtime(api, cluster):
    """The basic path on this runtime: a 4G claim's pod runs on the scheduler's allocation,
    the runtime's ADD attached it (eth0 on the allocated NIC, networkData in the claim), and
    deleting the pod runs DEL and releases the share and the IP."""
    node = cluster.node()
    make_template(api, "nic-4g", "4G")
    make_pod(api, cluster, "rt-a", template="nic-4g")
    p, _, res = check_attached(api, cluster, "rt-a", "4G")
    wait_for(lambda: books_match(api, cluster), "books == the scheduler's allocations", 30)
    assert p["status"]["podIP"] in ipam_held(cluster, node, cluster.NETWORK)
    log = node.logfile(node.runtime.name)
    torn_down = log.read_text(errors="replace").count(node.runtime.teardown_phrase)
    delete_pods(api, "rt-a")
    wait_for(lambda: nothing_held(cluster), "share released", 60)
    assert booked(cluster) == {n: Decimal(0) for n in cluster.NICS}
    assert p["status"]["podIP"] not in ipam_held(cluster, node, cluster.NETWORK)
    assert log.read_text(errors="replace").count(node.runtime.teardown_phrase) > torn_down


def test_status_failure_makes_the_nodes_network_not_ready_until_it_recovers(api, cluster):
    """cni-dra's STATUS fails (code 50) while the node's inventory cannot be read: the
    runtime reports its network not ready (containerd asks STATUS on every CRI status call;
    CRI-O polls it every 5 s and says so after its cni_status_grace_period), so the kubelet
    marks the Node NotReady; with the inventory back, the Node is Ready again."""
    node = cluster.node()
    inventory = node.host_path("/etc/cni-dra/resourceslice.yaml")
    saved = inventory.read_bytes()
    t0 = time.monotonic()
    try:
        inventory.write_text("{not an inventory")
        ready = wait_for(
            lambda: (c := node_ready_condition(api, node.name))["status"] != "True" and c,
            f"{node.name} NotReady after STATUS fails",
            120,
        )
        took = time.monotonic() - t0
        print(f"\ne2e: {cluster.RUNTIME}: NotReady after {took:.1f}s: {ready['reason']}: {ready['message']}")
        assert "NetworkReady=false" in ready["message"], ready
        assert "plugin not available: inventory" in ready["message"], ready
    finally:
        inventory.write_bytes(saved)
    t1 = time.monotonic()
    wait_for(lambda: cluster.node_ready(api, node.name), f"{node.name} Ready again", 120)
    print(f"e2e: {cluster.RUNTIME}: Ready again {time.monotonic() - t1:.1f}s after the inventory came back")
    make_template(api, "nic-1g", "1G")
    make_pod(api, cluster, "rt-after", template="nic-1g")
    check_attached(api, cluster, "rt-after", "1G")


def test_del_after_the_pods_netns_is_gone_releases_everything(api, cluster):
    """The pod's network namespace is gone before the runtime's DEL (its pinned mount
    removed and its processes killed, as CRI-O does in some stop paths): deleting the pod
    still succeeds, and DEL releases the link (gone with the namespace), its ifb device, the
    IP and the share."""
    node = cluster.node()
    make_template(api, "nic-2g", "2G")
    make_pod(api, cluster, "rt-gone", template="nic-2g")
    p, _, res = check_attached(api, cluster, "rt-gone", "2G")
    uid, ip = p["metadata"]["uid"], p["status"]["podIP"]
    (att,) = [a for a in books(cluster)["attachments"] if a["podUID"] == uid]
    ifb = (att.get("shaping") or {}).get("ifb")
    netns = att["netns"]
    assert netns, att
    # the namespace's pinned file (the runtime's bind mount, seen twice under the node's
    # shared propagation) goes, then its processes
    tried = [node.run("umount", "-l", netns, check=False) for _ in range(3)]
    tried.append(node.run("rm", "-f", netns, check=False))
    assert node.run("test", "-e", netns, check=False).returncode != 0, [
        (r.args[-3:], r.returncode, r.stderr) for r in tried
    ]
    for procs in _pod_cgroup_procs(uid):
        for pid in procs:
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass
    delete_pods(api, "rt-gone")
    wait_for(lambda: nothing_held(cluster), "DEL released the attachment and the claim", 60)
    assert booked(cluster) == {n: Decimal(0) for n in cluster.NICS}
    assert ip not in ipam_held(cluster, node, cluster.NETWORK)
    if ifb:
        assert ifb not in node_links(node)
    assert books_match(api, cluster)


def _pod_cgroup_procs(uid: str) -> list[list[str]]:
    """PIDs of pod ``uid``'s containers (not CRI-O's conmon), per cgroup."""
    out = []
    for d in (Path("/sys/fs/cgroup/pids") / "cni-dra-e2e").rglob(f"pod{uid}"):
        for procs in d.rglob("cgroup.procs"):
            pids = [
                x
                for x in procs.read_text().split()
                if Path(f"/proc/{x}/comm").exists()
                and Path(f"/proc/{x}/comm").read_text().strip() != "conmon"
            ]
            out.append(pids)
    return out


def test_runtime_restart_keeps_every_pods_network_and_charges_once(api, cluster):
    """The runtime restarts while two pods run: both keep eth0 (same link, MAC and IP), the
    books still equal the scheduler's allocations (nothing charged twice: CRI-O CHECKs each
    restored pod and sends GC listing them), and deleting the pods releases everything."""
    node = cluster.node()
    make_template(api, "nic-4g", "4G")
    make_template(api, "nic-2g", "2G")
    make_pod(api, cluster, "rt-r1", template="nic-4g")
    make_pod(api, cluster, "rt-r2", template="nic-2g")
    before = {}
    for name, bw in (("rt-r1", "4G"), ("rt-r2", "2G")):
        p, _, _ = check_attached(api, cluster, name, bw)
        (link,) = ip_json(p["metadata"]["uid"], "link", "show", "eth0")
        before[name] = (p["metadata"]["uid"], p["status"]["podIP"], link["ifindex"], link["address"])
    wait_for(lambda: books_match(api, cluster), "books before", 30)
    held = booked(cluster)
    atts = sorted((a["containerID"], a["shareID"]) for a in books(cluster)["attachments"])
    restart_runtime(api, cluster, node)
    time.sleep(5)  # CRI-O: its start-up STATUS, GC and CHECK of each restored pod
    for name, (uid, ip, ifindex, mac) in before.items():
        now = wait_running(api, name)
        assert now["metadata"]["uid"] == uid and now["status"]["podIP"] == ip
        (link,) = ip_json(uid, "link", "show", "eth0")
        assert (link["ifindex"], link["address"]) == (ifindex, mac), (name, link)
    assert sorted((a["containerID"], a["shareID"]) for a in books(cluster)["attachments"]) == atts
    assert booked(cluster) == held == scheduled(api, cluster)
    delete_pods(api, "rt-r1", "rt-r2")
    wait_for(lambda: nothing_held(cluster), "everything released after the restart", 60)
    assert booked(cluster) == {n: Decimal(0) for n in cluster.NICS}


# -- CRI-O ------------------------------------------------------------------------------------

AGED_ADD = (
    "import sys, time; sys.path.append('/opt/cni/bin/cni-dra.d/lib/python3/dist-packages'); "
    "real = time.time; time.time = lambda: real() - {age}; "
    "from cni_dra.main import main; sys.exit(main())"
)


def aged_add(cluster, node, netns: str, container_id: str, age_s: int) -> dict:
    """cni-dra's ADD run by hand in ``node`` for a container no runtime knows (standalone:
    no pod UID), its clock ``age_s`` seconds behind, so the attachment is recorded as made
    that long ago (older than GC's grace period): what a pod the runtime has forgotten
    leaves. In-process (CNI_DRA_AGENT_ASKED: the agent is not asked)."""
    tree = "/opt/cni/bin/cni-dra.d"
    conf = {**cluster.conflist(node.name)["plugins"][0], "cniVersion": "1.1.0", "name": cluster.NETWORK}
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": container_id,
        "CNI_NETNS": netns,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/opt/cni/bin",
        "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=forgotten",
        "CNI_DRA_AGENT_ASKED": "e2e",
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
    }
    res = node.run(
        "env",
        "-i",
        *(f"{k}={v}" for k, v in env.items()),
        f"{tree}/lib/ld-linux-x86-64.so.2",
        "--library-path",
        f"{tree}/lib",
        f"{tree}/bin/python3",
        "-IS",
        "-c",
        AGED_ADD.format(age=age_s),
        input=json.dumps(conf),
        check=False,
    )
    assert res.returncode == 0, (res.stdout, res.stderr)
    return json.loads(res.stdout)


def test_crio_gc_at_start_up_collects_what_no_pod_uses_and_keeps_running_pods(api, cluster):
    """CRI-O sends GC at start-up with the pods it knows. An attachment no runtime knows
    (an ADD by hand into a namespace of our own, recorded 10 minutes ago: older than
    cni-dra's GC grace period) is collected: its link, IP and share are released. The
    running pod's attachment, IP and share are kept."""
    crio_only(cluster)
    from cni_dra.verbs.gc import GRACE_S

    node = cluster.node()
    make_template(api, "nic-4g", "4G")
    make_pod(api, cluster, "rt-gc", template="nic-4g")
    p, _, res = check_attached(api, cluster, "rt-gc", "4G")
    wait_for(lambda: books_match(api, cluster), "books", 30)
    ns_name = "cde2e-forgotten"
    netns = f"/run/netns/{ns_name}"
    node.run("ip", "netns", "add", ns_name)
    try:
        result = aged_add(cluster, node, netns, "forgotten-0123456789", int(GRACE_S) + 300)
        ip = result["ips"][0]["address"].split("/")[0]
        (stale,) = [a for a in books(cluster)["attachments"] if a["containerID"] == "forgotten-0123456789"]
        assert parse_quantity(stale["consumedCapacity"]["bandwidth"]) == GIB  # standalone: the default
        assert ip in ipam_held(cluster, node, cluster.NETWORK)
        assert "eth0" in node.run("ip", "-n", ns_name, "-j", "link", "show").stdout
        charged = booked(cluster)
        restart_runtime(api, cluster, node)
        wait_for(
            lambda: (
                not [a for a in books(cluster)["attachments"] if a["containerID"].startswith("forgotten")]
            ),
            "CRI-O's start-up GC collected the forgotten attachment",
            60,
        )
        assert ip not in ipam_held(cluster, node, cluster.NETWORK)
        assert "eth0" not in node.run("ip", "-n", ns_name, "-j", "link", "show").stdout
        after = booked(cluster)
        assert after[stale["device"]] == charged[stale["device"]] - GIB
        assert after == scheduled(api, cluster)
        # the running pod: its attachment, IP and share are kept
        uid = p["metadata"]["uid"]
        (kept,) = [a for a in books(cluster)["attachments"] if a["podUID"] == uid]
        assert (kept["device"], kept["shareID"]) == (res["device"], res["shareID"])
        assert p["status"]["podIP"] in ipam_held(cluster, node, cluster.NETWORK)
        assert wait_running(api, "rt-gc")["status"]["podIP"] == p["status"]["podIP"]
    finally:
        node.run("ip", "netns", "del", ns_name, check=False)
    delete_pods(api, "rt-gc")


# -- Multus -----------------------------------------------------------------------------------

MULTUS_DIR = "conf/k8s/multus"


def apply_multus_networks(api, cluster) -> None:
    cluster.apply_manifest(api, cluster.REPO / MULTUS_DIR / "networks.yaml")


def multus_pod(
    api,
    cluster,
    path: str,
    *,
    name: str | None = None,
    annotations: dict | None = None,
    template: str | None = None,
) -> dict:
    """The pod of ``path`` (conf/k8s/multus/), pinned to the node that runs Multus (in a
    real cluster every node does; here only the second node)."""
    import yaml

    body = yaml.safe_load((cluster.REPO / path).read_text())
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": cluster.multus_node().name}
    if name:
        body["metadata"]["name"] = name
    if annotations is not None:
        body["metadata"]["annotations"] = annotations
    if template:
        body["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = template
    return to_dict(api, core(api).create_namespaced_pod(NS, body))


def network_status(p: dict) -> dict[str, dict]:
    """Multus's k8s.v1.cni.cncf.io/network-status annotation, by interface."""
    entries = json.loads(p["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"])
    return {e.get("interface"): e for e in entries}


def test_multus_gives_a_pod_net1_and_net2_from_its_claims_two_requests(api, cluster):
    """conf/k8s/multus/ (CRD, RBAC, networks, the two-request claim template, the pod)
    applied unchanged: the pod gets eth0 from Multus's primary network (ptp) and net1, net2
    as macvlans on the NICs the scheduler allocated to requests net1 (4G) and net2 (2G), each
    shaped to its own share; the claim's status.devices has networkData for both, and
    Multus's network-status annotation agrees with it and with the kernel. Deleting the pod
    releases both shares, both IPs and both links."""
    multus_only(cluster)
    node = cluster.multus_node()
    apply_multus_networks(api, cluster)
    cluster.apply_manifest(api, cluster.REPO / MULTUS_DIR / "resourceclaimtemplate.yaml")
    p = multus_pod(api, cluster, f"{MULTUS_DIR}/pod.yaml")
    name = p["metadata"]["name"]
    p = wait_running(api, name, 120)
    uid = p["metadata"]["uid"]
    claim = claim_of(api, p)
    results = {r["request"]: r for r in claim["status"]["allocation"]["devices"]["results"]}
    assert sorted(results) == ["net1", "net2"]
    assert results["net1"]["device"] != results["net2"]["device"]
    assert all(r["pool"] == node.name for r in results.values())
    # eth0: the primary network (ptp: a veth), the pod IP, in the node's pod subnet
    (eth0,) = ip_json(uid, "-d", "addr", "show", "eth0")
    assert eth0["linkinfo"]["info_kind"] == "veth"
    assert [a["local"] for a in eth0["addr_info"] if a["family"] == "inet"] == [p["status"]["podIP"]]
    status = network_status(p)
    kernel = {}
    for ifname, bw in (("net1", "4G"), ("net2", "2G")):
        (link,) = ip_json(uid, "-d", "addr", "show", ifname)
        assert link["linkinfo"]["info_kind"] == "macvlan", link
        parent = node.run("ip", "-j", "link", "show", "dev", results[ifname]["device"]).stdout
        assert link["link_index"] == json.loads(parent)[0]["ifindex"], (ifname, link, parent)
        assert kernel_rates(uid, ifname) == {
            "egress": int(parse_quantity(bw)),
            "ingress": int(parse_quantity(bw)),
        }
        ips = [f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"] if a["family"] == "inet"]
        kernel[ifname] = (ips, link["address"])
        assert status[ifname]["ips"] == [i.split("/")[0] for i in ips], status
        assert status[ifname]["mac"].lower() == link["address"].lower(), status
    print(f"\ne2e: Multus network-status: {json.dumps(list(status.values()))}")

    def network_data() -> dict | None:
        c = to_dict(api, resource(api).read_namespaced_resource_claim(claim["metadata"]["name"], NS))
        by_if = {
            d["networkData"]["interfaceName"]: d
            for d in (c.get("status") or {}).get("devices") or []
            if d.get("networkData")
        }
        return by_if if sorted(by_if) == ["net1", "net2"] else None

    by_if = wait_for(network_data, "networkData for net1 and net2", 60)
    for ifname, (ips, mac) in kernel.items():
        entry = by_if[ifname]
        assert entry["device"] == results[ifname]["device"] and entry["shareID"] == results[ifname]["shareID"]
        assert entry["networkData"]["ips"] == ips
        assert entry["networkData"]["hardwareAddress"].lower() == mac.lower()
    wait_for(lambda: books_match(api, cluster, node.name), "books == the scheduler's allocations", 30)
    atts = {a["ifname"]: a for a in books(cluster, node.name)["attachments"] if a["podUID"] == uid}
    assert sorted(atts) == ["net1", "net2"]
    assert {k: a["device"] for k, a in atts.items()} == {k: r["device"] for k, r in results.items()}
    held_a = ipam_held(cluster, node, "cni-dra-a")
    held_b = ipam_held(cluster, node, "cni-dra-b")
    assert kernel["net1"][0][0].split("/")[0] in held_a and kernel["net2"][0][0].split("/")[0] in held_b
    delete_pods(api, name)
    wait_for(lambda: nothing_held(cluster, node.name), "both shares released", 60)
    assert booked(cluster, node.name) == {n: Decimal(0) for n in cluster.NICS}
    assert not ipam_held(cluster, node, "cni-dra-a") and not ipam_held(cluster, node, "cni-dra-b")


def test_multus_interface_no_request_is_named_after_is_refused_and_charges_nothing(api, cluster):
    """A claim whose requests (fast, slow) match no interface Multus asks for (net1, net2):
    the sandbox fails with an event naming the interface, the claim and both requests, and
    the node holds no attachment (nothing is charged beyond the prepared claim's reservation,
    which goes with the pod)."""
    multus_only(cluster)
    node = cluster.multus_node()
    apply_multus_networks(api, cluster)
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "fast-slow", "namespace": NS},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": r,
                            "exactly": {
                                "deviceClassName": "cni-dra-shared-nic",
                                "capacity": {"requests": {"bandwidth": "1G"}},
                            },
                        }
                        for r in ("fast", "slow")
                    ]
                }
            }
        },
    }
    resource(api).create_namespaced_resource_claim_template(NS, body)
    try:
        p = multus_pod(api, cluster, f"{MULTUS_DIR}/pod.yaml", name="misnamed", template="fast-slow")
        msg = wait_event(api, "misnamed", "FailedCreatePodSandBox", "none is named 'net1'", timeout_s=120)
        print(f"\ne2e: misnamed: FailedCreatePodSandBox: {msg}")
        claim = claim_of(api, pod(api, "misnamed"))
        who = f"claim default/{claim['metadata']['name']}"
        assert f"{who} request 'fast'" in msg and f"{who} request 'slow'" in msg, msg
        assert not [
            a for a in books(cluster, node.name)["attachments"] if a["podUID"] == p["metadata"]["uid"]
        ]
        assert not ipam_held(cluster, node, "cni-dra-a")
        delete_pods(api, "misnamed")
        wait_for(lambda: nothing_held(cluster, node.name), "nothing held", 60)
    finally:
        resource(api).delete_namespaced_resource_claim_template("fast-slow", NS)


def test_multus_network_without_a_claim_is_a_standalone_share(api, cluster):
    """A pod without a claim naming a cni-dra network: net1 is a standalone attachment
    (README "Kubernetes": the requestPolicy default, 1G, on a NIC cni-dra picks), charged on
    the node and invisible to the scheduler; deleting the pod releases it."""
    multus_only(cluster)
    node = cluster.multus_node()
    apply_multus_networks(api, cluster)
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "plain-net1",
            "namespace": NS,
            "annotations": {"k8s.v1.cni.cncf.io/networks": "cni-dra-a"},
        },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {"kubernetes.io/hostname": node.name},
            "containers": [{"name": "app", "image": cluster.TEST_IMAGE, "imagePullPolicy": "Never"}],
        },
    }
    core(api).create_namespaced_pod(NS, body)
    p = wait_running(api, "plain-net1", 120)
    uid = p["metadata"]["uid"]
    (att,) = [a for a in books(cluster, node.name)["attachments"] if a["podUID"] == uid]
    assert att["ifname"] == "net1" and att.get("claim") is None and att["network"] == "cni-dra-a"
    assert parse_quantity(att["consumedCapacity"]["bandwidth"]) == GIB
    (link,) = ip_json(uid, "-d", "link", "show", "net1")
    assert link["linkinfo"]["info_kind"] == "macvlan"
    assert scheduled(api, cluster, node.name) == {n: Decimal(0) for n in cluster.NICS}
    assert booked(cluster, node.name)[att["device"]] == GIB
    assert network_status(p)["net1"]["mac"].lower() == link["address"].lower()
    delete_pods(api, "plain-net1")
    wait_for(lambda: nothing_held(cluster, node.name), "standalone share released", 60)


def test_multus_runs_with_its_own_node_bound_token(api, cluster):
    """Multus's kubeconfig holds a token of its own service account (conf/k8s/multus/rbac.yaml)
    bound to its Node: it may read pods and NetworkAttachmentDefinitions, and nothing of
    cni-dra's (ResourceSlices, ResourceClaims) or secrets."""
    multus_only(cluster)
    import yaml
    from kubernetes import client, config

    node = cluster.multus_node()
    kc = yaml.safe_load(node.host_path(cluster.cluster_multus.KUBECONFIG).read_text())
    mc = config.new_client_from_config_dict(kc)
    try:
        me = client.AuthenticationV1Api(mc).create_self_subject_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        )
        assert me.status.user_info.username == "system:serviceaccount:kube-system:multus"
        assert me.status.user_info.extra["authentication.kubernetes.io/node-name"] == [node.name]
        authz = client.AuthorizationV1Api(mc)

        def can(verb: str, resource_: str, group: str = "", sub: str | None = None) -> bool:
            review = {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {
                    "resourceAttributes": {
                        "verb": verb,
                        "resource": resource_,
                        "group": group,
                        "namespace": NS,
                        **({"subresource": sub} if sub else {}),
                    }
                },
            }
            return authz.create_self_subject_access_review(review).status.allowed

        assert can("get", "pods") and can("update", "pods", sub="status")
        assert can("get", "network-attachment-definitions", "k8s.cni.cncf.io")
        assert not can("create", "pods") and not can("delete", "pods") and not can("get", "secrets")
        assert not can("get", "resourceclaims", "resource.k8s.io")
        assert not can("list", "resourceslices", "resource.k8s.io")
    finally:
        mc.close()
