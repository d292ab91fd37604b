"""The pure parts of ``make bench-cluster`` (bench/cluster.py): percentiles of per-pod
latencies, histograms read from a component's Prometheus ``/metrics`` text and their
deltas over a round, quantiles estimated from histogram buckets (as PromQL's
``histogram_quantile``), the per-variant summary and the table. No I/O, no clock."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?\s*$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')

Labels = frozenset[tuple[str, str]]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, linear between the closest ranks (NumPy's
    default); NaN for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _unescape(value: str) -> str:
    return value.replace(r"\\", "\0").replace(r"\"", '"').replace(r"\n", "\n").replace("\0", "\\")


def parse_metrics(text: str) -> dict[str, dict[Labels, float]]:
    """Every sample of a Prometheus text exposition: ``{name: {labels: value}}``. Comments,
    blank lines and lines that are no sample are skipped."""
    out: dict[str, dict[Labels, float]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        name, body, raw = m.groups()
        labels = frozenset((k, _unescape(v)) for k, v in _LABEL.findall(body or ""))
        try:
            value = float(raw)
        except ValueError:
            continue
        out.setdefault(name, {})[labels] = value
    return out


@dataclass(frozen=True)
class Histogram:
    """Cumulative buckets ``(upper bound, count)`` in ascending order (the last one
    ``+Inf``), the observations' count and sum."""

    buckets: tuple[tuple[float, float], ...] = ()
    count: float = 0.0
    sum: float = 0.0

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else math.nan

    def quantile(self, q: float) -> float:
        """``histogram_quantile(q, ...)``: linear within the bucket that holds rank
        ``q * count``; the highest finite bound when that is the ``+Inf`` bucket."""
        if not self.count or not self.buckets:
            return math.nan
        rank = q * self.count
        prev_le, prev_n = 0.0, 0.0
        for le, n in self.buckets:
            if n >= rank:
                if math.isinf(le):
                    return prev_le
                if n == prev_n:
                    return le
                return prev_le + (le - prev_le) * (rank - prev_n) / (n - prev_n)
            prev_le, prev_n = le, n
        return prev_le

    def minus(self, before: Histogram) -> Histogram:
        """What was observed since ``before`` (an earlier scrape of the same series)."""
        old = dict(before.buckets)
        return Histogram(
            tuple((le, n - old.get(le, 0.0)) for le, n in self.buckets),
            self.count - before.count,
            self.sum - before.sum,
        )

    def plus(self, other: Histogram) -> Histogram:
        if not self.buckets:
            return other
        theirs = dict(other.buckets)
        return Histogram(
            tuple((le, n + theirs.get(le, 0.0)) for le, n in self.buckets),
            self.count + other.count,
            self.sum + other.sum,
        )


def histogram(samples: Mapping[str, Mapping[Labels, float]], name: str, **match: str) -> Histogram:
    """Histogram ``name`` summed over every series whose labels include ``match`` (so
    ``is_error`` or a driver label need not be named); empty when none matches."""
    want = set(match.items())
    buckets: dict[float, float] = {}
    for labels, value in samples.get(f"{name}_bucket", {}).items():
        if want <= labels:
            le = float(dict(labels)["le"])
            buckets[le] = buckets.get(le, 0.0) + value

    def total(suffix: str) -> float:
        return sum(v for labels, v in samples.get(f"{name}_{suffix}", {}).items() if want <= labels)

    return Histogram(tuple(sorted(buckets.items())), total("count"), total("sum"))


@dataclass
class PodTimes:
    """Monotonic times (seconds) of one pod as the bench saw them: its create request sent,
    the first watch event with its node set, the first with Ready=True, its delete request
    sent, its DELETED event."""

    created: float | None = None
    scheduled: float | None = None
    ready: float | None = None
    delete_sent: float | None = None
    gone: float | None = None
    cni_add_s: float | None = None
    """How long the runtime's CNI ADD took (its log's words; CRI-O only)."""
    cni_check_s: float | None = None
    """From CRI-O's CHECK, right after the ADD, to its sandbox being ready."""


