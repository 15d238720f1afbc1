"""Fake API server: injected faults (watch-semantics.md §4, §5.5, §7, §8) as the official client
experiences them, plus byte-level checks of the chunk framing with a raw socket."""

from __future__ import annotations

import json
import socket
import threading
import time

import kubernetes
import pydantic
import pytest
import urllib3
from kubernetes.client.rest import ApiException

from collector.sim import Fault
from collector.sim.scenario import make_claim, make_pod


@pytest.fixture
def core(srv):
    cfg = kubernetes.client.Configuration()
    cfg.host = srv.url
    return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(cfg))


def _read_exact(sock: socket.socket, buf: bytearray, n: int) -> bytes:
    while len(buf) < n:
        data = sock.recv(65536)
        if not data:
            raise EOFError(f"EOF after {len(buf)} of {n} bytes")
        buf += data
    out = bytes(buf[:n])
    del buf[:n]
    return out


def _read_line(sock: socket.socket, buf: bytearray) -> bytes:
    while b"\r\n" not in buf:
        data = sock.recv(65536)
        if not data:
            raise EOFError("EOF inside a line")
        buf += data
    i = buf.index(b"\r\n")
    line = bytes(buf[:i])
    del buf[: i + 2]
    return line


def raw_watch(srv, path: str, timeout_s: float = 5.0) -> tuple[bytes, list[bytes], str]:
    """GET ``path`` on a raw socket; returns (header block, chunk payloads, how it ended).

    ``how`` is ``clean`` (terminating chunk), ``eof`` (FIN without it) or ``reset``.
    """
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=timeout_s)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: sim\r\nAccept: application/json\r\n\r\n".encode())
    buf = bytearray()
    chunks: list[bytes] = []
    try:
        while b"\r\n\r\n" not in buf:
            data = sock.recv(65536)
            if not data:
                return bytes(buf), chunks, "eof"
            buf += data
        head, _, rest = bytes(buf).partition(b"\r\n\r\n")
        buf = bytearray(rest)
        while True:
            size = int(_read_line(sock, buf), 16)
            if size == 0:
                _read_line(sock, buf)
                return head, chunks, "clean"
            chunks.append(_read_exact(sock, buf, size))
            assert _read_exact(sock, buf, 2) == b"\r\n"
    except EOFError:
        return head, chunks, "eof"
    except ConnectionResetError:
        return head, chunks, "reset"
    finally:
        sock.close()


def test_watch_framing_is_chunked_newline_delimited_and_ends_with_zero_chunk(srv):
    for name in ("a", "b", "c"):
        srv.apply(make_pod(name, "ml"))
    head, chunks, how = raw_watch(srv, "/api/v1/pods?watch=true&timeoutSeconds=1")
    assert head.startswith(b"HTTP/1.1 200")
    assert b"Transfer-Encoding: chunked" in head and b"Content-Type: application/json" in head
    assert how == "clean"
    body = b"".join(chunks)
    assert body.endswith(b"\n") and body.count(b"\n") == 3
    # the three synthetic events were queued together: they share one chunk
    assert len(chunks) == 1


def test_split_utf8_splits_inside_the_character_and_arrives_intact(srv, core):
    text = "Überweisung – 取引 😀 prüfen"
    claim = make_claim("utf8", "ml", annotations={"bank.example/purpose": text})
    rv = str(srv.current_rv)
    srv.apply(claim)
    srv.add_fault(Fault(kind="ResourceClaim", verb="watch", action="split_utf8", pause_s=0.05))
    _head, chunks, how = raw_watch(srv, f"/apis/resource.k8s.io/v1/resourceclaims?watch=true&resourceVersion={rv}&timeoutSeconds=1")
    assert how == "clean" and len(chunks) == 2
    first = chunks[0]
    assert first[-1] >= 0xC0  # the first chunk ends with the lead byte of a multi-byte character
    with pytest.raises(UnicodeDecodeError):
        first.decode("utf-8")
    event = json.loads(b"".join(chunks))
    assert event["object"]["metadata"]["annotations"]["bank.example/purpose"] == text
    # and through the official client
    srv.add_fault(Fault(kind="Pod", verb="watch", action="split_utf8"))
    pod = make_pod("p", "ml")
    pod["metadata"]["annotations"] = {"purpose": text}
    srv.apply(pod)
    [e] = list(kubernetes.watch.Watch().stream(core.list_pod_for_all_namespaces, resource_version=rv, timeout_seconds=1))
    assert e["object"].metadata.annotations["purpose"] == text


