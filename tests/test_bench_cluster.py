"""The pure parts of ``make bench-cluster`` (bench/cluster_stats.py), without a cluster:
percentiles of per-pod latencies, histograms read from a kubelet's ``/metrics`` (a
verbatim excerpt of the bed's kubelet v1.37.2) and their deltas over a burst, quantiles
from buckets as PromQL's ``histogram_quantile`` computes them, and the table."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location(
        "cni_dra_bench_cluster_stats", _REPO / "bench/cluster_stats.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


stats = _load()

# The bed's kubelet (v1.37.2), as served at /api/v1/nodes/cni-dra-e2e/proxy/metrics: one
# series of each kind the bench reads, verbatim (other series and bucket lines of the same
# histograms left out), after 19 pods.
BEFORE = """\
# HELP dra_operations_duration_seconds [ALPHA] Latency histogram in seconds for the duration of handling all ResourceClaims referenced by a pod when the pod starts or stops. Identified by the name of the operation (PrepareResources or UnprepareResources) and separated by the success of the operation. The number of failed operations is provided through the histogram's overall count.
# TYPE dra_operations_duration_seconds histogram
dra_operations_duration_seconds_bucket{is_error="false",operation_name="PrepareResources",le="0.1"} 18
dra_operations_duration_seconds_bucket{is_error="false",operation_name="PrepareResources",le="0.1534127404634391"} 19
dra_operations_duration_seconds_bucket{is_error="false",operation_name="PrepareResources",le="0.23535468936502524"} 19
dra_operations_duration_seconds_bucket{is_error="false",operation_name="PrepareResources",le="+Inf"} 19
dra_operations_duration_seconds_sum{is_error="false",operation_name="PrepareResources"} 0.655516963
dra_operations_duration_seconds_count{is_error="false",operation_name="PrepareResources"} 19
# HELP kubelet_runtime_operations_duration_seconds [ALPHA] Duration in seconds of runtime operations. Broken down by operation type.
# TYPE kubelet_runtime_operations_duration_seconds histogram
kubelet_runtime_operations_duration_seconds_bucket{operation_type="run_podsandbox",le="0.005"} 0
kubelet_runtime_operations_duration_seconds_bucket{operation_type="run_podsandbox",le="0.0125"} 0
kubelet_runtime_operations_duration_seconds_bucket{operation_type="run_podsandbox",le="0.03125"} 0
kubelet_runtime_operations_duration_seconds_bucket{operation_type="run_podsandbox",le="0.078125"} 0
kubelet_runtime_operations_duration_seconds_bucket{operation_type="run_podsandbox",le="0.1953125"} 4
kubelet_runtime_operations_duration_seconds_bucket{operation_type="run_podsandbox",le="0.48828125"} 9
kubelet_runtime_operations_duration_seconds_bucket{operation_type="run_podsandbox",le="1.220703125"} 19
kubelet_runtime_operations_duration_seconds_bucket{operation_type="run_podsandbox",le="3.0517578125"} 19
kubelet_runtime_operations_duration_seconds_bucket{operation_type="run_podsandbox",le="7.62939453125"} 19
kubelet_runtime_operations_duration_seconds_bucket{operation_type="run_podsandbox",le="19.073486328125"} 19
kubelet_runtime_operations_duration_seconds_bucket{operation_type="run_podsandbox",le="47.6837158203125"} 19
kubelet_runtime_operations_duration_seconds_bucket{operation_type="run_podsandbox",le="119.20928955078125"} 19
kubelet_runtime_operations_duration_seconds_bucket{operation_type="run_podsandbox",le="298.0232238769531"} 19
kubelet_runtime_operations_duration_seconds_bucket{operation_type="run_podsandbox",le="745.0580596923828"} 19
kubelet_runtime_operations_duration_seconds_bucket{operation_type="run_podsandbox",le="+Inf"} 19
kubelet_runtime_operations_duration_seconds_sum{operation_type="run_podsandbox"} 9.097372640000001
kubelet_runtime_operations_duration_seconds_count{operation_type="run_podsandbox"} 19
"""


def _after() -> str:
    """The same series after a burst of 10 pods: 6 more prepares (all under 0.1 s, 0.6 s in
    all), 4 failed ones (a series of their own appears), 10 more sandboxes (5 in
    (0.195, 0.488] s, 5 in (0.488, 1.22] s, 5 s in all)."""
    sandbox_les = ["1.220703125", "3.0517578125", "7.62939453125", "19.073486328125", "47.6837158203125"]
    sandbox_les += ["119.20928955078125", "298.0232238769531", "745.0580596923828", "+Inf"]
    raised = {
        'PrepareResources",le="0.1"} 18': "24",
        'PrepareResources",le="0.1534127404634391"} 19': "25",
        'PrepareResources",le="0.23535468936502524"} 19': "25",
        'PrepareResources",le="+Inf"} 19': "25",
        'operation_name="PrepareResources"} 19': "25",
        'operation_name="PrepareResources"} 0.655516963': "1.255516963",
        'run_podsandbox",le="0.48828125"} 9': "14",
        **{f'run_podsandbox",le="{le}"}} 19': "29" for le in sandbox_les},
        'operation_type="run_podsandbox"} 19': "29",
        'operation_type="run_podsandbox"} 9.097372640000001': "14.097372640000001",
    }
    lines = []
    for line in BEFORE.splitlines():
        for end, new in raised.items():
            if line.endswith(end):
                line = line.rsplit(" ", 1)[0] + " " + new
        lines.append(line)
    failed = '{is_error="true",operation_name="PrepareResources"'
    for le in ("0.1", "0.1534127404634391", "0.23535468936502524", "+Inf"):
        lines.append(f'dra_operations_duration_seconds_bucket{failed},le="{le}"}} 4')
    lines.append(f"dra_operations_duration_seconds_sum{failed}}} 0.1")
    lines.append(f"dra_operations_duration_seconds_count{failed}}} 4")
    return "\n".join(lines) + "\n"


AFTER = _after()


@pytest.mark.parametrize(
    ("values", "q", "want"),
    [
        ([1.0, 2.0, 3.0, 4.0], 0.5, 2.5),
        ([1.0, 2.0, 3.0, 4.0], 0.95, 3.85),
        ([4.0, 1.0, 3.0, 2.0], 0.0, 1.0),
        ([4.0, 1.0, 3.0, 2.0], 1.0, 4.0),
        ([7.0], 0.95, 7.0),
    ],
)
def test_percentile_interpolates_between_ranks(values, q, want) -> None:
    assert stats.percentile(values, q) == pytest.approx(want)


def test_percentile_of_nothing_is_nan() -> None:
    assert math.isnan(stats.percentile([], 0.5))


def test_parse_metrics_reads_every_sample_with_its_labels() -> None:
    samples = stats.parse_metrics(BEFORE)
    key = frozenset({("is_error", "false"), ("operation_name", "PrepareResources")})
    assert samples["dra_operations_duration_seconds_sum"][key] == pytest.approx(0.655516963)
    assert samples["dra_operations_duration_seconds_count"][key] == 19
    inf = frozenset({("operation_type", "run_podsandbox"), ("le", "+Inf")})
    assert samples["kubelet_runtime_operations_duration_seconds_bucket"][inf] == 19
    assert not any(name.startswith("#") for name in samples)


def test_parse_metrics_unescapes_label_values_and_skips_junk() -> None:
    text = 'm{path="a\\"b\\\\c",x="1"} 2 1700000000000\nnot a sample line\nm_other 3\n'
    samples = stats.parse_metrics(text)
    assert samples["m"] == {frozenset({("path", 'a"b\\c'), ("x", "1")}): 2.0}
    assert samples["m_other"] == {frozenset(): 3.0}


def test_histogram_selects_by_labels_and_sums_the_other_series() -> None:
    after = stats.parse_metrics(AFTER)
    prep = stats.histogram(after, "dra_operations_duration_seconds", operation_name="PrepareResources")
    assert prep.count == 29  # 25 ok + 4 failed: is_error not named, both series summed
    assert prep.sum == pytest.approx(1.355516963)
    assert prep.buckets[0] == (0.1, 28)
    assert prep.buckets[-1][0] == math.inf
    ok = stats.histogram(
        after, "dra_operations_duration_seconds", operation_name="PrepareResources", is_error="false"
    )
    assert ok.count == 25
    assert stats.histogram(after, "no_such_metric").count == 0


def test_delta_over_a_burst() -> None:
    name = "kubelet_runtime_operations_duration_seconds"
    before = stats.histogram(stats.parse_metrics(BEFORE), name, operation_type="run_podsandbox")
    after = stats.histogram(stats.parse_metrics(AFTER), name, operation_type="run_podsandbox")
    d = after.minus(before)
    assert d.count == 10
    assert d.sum == pytest.approx(5.0)
    assert d.mean == pytest.approx(0.5)
    assert dict(d.buckets)[0.1953125] == 0
    assert dict(d.buckets)[0.48828125] == 5
    assert dict(d.buckets)[1.220703125] == 10
    assert dict(d.buckets)[math.inf] == 10
    # histogram_quantile: rank 5 is the top of (0.195, 0.488]; rank 9.5 is 0.9 into (0.488, 1.22]
    assert d.quantile(0.5) == pytest.approx(0.48828125)
    assert d.quantile(0.95) == pytest.approx(0.48828125 + (1.220703125 - 0.48828125) * 0.9)


def test_delta_of_a_series_that_appeared_meanwhile() -> None:
    before = stats.histogram(stats.parse_metrics(BEFORE), "dra_operations_duration_seconds", is_error="true")
    after = stats.histogram(stats.parse_metrics(AFTER), "dra_operations_duration_seconds", is_error="true")
    d = after.minus(before)
    assert (d.count, d.sum) == (4, pytest.approx(0.1))
    # every failure in the first bucket: linear from 0 to its bound
    assert d.quantile(0.5) == pytest.approx(0.05)


def test_quantile_in_the_inf_bucket_is_the_highest_finite_bound() -> None:
    h = stats.Histogram(((0.1, 1.0), (0.2, 2.0), (math.inf, 10.0)), 10.0, 30.0)
    assert h.quantile(0.95) == 0.2
    assert math.isnan(stats.Histogram().quantile(0.5))
    assert math.isnan(stats.Histogram().mean)


def test_plus_adds_rounds() -> None:
    a = stats.Histogram(((0.1, 1.0), (math.inf, 2.0)), 2.0, 0.3)
    b = stats.Histogram(((0.1, 3.0), (math.inf, 3.0)), 3.0, 0.2)
    assert a.plus(b) == stats.Histogram(((0.1, 4.0), (math.inf, 5.0)), 5.0, 0.5)
    assert stats.Histogram().plus(b) == b


def _round(variant: str, index: int, ready_s: list[float], hist: dict) -> object:
    r = stats.Round(variant, index)
    for i, ready in enumerate(ready_s):
        r.pods[f"p{i}"] = stats.PodTimes(
            created=100.0 + i * 0.01,
            scheduled=100.05 + i * 0.01,
            ready=100.0 + i * 0.01 + ready,
            delete_sent=200.0,
            gone=201.0 + i * 0.1,
        )
    r.histograms = hist
    return r


def test_summary_pools_pods_and_takes_each_rounds_span() -> None:
    sandbox = stats.Histogram(((0.5, 2.0), (1.0, 4.0), (math.inf, 4.0)), 4.0, 2.4)
    rounds = [
        _round("reference", 0, [1.0, 1.0, 1.0, 1.0], {"run_podsandbox": sandbox}),
        _round("cni-dra", 0, [1.0, 2.0, 2.0, 3.0], {"run_podsandbox": sandbox.plus(sandbox)}),
        _round("cni-dra", 1, [2.0, 2.0, 2.0, 2.0], {}),
    ]
    s = stats.summarize(rounds)
    assert list(s) == ["reference", "cni-dra"]
    assert s["cni-dra"]["rounds"] == 2 and s["cni-dra"]["pods"] == 8
    assert s["cni-dra"]["ready_p50_s"] == pytest.approx(2.0)
    assert s["cni-dra"]["ready_p95_s"] == pytest.approx(2.65)
    assert s["reference"]["scheduled_p50_s"] == pytest.approx(0.05)
    # a round's span: first create to last Ready (3.03 s and 2.03 s), the median of the rounds
    assert s["cni-dra"]["all_ready_s"] == pytest.approx((3.03 + 2.03) / 2)
    assert s["reference"]["all_gone_s"] == pytest.approx(1.3)
    h = s["cni-dra"]["histograms"]["run_podsandbox"]
    assert (h["count"], h["mean_s"]) == (8, pytest.approx(0.6))


def test_table_has_a_column_per_variant_and_the_ratios() -> None:
    sandbox = stats.Histogram(((0.5, 2.0), (1.0, 4.0), (math.inf, 4.0)), 4.0, 2.4)
    s = stats.summarize(
        [
            _round("reference", 0, [1.0, 1.0, 1.0, 1.0], {"run_podsandbox": sandbox}),
            _round("cni-dra", 0, [1.2, 1.2, 1.2, 1.2], {"run_podsandbox": sandbox}),
        ]
    )
    table = stats.render_table(s, [("cni-dra", "reference"), ("cni-dra", "absent")]).splitlines()
    head = [c.strip() for c in table[0].strip("|").split("|")]
    assert head == ["", "reference", "cni-dra", "cni-dra / reference"]
    assert set(table[1]) <= {"|", "-", ":", " "}
    rows = {r.split("|")[1].strip(): [c.strip() for c in r.strip("|").split("|")[1:]] for r in table[2:]}
    assert rows["pod create → Ready, p50"] == ["1.00 s", "1.20 s", "1.20×"]
    assert rows["create → scheduled (node set), p50"] == ["50 ms", "50 ms", "1.00×"]
    assert rows["run_podsandbox: mean (n; p50, p95)"] == [
        "600 ms (n=4; 500 ms, 950 ms)",
        "600 ms (n=4; 500 ms, 950 ms)",
        "1.00×",
    ]
    assert "all N claims gone (first delete →)" not in rows  # no variant measured it
    assert len({len(r) for r in table}) == 1  # aligned


# CRI-O v1.36.3 on the bed (its log at level info), one sandbox's lines, verbatim, between
# lines about another pod and a pod of another namespace.
CRIO_LOG = (
    'time="2026-12-06T11:15:50.800000000Z" level=info msg="Running pod sandbox: default/bench-reference-0-002/POD"\n'
    + """time="2026-12-06T11:15:50.827378958Z" level=info msg="Running pod sandbox: default/bench-reference-0-001/POD" id=ebd75bc5-03c1-48c2-aab0-6d3bec6cf6da name=/runtime.v1.RuntimeService/RunPodSandbox
