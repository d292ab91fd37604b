"""The kubelet plugin's resource health service (``DRAResourceHealth`` v1 and v1alpha1),
called over its unix socket with stubs from the same .proto files, as the kubelet does: the
registration advertises it, ``NodeWatchResources`` streams complete reports when they
change and again before the kubelet's timeout, and ends when the plugin stops."""

from __future__ import annotations

import dataclasses
import queue
import shutil
import tempfile
import threading
import time

import grpc
import pytest

from cni_dra.k8s.dra_health import DeviceHealth, HealthFeed
from cni_dra.k8s.kubelet_plugin import KubeletPlugin
from cni_dra.k8s.protos import load

DRIVER = "net.cni-dra.dev"
UP = DeviceHealth(
    pool="node-1", device="eth-a", healthy=True, message="host NIC ens1 is up", updated_s=1800000000
)
DOWN = DeviceHealth(
    pool="node-1",
    device="eth-b",
    healthy=False,
    message="host NIC ens2 has no carrier (since 2027-01-15T08:00:10Z)",
    updated_s=1800000010,
)


class NoDriver:
    def prepare_claims(self, claims):  # pragma: no cover - not called here
        raise AssertionError

    def unprepare(self, *a):  # pragma: no cover
        raise AssertionError


@pytest.fixture
def plugin():
    short = tempfile.mkdtemp(prefix="cdh", dir="/tmp")  # unix socket paths are short
    feed = HealthFeed(timeout_s=45, resend_s=0.5)
    p = KubeletPlugin(
        DRIVER, NoDriver(), plugin_dir=f"{short}/plugins", registry_dir=f"{short}/reg", health=feed
    )
    p.start()
    try:
        yield p, feed
    finally:
        p.stop()
        shutil.rmtree(short)


class Stream:
    """``NodeWatchResources`` of one API version, read by a thread into a queue."""

    def __init__(self, plugin: KubeletPlugin, proto: str) -> None:
        self.pb2, services = load(proto)
        self.channel = grpc.insecure_channel(f"unix://{plugin.dra_socket}")
        self.call = services.DRAResourceHealthStub(self.channel).NodeWatchResources(
            self.pb2.NodeWatchResourcesRequest()
        )
        self.got: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for msg in self.call:
                self.got.put((time.monotonic(), msg))
            self.got.put((time.monotonic(), "end"))
        except grpc.RpcError as exc:
            self.got.put((time.monotonic(), exc.code()))

    def next(self, timeout_s: float = 10.0):
        return self.got.get(timeout=timeout_s)

    def devices(self, msg) -> list[tuple]:
        pb2 = self.pb2
        return [
            (
                d.device.pool_name,
                d.device.device_name,
                pb2.HealthStatus.Name(d.health),
                d.message,
                d.last_updated_time,
                d.health_check_timeout_seconds,
            )
            for d in msg.devices
        ]

    def close(self) -> None:
        self.call.cancel()
        self.channel.close()


def test_registration_advertises_the_resource_health_service(plugin):
    p, _ = plugin
    pb2, services = load("pluginregistration_v1")
    with grpc.insecure_channel(f"unix://{p.registration_socket}") as ch:
        info = services.RegistrationStub(ch).GetInfo(pb2.InfoRequest(), timeout=10)
    # a 1.37 kubelet watches the first it knows of v1, v1alpha1, and nothing when neither is listed
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]
    hp, hs = load("health_v1")
    with grpc.insecure_channel(f"unix://{p.dra_socket}") as ch:
        for name in ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"):
            assert (
                hs.HealthStub(ch).Check(hp.HealthCheckRequest(service=name), timeout=10).status
                == hp.HealthCheckResponse.SERVING
            )


def test_without_a_feed_nothing_is_advertised_or_served():
    short = tempfile.mkdtemp(prefix="cdh", dir="/tmp")
    p = KubeletPlugin(DRIVER, NoDriver(), plugin_dir=f"{short}/plugins", registry_dir=f"{short}/reg")
    p.start()
    try:
        assert p.supported_versions() == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
        s = Stream(p, "dra_health_v1")
        assert s.next()[1] == grpc.StatusCode.UNIMPLEMENTED  # what tells a kubelet to stop watching
        s.close()
    finally:
        p.stop()
        shutil.rmtree(short)


@pytest.mark.parametrize("proto", ["dra_health_v1", "dra_health_v1alpha1"])
def test_stream_sends_the_report_on_change_and_again_before_the_timeout(plugin, proto):
    p, feed = plugin
    s = Stream(p, proto)
    try:
        with pytest.raises(queue.Empty):
            s.next(0.7)  # nothing published yet: nothing sent (a report must be complete)
        assert feed.publish([UP, dataclasses.replace(DOWN, healthy=True, message="host NIC ens2 is up")])
        _, first = s.next()
        assert [d[:3] for d in s.devices(first)] == [
            ("node-1", "eth-a", "HEALTHY"),
            ("node-1", "eth-b", "HEALTHY"),
        ]
        t0 = time.monotonic()
        assert feed.publish([UP, DOWN])
        when, msg = s.next()
        assert when - t0 < 0.4  # at once, not at the next resend
        assert s.devices(msg) == [
            ("node-1", "eth-a", "HEALTHY", "host NIC ens1 is up", 1800000000, 45),
            (
                "node-1",
                "eth-b",
                "UNHEALTHY",
                "host NIC ens2 has no carrier (since 2027-01-15T08:00:10Z)",
                1800000010,
                45,
            ),
        ]
        assert not feed.publish([UP, DOWN])  # the same report: no change
        when2, again = s.next()  # but repeated after resend_s, so the kubelet never times it out
        assert 0.3 < when2 - when < 2.0
        assert s.devices(again) == s.devices(msg)
    finally:
        s.close()


def test_a_stream_opened_later_gets_the_current_report_at_once(plugin):
    p, feed = plugin
    feed.publish([DOWN])
    s = Stream(p, "dra_health_v1")
    try:
        when, msg = s.next()
        assert [d[2] for d in s.devices(msg)] == ["UNHEALTHY"]
    finally:
        s.close()


def test_streams_end_when_the_plugin_stops_and_cancelled_ones_free_their_thread(plugin):
    p, feed = plugin
    feed.publish([UP])
    streams = [Stream(p, "dra_health_v1") for _ in range(12)]  # more than the server's threads
    for s in streams[:-1]:
        s.next()
        s.close()  # the kubelet reconnects: the old stream must not keep its worker
    last = streams[-1]
    last.next()
    p.stop()
    _, end = last.next()
    while end != "end" and not isinstance(end, grpc.StatusCode):
        _, end = last.next()
    assert end in ("end", grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
    last.close()


def test_feed_wait_and_close():
    feed = HealthFeed(timeout_s=3)
    assert feed.resend_s == 1.0
    assert feed.wait(0, 0.05) == (0, ())
    feed.publish([UP])
    assert feed.wait(0, 5) == (1, (UP,))
    assert feed.current() == (1, (UP,))
    threading.Timer(0.1, feed.close).start()
    assert feed.wait(1, 5) is None
    with pytest.raises(ValueError):
        HealthFeed(timeout_s=0)
