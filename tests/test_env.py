"""Tests for cni_dra.protocol.env (CNI spec 1.1.0 "Parameters", CNI_ARGS conventions)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_dra.errors import InvalidEnvironmentError, UnsupportedFieldError
from cni_dra.protocol.env import CniArgs, parse_cni_args, parse_env, validate_container_id, validate_ifname

FULL = {
    "CNI_CONTAINERID": "abc123",
    "CNI_NETNS": "/var/run/netns/x",
    "CNI_IFNAME": "eth0",
    "CNI_PATH": "/opt/cni/bin:/usr/lib/cni",
}


def env(command: str, **overrides: str | None) -> dict[str, str]:
    out = {"CNI_COMMAND": command, **FULL}
    for key, value in overrides.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


# --- CNI_COMMAND and the required-variable table ---------------------------


def test_add_full_env() -> None:
    e = parse_env(env("ADD", CNI_ARGS="K8S_POD_NAME=p"))
    assert e.command == "ADD"
    assert e.container_id == "abc123"
    assert e.netns == "/var/run/netns/x"
    assert e.ifname == "eth0"
    assert e.path == ("/opt/cni/bin", "/usr/lib/cni")
    assert e.args.pod_name == "p"
    assert e.raw["CNI_ARGS"] == "K8S_POD_NAME=p"


@pytest.mark.parametrize("command", [None, "", "add", "UPDATE", "ADD "])
def test_missing_or_unknown_command_is_code_4(command: str | None) -> None:
    e = env("ADD")
    if command is None:
        del e["CNI_COMMAND"]
    else:
        e["CNI_COMMAND"] = command
    with pytest.raises(InvalidEnvironmentError) as info:
        parse_env(e)
    assert info.value.code == 4
    assert "CNI_COMMAND" in info.value.msg


@pytest.mark.parametrize(
    ("command", "required"),
    [
        ("ADD", ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"]),
        ("CHECK", ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"]),
        ("DEL", ["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"]),
        ("GC", ["CNI_PATH"]),
        ("STATUS", ["CNI_PATH"]),
    ],
)
def test_each_required_variable_missing_or_empty_is_code_4(command: str, required: list[str]) -> None:
    for name in required:
        for value in (None, ""):
            with pytest.raises(InvalidEnvironmentError) as info:
                parse_env(env(command, **{name: value}))
            assert name in info.value.msg


def test_all_missing_variables_are_named_together() -> None:
    with pytest.raises(InvalidEnvironmentError) as info:
        parse_env({"CNI_COMMAND": "ADD"})
    for name in ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"):
        assert name in info.value.msg


def test_del_without_netns_is_fine() -> None:
    e = parse_env(env("DEL", CNI_NETNS=None))
    assert e.netns == ""
    assert e.container_id == "abc123"


@pytest.mark.parametrize("command", ["ADD", "CHECK", "DEL"])
@pytest.mark.parametrize("netns", ["var/run/netns/x", "./x", "x", "../run/netns/x", " /var/run/netns/x"])
def test_relative_netns_is_code_4(command: str, netns: str) -> None:
    """A relative CNI_NETNS names another namespace from another working directory (an ADD
    and its DEL would act on different ones): refused on every verb that uses it."""
    with pytest.raises(InvalidEnvironmentError) as info:
        parse_env(env(command, CNI_NETNS=netns))
    assert info.value.code == 4
    assert "CNI_NETNS" in info.value.msg and "not an absolute path" in info.value.msg


@pytest.mark.parametrize("command", ["GC", "STATUS"])
def test_gc_status_ignore_a_relative_netns_they_do_not_use(command: str) -> None:
    assert parse_env({"CNI_COMMAND": command, "CNI_PATH": "/p", "CNI_NETNS": "x"}).command == command


@pytest.mark.parametrize("command", ["GC", "STATUS"])
def test_gc_status_need_only_path(command: str) -> None:
    e = parse_env({"CNI_COMMAND": command, "CNI_PATH": "/usr/lib/cni"})
    assert e.path == ("/usr/lib/cni",)
    assert e.container_id == "" and e.ifname == "" and e.netns == ""


def test_gc_ignores_invalid_ifname_it_does_not_need() -> None:
    assert parse_env({"CNI_COMMAND": "GC", "CNI_PATH": "/p", "CNI_IFNAME": "a/b"}).command == "GC"


def test_version_needs_nothing_and_ignores_bad_args() -> None:
    e = parse_env({"CNI_COMMAND": "VERSION", "CNI_ARGS": "garbage"})
    assert e.command == "VERSION"
    assert e.args == CniArgs()


def test_cni_path_drops_empty_entries() -> None:
    assert parse_env(env("ADD", CNI_PATH=":/a::/b:")).path == ("/a", "/b")


def test_env_raw_is_read_only() -> None:
    e = parse_env(env("ADD"))
    with pytest.raises(TypeError):
        e.raw["CNI_COMMAND"] = "DEL"  # type: ignore[index]


# --- container ID and interface name -----------------------------------------


@pytest.mark.parametrize("cid", ["a", "0", "abc-DEF_1.2", "a" * 200])
def test_valid_container_ids(cid: str) -> None:
    assert validate_container_id(cid) == cid
    assert parse_env(env("ADD", CNI_CONTAINERID=cid)).container_id == cid


@pytest.mark.parametrize("cid", ["-a", "_a", ".a", "a b", "a/b", "a:b", "a\n", "é", "a\udc80"])
def test_invalid_container_ids_are_code_4(cid: str) -> None:
    with pytest.raises(InvalidEnvironmentError) as info:
        parse_env(env("ADD", CNI_CONTAINERID=cid))
    assert info.value.code == 4


@pytest.mark.parametrize("name", ["eth0", "a", "x" * 15, "net1.100", "-", "@", "net+1", "a~b", "!"])
def test_valid_ifnames(name: str) -> None:
    assert validate_ifname(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        ".",
        "..",
        "x" * 16,
        "é" * 8,
        "a/b",
        "a:b",
        "a b",
        "a\tb",
        "a\nb",
        "a\u00a0b",
        "a\udc80",
        "eth%d",
        "a\x00b",
        "à",
        "a\u2003b",
        "a\x85",
        "é" * 7,
        "eté",
        "a\x1fb",
        "eth\x7f",
        "\uff45th0",
    ],
)
def test_invalid_ifnames_are_code_4(name: str) -> None:
    with pytest.raises(InvalidEnvironmentError) as info:
        validate_ifname(name)
    assert info.value.code == 4


def test_a_non_ascii_ifname_is_refused_up_front_with_code_4() -> None:
    """The kernel would take it, but cni-dra names sysctls and ifb devices after it: refused
    before anything is done, not half way through ADD."""
    with pytest.raises(InvalidEnvironmentError) as info:
        parse_env(env("ADD", CNI_IFNAME="eté"))
    assert info.value.code == 4
    assert info.value.msg == (
        "invalid CNI_IFNAME 'eté': interface name contains a character that is not printable "
        "ASCII (cni-dra takes '!' to '~' only)"
    )


def test_invalid_ifname_through_parse_env_on_del() -> None:
    with pytest.raises(InvalidEnvironmentError):
        parse_env(env("DEL", CNI_IFNAME="bad/name"))


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=20))
def test_ifname_rule_matches_the_spec_definition(name: str) -> None:
    # CNI spec "Parameters" (whitespace as the reference skel's unicode.IsSpace: Unicode
    # White_Space, which leaves out the ASCII separators 0x1c-0x1f that str.isspace counts),
    # what the kernel would not keep as sent: NUL, '%', a 0xa0 byte (its isspace()), and
    # cni-dra's own limit: printable ASCII only.
    raw = name.encode("utf-8")
    ok = (
        0 < len(raw) <= 15
        and name not in (".", "..")
        and not any(c in "/:\x00%" or (c.isspace() and c not in "\x1c\x1d\x1e\x1f") for c in name)
        and 0xA0 not in raw
        and all(0x21 <= ord(c) <= 0x7E for c in name)
    )
    if ok:
        assert validate_ifname(name) == name
    else:
        with pytest.raises(InvalidEnvironmentError):
            validate_ifname(name)


# --- CNI_ARGS ----------------------------------------------------------------


def test_kubernetes_args() -> None:
    a = parse_cni_args(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod-0;"
        "K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=0b1c2d3e-0000-4000-8000-000000000001"
    )
    assert a == CniArgs(
        ignore_unknown=True,
        pod_namespace="ns",
        pod_name="pod-0",
        pod_infra_container_id="abc",
        pod_uid="0b1c2d3e-0000-4000-8000-000000000001",
    )


def test_empty_args() -> None:
    assert parse_cni_args("") == CniArgs()
    assert parse_cni_args(";;") == CniArgs()


def test_mac_value_keeps_colons_and_split_is_at_first_equals() -> None:
    a = parse_cni_args("MAC=02:00:00:00:00:01;K8S_POD_NAME=a=b")
    assert a.mac == "02:00:00:00:00:01"
    assert a.pod_name == "a=b"


def test_empty_value_is_kept() -> None:
    assert parse_cni_args("K8S_POD_NAME=").pod_name == ""


def test_repeated_key_keeps_last_value() -> None:
    assert parse_cni_args("K8S_POD_NAME=a;K8S_POD_NAME=b").pod_name == "b"


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "True", "tRuE"])
def test_ignore_unknown_true_spellings(value: str) -> None:
    a = parse_cni_args(f"FOO=bar;IgnoreUnknown={value}")
    assert a.ignore_unknown is True
    assert dict(a.extra) == {"FOO": "bar"}


@pytest.mark.parametrize("value", ["0", "false", "FALSE"])
def test_ignore_unknown_false_spellings(value: str) -> None:
    assert parse_cni_args(f"IgnoreUnknown={value}").ignore_unknown is False
    with pytest.raises(UnsupportedFieldError):
        parse_cni_args(f"IgnoreUnknown={value};FOO=1")


@pytest.mark.parametrize("value", ["yes", "", "2", "on"])
def test_ignore_unknown_non_boolean_is_code_4(value: str) -> None:
    with pytest.raises(InvalidEnvironmentError):
        parse_cni_args(f"IgnoreUnknown={value}")


def test_unknown_key_without_ignore_is_code_2_naming_it() -> None:
    with pytest.raises(UnsupportedFieldError) as info:
        parse_cni_args("K8S_POD_NAME=p;BANDWIDTH=10G;COLOUR=red")
    assert info.value.code == 2
    assert "BANDWIDTH" in info.value.msg and "COLOUR" in info.value.msg
    assert "K8S_POD_NAME" not in info.value.msg


def test_extra_known_keys_are_accepted_into_extra() -> None:
    a = parse_cni_args("CNI_DRA_SHARE=x", extra_known=["CNI_DRA_SHARE"])
    assert dict(a.extra) == {"CNI_DRA_SHARE": "x"}
    assert a.ignore_unknown is False


def test_extra_known_through_parse_env() -> None:
    e = parse_env(env("ADD", CNI_ARGS="CNI_DRA_SHARE=x"), extra_known_args=("CNI_DRA_SHARE",))
    assert e.args.extra["CNI_DRA_SHARE"] == "x"
    with pytest.raises(UnsupportedFieldError):
        parse_env(env("ADD", CNI_ARGS="CNI_DRA_SHARE=x"))


@pytest.mark.parametrize("raw", ["FOO", "K8S_POD_NAME=p;junk", "=value", "IgnoreUnknown=1;=x"])
def test_segment_without_equals_or_key_is_code_4(raw: str) -> None:
    with pytest.raises(InvalidEnvironmentError) as info:
        parse_cni_args(raw)
    assert info.value.code == 4


def test_invalid_utf8_is_code_4() -> None:
    # os.environ decodes undecodable bytes to lone surrogates (surrogateescape)
    with pytest.raises(InvalidEnvironmentError):
        parse_cni_args("K8S_POD_NAME=\udcff")


def test_size_limits() -> None:
    parse_cni_args("K8S_POD_NAME=" + "a" * 1024)
    with pytest.raises(InvalidEnvironmentError):
        parse_cni_args("K8S_POD_NAME=" + "a" * 1025)
    with pytest.raises(InvalidEnvironmentError):
        parse_cni_args("K8S_POD_NAME=" + "é" * 513)  # 1026 bytes
    big = "IgnoreUnknown=1;" + ";".join(f"K{i}={'v' * 100}" for i in range(40))
    assert len(big) > 4096
    with pytest.raises(InvalidEnvironmentError):
        parse_cni_args(big)


def test_bad_args_through_parse_env() -> None:
    with pytest.raises(InvalidEnvironmentError):
        parse_env(env("ADD", CNI_ARGS="nonsense"))


_key = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789", min_size=1, max_size=12).filter(
    lambda k: k != "IgnoreUnknown"
)
_value = st.text(alphabet=st.characters(codec="utf-8", exclude_characters=";"), max_size=30)


@given(st.dictionaries(_key, _value, max_size=8))
def test_args_roundtrip_property(pairs: dict[str, str]) -> None:
    raw = ";".join(["IgnoreUnknown=1", *(f"{k}={v}" for k, v in pairs.items())])
    a = parse_cni_args(raw)
    known = {
        "K8S_POD_NAMESPACE": a.pod_namespace,
        "K8S_POD_NAME": a.pod_name,
        "K8S_POD_INFRA_CONTAINER_ID": a.pod_infra_container_id,
        "K8S_POD_UID": a.pod_uid,
        "MAC": a.mac,
    }
    for k, v in pairs.items():
        if k in known:
            assert known[k] == v
        else:
            assert a.extra[k] == v
    assert set(a.extra) == set(pairs) - set(known)


@given(st.text(max_size=60))
def test_parse_cni_args_only_raises_cni_errors(raw: str) -> None:
    try:
        parse_cni_args(raw)
    except (InvalidEnvironmentError, UnsupportedFieldError):
        pass


@given(
    st.dictionaries(
        st.sampled_from(
            ["CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH", "CNI_ARGS"]
        ),
        st.sampled_from(
            [
                "ADD",
                "DEL",
                "CHECK",
                "GC",
                "STATUS",
                "VERSION",
                "",
                "x",
                "eth0",
                "/p",
                "a=b",
                "IgnoreUnknown=1;Z=1",
            ]
        )
        | st.text(max_size=10),
    )
)
def test_parse_env_only_raises_cni_errors(environ: dict[str, str]) -> None:
    try:
        e = parse_env(environ)
    except (InvalidEnvironmentError, UnsupportedFieldError):
        return
    assert e.command == environ["CNI_COMMAND"]
