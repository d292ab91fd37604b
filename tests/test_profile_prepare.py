"""Device profiles are validated before the sandbox: prepare (``cni-dra claims prepare`` and
the kubelet plugin's NodePrepareResources) refuses a claim whose profile does not validate or
breaks the node's limits, with a message naming the claim, request, field and limit and the
state left as it was; a prepared claim's results carry their checked profile, decoded once."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from cni_dra.agent.driver import ClaimDriver
from cni_dra.cli import cli
from cni_dra.dra.inventory import load_inventory
from cni_dra.errors import InvalidConfigError
from cni_dra.k8s.api import KubeApi
from cni_dra.k8s.kubelet_plugin import KubeletPlugin
from cni_dra.k8s.protos import load
from cni_dra.protocol.profile import InterfaceProfile, ProfileLimits, ShapingProfile
from cni_dra.state import StateStore
from cni_dra.state.preparing import prepare_claim
from tests.builders import DRIVER, allocation_result, profile_config, resource_claim
from tests.k8s_apiserver import FakeApiServer, allocated_claim, inventory_doc

SHARE = "6f1d7a62-3b0e-4b7e-9a51-0c7b3d0e2f11"
OPEN = ProfileLimits(allowMac=True, allowShapingOff=True)


def claim(*config, uid="u-1", name="web", results=None):
    results = results or [
        allocation_result("nic-a", request="net1", consumed={"bandwidth": "1G"}, share_id=SHARE)
    ]
    return resource_claim(*results, uid=uid, name=name, namespace="prod", config=list(config))


def state_files(state_dir: Path) -> dict[str, bytes]:
    return (
        {p.name: p.read_bytes() for p in sorted(state_dir.iterdir()) if p.name != "state.lock"}
        if state_dir.exists()
        else {}
    )


@pytest.fixture
def state_dir(tmp_path):
    """A state that already holds one prepared claim (so 'unchanged' is not just 'empty')."""
    d = tmp_path / "state"
    assert prepare_claim(str(d), "pod-0", claim(uid="u-0", name="first"))
    return d


# -- the library path both prepares take ------------------------------------------------------
def test_prepare_stores_the_claim_and_its_results_carry_the_profile(state_dir):
    c = claim(
        profile_config("FromClass", linkType="ipvlan", mode="l3"),
        profile_config("FromClaim", requests=["net1"], mtu=9000, shaping={"egressBurstBytes": 262144}),
    )
    assert prepare_claim(str(state_dir), "pod-1", c, driver=DRIVER, limits=ProfileLimits(maxMtu=9000))
    (prepared,) = StateStore(str(state_dir)).read().prepared("pod-1")
    (res,) = prepared.results
    assert res.profile == InterfaceProfile(
        linkType="ipvlan", mode="l3", mtu=9000, shaping=ShapingProfile(egressBurstBytes=262144)
    )
    assert res.profileError is None
    # stored as the API server returned it: the profile is decoded from its config
    assert StateStore(str(state_dir)).read().claims["pod-1"][0] == c


def test_a_result_without_config_has_no_profile(state_dir):
    (prepared,) = StateStore(str(state_dir)).read().prepared("pod-0")
    assert [(r.profile, r.profileError) for r in prepared.results] == [(None, None)]


@pytest.mark.parametrize(
    ("config", "limits", "words"),
    [
        (
            [profile_config(requests=["net1"], mtu=9000)],
            ProfileLimits(maxMtu=1500),
            "failed to prepare claim prod/web request 'net1': mtu 9000 is above this node's limit "
            "(profiles.maxMtu: 1500), asked by config[0] (FromClaim, requests net1)",
        ),
        (
            [profile_config("FromClass", linkType="ipvlan", mode="l3")],
            ProfileLimits(allowedLinkTypes=("macvlan",)),
            "failed to prepare claim prod/web request 'net1': linkType ipvlan is not allowed on this node "
            "(profiles.allowedLinkTypes: macvlan), asked by config[0] (FromClass)",
        ),
        (
            [profile_config(linkType="macvlan", mac="02:00:00:00:00:01")],
            ProfileLimits(),
            "mac 02:00:00:00:00:01 is fixed, which this node does not allow (profiles.allowMac: false)",
        ),
        (
            [profile_config(shaping={"enabled": False})],
            ProfileLimits(),
            "shaping.enabled false is not allowed on this node (profiles.allowShapingOff: false)",
        ),
        (
            [profile_config(master="eth0")],
            OPEN,
            "failed to prepare claim prod/web: config[0] (FromClaim): unknown field 'master' "
            "(the parent NIC is the allocated device: a profile cannot name it)",
        ),
        ([profile_config(mode="l3")], OPEN, "mode set without linkType"),
        ([profile_config(linkType="macvlan", mode="passthru")], OPEN, "'passthru' takes the whole NIC"),
        (
            [{**profile_config(), "opaque": {"driver": DRIVER, "parameters": {"kind": "InterfaceConfig"}}}],
            OPEN,
            "apiVersion: Field required",
        ),
    ],
)
def test_prepare_refuses_a_bad_or_forbidden_profile_and_writes_nothing(state_dir, config, limits, words):
    before = state_files(state_dir)
    with pytest.raises(InvalidConfigError) as exc:
        prepare_claim(str(state_dir), "pod-1", claim(*config), driver=DRIVER, limits=limits)
    assert exc.value.code == 7
    assert words in exc.value.msg
    assert state_files(state_dir) == before
    assert "pod-1" not in StateStore(str(state_dir)).read().claims


def test_a_repeated_prepare_with_a_now_bad_profile_keeps_the_stored_copy(state_dir):
    good = claim(profile_config(mtu=1500))
    prepare_claim(str(state_dir), "pod-1", good)
    before = state_files(state_dir)
    with pytest.raises(InvalidConfigError):
        prepare_claim(
            str(state_dir), "pod-1", claim(profile_config(mtu=9000)), limits=ProfileLimits(maxMtu=1500)
        )
    assert state_files(state_dir) == before


def test_only_this_drivers_config_and_results_are_checked(state_dir):
    c = claim(
        profile_config(driver="gpu.example.com", mtu=1),  # not ours: not even parsed
        results=[
            allocation_result("gpu-0", request="gpu", driver="gpu.example.com"),
            allocation_result("nic-a", request="net1", share_id=SHARE),
        ],
    )
    assert prepare_claim(str(state_dir), "pod-1", c, driver=DRIVER)
    # another driver name for cni-dra: its config is the one checked
    with pytest.raises(InvalidConfigError, match="mtu: Input should be greater"):
        prepare_claim(
            str(state_dir),
            "pod-2",
            claim(
                profile_config(driver="net.example.org", mtu=1),
                results=[allocation_result("nic-a", request="net1", driver="net.example.org")],
            ),
            driver="net.example.org",
        )


def test_a_stored_claim_with_a_bad_profile_decodes_with_its_error(tmp_path):
    """A claim stored without the check (an older cni-dra) is read, not refused: its
    result says why it has no profile, and ADD can refuse that result."""
    d = str(tmp_path / "state")
    with StateStore(d).transaction() as txn:
        txn.set_claims("pod-1", [claim(profile_config(mtu="jumbo"), profile_config(driver="other", x=1))])
    (prepared,) = StateStore(d).read().prepared("pod-1")
    (res,) = prepared.results
    assert res.profile is None
    assert res.profileError == 'config[0] (FromClaim): mtu: Input should be a valid integer, not "jumbo"'
    assert str(res.consumedCapacity["bandwidth"]) == "1G" and res.shareID == SHARE


# -- cni-dra claims prepare ------------------------------------------------------------------
@pytest.fixture
def cli_env(tmp_path, state_dir):
    inv = tmp_path / "slice.yaml"
    inv.write_text(yaml.safe_dump(inventory_doc("n", {"nic-a": "ens1"}, driver=DRIVER)))
    return {"CNI_DRA_STATE_DIR": str(state_dir), "CNI_DRA_INVENTORY": str(inv)}


def _conflist(tmp_path, profiles) -> str:
    path = tmp_path / "10-cni-dra.conflist"
    path.write_text(
        json.dumps(
            {"cniVersion": "1.1.0", "name": "dra-net", "plugins": [{"type": "cni-dra", "profiles": profiles}]}
        )
    )
    return str(path)


def _cli_claim(tmp_path, *config) -> str:
    c = claim(*config, results=[allocation_result("nic-a", request="net1", pool="n", share_id=SHARE)])
    path = tmp_path / "claim.json"
    path.write_text(json.dumps(c))
    return str(path)


def test_cli_prepare_reads_the_limits_from_the_conflist(tmp_path, cli_env, state_dir):
    f = _cli_claim(tmp_path, profile_config(mtu=9000))
    conflist = _conflist(tmp_path, {"maxMtu": 1500})
    before = state_files(state_dir)
    r = CliRunner().invoke(
        cli, ["claims", "prepare", "--pod-uid", "pod-1", "--conflist", conflist, f], env=cli_env
    )
    assert r.exit_code == 1
    assert r.output.strip() == (
        "InvalidConfigError: failed to prepare claim prod/web request 'net1': mtu 9000 is above "
        "this node's limit (profiles.maxMtu: 1500), asked by config[0] (FromClaim)"
    )
    assert state_files(state_dir) == before
    ok = CliRunner().invoke(
        cli,
        ["claims", "prepare", "--pod-uid", "pod-1", f],
        env={**cli_env, "CNI_DRA_CONFLIST": _conflist(tmp_path, {"maxMtu": 9000})},
    )
    assert ok.exit_code == 0, ok.output
    (prepared,) = StateStore(str(state_dir)).read().prepared("pod-1")
    assert prepared.results[0].profile == InterfaceProfile(mtu=9000)


def test_cli_prepare_refuses_bad_limits(tmp_path, cli_env):
    r = CliRunner().invoke(
        cli,
        [
            "claims",
            "prepare",
            "--pod-uid",
            "pod-1",
            "--conflist",
            _conflist(tmp_path, {"maxMTU": 9000}),
            _cli_claim(tmp_path),
        ],
        env=cli_env,
    )
    assert r.exit_code == 1
    assert "InvalidConfigError: invalid network config" in r.output and "unknown field 'maxMTU'" in r.output


# -- the kubelet plugin: NodePrepareResources -------------------------------------------------
@pytest.fixture
def kubelet(tmp_path):
    short = tempfile.mkdtemp(prefix="cdp", dir="/tmp")  # unix socket paths are short (108 bytes)
    inv_path = f"{short}/inventory.yaml"
    with open(inv_path, "w") as fh:
        yaml.safe_dump(inventory_doc("node-1", {"eth-a": "ens1"}), fh)
    conflist = _conflist(tmp_path, {"maxMtu": 1500, "allowedLinkTypes": ["macvlan"]})
    with FakeApiServer() as server:
        api = KubeApi.from_config(host=server.url)
        driver = ClaimDriver(
            api,
            state_dir=f"{short}/state",
            driver_name=DRIVER,
            inventory=lambda: load_inventory(inv_path),
            limits=lambda: load_limits_of(conflist),
        )
        plugin = KubeletPlugin(
            DRIVER, driver, plugin_dir=f"{short}/plugins/{DRIVER}", registry_dir=f"{short}/reg"
        )
        plugin.start()
        try:
            yield server, plugin, Path(f"{short}/state")
        finally:
            plugin.stop()
            api.close()
            shutil.rmtree(short)


def load_limits_of(path: str) -> ProfileLimits:
    from cni_dra.protocol.profile import load_limits

    return load_limits([path])


def node_prepare(plugin, claims):
    import grpc

    pb2, services = load("dra_v1")
    with grpc.insecure_channel(f"unix://{plugin.dra_socket}") as ch:
        return services.DRAPluginStub(ch).NodePrepareResources(
            pb2.NodePrepareResourcesRequest(
                claims=[
                    pb2.Claim(
                        namespace=c["metadata"]["namespace"],
                        uid=c["metadata"]["uid"],
                        name=c["metadata"]["name"],
                    )
                    for c in claims
                ]
            ),
            timeout=10,
        )


def with_config(c, *config):
    c["status"]["allocation"]["devices"]["config"] = list(config)
    return c


def test_node_prepare_fails_only_the_claim_with_a_forbidden_profile(kubelet):
    server, plugin, state_dir = kubelet
    good = server.add_claim(
        with_config(
            allocated_claim(
                "good", pool="node-1", device="eth-a", bandwidth="1G", share_id=SHARE, pod_uids=["pod-a"]
            ),
            profile_config("FromClaim", mtu=1500),
        )
    )
    jumbo = server.add_claim(
        with_config(
            allocated_claim(
                "jumbo",
                pool="node-1",
                device="eth-a",
                bandwidth="1G",
                share_id="0f1d7a62-3b0e-4b7e-9a51-0c7b3d0e2f12",
                pod_uids=["pod-b"],
            ),
            profile_config("FromClass", linkType="ipvlan", mode="l3"),
            profile_config("FromClaim", mtu=9000),
        )
    )
    resp = node_prepare(plugin, [good, jumbo])
    assert resp.claims[good["metadata"]["uid"]].error == ""
    bad = resp.claims[jumbo["metadata"]["uid"]]
    assert list(bad.devices) == []
    assert bad.error == (
        "InvalidConfigError (CNI code 7): failed to prepare claim default/jumbo request 'net1': linkType ipvlan is "
        "not allowed on this node (profiles.allowedLinkTypes: macvlan), asked by config[0] (FromClass); mtu 9000 "
        "is above this node's limit (profiles.maxMtu: 1500), asked by config[1] (FromClaim)"
    )
    state = StateStore(str(state_dir)).read()
    assert sorted(state.claims) == ["pod-a"]
    assert state.prepared("pod-a")[0].results[0].profile == InterfaceProfile(mtu=1500)
