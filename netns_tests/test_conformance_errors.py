"""Error paths of the installed cni-dra, each with its specific code (cni_dra.errors) and
nothing left behind. Codes covered elsewhere: 1, 2, 3, 4, 5, 6, 7, 11 (dhcp),
50, 100, 104, 105 in test_conformance.py; 101 in test_plugin.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from netns_tests.bed import SPEC_NODE, NodeBed, links_named
from netns_tests.runner import CNI_PATH, link_in_netns


@pytest.fixture
def bed(make_node) -> NodeBed:
    return make_node(nics=1, **SPEC_NODE)


def _fake_ipam(tmp_path: Path, body: str) -> str:
    """A directory holding an IPAM plugin ``fake-ipam`` (a shell script) for CNI_PATH."""
    d = tmp_path / "fakebin"
    d.mkdir(exist_ok=True)
    exe = d / "fake-ipam"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return f"{d}{os.pathsep}{CNI_PATH}"


_VERSION_REPLY = 'if [ "$CNI_COMMAND" = VERSION ]; then echo \'{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}\'; exit 0; fi\n'


def test_ipam_catch_all_999_becomes_103_and_rolls_back(bed: NodeBed, tmp_path: Path) -> None:
    path = _fake_ipam(
        tmp_path,
        _VERSION_REPLY + "cat >/dev/null\n"
        'if [ "$CNI_COMMAND" = DEL ]; then exit 0; fi\n'
        'echo \'{"cniVersion":"1.0.0","code":999,"msg":"pool exploded"}\'; exit 1\n',
    )
    netns = bed.make_netns()
    conf = bed.spec_conf("1.0.0", {"type": "fake-ipam"})
    code, out, err = bed.run("ADD", conf, netns, cid="c1", cni_path=path)
    assert code == 1 and out["code"] == 103, (out, err)
    assert "pool exploded" in out["msg"]
    assert [n for n, _ in links_named(netns)] == ["lo"]  # the link made before IPAM is gone
    assert bed.attachments() == []


def test_ipam_catch_all_on_del_is_103_and_del_can_be_retried(bed: NodeBed, tmp_path: Path) -> None:
    fail_flag = tmp_path / "fail-del"
    path = _fake_ipam(
        tmp_path,
        _VERSION_REPLY + "cat >/dev/null\n"
        f'if [ "$CNI_COMMAND" = DEL ] && [ -e {fail_flag} ]; then '
        'echo \'{"cniVersion":"1.0.0","code":999,"msg":"db locked"}\'; exit 1; fi\n'
        'if [ "$CNI_COMMAND" = ADD ]; then echo \'{"cniVersion":"1.0.0","ips":[{"address":"198.51.100.5/24"}]}\'; fi\n'
        "exit 0\n",
    )
    netns = bed.make_netns()
    conf = bed.spec_conf("1.0.0", {"type": "fake-ipam"})
    assert bed.run("ADD", conf, netns, cid="c1", cni_path=path)[0] == 0
    fail_flag.touch()
    code, out, err = bed.run("DEL", conf, netns, cid="c1", cni_path=path)
    assert code == 1 and out["code"] == 103 and "db locked" in out["msg"], (out, err)
    assert bed.attachments() == [("c1", "eth0")]  # capacity is released last, after IPAM
    fail_flag.unlink()
    assert bed.run("DEL", conf, netns, cid="c1", cni_path=path)[0] == 0
    assert bed.attachments() == []


def test_ipam_result_without_ips_is_103(bed: NodeBed, tmp_path: Path) -> None:
    path = _fake_ipam(
        tmp_path,
        _VERSION_REPLY + "cat >/dev/null\n"
        'if [ "$CNI_COMMAND" = ADD ]; then echo \'{"cniVersion":"1.0.0"}\'; fi\nexit 0\n',
    )
    netns = bed.make_netns()
    code, out, err = bed.run(
        "ADD", bed.spec_conf("1.0.0", {"type": "fake-ipam"}), netns, cid="c1", cni_path=path
    )
    assert code == 1 and out["code"] == 103 and "no IP address" in out["msg"], (out, err)
    assert link_in_netns(netns, "eth0") is None and bed.attachments() == []


def test_ipam_plugin_missing_is_code_7(bed: NodeBed) -> None:
    netns = bed.make_netns()
    code, out, err = bed.run("ADD", bed.spec_conf("1.0.0", {"type": "no-such-ipam"}), netns, cid="c1")
    assert code == 1 and out["code"] == 7 and "no-such-ipam" in out["msg"], (out, err)
    assert link_in_netns(netns, "eth0") is None and bed.attachments() == []


def test_gc_continues_past_a_failing_release_and_reports_it(bed: NodeBed, tmp_path: Path) -> None:
    """IPAM DEL fails for c2 only: GC still releases c1 and c3, keeps c2 (its release
    failed, so it must be retried), and answers with the failure's code."""
    path = _fake_ipam(
        tmp_path,
        _VERSION_REPLY + "cat >/dev/null\n"
        'case "$CNI_COMMAND" in\n'
        ' ADD) n=$(printf %s "$CNI_CONTAINERID" | tr -dc 0-9); '
        'echo "{\\"cniVersion\\":\\"1.0.0\\",\\"ips\\":[{\\"address\\":\\"198.51.100.$n/24\\"}]}";;\n'
        ' DEL) if [ "$CNI_CONTAINERID" = c2 ]; then '
        'echo \'{"cniVersion":"1.0.0","code":11,"msg":"store busy"}\'; exit 1; fi;;\n'
        "esac\nexit 0\n",
    )
    conf = bed.spec_conf("1.1.0", {"type": "fake-ipam"})
    nss = {cid: bed.make_netns() for cid in ("c1", "c2", "c3")}
    for cid, ns in nss.items():
        code, out, err = bed.run("ADD", conf, ns, cid=cid, cni_path=path)
        assert code == 0, (out, err)
    bed.age_attachments()
    code, out, err = bed.run("GC", {**conf, "cni.dev/valid-attachments": []}, cni_path=path)
    assert code == 1 and out["code"] == 11, (out, err)
    assert "c2" in out["msg"] and "store busy" in out["msg"]
    assert bed.attachments() == [("c2", "eth0")]
    assert link_in_netns(nss["c1"], "eth0") is None and link_in_netns(nss["c3"], "eth0") is None