def test_cut_mid_event_gives_protocol_error_after_the_complete_events(srv, core):
    rv = str(srv.current_rv)
    written = [srv.apply(make_pod(f"p{i}", "ml")) for i in range(4)]
    srv.add_fault(Fault(kind="Pod", verb="watch", action="cut_mid_event", after_events=2))
    got = []
    with pytest.raises(urllib3.exceptions.ProtocolError):
        for e in kubernetes.watch.Watch().stream(core.list_pod_for_all_namespaces, resource_version=rv):
            got.append(e["raw_object"]["metadata"]["resourceVersion"])
    assert got == [w["metadata"]["resourceVersion"] for w in written[:2]]
    # on the wire: complete chunks, then half an event, then FIN without the zero chunk
    srv.add_fault(Fault(kind="Pod", verb="watch", action="cut_mid_event", after_events=2))
    _head, chunks, how = raw_watch(srv, f"/api/v1/pods?watch=true&resourceVersion={rv}")
    assert how == "eof"
    body = b"".join(chunks)
    assert body.count(b"\n") == 2
    tail = body[body.rindex(b"\n") + 1 :]
    assert tail.startswith(b'{"type":"ADDED"')  # half of the third event
    with pytest.raises(ValueError):
        json.loads(tail)


def test_reset_mid_stream_and_before_headers(srv, core):
    rv = str(srv.current_rv)
    for i in range(3):
        srv.apply(make_pod(f"p{i}", "ml"))
    srv.add_fault(Fault(kind="Pod", verb="watch", action="reset_mid_stream", after_events=1))
    _head, chunks, how = raw_watch(srv, f"/api/v1/pods?watch=true&resourceVersion={rv}")
    assert how in ("reset", "eof") and b"".join(chunks).count(b"\n") == 1
    srv.add_fault(Fault(kind="Pod", verb="list", action="reset_before_headers"))
    with pytest.raises(urllib3.exceptions.ProtocolError):
        core.api_client.rest_client.pool_manager.request("GET", srv.url + "/api/v1/pods", retries=False)
    assert len(core.list_pod_for_all_namespaces().items) == 3  # the fault was consumed


def test_stall_needs_a_client_read_timeout(srv, core):
    srv.apply(make_pod("a", "ml"))
    srv.add_fault(Fault(kind="Pod", verb="watch", action="stall", seconds=5))
    t0 = time.monotonic()
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        list(kubernetes.watch.Watch().stream(core.list_pod_for_all_namespaces, resource_version=str(srv.current_rv),
                                             _request_timeout=(2, 0.5)))
    assert 0.4 <= time.monotonic() - t0 < 2.0
    # a stalled list sends its headers, then nothing until the stall ends
    srv.add_fault(Fault(kind="Pod", verb="list", action="stall", seconds=0.6))
    t0 = time.monotonic()
    assert [p.metadata.name for p in core.list_pod_for_all_namespaces().items] == ["a"]
    assert time.monotonic() - t0 >= 0.55


def test_429_with_retry_after_is_retried_by_urllib3(srv, core):
    srv.apply(make_pod("a", "ml"))
    srv.add_fault(Fault(kind="Pod", verb="list", action="status", code=429, retry_after=1))
    t0 = time.monotonic()
    pods = core.list_pod_for_all_namespaces()
    assert [p.metadata.name for p in pods.items] == ["a"]
    lists = [r for r in srv.requests if r.path == "/api/v1/pods"]
    assert len(lists) == 2 and lists[1].at - lists[0].at >= 0.9
    assert time.monotonic() - t0 >= 0.9