@dataclass
class Round:
    """One burst of one variant: its pods' times and the histograms' deltas over it."""

    variant: str
    index: int
    pods: dict[str, PodTimes] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    claims_gone_s: float | None = None
    load: tuple[float, float] = (math.nan, math.nan)

    def _span(self, start: str, end: str) -> float:
        starts = [getattr(t, start) for t in self.pods.values()]
        ends = [getattr(t, end) for t in self.pods.values()]
        if not starts or None in starts or None in ends:
            return math.nan
        return max(e for e in ends if e is not None) - min(s for s in starts if s is not None)

    @property
    def all_ready_s(self) -> float:
        """First create request to the last pod Ready."""
        return self._span("created", "ready")

    @property
    def all_gone_s(self) -> float:
        """First delete request to the last pod's DELETED event."""
        return self._span("delete_sent", "gone")

    def latencies(self, start: str, end: str) -> list[float]:
        out = []
        for t in self.pods.values():
            a, b = getattr(t, start), getattr(t, end)
            if a is not None and b is not None:
                out.append(b - a)
        return out


_CRIO_LINE = re.compile(r'^time="([^"]+)" level=\w+ msg="(.*)$')


def _rfc3339_s(stamp: str) -> float:
    """Seconds since midnight of an RFC 3339 UTC time with up to nanoseconds (CRI-O's log)."""
    clock = stamp.split("T", 1)[1].rstrip("Z")
    h, m, sec = clock.split(":")
    return int(h) * 3600 + int(m) * 60 + float(sec)


def crio_cni_calls(log_text: str, pods: Iterable[str]) -> dict[str, tuple[float | None, float | None]]:
    """Per pod of ``pods`` (names, in namespace ``default``): how long CRI-O's CNI ADD took
    (``Adding pod default_<pod> to CNI network`` to the next ``Got pod network`` of that pod,
    which CRI-O logs before its CHECK) and from its CHECK (``Checking pod``) to ``Ran pod
    sandbox``. The first sandbox of each pod only; a run that crosses midnight is not read."""
    wanted = set(pods)
    marks: dict[str, dict[str, float]] = {}
    pod_re = re.compile(r"(?:default_|default/|Name:)([a-z0-9-]+)")
    for line in log_text.splitlines():
        m = _CRIO_LINE.match(line)
        if m is None:
            continue
        msg = m.group(2)
        found = pod_re.search(msg)
        if found is None or found.group(1) not in wanted:
            continue
        t, e = _rfc3339_s(m.group(1)), marks.setdefault(found.group(1), {})
        if msg.startswith("Adding pod "):
            e.setdefault("add", t)
        elif msg.startswith("Got pod network") and "add" in e and "add_end" not in e:
            e["add_end"] = t
        elif msg.startswith("Checking pod "):
            e.setdefault("check", t)
        elif msg.startswith("Ran pod sandbox") and "check" in e:
            e.setdefault("ran", t)
    return {
        pod: (
            e["add_end"] - e["add"] if "add_end" in e else None,
            e["ran"] - e["check"] if "ran" in e else None,
        )
        for pod, e in marks.items()
    }


def _median(values: Iterable[float]) -> float:
    return percentile([v for v in values if not math.isnan(v)], 0.5)


def summarize(rounds: Sequence[Round]) -> dict[str, dict[str, object]]:
    """Per variant, over its rounds: per-pod latency percentiles (all rounds' pods pooled),
    the median of each round's all-Ready and all-gone times, and each histogram's deltas
    summed over the rounds (count, mean, p50 and p95 estimated from the buckets)."""
    out: dict[str, dict[str, object]] = {}
    for variant in dict.fromkeys(r.variant for r in rounds):
        mine = [r for r in rounds if r.variant == variant]
        ready = [x for r in mine for x in r.latencies("created", "ready")]
        sched = [x for r in mine for x in r.latencies("created", "scheduled")]
        to_ready = [x for r in mine for x in r.latencies("scheduled", "ready")]
        gone = [x for r in mine for x in r.latencies("delete_sent", "gone")]
        cni_add = [t.cni_add_s for r in mine for t in r.pods.values() if t.cni_add_s is not None]
        cni_check = [t.cni_check_s for r in mine for t in r.pods.values() if t.cni_check_s is not None]
        hists: dict[str, Histogram] = {}
        for r in mine:
            for key, h in r.histograms.items():
                hists[key] = hists[key].plus(h) if key in hists else h
        out[variant] = {
            "rounds": len(mine),
            "pods": len(ready),
            "ready_p50_s": percentile(ready, 0.5),
            "ready_p95_s": percentile(ready, 0.95),
            "scheduled_p50_s": percentile(sched, 0.5),
            "scheduled_p95_s": percentile(sched, 0.95),
            "scheduled_to_ready_p50_s": percentile(to_ready, 0.5),
            "scheduled_to_ready_p95_s": percentile(to_ready, 0.95),
            "gone_p50_s": percentile(gone, 0.5),
            "gone_p95_s": percentile(gone, 0.95),
            "cni_add_p50_s": percentile(cni_add, 0.5),
            "cni_add_p95_s": percentile(cni_add, 0.95),
            "cni_check_p50_s": percentile(cni_check, 0.5),
            "all_ready_s": _median(r.all_ready_s for r in mine),
            "all_gone_s": _median(r.all_gone_s for r in mine),
            "claims_gone_s": _median(r.claims_gone_s for r in mine if r.claims_gone_s is not None),
            "histograms": {
                key: {
                    "count": h.count,
                    "mean_s": h.mean,
                    "p50_s": h.quantile(0.5),
                    "p95_s": h.quantile(0.95),
                }
                for key, h in hists.items()
            },
        }
    return out


