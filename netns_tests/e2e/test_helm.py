"""cni-dra as operators run it, on the real two-node cluster: the image (``make image``,
imported into each node's containerd), the Helm chart deploy/helm/cni-dra installed by
the real Helm with scripts/e2e/helm-values.yaml and its RBAC unchanged, one agent pod per
node (the DaemonSet). What its life cycle does to the pods that run: the agent pod deleted,
``helm upgrade`` to a second image, ``helm uninstall`` and a later ``helm install``.

Runs after test_cluster.py (file order); each scenario leaves the chart installed and its
two agents Ready, and removes its pods and claims (test_cluster's ``clean_namespace``).
"""

from __future__ import annotations

import time

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from netns_tests.e2e.helpers import (  # noqa: F401  # noqa: F401
    NS,
    books,
    books_match,
    check_attached,
    clean_namespace,
    core,
    delete_pods,
    eth0_parent,
    kernel_eth0,
    kernel_rates,
    make_pod,
    make_template,
    on_nic,
    pod,
    resource,
    to_dict,
    wait_for,
    wait_running,
)

AGENT_CAPS = ["NET_ADMIN", "SYS_ADMIN", "SYS_CHROOT", "SYS_PTRACE"]


def apps(api) -> client.AppsV1Api:
    return client.AppsV1Api(api)


def daemonset(api, cluster):
    return apps(api).read_namespaced_daemon_set(cluster.RELEASE, cluster.RELEASE_NS)


def rolled_out(api, cluster, image: str | None = None) -> bool:
    """The DaemonSet's every pod is of its current template (``image`` when given) and Ready."""
    ds = daemonset(api, cluster)
    st = ds.status
    if ds.metadata.generation != st.observed_generation:
        return False
    if not (
        st.desired_number_scheduled == st.updated_number_scheduled == st.number_ready == len(cluster.NODES)
    ):
        return False
    pods = [q for q in cluster.agent_pods(api) if q.metadata.deletion_timestamp is None]
    return (
        len(pods) == len(cluster.NODES)
        and all(cluster.pod_ready(q) for q in pods)
        and (image is None or all(q.spec.containers[0].image == image for q in pods))
    )


def slice_of(api, cluster, node: str) -> dict | None:
    try:
        return to_dict(api, resource(api).read_resource_slice(f"{node}-{cluster.DRIVER}"))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def network_of(api, cluster, name: str) -> dict:
    """What a running pod's network is, in the kernel's words: eth0's address, MAC, MTU,
    parent (the node's netns and ifindex there), and its rates (egress, ingress)."""
    p = pod(api, name)
    assert p is not None and p["status"]["phase"] == "Running", name
    uid = p["metadata"]["uid"]
    eth0 = kernel_eth0(uid)
    return {
        "ip": p["status"]["podIP"],
        "ipv4": eth0["ipv4"],
        "mac": eth0["mac"],
        "mtu": eth0["mtu"],
        "parent": eth0_parent(uid),
        "rates": kernel_rates(uid),
    }


def held(cluster, node: str) -> dict:
    """A node's books without what changes by itself (the time of a status write)."""
    b = books(cluster, node)
    return {
        "attachments": sorted(
            (a["podUID"], a["device"], a["shareID"], str(a["consumedCapacity"])) for a in b["attachments"]
        ),
        "preparedClaims": sorted(c["uid"] for c in b["preparedClaims"]),
        "devices": {d["name"]: d["consumed"] for d in b["devices"]},
    }


