"""Plugin config loading: defaults, validation codes, precedence."""

from __future__ import annotations

import pytest

from cni_dra.errors import DecodeError, IncompatibleVersionError, InvalidConfigError, UnsupportedFieldError
from cni_dra.protocol.config import MAX_CONFIG_BYTES, load_conf
from cni_dra.protocol.env import parse_env
from cni_dra.quantity import Quantity
from tests.builders import cni_env, netconf_bytes


def _raw(**kw) -> bytes:
    return netconf_bytes(**kw)


def _env(args: str = "") -> object:
    return parse_env(cni_env("ADD", args=args))


def test_defaults():
    c = load_conf(_raw())
    assert (c.driver, c.stateDir, c.inventory) == (
        "net.cni-dra.dev",
        "/var/lib/cni-dra",
        "/etc/cni-dra/resourceslice.yaml",
    )
    assert (c.linkType, c.mode, c.selectionPolicy, c.mtu, c.mac) == (
        "macvlan",
        "bridge",
        "best-fit",
        None,
        None,
    )
    assert c.capacity.requests == {}
    assert c.ipam_type is None


def test_capacity_requests_are_quantities():
    c = load_conf(_raw(capacity={"requests": {"bandwidth": "4G"}}))
    assert c.capacity.requests["bandwidth"] == Quantity.parse("4000000000")