def test_429_body_is_plain_text_and_503_raises(srv, core):
    srv.add_fault(Fault(kind="Pod", verb="list", action="status", code=429))  # no Retry-After: not retried
    with pytest.raises(ApiException) as info:
        core.list_pod_for_all_namespaces()
    assert info.value.status == 429
    body = info.value.body.decode() if isinstance(info.value.body, bytes) else info.value.body
    assert body == "Too many requests, please try again later.\n"
    assert info.value.headers["Content-Type"].startswith("text/plain")
    srv.add_fault(Fault(kind="Pod", verb="list", action="status", code=503))
    with pytest.raises(kubernetes.client.exceptions.ServiceException) as info:
        core.list_pod_for_all_namespaces()
    assert info.value.status == 503
    assert json.loads(info.value.body)["reason"] == "ServiceUnavailable"
    srv.add_fault(Fault(kind="Pod", verb="watch", action="status", code=500))
    with pytest.raises(kubernetes.client.exceptions.ServiceException):
        list(kubernetes.watch.Watch().stream(core.list_pod_for_all_namespaces, timeout_seconds=1))


def test_http_410_on_a_watch_raises_api_exception(srv, core):
    srv.add_fault(Fault(kind="Pod", verb="watch", action="http_410"))
    with pytest.raises(ApiException) as info:
        list(kubernetes.watch.Watch().stream(core.list_pod_for_all_namespaces, resource_version=str(srv.current_rv)))
    assert info.value.status == 410 and json.loads(info.value.body)["reason"] == "Expired"


def test_error_event_first_even_with_a_field_selector(srv, core):
    srv.apply(make_pod("a", "ml", node_name="node-a"))
    rv = str(srv.current_rv)
    srv.add_fault(Fault(kind="Pod", verb="watch", action="error_event", count=3))
    resp = core.list_pod_for_all_namespaces(watch=True, resource_version=rv, field_selector="spec.nodeName=node-a",
                                            timeout_seconds=1, _preload_content=False)
    [line] = resp.data.decode().splitlines()
    event = json.loads(line)
    assert event["type"] == "ERROR" and event["object"]["code"] == 410 and event["object"]["reason"] == "Expired"
    with pytest.raises(ApiException) as info:  # uses two and three: the client retries once with the same RV
        list(kubernetes.watch.Watch().stream(core.list_pod_for_all_namespaces, resource_version=rv))
    assert info.value.status == 410
    assert srv.pending_faults() == []


def test_inject_line_yields_none_for_invalid_json_then_continues(srv, core):
    rv = str(srv.current_rv)
    srv.apply(make_pod("a", "ml"))
    srv.add_fault(Fault(kind="Pod", verb="watch", action="inject_line", raw=b'{"type":"ADDED","object":{"kind":'))
    got = list(kubernetes.watch.Watch().stream(core.list_pod_for_all_namespaces, resource_version=rv, timeout_seconds=1))
    assert got[0] is None and got[1]["object"].metadata.name == "a" and len(got) == 2


def test_inject_wrongly_typed_field_raises_validation_error_in_the_client(srv):
    cfg = kubernetes.client.Configuration()
    cfg.host = srv.url
    resource = kubernetes.client.ResourceV1Api(kubernetes.client.ApiClient(cfg))
    rv = str(srv.current_rv)
    bad = {"kind": "ResourceSlice", "apiVersion": "resource.k8s.io/v1",
           "metadata": {"name": "s", "resourceVersion": str(srv.current_rv + 1)},
           "spec": {"driver": "gpu.nvidia.com", "nodeName": "n", "pool": {"name": "n", "generation": 1, "resourceSliceCount": "many"}}}
    srv.add_fault(Fault(kind="ResourceSlice", verb="watch", action="inject_line", raw=json.dumps({"type": "ADDED", "object": bad})))
    with pytest.raises(pydantic.ValidationError) as info:
        list(kubernetes.watch.Watch().stream(resource.list_resource_slice, resource_version=rv, timeout_seconds=1))
    assert "resourceSliceCount" in str(info.value) and "valid integer" in str(info.value)


def test_close_immediately_makes_the_python_watch_reconnect_in_a_hot_loop(srv, core):
    srv.add_fault(Fault(kind="Pod", verb="watch", action="close_immediately", count=5))
    rv = str(srv.current_rv)
    w = kubernetes.watch.Watch()
    stopper = threading.Timer(1.0, lambda: (srv.apply(make_pod("a", "ml"))))
    stopper.start()
    for e in w.stream(core.list_pod_for_all_namespaces, resource_version=rv):
        assert e["object"].metadata.name == "a"
        w.stop()
        break
    watches = [r for r in srv.requests if r.query.get("watch") == "true"]
    assert len(watches) == 6 and all(r.query["resourceVersion"] == rv for r in watches)
    assert watches[5].at - watches[0].at < 0.5  # no backoff in the client


