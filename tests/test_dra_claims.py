"""Reading ResourceClaim files and the --consumed file."""

from __future__ import annotations

from pathlib import Path

import pytest

from cni_dra.dra.claim_files import load_claims, load_consumed, parse_claims, parse_consumed
from cni_dra.errors import InvalidConfigError, IOFailureError
from cni_dra.quantity import Quantity

YAML_TWO = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: a, namespace: ns}
spec:
  devices:
    requests:
    - name: nic
      exactly: {deviceClassName: nic, capacity: {requests: {bandwidth: 1G}}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: b}
spec: {devices: {requests: [{name: nic, exactly: {deviceClassName: nic}}]}}
"""


def test_yaml_multi_document(tmp_path: Path) -> None:
    p = tmp_path / "claims.yaml"
    p.write_text(YAML_TWO)
    claims = load_claims(str(p))
    assert [c.metadata.name for c in claims] == ["a", "b"]
    req = claims[0].spec.devices.requests[0]
    assert req.exactly is not None and req.exactly.capacity is not None
    assert req.exactly.capacity.requests == {"bandwidth": Quantity.parse("1G")}


def test_json_list_and_kind_list() -> None:
    one = {"kind": "ResourceClaim", "metadata": {"name": "x"}, "spec": {}}
    assert [c.metadata.name for c in parse_claims('[{"metadata": {"name": "x"}}]', "c.json")] == ["x"]
    import json

    assert len(parse_claims(json.dumps({"kind": "List", "items": [one, one]}), "c.json")) == 2


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{bad", "invalid JSON"),
        ("a: [", "invalid YAML"),
        ("", "no ResourceClaim"),
        ('{"kind": "Pod"}', "not a ResourceClaim"),
        ('{"spec": {"devices": {"requests": [{"name": "r", "exactly": {"count": "x"}}]}}}', "count"),
        (
            '{"spec": {"devices": {"requests": [{"name": "r", "exactly": {"capacity": {"requests": {"bw": "1 G"}}}}]}}}',
            "invalid quantity",
        ),
    ],
)
def test_invalid_claims(text: str, needle: str) -> None:
    with pytest.raises(InvalidConfigError) as ei:
        parse_claims(text, "c.yaml")
    assert needle in ei.value.msg


def test_unreadable_claim(tmp_path: Path) -> None:
    with pytest.raises(IOFailureError):
        load_claims(str(tmp_path / "nope.yaml"))


def test_consumed_file(tmp_path: Path) -> None:
    p = tmp_path / "consumed.json"
    p.write_text('{"eth-a": {"bandwidth": "3G"}, "eth-b": {}}')
    assert load_consumed(str(p)) == {"eth-a": {"bandwidth": Quantity.parse("3G")}, "eth-b": {}}
    assert parse_consumed("eth-a: {bandwidth: 1Gi}", "c.yaml") == {
        "eth-a": {"bandwidth": Quantity.parse("1Gi")}
    }
    with pytest.raises(InvalidConfigError, match=r"eth-a\.bandwidth"):
        parse_consumed('{"eth-a": {"bandwidth": "x"}}', "c.json")
    with pytest.raises(InvalidConfigError, match="expected"):
        parse_consumed('["eth-a"]', "c.json")