@pytest.mark.parametrize("version", ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
def test_accepted_versions(version):
    assert load_conf(_raw(cniVersion=version)).cniVersion == version


@pytest.mark.parametrize(
    ("raw", "err", "code"),
    [
        (b"{not json", DecodeError, 6),
        (b"[1, 2]", DecodeError, 6),
        (b" " * (MAX_CONFIG_BYTES + 1), DecodeError, 6),
        (_raw(cniVersion="9.9.9"), IncompatibleVersionError, 1),
        (_raw(linkType="ipvlan2"), InvalidConfigError, 7),
        (_raw(mode="l3"), InvalidConfigError, 7),
        (_raw(selectionPolicy="random"), InvalidConfigError, 7),
        (_raw(mtu=10), InvalidConfigError, 7),
        (_raw(mac="01:00:5e:00:00:01"), InvalidConfigError, 7),
        (_raw(mac="zz:11:22:33:44:55"), InvalidConfigError, 7),
        (_raw(capacity={"requests": {"bandwidth": "lots"}}), InvalidConfigError, 7),
        (_raw(bogusKey=1), UnsupportedFieldError, 2),
        (_raw(dns={"nameservers": "192.0.2.1"}), InvalidConfigError, 7),
        (_raw(stateDir=""), InvalidConfigError, 7),
        (_raw(stateDir="relative/state"), InvalidConfigError, 7),
        (_raw(inventory="slice.yaml"), InvalidConfigError, 7),
        (_raw(ipam={"type": 5}), InvalidConfigError, 7),
        (_raw(ipam={"type": "../evil"}), InvalidConfigError, 7),
        (_raw(capacity={"requests": {"bandwidth": "-3G"}}), InvalidConfigError, 7),
        (_raw(mtu="1400"), InvalidConfigError, 7),
        (_raw(mtu=1400.0), InvalidConfigError, 7),
        (_raw(mtu=True), InvalidConfigError, 7),
    ],
)
def test_bad_config_codes(raw, err, code):
    with pytest.raises(err) as ei:
        load_conf(raw)
    assert ei.value.code == code


def test_error_names_the_field():
    with pytest.raises(InvalidConfigError) as ei:
        load_conf(_raw(selectionPolicy="random"))
    assert "selectionPolicy" in ei.value.msg
    with pytest.raises(UnsupportedFieldError) as ei:
        load_conf(_raw(bogusKey=1))
    assert "bogusKey" in ei.value.msg


def test_mac_precedence_file_then_cni_args_then_runtime_config():
    assert load_conf(_raw(mac="c2:00:00:00:00:01")).mac == "c2:00:00:00:00:01"
    env = _env("IgnoreUnknown=1;MAC=C2:11:22:33:44:55")
    assert load_conf(_raw(mac="c2:00:00:00:00:01"), env).mac == "c2:11:22:33:44:55"
    rc = {"runtimeConfig": {"mac": "c2:aa:aa:aa:aa:aa"}}
    assert (
        load_conf(_raw(mac="c2:00:00:00:00:01", **rc), env).mac == "c2:11:22:33:44:55"
    )  # no capability declared
    caps = {"capabilities": {"mac": True}}
    assert load_conf(_raw(mac="c2:00:00:00:00:01", **rc, **caps), env).mac == "c2:aa:aa:aa:aa:aa"


def test_gc_attachment_lists():
    new = load_conf(_raw(**{"cni.dev/valid-attachments": [{"containerID": "a", "ifname": "eth0"}]}))
    old = load_conf(_raw(**{"cni.dev/attachments": [{"containerID": "b", "ifname": "eth0"}]}))
    assert new.valid_attachments == [{"containerID": "a", "ifname": "eth0"}]
    assert old.valid_attachments == [{"containerID": "b", "ifname": "eth0"}]


def test_gc_list_absent_is_none_not_empty():
    """An absent list says nothing about which attachments are stale; ``[]`` says none is valid."""
    assert load_conf(_raw()).valid_attachments is None
    assert load_conf(_raw(**{"cni.dev/valid-attachments": []})).valid_attachments == []
    assert load_conf(_raw(**{"cni.dev/attachments": []})).valid_attachments == []


def test_gc_list_keys_match_in_any_case_as_libcnis_go_decoding_does():
    """libcni decodes an entry into Go's ``GCAttachment``: a key matches its field exactly or
    in another case, a later key wins, a null is no value and other keys are ignored."""
    spelled = [
        {"ContainerId": "a", "IfName": "eth0"},
        {"CONTAINERID": "b", "ifName": "net1", "extra": 7},
        {"containerID": "x", "containerid": "c", "ifname": "eth0", "IFNAME": None},
    ]
    conf = load_conf(_raw(**{"cni.dev/valid-attachments": spelled}))
    assert conf.valid_attachments == [
        {"containerID": "a", "ifname": "eth0"},
        {"containerID": "b", "ifname": "net1"},
        {"containerID": "c", "ifname": "eth0"},
    ]


def test_valid_attachments_wins_over_the_older_list_even_when_empty():
    conf = load_conf(
        _raw(
            **{
                "cni.dev/valid-attachments": [],
                "cni.dev/attachments": [{"containerID": "a", "ifname": "eth0"}],
            }
        )
    )
    assert conf.valid_attachments == []


@pytest.mark.parametrize(
    ("entries", "says"),
    [
        ([{"containerID": "g1"}], 'entry 0 {"containerID": "g1"} has no \'ifname\''),
        (
            [{"containerID": "a", "ifname": "eth0"}, {"ifname": "eth0"}],
            'entry 1 {"ifname": "eth0"} has no \'containerID\'',
        ),
        ([{"containerID": "a", "ifname": ""}], "has no 'ifname'"),
        ([{"containerID": "a", "ifname": None}], "has no 'ifname'"),
        (
            [{"containerID": 7, "ifname": "eth0"}],
            'entry 0 {"containerID": 7, "ifname": "eth0"}: \'containerID\' must be a string',
        ),
        (["a/eth0"], 'entry 0 "a/eth0" is not an object'),
        ({"containerID": "a", "ifname": "eth0"}, "must be a list"),
    ],
)
@pytest.mark.parametrize("key", ["cni.dev/valid-attachments", "cni.dev/attachments"])
def test_a_gc_list_entry_that_does_not_name_an_attachment_is_code_7(key, entries, says):
    """GC collects what its list fails to name: an entry it cannot read whole is refused."""
    with pytest.raises(InvalidConfigError) as ei:
        load_conf(_raw(**{key: entries}))
    assert ei.value.code == 7 and key in ei.value.msg and says in ei.value.msg, ei.value.msg


@pytest.mark.parametrize("value", [True, False])
def test_disable_gc_is_accepted(value):
    """libcni keeps ``disableGC`` at the conflist level, but a plugin config carrying it is valid."""
    assert load_conf(_raw(disableGC=value)).disableGC is value
    assert load_conf(_raw()).disableGC is False


@pytest.mark.parametrize("key", ["lockTimeoutSeconds", "dadTimeoutSeconds"])
@pytest.mark.parametrize("raw_value", ['"NaN"', '"nan"', "NaN", '"inf"', "Infinity", "-Infinity", "1e999"])
def test_non_finite_timeouts_are_refused_as_such(key, raw_value):
    """NaN fails every comparison, so a range check alone reported "must be ≤ 600"."""
    raw = (
        b'{"cniVersion": "1.1.0", "name": "net1", "type": "cni-dra", "'
        + key.encode()
        + b'": '
        + raw_value.encode()
        + b"}"
    )
    with pytest.raises(InvalidConfigError) as ei:
        load_conf(raw)
    assert key in ei.value.msg and "finite" in ei.value.msg
    assert "less than or equal" not in ei.value.msg


@pytest.mark.parametrize("where", ["args", "runtimeConfig", "prevResult", "ipam", "top"])
@pytest.mark.parametrize("depth", [5000, 200_000])
def test_deeply_nested_json_is_code_6(where, depth):
    """Nesting deeper than the interpreter recurses (well under the 1 MiB limit) is
    undecodable input like any other: code 6, not a RecursionError."""
    nest = "[" * depth + "]" * depth
    inner = {
        "args": f'{{"x": {nest}}}',
        "runtimeConfig": f'{{"x": {nest}}}',
        "prevResult": f'{{"cniVersion": "1.1.0", "interfaces": {nest}}}',
        "ipam": f'{{"type": "host-local", "x": {nest}}}',
        "top": nest,
    }[where]
    raw = f'{{"cniVersion": "1.1.0", "name": "net1", "type": "cni-dra", "{where}": {inner}}}'.encode()
    assert len(raw) < MAX_CONFIG_BYTES
    with pytest.raises(DecodeError) as ei:
        load_conf(raw)
    assert ei.value.code == 6 and "nested too deeply" in ei.value.msg


def test_dns_and_ipam_pass_through():
    c = load_conf(
        _raw(
            dns={"nameservers": ["192.0.2.53"], "search": ["example.org"]},
            ipam={"type": "host-local", "ranges": [[{"subnet": "198.51.100.0/24"}]]},
        )
    )
    assert c.dns.nameservers == ["192.0.2.53"] and c.dns.search == ["example.org"]
    assert c.ipam_type == "host-local"
    assert c.ipam.model_extra["ranges"] == [[{"subnet": "198.51.100.0/24"}]]
