"""Operator CLI: status (text and JSON), claims prepare/unprepare (idempotent), error shape."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cni_dra.cli import cli
from cni_dra.quantity import Quantity
from cni_dra.state import Attachment, StateStore
from tests.builders import attachment

SLICE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceSlice",
    "metadata": {"name": "n"},
    "spec": {
        "driver": "net.cni-dra.dev",
        "nodeName": "n",
        "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
        "devices": [
            {
                "name": "eth-a",
                "allowMultipleAllocations": True,
                "attributes": {"ifName": {"string": "eth-a"}},
                "capacity": {"bandwidth": {"value": "10G"}},
            },
            {
                "name": "eth-b",
                "allowMultipleAllocations": True,
                "attributes": {"ifName": {"string": "eth-b"}},
                "capacity": {"bandwidth": {"value": "10G"}},
            },
        ],
    },
}


def _claim(uid: str = "claim-uid-1", device: str = "eth-b", bw: str = "6G") -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "net", "exactly": {"deviceClassName": "x"}}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "net",
                            "driver": "net.cni-dra.dev",
                            "pool": "n",
                            "device": device,
                            "consumedCapacity": {"bandwidth": bw},
                            "shareID": "2f1d3c4e-0000-4000-8000-000000000001",
                        }
                    ]
                }
            }
        },
    }


@pytest.fixture
def env(tmp_path):
    inv = tmp_path / "slice.json"
    inv.write_text(json.dumps(SLICE))
    return {"CNI_DRA_STATE_DIR": str(tmp_path / "state"), "CNI_DRA_INVENTORY": str(inv)}


def _invoke(args, env, input=None):  # noqa: A002 - CliRunner.invoke's name for it
    return CliRunner().invoke(cli, args, env=env, input=input, catch_exceptions=False)


def test_status_json_shape_and_quantities(env, tmp_path):
    with StateStore(env["CNI_DRA_STATE_DIR"]).transaction() as txn:
        txn.put(
            Attachment(
                network="n1",
                containerID="c1",
                ifname="eth0",
                driver="net.cni-dra.dev",
                pool="n",
                device="eth-a",
                parent="eth-a",
                consumedCapacity={"bandwidth": Quantity.parse("4000M")},
                shareID="s1",
                podUID="p1",
                phase="ready",
            )
        )
    r = _invoke(["status", "--json"], env)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["devices"][0] == {
        "name": "eth-a",
        "ifName": "eth-a",
        "capacity": {"bandwidth": "10G"},
        "consumed": {"bandwidth": "4G"},
        "remaining": {"bandwidth": "6G"},
    }
    assert doc["devices"][1]["consumed"] == {"bandwidth": "0"}
    att = doc["attachments"][0]
    assert {
        k: att[k] for k in ("podUID", "containerID", "ifname", "device", "consumedCapacity", "shareID")
    } == {
        "podUID": "p1",
        "containerID": "c1",
        "ifname": "eth0",
        "device": "eth-a",
        "consumedCapacity": {"bandwidth": "4G"},
        "shareID": "s1",
    }
    text = _invoke(["status"], env).output
    assert "eth-a" in text and "bandwidth=6G" in text and "s1" in text


def test_prepare_is_idempotent_and_reserves(env, tmp_path):
    f = tmp_path / "claim.json"
    f.write_text(json.dumps(_claim()))
    r1 = _invoke(["claims", "prepare", "--pod-uid", "pod-1", str(f)], env)
    r2 = _invoke(["claims", "prepare", "--pod-uid", "pod-1", str(f)], env)
    assert r1.exit_code == 0 and r2.exit_code == 0
    assert "already prepared" in r2.output
    state = StateStore(env["CNI_DRA_STATE_DIR"]).read()
    assert len(state.claims["pod-1"]) == 1
    doc = json.loads(_invoke(["status", "--json"], env).output)
    assert doc["devices"][1]["consumed"] == {"bandwidth": "6G"}


def test_prepare_accepts_yaml_on_stdin(env):
    import yaml

    r = _invoke(["claims", "prepare", "--pod-uid", "pod-2", "-"], env, input=yaml.safe_dump(_claim("u2")))
    assert r.exit_code == 0, r.output
    assert StateStore(env["CNI_DRA_STATE_DIR"]).read().claims["pod-2"][0]["metadata"]["uid"] == "u2"


def test_unprepare_is_idempotent(env, tmp_path):
    f = tmp_path / "claim.json"
    f.write_text(json.dumps(_claim()))
    _invoke(["claims", "prepare", "--pod-uid", "pod-1", str(f)], env)
    assert "1 claim(s)" in _invoke(["claims", "unprepare", "--pod-uid", "pod-1"], env).output
    assert "0 claim(s)" in _invoke(["claims", "unprepare", "--pod-uid", "pod-1"], env).output
    assert StateStore(env["CNI_DRA_STATE_DIR"]).read().claims == {}


def test_prepare_refuses_unallocated_claim_with_type_and_message(env, tmp_path):
    c = _claim()
    del c["status"]
    f = tmp_path / "claim.json"
    f.write_text(json.dumps(c))
    r = CliRunner().invoke(cli, ["claims", "prepare", "--pod-uid", "p", str(f)], env=env)
    assert r.exit_code == 1
    assert "InvalidConfigError: failed to prepare claim c: it has no status.allocation" in r.output


def _named(uid: str, name: str, request: str, device: str) -> dict:
    c = _claim(uid, device, "1G")
    c["metadata"]["name"] = name
    (res,) = c["status"]["allocation"]["devices"]["results"]
    res["request"] = c["spec"]["devices"]["requests"][0]["name"] = request
    res["shareID"] = f"2f1d3c4e-0000-4000-8000-00000000000{uid[-1]}"
    return c


def test_prepare_refuses_claims_that_give_one_interface_two_results_and_stores_none(env, tmp_path):
    f = tmp_path / "claims.json"
    f.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "List",
                "items": [_named("u1", "a", "net1", "eth-a"), _named("u2", "b", "net1", "eth-b")],
            }
        )
    )
    r = CliRunner().invoke(cli, ["claims", "prepare", "--pod-uid", "pod-1", str(f)], env=env)
    assert r.exit_code == 1, r.output
    assert (
        "ClaimError: failed to prepare claims ns/a, ns/b for pod pod-1: interface 'net1' would have 2 "
        "allocation results of net.cni-dra.dev to choose from (claim ns/a request 'net1', claim ns/b request "
        "'net1')"
    ) in r.output, r.output
    assert StateStore(env["CNI_DRA_STATE_DIR"]).read().claims == {}
    doc = json.loads(_invoke(["status", "--json"], env).output)
    assert [d["consumed"] for d in doc["devices"]] == [{"bandwidth": "0"}, {"bandwidth": "0"}]


def test_prepare_refuses_a_claim_that_gives_a_held_interface_a_second_result(env, tmp_path):
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    first.write_text(json.dumps(_named("u1", "a", "net1", "eth-a")))
    second.write_text(json.dumps(_named("u2", "b", "net1", "eth-b")))
    assert _invoke(["claims", "prepare", "--pod-uid", "pod-1", str(first)], env).exit_code == 0
    r = CliRunner().invoke(cli, ["claims", "prepare", "--pod-uid", "pod-1", str(second)], env=env)
    assert r.exit_code == 1 and "failed to prepare claim ns/b for pod pod-1: interface 'net1'" in r.output, (
        r.output
    )
    assert [c["metadata"]["name"] for c in StateStore(env["CNI_DRA_STATE_DIR"]).read().claims["pod-1"]] == [
        "a"
    ]
    # another pod may hold it
    assert _invoke(["claims", "prepare", "--pod-uid", "pod-2", str(second)], env).exit_code == 0


def test_prepare_takes_two_claims_whose_requests_name_two_interfaces(env, tmp_path):
    f = tmp_path / "claims.yaml"
    import yaml

    f.write_text(yaml.safe_dump_all([_named("u1", "a", "net1", "eth-a"), _named("u2", "b", "net2", "eth-b")]))
    r = _invoke(["claims", "prepare", "--pod-uid", "pod-1", str(f)], env)
    assert r.exit_code == 0 and r.output.splitlines() == [
        "claim a prepared for pod pod-1",
        "claim b prepared for pod pod-1",
    ], r.output


def test_status_with_unreadable_inventory_fails_cleanly(env):
    env = dict(env, CNI_DRA_INVENTORY="/nonexistent.yaml")
    r = CliRunner().invoke(cli, ["status"], env=env)
    assert r.exit_code == 1 and r.output.startswith("IOFailureError: ")


def _allocate_4g(env, tmp_path, how: str, env_state_dir: str | None = None):
    """Run ``allocate`` for a 4G claim with the state dir given ``how``; eth-a holds 7G of 10G there."""
    with StateStore(env["CNI_DRA_STATE_DIR"]).transaction() as txn:
        txn.put(
            Attachment(
                network="n1",
                containerID="c1",
                ifname="eth0",
                driver="net.cni-dra.dev",
                pool="n",
                device="eth-a",
                parent="eth-a",
                consumedCapacity={"bandwidth": Quantity.parse("7G")},
                shareID="s1",
                phase="ready",
            )
        )
    claim = _claim()
    claim["spec"]["devices"]["requests"][0]["exactly"] = {
        "deviceClassName": "x",
        "capacity": {"requests": {"bandwidth": "4G"}},
    }
    del claim["status"]
    f = tmp_path / "claim.json"
    f.write_text(json.dumps(claim))
    args = ["allocate", "--inventory", env["CNI_DRA_INVENTORY"], "--claim", str(f)]
    run_env = {} if env_state_dir is None else {"CNI_DRA_STATE_DIR": env_state_dir}
    if how == "env":
        run_env = {"CNI_DRA_STATE_DIR": env["CNI_DRA_STATE_DIR"]}
    elif how == "--state-dir=":
        args.append(f"--state-dir={env['CNI_DRA_STATE_DIR']}")
    else:
        args += [how, env["CNI_DRA_STATE_DIR"]]
    return CliRunner().invoke(cli, args, env=run_env)


def _placed_on(r) -> tuple[str, dict]:
    (entry,) = json.loads(r.stdout)
    (result,) = entry["allocation"]["devices"]["results"]
    return result["device"], result["consumedCapacity"]


@pytest.mark.parametrize("how", ["--state-dir", "--state-dir=", "env"])
def test_allocate_sees_what_the_state_consumed(env, tmp_path, how):
    r = _allocate_4g(env, tmp_path, how)
    assert r.exit_code == 0, r.output
    assert r.stderr == ""
    # eth-a has only 3G left in the state, so the 4G request goes to eth-b
    assert _placed_on(r) == ("eth-b", {"bandwidth": "4G"})


def test_allocate_still_takes_the_deprecated_state_option(env, tmp_path):
    r = _allocate_4g(env, tmp_path, "--state")
    assert r.exit_code == 0, r.output
    assert _placed_on(r) == ("eth-b", {"bandwidth": "4G"})
    assert "'state' is deprecated" in r.stderr and "--state-dir" in r.stderr


def test_allocate_deprecated_state_option_beats_the_environment(env, tmp_path):
    r = _allocate_4g(env, tmp_path, "--state", env_state_dir=str(tmp_path / "empty"))
    assert r.exit_code == 0, r.output
    assert _placed_on(r) == ("eth-b", {"bandwidth": "4G"})
    assert not (tmp_path / "empty").exists()


def test_allocate_help_names_state_dir_only(env):
    r = CliRunner().invoke(cli, ["allocate", "--help"], env={})
    assert r.exit_code == 0
    assert "--state-dir" in r.output
    assert "--state " not in r.output and "--state\n" not in r.output


def _commands(group, path=()):
    for name, cmd in group.commands.items():
        yield path + (name,), cmd
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, path + (name,))


def test_every_command_names_the_state_directory_state_dir_with_its_env_twin():
    seen = []
    for path, cmd in _commands(cli):
        for p in cmd.params:
            if p.name == "state_dir":
                seen.append(" ".join(path))
                assert p.opts == ["--state-dir"] and p.envvar == "CNI_DRA_STATE_DIR", path
                assert p.help and "state" in p.help
            visible = [o for o in p.opts if not getattr(p, "hidden", False)]
            assert "--state" not in visible, path
    assert sorted(seen) == [
        "agent",
        "allocate",
        "claims prepare",
        "claims unprepare",
        "state recover",
        "state repair",
        "status",
    ]


@pytest.mark.parametrize("where", ["missing-dir/slice.yaml", "a-directory"])
def test_discover_that_cannot_write_its_output_fails_cleanly_and_leaves_no_temporary_file(tmp_path, where):
    (tmp_path / "a-directory").mkdir()
    devices = tmp_path / "devices.yaml"
    devices.write_text('[{"ifName": "eth-x", "bandwidth": "10G"}]')
    out = tmp_path / where
    r = _invoke(["inventory", "discover", "--devices", str(devices), "--node-name", "n", "-o", str(out)], {})
    assert r.exit_code == 1
    assert r.stderr.startswith(f"IOFailureError: failed to write inventory {out}: "), r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-directory", "devices.yaml"]


@pytest.mark.parametrize("kind", ["regular file", "symlink"])
def test_recover_refuses_a_state_directory_that_status_refuses(env, tmp_path, kind):
    """An operator who names the wrong path learns it from ``state recover`` as from
    ``status``, instead of reading "nothing to do"."""
    if kind == "regular file":
        (tmp_path / "state").write_text("")
    else:
        (tmp_path / "real").mkdir(mode=0o700)
        (tmp_path / "state").symlink_to(tmp_path / "real")
    status = CliRunner().invoke(cli, ["status"], env=env)
    assert status.exit_code == 1
    assert status.stderr.startswith("StateError: failed to use state directory "), status.stderr
    r = CliRunner().invoke(cli, ["state", "recover", "--cni-path", str(tmp_path)], env=env)
    assert (r.exit_code, r.stdout) == (1, "")
    assert r.stderr.splitlines()[0] == status.stderr.splitlines()[0]


def test_status_text_tells_repair_placeholders_apart_by_their_netns(env):
    """``state repair`` charges each untracked link as a placeholder that knows no pod, only
    the namespace it found the link in; the text table shows that namespace, since the
    truncated CONTAINER (``repair-<netns>``) of two such links can be the same."""
    with StateStore(env["CNI_DRA_STATE_DIR"]).transaction() as txn:
        for netns in ("/var/run/netns/cni-1111aaaa", "/var/run/netns/cni-2222bbbb"):
            txn.put(
                attachment(
                    f"repair-{netns.rsplit('/', 1)[-1]}",
                    "eth-a",
                    network="cni-dra-repair",
                    parent="eth-a",
                    netns=netns,
                    consumedCapacity={"bandwidth": Quantity.parse("10G")},
                )
            )
    rows = [line.split() for line in _invoke(["status"], env).output.splitlines()]
    pods = [row[0] for row in rows if "eth-a" in row and "bandwidth=10G" in row and len(row) > 5]
    assert pods == ["/var/run/netns/cni-1111aaaa", "/var/run/netns/cni-2222bbbb"]