ROWS: tuple[tuple[str, str], ...] = (
    ("pod create → Ready, p50", "ready_p50_s"),
    ("pod create → Ready, p95", "ready_p95_s"),
    ("  create → scheduled (node set), p50", "scheduled_p50_s"),
    ("  create → scheduled, p95", "scheduled_p95_s"),
    ("  scheduled → Ready, p50", "scheduled_to_ready_p50_s"),
    ("  scheduled → Ready, p95", "scheduled_to_ready_p95_s"),
    ("  CNI ADD (CRI-O's log), p50", "cni_add_p50_s"),
    ("  CNI ADD (CRI-O's log), p95", "cni_add_p95_s"),
    ("  CNI CHECK → sandbox ready (CRI-O's log), p50", "cni_check_p50_s"),
    ("all N Ready (first create → last Ready)", "all_ready_s"),
    ("pod delete → gone, p50", "gone_p50_s"),
    ("pod delete → gone, p95", "gone_p95_s"),
    ("all N gone (first delete → last gone)", "all_gone_s"),
    ("all N claims gone (first delete →)", "claims_gone_s"),
)
"""The table's rows: label, key of :func:`summarize`'s output (seconds)."""


def _cell(seconds: object) -> str:
    if not isinstance(seconds, int | float) or math.isnan(seconds):
        return ""
    return f"{seconds * 1e3:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _ratio(a: object, b: object) -> str:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or not b or math.isnan(a / b):
        return ""
    return f"{a / b:.2f}×"


def render_table(summary: Mapping[str, Mapping[str, object]], ratios: Sequence[tuple[str, str]]) -> str:
    """A Markdown table: one column per variant, then one per ``(subject, base)`` of
    ``ratios`` (present variants only) with subject/base; per-pod rows first, then each
    histogram's mean (count; p50, p95 from its buckets)."""
    variants = list(summary)
    ratios = [(s, b) for s, b in ratios if s in summary and b in summary]
    header = ["", *variants, *(f"{s} / {b}" for s, b in ratios)]
    rows: list[list[str]] = []
    for label, key in ROWS:
        vals = [summary[v].get(key) for v in variants]
        if all(not _cell(x) for x in vals):
            continue
        rows.append(
            [label, *map(_cell, vals), *(_ratio(summary[s].get(key), summary[b].get(key)) for s, b in ratios)]
        )
    keys: list[str] = []
    for v in variants:
        hists = summary[v].get("histograms")
        if isinstance(hists, Mapping):
            keys += [k for k in hists if k not in keys]
    for key in keys:

        def stat(v: str, key: str = key) -> Mapping[str, float] | None:
            hists = summary[v].get("histograms")
            h = hists.get(key) if isinstance(hists, Mapping) else None
            return h if isinstance(h, Mapping) and h.get("count") else None

        cells = []
        for v in variants:
            h = stat(v)
            cells.append(
                f"{_cell(h['mean_s'])} (n={h['count']:.0f}; {_cell(h['p50_s'])}, {_cell(h['p95_s'])})"
                if h
                else ""
            )
        rows.append(
            [
                f"{key}: mean (n; p50, p95)",
                *cells,
                *(_ratio((h := stat(s)) and h["mean_s"], (g := stat(b)) and g["mean_s"]) for s, b in ratios),
            ]
        )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "| " + " | ".join("-" * w if i == 0 else "-" * (w - 1) + ":" for i, w in enumerate(widths)) + " |"
    return "\n".join([line(header), sep, *map(line, rows)])