def test_add_in_progress_is_code_11(bed: NodeBed) -> None:
    """An attachment recorded as ``adding`` (another ADD holds it) makes a second ADD of
    the same key answer "try again later"."""
    netns = bed.make_netns()
    conf = bed.spec_conf("1.1.0", "l2")
    assert bed.run("ADD", conf, netns, cid="c1")[0] == 0
    from cni_dra.state import StateStore, Txn
    from cni_dra.state.store import current_owner, encode_state

    state_file = bed.state_dir / "state.json"
    state = StateStore(bed.state_dir).read_files()  # snapshot + journal; written back as a snapshot
    txn = Txn(state)  # on a copy of the state read
    txn.update(state.attachments[0], phase="adding", owner=current_owner())  # a live process holds the intent
    state_file.write_bytes(encode_state(txn.state))
    code, out, err = bed.run("ADD", conf, netns, cid="c1")
    assert code == 1 and out["code"] == 11, (out, err)
    assert "in progress" in out["msg"]


def test_ipv6_dad_wait_is_bounded_and_rolls_back(bed: NodeBed) -> None:
    """DAD that cannot finish in ``dadTimeoutSeconds``: ADD fails (102) naming the
    tentative address, and releases link, IP and capacity."""
    netns = bed.make_netns()
    name = netns.rsplit("/", 1)[1]
    subprocess.run(
        ["ip", "netns", "exec", name, "sh", "-c", "echo 30 > /proc/sys/net/ipv6/conf/default/dad_transmits"],
        check=True,
    )
    conf = bed.spec_conf("1.1.0", "host-local-v6", dadTimeoutSeconds=1)
    code, out, err = bed.run("ADD", conf, netns, cid="c1")
    assert code == 1 and out["code"] == 102, (out, err)
    assert "tentative" in out["msg"]
    assert [n for n, _ in links_named(netns)] == ["lo"]
    assert bed.attachments() == [] and bed.ipam_reservations() == []


def test_ipvlan_on_a_kernel_without_it_is_102_and_leaves_nothing(bed: NodeBed) -> None:
    from cni_dra.netlink.sublink import link_kind_supported

    if link_kind_supported("ipvlan"):
        pytest.skip("this kernel has ipvlan (test_ipvlan.py covers it)")
    netns = bed.make_netns()
    code, out, err = bed.run(
        "ADD", bed.spec_conf("1.1.0", "host-local-v4", linkType="ipvlan"), netns, cid="c1"
    )
    assert code == 1 and out["code"] == 102, (out, err)
    assert "does not support link kind ipvlan" in out["msg"]
    assert [n for n, _ in links_named(netns)] == ["lo"]
    assert bed.attachments() == [] and bed.ipam_reservations() == []
    assert bed.status()["devices"][0]["consumed"]["bandwidth"] == "0"