time="2026-12-06T11:15:51.453306408Z" level=info msg="Got pod network &{Name:bench-reference-0-001 Namespace:default ID:a142ad6ccdf375f4973148572e0242699e9ae8fb3c34eeacb858108275ce0040 UID:ab8a88e1-32f7-4622-8cc0-d77f53ad19af NetNS:/var/run/netns/ad4f6727-3ccb-46c9-916d-44a80031e4ac Networks:[{Name:bench-reference Ifname:eth0}] RuntimeConfig:map[bench-reference:{IP: MAC: PortMappings:[] Bandwidth:<nil> IpRanges:[] CgroupPath:/cni-dra-e2e/cni-dra-e2e/kubepods/besteffort/podab8a88e1-32f7-4622-8cc0-d77f53ad19af PodAnnotations:0x299215ed6418}] Aliases:map[]}"
time="2026-12-06T11:15:51.45333209Z" level=info msg="Adding pod default_bench-reference-0-001 to CNI network \\"bench-reference\\" (type=macvlan)"
time="2026-12-06T11:15:51.492728405Z" level=info msg="Got pod network &{Name:bench-reference-0-001 Namespace:default ID:a142ad6ccdf375f4973148572e0242699e9ae8fb3c34eeacb858108275ce0040 UID:ab8a88e1-32f7-4622-8cc0-d77f53ad19af NetNS:/var/run/netns/ad4f6727-3ccb-46c9-916d-44a80031e4ac Networks:[{Name:bench-reference Ifname:eth0}] RuntimeConfig:map[bench-reference:{IP: MAC: PortMappings:[] Bandwidth:<nil> IpRanges:[] CgroupPath:/cni-dra-e2e/cni-dra-e2e/kubepods/besteffort/podab8a88e1-32f7-4622-8cc0-d77f53ad19af PodAnnotations:0x299215ed6418}] Aliases:map[]}"
time="2026-12-06T11:15:51.492818516Z" level=info msg="Checking pod default_bench-reference-0-001 for CNI network bench-reference (type=macvlan)"
time="2026-12-06T11:15:52.069186133Z" level=info msg="Ran pod sandbox a142ad6ccdf375f4973148572e0242699e9ae8fb3c34eeacb858108275ce0040 with infra container: default/bench-reference-0-001/POD" id=ebd75bc5-03c1-48c2-aab0-6d3bec6cf6da name=/runtime.v1.RuntimeService/RunPodSandbox
"""
    + 'time="2026-12-06T11:15:52.100000000Z" level=info msg="Adding pod other_bench-reference-0-001 to CNI network"\n'
)


def test_crio_cni_calls_times_add_and_check_of_each_pod() -> None:
    calls = stats.crio_cni_calls(CRIO_LOG, ["bench-reference-0-001", "bench-reference-0-009"])
    assert list(calls) == ["bench-reference-0-001"]  # only the pods asked for, and seen
    add_s, check_s = calls["bench-reference-0-001"]
    assert add_s == pytest.approx(51.492728405 - 51.45333209)
    assert check_s == pytest.approx(52.069186133 - 51.492818516)


def test_crio_cni_calls_without_the_end_of_a_call() -> None:
    head = "\n".join(CRIO_LOG.splitlines()[:4])  # ADD started, nothing after it
    assert stats.crio_cni_calls(head, ["bench-reference-0-001"]) == {"bench-reference-0-001": (None, None)}


def test_cni_rows_only_where_the_runtime_logged_them() -> None:
    r = _round("cni-dra", 0, [1.0, 1.0], {})
    r.pods["p0"].cni_add_s, r.pods["p1"].cni_add_s = 0.1, 0.3
    s = stats.summarize([r, _round("reference", 0, [1.0, 1.0], {})])
    assert s["cni-dra"]["cni_add_p50_s"] == pytest.approx(0.2)
    assert math.isnan(s["reference"]["cni_add_p50_s"])
    table = stats.render_table(s, [("cni-dra", "reference")])
    assert "| CNI ADD (CRI-O's log), p50" in table.replace("|   ", "| ")
    assert "CNI CHECK" not in table