def test_faults_match_kind_verb_namespace_and_count(srv, core):
    srv.apply(make_pod("a", "ml"))
    srv.apply(make_pod("b", "web"))
    f = srv.add_fault(Fault(kind="Pod", verb="list", action="status", code=500, namespace="web", count=2))
    assert [p.metadata.name for p in core.list_pod_for_all_namespaces().items] == ["a", "b"]  # other path
    assert [p.metadata.name for p in core.list_namespaced_pod("ml").items] == ["a"]
    for _ in range(2):
        with pytest.raises(kubernetes.client.exceptions.ServiceException):
            core.list_namespaced_pod("web")
    assert [p.metadata.name for p in core.list_namespaced_pod("web").items] == ["b"]
    assert f.count == 0 and srv.pending_faults() == []
    with pytest.raises(ValueError):
        Fault(kind="Pod", verb="list", action="explode")
    with pytest.raises(ValueError):
        Fault(kind="Pod", verb="watch", action="stall", second=3)


def test_requests_are_recorded_with_their_query(srv, core):
    core.list_pod_for_all_namespaces(limit=5, label_selector="app=fraud")
    list(kubernetes.watch.Watch().stream(core.list_namespaced_pod, "ml", resource_version="1", allow_watch_bookmarks=True,
                                         timeout_seconds=1))
    lst, watch = srv.requests
    assert (lst.method, lst.path, lst.query) == ("GET", "/api/v1/pods", {"limit": "5", "labelSelector": "app=fraud"})
    assert watch.path == "/api/v1/namespaces/ml/pods"
    assert watch.query == {"allowWatchBookmarks": "true", "resourceVersion": "1", "timeoutSeconds": "1", "watch": "true"}
    assert watch.headers["Accept"] == "application/json" and watch.at >= lst.at


def test_delay_newline_sends_the_event_end_in_a_later_chunk(srv, core):
    rv = str(srv.current_rv)
    srv.apply(make_pod("a", "ml"))
    srv.add_fault(Fault(kind="Pod", verb="watch", action="delay_newline", pause_s=0.1))
    _head, chunks, how = raw_watch(srv, f"/api/v1/pods?watch=true&resourceVersion={rv}&timeoutSeconds=1")
    assert how == "clean" and chunks[0].endswith(b"}") and chunks[1] == b"\n"
    assert json.loads(chunks[0])["object"]["metadata"]["name"] == "a"
    srv.add_fault(Fault(kind="Pod", verb="watch", action="delay_newline", pause_s=0.1))
    [e] = list(kubernetes.watch.Watch().stream(core.list_pod_for_all_namespaces, resource_version=rv, timeout_seconds=1))
    assert e["object"].metadata.name == "a"


def test_outage_refuses_connections_then_serves_on_the_same_port(srv, core):
    older = srv.apply(make_pod("a", "ml"))["metadata"]["resourceVersion"]
    rv = srv.apply(make_pod("b", "ml"))["metadata"]["resourceVersion"]
    got, errors = [], []

    def watch():
        try:
            for e in kubernetes.watch.Watch().stream(core.list_pod_for_all_namespaces, resource_version=rv, timeout_seconds=30):
                got.append(e)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            errors.append(exc)

    t = threading.Thread(target=watch)
    t.start()
    assert srv.wait_for_watches(1)
    port = srv.port
    srv.outage(0.5)
    t.join(3)
    assert not t.is_alive() and got == [] and isinstance(errors[0], urllib3.exceptions.ProtocolError)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1)
    time.sleep(0.8)
    assert srv.port == port and [p.metadata.name for p in core.list_pod_for_all_namespaces().items] == ["a", "b"]
    # a restarted apiserver rebuilt its watch cache: older resume points are gone
    resp = core.list_pod_for_all_namespaces(watch=True, resource_version=older, timeout_seconds=1, _preload_content=False)
    assert json.loads(resp.data.decode().splitlines()[0])["object"]["code"] == 410