# --------------------------------------------------------------------------- STATUS and GC forwarded to IPAM

_V11_REPLY = 'if [ "$CNI_COMMAND" = VERSION ]; then echo \'{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}\'; exit 0; fi\n'


def test_status_forwards_the_ipam_plugins_answer(bed: NodeBed, tmp_path: Path) -> None:
    path = _fake_ipam(
        tmp_path,
        _V11_REPLY + "cat >/dev/null\n"
        'if [ "$CNI_COMMAND" = STATUS ]; then '
        'echo \'{"cniVersion":"1.1.0","code":51,"msg":"pool nearly empty"}\'; exit 1; fi\nexit 0\n',
    )
    code, out, err = bed.run("STATUS", bed.spec_conf("1.1.0", {"type": "fake-ipam"}), cni_path=path)
    assert code == 1 and out["code"] == 51 and "pool nearly empty" in out["msg"], (out, err)


def test_gc_is_forwarded_to_ipam_with_the_valid_list(bed: NodeBed, tmp_path: Path) -> None:
    seen = tmp_path / "gc-stdin.json"
    path = _fake_ipam(
        tmp_path,
        _V11_REPLY + f'if [ "$CNI_COMMAND" = GC ]; then cat > {seen}; else cat >/dev/null; fi\nexit 0\n',
    )
    valid = [{"containerID": "keep", "ifname": "eth0"}]
    code, out, err = bed.run(
        "GC",
        {**bed.spec_conf("1.1.0", {"type": "fake-ipam"}), "cni.dev/valid-attachments": valid},
        cni_path=path,
    )
    assert code == 0, (out, err)
    assert json.loads(seen.read_text())["cni.dev/valid-attachments"] == valid


# --------------------------------------------------------------------------- CNI_ARGS through the executable


@pytest.mark.parametrize(
    "args,code",
    [
        (b"IgnoreUnknown=1;K8S_POD_NAME=\xff\xfe", 4),  # not UTF-8
        (b"IgnoreUnknown=1;K8S_POD_NAME=" + b"x" * 5000, 4),  # over the size limit
        (b"K8S_POD_NAME=p;NOT_KNOWN=1", 2),  # unknown key without IgnoreUnknown
        (b"IgnoreUnknown=maybe", 4),
        (b"novalue", 4),
    ],
)
def test_bad_cni_args_codes(bed: NodeBed, args: bytes, code: int) -> None:
    netns = bed.make_netns()
    rc, out, err = bed.run(
        "ADD", bed.spec_conf("1.1.0", "l2"), netns, cid="c1", cni_args=None, extra_env={"CNI_ARGS": args}
    )
    assert rc == 1 and out["code"] == code, (out, err)
    if code == 2:
        assert "NOT_KNOWN" in out["msg"]
    assert link_in_netns(netns, "eth0") is None


def test_cni_args_empty_segments_and_first_equals(bed: NodeBed) -> None:
    netns = bed.make_netns()
    args = ";IgnoreUnknown=true;;K8S_POD_NAME=a=b;;MAC=c2:11:22:33:44:88;X=;"
    rc, out, err = bed.run("ADD", bed.spec_conf("1.1.0", "l2"), netns, cid="c1", cni_args=args)
    assert rc == 0, (out, err)
    assert link_in_netns(netns, "eth0")["mac"] == "c2:11:22:33:44:88"
    from cni_dra.state import StateStore

    recorded = StateStore(bed.state_dir).read_files().model_dump(mode="json")["attachments"][0]
    assert recorded["podName"] == "a=b"  # split at the first '=' only


def test_status_is_50_when_no_inventory_nic_exists(bed: NodeBed) -> None:
    from netns_tests.conftest import delete_host_link

    conf = bed.spec_conf("1.1.0", "host-local-v4")
    assert bed.run("STATUS", conf)[0] == 0
    delete_host_link(bed.nics[0])
    code, out, err = bed.run("STATUS", conf)
    assert code == 1 and out["code"] == 50 and bed.nics[0] in out["msg"], (out, err)