def serving(sock) -> bool:
    """Whether anything accepts connections on the unix socket ``sock``."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(sock))
        except OSError:
            return False
    return True


def spread_pods(api, cluster, prefix: str, per_node: int, bandwidth: str = "1G") -> list[str]:
    make_template(api, f"nic-{bandwidth.lower()}", bandwidth)
    names = []
    for n in cluster.NODES:
        for i in range(per_node):
            name = f"{prefix}-{n.index}-{i}"
            make_pod(api, cluster, name, template=f"nic-{bandwidth.lower()}", node=n.name)
            names.append(name)
    for name in names:
        check_attached(api, cluster, name, bandwidth)
    return names


# -- scenarios -----------------------------------------------------------------------------


def test_helm_install_runs_one_agent_pod_per_node_each_publishing_its_own_slice(api, cluster):
    """``helm install`` (done by the bed): the release is deployed; the DaemonSet runs one
    Ready agent pod on each node, unprivileged with the chart's four capabilities and the
    pod's own token; each node's slice is published by the agent pod on that node (its log
    names that slice, never the other node's) with that node's two NICs; each node's
    /opt/cni/bin holds the plugin the init container installed, and its conflist is the
    chart's, on that node's own pod subnet."""
    status = cluster.helm("status", cluster.RELEASE, "-n", cluster.RELEASE_NS, "-o", "json").stdout
    import json

    assert json.loads(status)["info"]["status"] == "deployed"
    # (the DaemonSet tolerates every taint: the differential module's kubelet-less Nodes get
    # a pod each until they are deleted, and the count settles after)
    wait_for(lambda: rolled_out(api, cluster), "the DaemonSet: one Ready pod on each of the two nodes", 120)
    subnets = set()
    for n in cluster.NODES:
        (agent,) = [q for q in cluster.agent_pods(api, n.name) if q.metadata.deletion_timestamp is None]
        assert cluster.pod_ready(agent)
        assert agent.spec.host_network and agent.spec.host_pid and agent.spec.automount_service_account_token
        (c,) = agent.spec.containers
        assert not c.security_context.privileged and c.security_context.capabilities.add == AGENT_CAPS
        log = cluster.agent_log(n)
        assert f"published slice {n.name}-{cluster.DRIVER} " in log
        assert not [m for m in cluster.NODES if m is not n and f"slice {m.name}-{cluster.DRIVER}" in log]
        slc = slice_of(api, cluster, n.name)
        assert slc is not None and slc["spec"]["nodeName"] == n.name
        assert sorted(d["name"] for d in slc["spec"]["devices"]) == sorted(cluster.NICS)
        binary = n.host_path("/opt/cni/bin/cni-dra")
        assert binary.is_file() and (n.host_path("/opt/cni/bin/cni-dra.d")).is_dir()
        conf = cluster.conflist(n.name)
        (entry,) = conf["plugins"]
        assert (conf["name"], entry["type"]) == (cluster.NETWORK, "cni-dra")
        ((rng,),) = entry["ipam"]["ranges"]
        assert rng["subnet"] == n.pod_subnet
        subnets.add(rng["subnet"])
    assert len(subnets) == len(cluster.NODES)


def test_agent_pod_deleted_pods_keep_their_network_and_the_hosts_fallback_serves_meanwhile(api, cluster):
    """``kubectl delete pod`` of node A's agent while a pod with a claim runs there, with
    the image withheld from A's containerd (as a registry outage would), so that the
    DaemonSet's new pod cannot start: the running pod keeps its eth0 and share; a new pod
    without a claim starts anyway, its ADD run by the plugin the chart installed in the
    node's /opt/cni/bin, in-process (no agent, no socket); once the image is back the new
    agent pod is Ready, publishes the slice again, and a new pod with a claim runs; the
    books match the scheduler's allocations throughout."""
    node = cluster.node()
    bins = cluster.binaries()
    ctr = [f"{bins['containerd_bin']}/ctr", "-n", "k8s.io"]
    make_template(api, "nic-2g", "2G")
    make_pod(api, cluster, "pod-keep", template="nic-2g")
    p, _, res = check_attached(api, cluster, "pod-keep", "2G")
    before = network_of(api, cluster, "pod-keep")
    old = cluster.agent_pod(api, node.name)
    image = old.spec.containers[0].image
    node.run(*ctr, "images", "rm", image)
    try:
        core(api).delete_namespaced_pod(old.metadata.name, cluster.RELEASE_NS)
        wait_for(
            lambda: old.metadata.uid not in {q.metadata.uid for q in cluster.agent_pods(api, node.name)},
            "the old agent pod gone",
            60,
        )
        new = wait_for(lambda: cluster.agent_pods(api, node.name), "the DaemonSet's new agent pod", 30)[-1]
        assert new.metadata.uid != old.metadata.uid and not cluster.pod_ready(new)
        assert not serving(node.host_path("/run/cni-dra/agent.sock")), "something serves the fast path"
        # the fallback: a pod without a claim needs no agent (nothing to prepare)
        make_pod(api, cluster, "pod-fallback")
        fb = wait_running(api, "pod-fallback")
        assert cluster.agent_pod(api, node.name) is None, "an agent came back before the ADD"
        (att,) = [a for a in books(cluster)["attachments"] if a["podUID"] == fb["metadata"]["uid"]]
        assert att["ifname"] == "eth0" and kernel_eth0(fb["metadata"]["uid"])
        assert network_of(api, cluster, "pod-keep") == before
        assert on_nic(cluster, p["metadata"]["uid"], node.name, res["device"])
    finally:
        cluster.load_image(cluster.image_archive(image.rsplit(":", 1)[1]))
    # the image is back: the kubelet's next try (or a fresh pod) starts it
    for q in cluster.agent_pods(api, node.name):
        if not cluster.pod_ready(q):
            core(api).delete_namespaced_pod(q.metadata.name, cluster.RELEASE_NS, grace_period_seconds=0)
    wait_for(lambda: cluster.agents_ready(api), "the new agent pod Ready and its slice published", 120)
    make_pod(api, cluster, "pod-after")
    make_pod(api, cluster, "pod-after-claim", template="nic-2g")
    check_attached(api, cluster, "pod-after-claim", "2G")
    wait_running(api, "pod-after")
    assert network_of(api, cluster, "pod-keep") == before
    # the books: claim-mode shares equal the scheduler's, plus the 1G default of each
    # claim-less pod (which the scheduler does not see)
    wait_for(lambda: len(books(cluster)["attachments"]) == 4, "four attachments", 30)
    delete_pods(api, "pod-fallback", "pod-after")
    wait_for(lambda: books_match(api, cluster), "books == the scheduler's allocations", 30)


def test_helm_upgrade_to_a_second_image_keeps_every_pods_network_and_the_books(api, cluster):
    """``helm upgrade --set image.tag=<v2>`` (the same tree built with another version
    label, imported into both nodes) while four pods with claims run on each node: the
    DaemonSet rolls one node at a time; no pod loses its eth0, its address, MAC or its
    shaping (the kernel's rates); each node's books after equal those before; pods created
    during the rollout (one per node) run with their shares; the new pods run the new image."""
    names = spread_pods(api, cluster, "pod-up", 4)
    before = {name: network_of(api, cluster, name) for name in names}
    books_before = {n.name: held(cluster, n.name) for n in cluster.NODES}
    version = "0.1.1"
    archive = cluster.image_archive(version)
    cluster.load_image(archive)
    image = f"{cluster.IMAGE}:{version}"
    t0 = time.monotonic()
    cluster.helm_install("--set", f"image.tag={version}", verb="upgrade")
    during = []
    for n in cluster.NODES:
        name = f"pod-roll-{n.index}"
        make_pod(api, cluster, name, template="nic-1g", node=n.name)
        during.append(name)
    wait_for(lambda: rolled_out(api, cluster, image), f"the DaemonSet rolled out to {image}", 240)
    print(f"\ne2e helm upgrade: rolled out in {time.monotonic() - t0:.0f}s")
    for name in during:
        check_attached(api, cluster, name, "1G")
    assert {name: network_of(api, cluster, name) for name in names} == before
    delete_pods(api, *during)
    wait_for(
        lambda: {n.name: held(cluster, n.name) for n in cluster.NODES} == books_before,
        "books after the upgrade == before",
        60,
    )
    for n in cluster.NODES:
        assert books_match(api, cluster, n.name)
        log = cluster.agent_log(n)
        assert f"published slice {n.name}-{cluster.DRIVER} " in log


def test_helm_uninstall_leaves_the_nodes_files_and_a_reinstall_charges_nothing_twice(api, cluster):
    """``helm uninstall`` while pods with claims run on both nodes removes what README
    "Install" says (DaemonSet and its pods, ConfigMap, ServiceAccount, ClusterRole and
    binding, admission policy and binding, DeviceClass; the slices go too) and leaves on
    each node the state, the plugin and its tree, the conflist, the inventory; running pods
    keep their network. A later ``helm install`` picks the attachments up: the books are
    those before, each NIC charged once (= the scheduler's allocations), the slices are
    published again, and deleting the pods releases everything."""
    names = spread_pods(api, cluster, "pod-un", 2)
    before = {name: network_of(api, cluster, name) for name in names}
    books_before = {n.name: held(cluster, n.name) for n in cluster.NODES}
    cluster.helm("uninstall", cluster.RELEASE, "-n", cluster.RELEASE_NS)
    rbac = client.RbacAuthorizationV1Api(api)
    adm = client.AdmissionregistrationV1Api(api)
    gone = {
        "DaemonSet": lambda: apps(api).read_namespaced_daemon_set(cluster.RELEASE, cluster.RELEASE_NS),
        "ConfigMap": lambda: core(api).read_namespaced_config_map(
            f"{cluster.RELEASE}-conflist", cluster.RELEASE_NS
        ),
        "ServiceAccount": lambda: core(api).read_namespaced_service_account(
            cluster.RELEASE, cluster.RELEASE_NS
        ),
        "ClusterRole": lambda: rbac.read_cluster_role(cluster.RELEASE),
        "ClusterRoleBinding": lambda: rbac.read_cluster_role_binding(cluster.RELEASE),
        "ValidatingAdmissionPolicy": lambda: adm.read_validating_admission_policy(
            f"{cluster.RELEASE}-resourceslices"
        ),
        "ValidatingAdmissionPolicyBinding": lambda: adm.read_validating_admission_policy_binding(
            f"{cluster.RELEASE}-resourceslices"
        ),
        "DeviceClass": lambda: resource(api).read_device_class("cni-dra-shared-nic"),
    }

    def absent(read) -> bool:
        try:
            read()
        except ApiException as exc:
            return exc.status == 404
        return False

    for kind, read in gone.items():
        wait_for(lambda read=read: absent(read), f"{kind} removed by helm uninstall", 30)
    wait_for(lambda: not cluster.agent_pods(api), "the agent pods gone", 60)
    for n in cluster.NODES:
        wait_for(lambda n=n: slice_of(api, cluster, n.name) is None, f"{n.name}'s slice removed", 60)
        for path in (
            "/opt/cni/bin/cni-dra",
            "/opt/cni/bin/cni-dra.d",
            cluster.CONFLIST,
            "/etc/cni-dra/resourceslice.yaml",
            "/var/lib/cni-dra/state.json",
            "/run/cni-dra",
        ):
            assert n.host_path(path).exists(), f"{n.name}: {path} removed by helm uninstall"
        assert held(cluster, n.name) == books_before[n.name]
    assert {name: network_of(api, cluster, name) for name in names} == before
    cluster.helm_install()
    wait_for(lambda: cluster.agents_ready(api), "agents Ready after the new install", 180)
    for n in cluster.NODES:
        wait_for(lambda n=n: held(cluster, n.name) == books_before[n.name], f"{n.name}: books as before", 30)
        assert books_match(api, cluster, n.name), f"{n.name}: charged twice?"
    assert {name: network_of(api, cluster, name) for name in names} == before
    delete_pods(api, *names)
    for n in cluster.NODES:
        wait_for(lambda n=n: not books(cluster, n.name)["attachments"], f"{n.name}: released", 60)


@pytest.fixture(autouse=True)
def _chart_installed(api, cluster):
    """Each scenario ends with the chart installed and both agents Ready (the next one
    depends on it), whatever happened."""
    yield
    if cluster.helm("status", cluster.RELEASE, "-n", cluster.RELEASE_NS, check=False).returncode != 0:
        cluster.helm_install()
    wait_for(lambda: cluster.agents_ready(api), "both agents Ready", 180)
