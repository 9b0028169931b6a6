"""nvcli's HTTP layer (cli/transport/http.py) against real sockets: a recording HTTP(S) server, a
recording proxy, certificates from a throwaway CA. What arrives on the wire is checked,
not what the client meant to send."""

from __future__ import annotations

import base64
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

from cli.transport.http import HttpClient, HttpError, HttpTimeout, tls_context
from cli.transport.proxy import Proxy, environment_proxy
from tests.fakes.pki import CertificateAuthority, CertPaths
from tests.support.http_proxy import RecordingProxy
from tests.support.http_recorder import RecordingServer, Reply, Seen
from tests.support.ports import free_port

TOKEN = "Bearer s3cret-token"


def ok(_seen: Seen) -> Reply:
    return Reply(json={"ok": True})


@pytest.fixture(autouse=True)
def no_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine's own proxy settings must not steer these tests."""
    for name in list(os.environ):
        if name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    return CertificateAuthority(tmp_path / "ca")


@pytest.fixture
def server_cert(ca: CertificateAuthority) -> CertPaths:
    return ca.issue_server("origin", hosts=["127.0.0.1"])


@pytest.fixture(params=["http", "https"])
def origin(request: pytest.FixtureRequest, server_cert: CertPaths) -> Iterator[RecordingServer]:
    """A server answering `ok`, over plain HTTP and over TLS."""
    tls = server_cert if request.param == "https" else None
    with RecordingServer(ok, tls=tls) as server:
        yield server


def client_for(server: RecordingServer, cert: CertPaths, **kwargs: object) -> HttpClient:
    context = tls_context(str(cert.ca)) if server.url.startswith("https") else None
    return HttpClient(server.url, context=context, **kwargs)  # type: ignore[arg-type]


def wait_until_closed_by_peer(local_port: int) -> None:
    """Wait until the kernel holds our end of 127.0.0.1:`local_port` in CLOSE_WAIT (the
    server's FIN arrived): a condition, so the test does not race the server's close."""
    suffix = f":{local_port:04X}"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[1].endswith(suffix) and fields[3] == "08":  # TCP_CLOSE_WAIT
                return
        time.sleep(0.01)
    pytest.fail(f"the server never closed the connection from port {local_port}")


# -- connections ---------------------------------------------------------------------------


def test_requests_of_one_client_share_one_connection(
    origin: RecordingServer, server_cert: CertPaths
) -> None:
    with client_for(origin, server_cert) as client:
        assert client.request("GET", "/one").is_success
        assert client.request("GET", "/two").is_success
    first, second = origin.seen
    assert first.client_port == second.client_port


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_a_connection_the_server_dropped_unannounced_is_replaced(
    tls: bool, server_cert: CertPaths
) -> None:
    """Keep-alive servers close idle connections without a `Connection: close` header."""

    def close_after_the_first(seen: Seen) -> Reply:
        return Reply(json={}, close=seen.target == "/first")

    tls_cert = server_cert if tls else None
    with (
        RecordingServer(close_after_the_first, tls=tls_cert) as origin,
        client_for(origin, server_cert) as client,
    ):
        assert client.request("GET", "/first").is_success
        wait_until_closed_by_peer(origin.seen[0].client_port)
        assert client.request("GET", "/second").is_success
    first, second = origin.seen
    assert first.client_port != second.client_port


def test_a_connection_dropped_with_the_request_unanswered_is_an_error_then_replaced() -> None:
    """The server reads the next request on a kept connection and closes without answering:
    HttpError (nvcli exit 1), not a traceback; the client's next request connects anew."""
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    listener = socket.create_server(("127.0.0.1", 0))
    ports: list[int] = []

    def serve() -> None:
        for _connection in range(2):  # each: one answer, then the next request is dropped
            conn, (_, port) = listener.accept()
            ports.append(port)
            with conn, conn.makefile("rb") as reader:
                _read_head(reader)
                conn.sendall(answer)
                _read_head(reader)  # the next request arrives (or EOF)... and is dropped

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with HttpClient(f"http://127.0.0.1:{listener.getsockname()[1]}") as client:
            assert client.request("GET", "/one").is_success
            with pytest.raises(HttpError) as info:
                client.request("GET", "/two")
            assert not isinstance(info.value, HttpTimeout)
            assert "GET http://127.0.0.1" in str(info.value)
            assert client.request("GET", "/three").is_success
    finally:
        listener.close()
        thread.join(timeout=10)
    assert len(ports) == 2
    assert ports[0] != ports[1]


def _read_head(reader: BinaryIO) -> None:
    while reader.readline() not in (b"\r\n", b""):
        pass


# -- timeouts and refusals -----------------------------------------------------------------


def test_no_answer_within_the_timeout_is_http_timeout() -> None:
    release = threading.Event()

    def slow(_seen: Seen) -> Reply:
        release.wait(timeout=2)
        return Reply(json={})

    with RecordingServer(slow) as server:
        try:
            with HttpClient(server.url, timeout=0.3) as client, pytest.raises(HttpTimeout):
                client.request("GET", "/slow")
        finally:
            release.set()


def test_a_server_that_never_completes_the_tls_handshake_is_http_timeout(
    ca: CertificateAuthority,
) -> None:
    """The kernel accepts the TCP connection (backlog); nothing ever answers the hello."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        url = f"https://127.0.0.1:{silent.getsockname()[1]}"
        context = tls_context(str(ca.cert_path))
        with HttpClient(url, context=context, timeout=0.3) as client, pytest.raises(HttpTimeout):
            client.request("GET", "/")


def test_connection_refused_is_http_error_not_timeout() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with HttpClient(url, timeout=5) as client, pytest.raises(HttpError) as info:
        client.request("GET", "/version")
    assert not isinstance(info.value, HttpTimeout)
    assert "refused" in str(info.value).lower()
    assert "/version" in str(info.value)


# -- TLS -------------------------------------------------------------------------------------


def test_tls_verified_against_the_given_ca(server_cert: CertPaths) -> None:
    with (
        RecordingServer(ok, tls=server_cert) as server,
        HttpClient(server.url, context=tls_context(str(server_cert.ca))) as client,
    ):
        assert client.request("GET", "/").json() == {"ok": True}


def test_tls_from_another_ca_is_refused(server_cert: CertPaths, tmp_path: Path) -> None:
    other = CertificateAuthority(tmp_path / "other", name="other-ca")
    with RecordingServer(ok, tls=server_cert) as server:
        with (
            HttpClient(server.url, context=tls_context(str(other.cert_path))) as client,
            pytest.raises(HttpError, match="certificate verify failed"),
        ):
            client.request("GET", "/")
        assert server.seen == []


def test_tls_context_true_uses_the_system_trust_store_only(server_cert: CertPaths) -> None:
    with RecordingServer(ok, tls=server_cert) as server:
        for context in (tls_context(True), None):  # None: the client's own default
            with (
                HttpClient(server.url, context=context) as client,
                pytest.raises(HttpError, match="certificate verify failed"),
            ):
                client.request("GET", "/")
        assert server.seen == []


def test_tls_server_name_checks_the_certificate_against_that_name(
    ca: CertificateAuthority,
) -> None:
    """kubeconfig's tls-server-name: dial an address, verify a name the cert holds."""
    named = ca.issue_server("agent", hosts=["agent.test"])
    with RecordingServer(ok, tls=named) as server:
        context = tls_context(str(named.ca))
        with HttpClient(server.url, context=context, server_name="agent.test") as client:
            assert client.request("GET", "/").is_success
        for server_name in (None, "other.test"):
            with (
                HttpClient(server.url, context=context, server_name=server_name) as client,
                pytest.raises(HttpError, match="mismatch"),
            ):
                client.request("GET", "/")
    assert len(server.seen) == 1


def test_tls_context_false_accepts_any_certificate(tmp_path: Path) -> None:
    stranger = CertificateAuthority(tmp_path / "stranger").issue_server(
        "elsewhere", hosts=["elsewhere.test"]
    )
    with (
        RecordingServer(ok, tls=stranger) as server,
        HttpClient(server.url, context=tls_context(False)) as client,
    ):
        assert client.request("GET", "/").is_success


def test_tls_context_passes_a_given_context_through() -> None:
    context = tls_context(True)
    assert tls_context(context) is context


# -- requests ------------------------------------------------------------------------------


def test_base_url_path_prefixes_every_path_and_params_are_percent_encoded() -> None:
    with RecordingServer(ok) as server:
        base = f"{server.url}/k8s/clusters/c1/"
        with HttpClient(base) as client:
            response = client.request(
                "GET",
                "/apis/x",
                params=[("labelSelector", "app=a/b"), ("k", "1"), ("k", "two words")],
            )
            client.request("GET", "/apis/y", params={"fieldSelector": "spec.nodeName=n1"})
    assert response.path == "/k8s/clusters/c1/apis/x"
    first, second = server.seen
    assert first.target == "/k8s/clusters/c1/apis/x?labelSelector=app%3Da%2Fb&k=1&k=two%20words"
    assert second.target == "/k8s/clusters/c1/apis/y?fieldSelector=spec.nodeName%3Dn1"


def test_json_body_and_response() -> None:
    def answer(seen: Seen) -> Reply:
        if seen.path == "/missing":
            return Reply(status=404, json={"kind": "Status", "reason": "NotFound"})
        if seen.path == "/page":
            return Reply(status=502, text="<html>bad gateway</html>")
        return Reply(status=201, json={"echo": seen.json()})

    body = {"gpus": 2, "name": "dana-ü"}
    with (
        RecordingServer(answer) as server,
        HttpClient(server.url, headers={"User-Agent": "nvcli/test"}) as client,
    ):
        created = client.request("POST", "/mounts", body=body)
        missing = client.request("GET", "/missing")
        page = client.request("GET", "/page")
    posted = server.seen[0]
    assert posted.method == "POST"
    assert posted.headers["content-type"] == "application/json"
    assert posted.headers["user-agent"] == "nvcli/test"
    assert posted.json() == body
    assert "content-type" not in server.seen[1].headers  # no body, no type
    assert (created.status, created.is_success, created.json()) == (201, True, {"echo": body})
    assert (missing.status, missing.reason, missing.is_success) == (404, "Not Found", False)
    assert missing.json()["reason"] == "NotFound"
    assert page.text == "<html>bad gateway</html>"
    with pytest.raises(ValueError):
        page.json()


def test_authorization_is_asked_for_on_every_request() -> None:
    """Exec-plugin tokens expire: each request gets the header afresh."""
    calls: list[int] = []

    def authorization() -> str | None:
        calls.append(1)
        return None if len(calls) == 2 else f"Bearer token-{len(calls)}"

    with (
        RecordingServer(ok) as server,
        HttpClient(server.url, authorization=authorization) as client,
    ):
        for _ in range(3):
            client.request("GET", "/")
    assert len(calls) == 3
    first, second, third = (seen.headers for seen in server.seen)
    assert first["authorization"] == "Bearer token-1"
    assert "authorization" not in second
    assert third["authorization"] == "Bearer token-3"


def test_no_authorization_callable_sends_no_header() -> None:
    with RecordingServer(ok) as server, HttpClient(server.url) as client:
        client.request("GET", "/")
    assert "authorization" not in server.seen[0].headers


def test_base_url_must_be_http_or_https() -> None:
    for url in ("ftp://host/", "127.0.0.1:8443", "https:///path"):
        with pytest.raises(ValueError, match="not an http:// or https:// URL"):
            HttpClient(url)


# -- proxies ---------------------------------------------------------------------------------


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_https_through_a_proxy_is_tunnelled_with_proxy_credentials(
    server_cert: CertPaths,
) -> None:
    with (
        RecordingServer(ok, tls=server_cert) as origin,
        RecordingProxy() as proxy,
        HttpClient(
            origin.url,
            context=tls_context(str(server_cert.ca)),
            proxy=f"http://user:pa%40ss@127.0.0.1:{proxy.port}",
            authorization=lambda: TOKEN,
        ) as client,
    ):
        assert client.request("GET", "/apis/x").is_success
        assert client.request("GET", "/apis/y").is_success
    [connect] = proxy.requests  # one tunnel, kept open for both requests
    assert connect.request_line == f"CONNECT 127.0.0.1:{origin.port}"
    assert connect.headers["proxy-authorization"] == basic("user", "pa@ss")
    assert TOKEN.encode() not in proxy.received  # inside TLS
    assert b"/apis/x" not in proxy.received
    assert [seen.path for seen in origin.seen] == ["/apis/x", "/apis/y"]  # both reached it
    for seen in origin.seen:
        assert seen.headers["authorization"] == TOKEN
        assert "proxy-authorization" not in seen.headers
        assert not any(name.startswith("proxy-") for name in seen.headers)


def test_plain_http_through_a_proxy_asks_for_the_absolute_url() -> None:
    with (
        RecordingServer(ok) as origin,
        RecordingProxy() as proxy,
        HttpClient(f"{origin.url}/base", proxy=f"http://u:p@127.0.0.1:{proxy.port}") as client,
    ):
        assert client.request("GET", "/path", params={"x": "1"}).json() == {"ok": True}
        assert client.request("GET", "/again").is_success
    first, second = proxy.requests
    assert first.request_line == f"GET http://127.0.0.1:{origin.port}/base/path?x=1"
    assert first.headers["host"] == f"127.0.0.1:{origin.port}"
    assert first.headers["proxy-authorization"] == basic("u", "p")  # no tunnel to carry it
    assert second.request_line == f"GET http://127.0.0.1:{origin.port}/base/again"
    assert [seen.target for seen in origin.seen] == ["/base/path?x=1", "/base/again"]


def test_a_proxy_that_refuses_the_tunnel_is_http_error(server_cert: CertPaths) -> None:
    with RecordingProxy() as proxy:
        url = f"https://127.0.0.1:{free_port()}"
        context = tls_context(str(server_cert.ca))
        with (
            HttpClient(url, context=context, proxy=proxy.url) as client,
            pytest.raises(HttpError, match="502"),
        ):
            client.request("GET", "/")
    assert [r.method for r in proxy.requests] == ["CONNECT"]


@pytest.mark.parametrize(
    "url",
    ["https://user:hunter2@proxy.corp:3128", "socks5://user:hunter2@proxy.corp:1080"],
    ids=["https", "socks5"],
)
def test_proxy_parse_refuses_what_is_not_http(url: str) -> None:
    with pytest.raises(ValueError, match=r"only http:// proxies are supported") as info:
        Proxy.parse(url)
    assert "hunter2" not in str(info.value)
    with pytest.raises(ValueError, match=r"only http:// proxies are supported"):
        HttpClient("https://api.example.test", proxy=url)


def test_proxy_parse_accepts_host_and_port_without_scheme() -> None:
    assert Proxy.parse("proxy.corp:3128") == Proxy("proxy.corp", 3128, None)
    assert Proxy.parse("http://proxy.corp") == Proxy("proxy.corp", 80, None)
    assert Proxy.parse("http://a%3Ab:c%3Ad@p:8").authorization == basic("a:b", "c:d")


def test_the_environment_proxy_is_used_for_a_remote_server(
    monkeypatch: pytest.MonkeyPatch, ca: CertificateAuthority
) -> None:
    """HTTPS_PROXY, end to end: the proxy resolves the name, TLS verifies it."""
    cert = ca.issue_server("api", hosts=["api.example.test"])
    with (
        RecordingServer(ok, tls=cert) as origin,
        RecordingProxy(hosts={"api.example.test": "127.0.0.1"}) as proxy,
    ):
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        url = f"https://api.example.test:{origin.port}"
        with HttpClient(url, context=tls_context(str(cert.ca))) as client:
            assert client.request("GET", "/version").is_success
    assert [r.request_line for r in proxy.requests] == [f"CONNECT api.example.test:{origin.port}"]
    assert [s.target for s in origin.seen] == ["/version"]


def test_the_environment_proxy_is_not_used_for_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    with RecordingServer(ok) as origin, RecordingProxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("http_proxy", proxy.url)
        with HttpClient(origin.url) as client:
            assert client.request("GET", "/x").is_success
    assert proxy.requests == []
    assert [s.target for s in origin.seen] == ["/x"]


def test_an_explicit_proxy_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    resolve = {"api.example.test": "127.0.0.1"}
    with RecordingServer(ok) as origin, RecordingProxy(hosts=resolve) as chosen:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{free_port()}")  # nothing there
        with HttpClient(f"http://api.example.test:{origin.port}", proxy=chosen.url) as client:
            assert client.request("GET", "/x").is_success
    assert [r.request_line for r in chosen.requests] == [
        f"GET http://api.example.test:{origin.port}/x"
    ]


def test_a_token_is_never_sent_in_clear_text_to_a_proxy() -> None:
    """The attack: a proxy on the path of an http:// server reads a bearer token. The
    client refuses before anything leaves; without a token the same request goes."""
    with RecordingServer(ok) as origin, RecordingProxy() as proxy:
        with (
            HttpClient(origin.url, proxy=proxy.url, authorization=lambda: TOKEN) as client,
            pytest.raises(HttpError, match="clear text") as info,
        ):
            client.request("GET", "/apis/x")
        assert not isinstance(info.value, HttpTimeout)
        assert b"s3cret-token" not in proxy.received
        assert proxy.requests == []
        assert origin.seen == []
        with HttpClient(origin.url, proxy=proxy.url, authorization=lambda: None) as client:
            assert client.request("GET", "/apis/x").is_success
    assert len(proxy.requests) == 1


# -- the proxy from the environment ------------------------------------------------------------

HTTPS_P, HTTP_P = "http://https-proxy.corp:3128", "http://http-proxy.corp:8080"
BOTH = {"HTTPS_PROXY": HTTPS_P, "HTTP_PROXY": HTTP_P}
API = "api.example.com"


@pytest.mark.parametrize(
    ("variables", "scheme", "host", "expected"),
    [
        pytest.param(BOTH, "https", API, HTTPS_P, id="https-by-HTTPS_PROXY"),
        pytest.param(BOTH, "http", API, HTTP_P, id="http-by-HTTP_PROXY"),
        pytest.param({"https_proxy": HTTPS_P}, "https", API, HTTPS_P, id="lower-case-https"),
        pytest.param({"http_proxy": HTTP_P}, "http", API, HTTP_P, id="lower-case-http"),
        pytest.param({"HTTP_PROXY": HTTP_P}, "https", API, None, id="https-no-fallback"),
        pytest.param({"HTTPS_PROXY": HTTPS_P}, "http", API, None, id="http-no-fallback"),
        pytest.param({}, "https", API, None, id="none-set"),
        pytest.param({**BOTH, "NO_PROXY": API}, "https", API, None, id="no-proxy-exact"),
        pytest.param({**BOTH, "no_proxy": API}, "http", API, None, id="no-proxy-lower-case"),
        pytest.param({**BOTH, "NO_PROXY": "example.com"}, "https", API, None, id="no-proxy-domain"),
        pytest.param({**BOTH, "NO_PROXY": ".example.com"}, "https", API, None, id="no-proxy-dot"),
        pytest.param(
            {**BOTH, "NO_PROXY": "other.org, example.com"}, "https", API, None, id="no-proxy-list"
        ),
        pytest.param(
            {**BOTH, "NO_PROXY": "example.com"},
            "https",
            "api.notexample.com",
            HTTPS_P,
            id="no-proxy-not-a-bare-suffix",
        ),
        pytest.param(
            {**BOTH, "NO_PROXY": API}, "https", "example.com", HTTPS_P, id="no-proxy-not-parent"
        ),
        pytest.param({**BOTH, "NO_PROXY": "*"}, "https", API, None, id="no-proxy-star"),
        pytest.param(BOTH, "https", "127.0.0.1", None, id="loopback-127.0.0.1"),
        pytest.param(BOTH, "http", "127.0.0.1", None, id="loopback-http"),
        pytest.param(BOTH, "https", "127.0.0.53", None, id="loopback-127/8"),
        pytest.param(BOTH, "https", "localhost", None, id="loopback-localhost"),
        pytest.param(BOTH, "https", "::1", None, id="loopback-::1"),
    ],
)
def test_environment_proxy(
    monkeypatch: pytest.MonkeyPatch,
    variables: dict[str, str],
    scheme: str,
    host: str,
    expected: str | None,
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert environment_proxy(scheme, host) == expected


def test_no_proxy_cidr_as_kubectl_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", HTTPS_P)
    monkeypatch.setenv("NO_PROXY", "10.0.0.0/8,.svc")
    assert environment_proxy("https", "10.96.0.1") is None


@pytest.mark.parametrize(
    ("no_proxy", "host", "port", "direct"),
    [
        ("10.0.0.0/8", "10.96.0.1", 443, True),
        ("10.0.0.0/8", "192.168.1.5", 443, False),
        ("fd00::/8", "fd00::5", 443, True),
        ("10.96.0.1", "10.96.0.1", 6443, True),
        ("10.96.0.1:6443", "10.96.0.1", 6443, True),
        ("10.96.0.1:6443", "10.96.0.1", 443, False),
        ("[fd00::5]:443", "fd00::5", 443, True),
        ("example.com:8443", "api.example.com", 8443, True),
        ("example.com:8443", "api.example.com", 443, False),
        ("example.com:x", "example.com", 443, False),
        ("*.example.com", "api.example.com", 443, True),
        ("*.example.com", "example.com", 443, False),
        (".svc", "svc", 443, False),
        (".svc", "kubernetes.default.svc", 443, True),
        ("EXAMPLE.com", "Api.Example.COM", 443, True),
        (" , ,", "api.example.com", 443, False),
        ("not-a-cidr/33", "10.0.0.1", 443, False),
    ],
)
def test_no_proxy_entries_as_go_reads_them(
    no_proxy: str, host: str, port: int, direct: bool
) -> None:
    """kubectl's reading (golang.org/x/net/http/httpproxy), not urllib's."""
    environ = {"HTTPS_PROXY": HTTPS_P, "NO_PROXY": no_proxy}
    expected = None if direct else HTTPS_P
    assert environment_proxy("https", host, port, environ) == expected


def test_upper_case_variables_come_first_as_in_go() -> None:
    environ = {"HTTPS_PROXY": HTTPS_P, "https_proxy": "http://lower:1", "no_proxy": API}
    assert environment_proxy("https", "other.org", 443, environ) == HTTPS_P
    assert environment_proxy("https", API, 443, environ) is None  # no_proxy when no NO_PROXY
    empty = {"https_proxy": "", "HTTPS_PROXY": ""}
    assert environment_proxy("https", "other.org", 443, empty) is None


def test_a_header_with_a_line_break_is_refused_without_quoting_it() -> None:
    """A token file with a newline inside would otherwise split the request (or put the
    token in http.client's error message, which nvcli prints)."""
    with (
        RecordingServer(ok) as server,
        HttpClient(server.url, authorization=lambda: "Bearer s3cret\r\nX-Injected: 1") as client,
    ):
        with pytest.raises(HttpError) as info:
            client.request("GET", "/apis/x")
        assert "s3cret" not in str(info.value) and "line break" in str(info.value)
        assert server.seen == []


# -- logging ---------------------------------------------------------------------------------


@pytest.fixture
def http_log(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[[], str]]:
    """nvcli.http's records, whatever an in-process `nvcli -v` did to the parent logger."""
    logger = logging.getLogger("nvcli.http")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.DEBUG, logger="nvcli.http")
    try:
        yield lambda: caplog.text
    finally:
        logger.removeHandler(caplog.handler)


def test_logs_mask_the_authorization_and_name_method_url_and_status(
    http_log: Callable[[], str], caplog: pytest.LogCaptureFixture
) -> None:
    with (
        RecordingServer(ok) as server,
        HttpClient(server.url, authorization=lambda: TOKEN) as client,
    ):
        client.request("POST", "/mounts", params={"dry": "1"}, body={"gpus": 1})
    text = http_log()
    assert "s3cret-token" not in text
    assert "<masked>" in text
    assert '{"gpus": 1}' in text
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any(message.startswith(f"POST {server.url}/mounts?dry=1 200 OK") for message in info), (
        info
    )


def test_messages_name_the_url_asked_for_once(
    http_log: Callable[[], str], caplog: pytest.LogCaptureFixture
) -> None:
    prefix = "/k8s/clusters/c1"
    with RecordingServer(ok) as server:
        with HttpClient(f"{server.url}{prefix}") as client:
            client.request("GET", "/apis/x")
        assert [s.target for s in server.seen] == [f"{prefix}/apis/x"]
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert info, http_log()
    assert info[0].startswith(f"GET {server.url}{prefix}/apis/x 200"), info
    refused = f"http://127.0.0.1:{free_port()}"
    with HttpClient(f"{refused}{prefix}") as client, pytest.raises(HttpError) as error:
        client.request("GET", "/apis/x")
    assert f"GET {refused}{prefix}/apis/x:" in str(error.value)


# -- what review found ------------------------------------------------------------------------


def test_a_client_in_a_process_with_fds_past_1024_keeps_its_connection() -> None:
    """A long-running notebook kernel holds many files; select() cannot watch fd 1024+."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    fillers = []
    try:
        while len(fillers) < 1100:
            fillers.append(os.open("/dev/null", os.O_RDONLY))
        with RecordingServer(ok) as server, HttpClient(server.url) as client:
            for _ in range(2):
                assert client.request("GET", "/apis/x").is_success
            assert client._connection is not None and client._connection.sock.fileno() > 1024
        assert len({seen.client_port for seen in server.seen}) == 1
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_an_upper_case_https_scheme_keeps_the_given_ca(server_cert: CertPaths) -> None:
    """`urlsplit` lower-cases the scheme: the CA must not be dropped for `HTTPS://`."""
    from cli.client import http_client

    with RecordingServer(ok, tls=server_cert) as server:
        url = server.url.replace("https://", "HTTPS://")
        with http_client(url, verify=str(server_cert.ca)) as client:
            assert client.request("GET", "/").is_success


def test_a_bad_tls_server_name_is_refused_before_connecting() -> None:
    with pytest.raises(ValueError, match=r"'\.bad' is not a host name TLS can check"):
        HttpClient("https://127.0.0.1:1", server_name=".bad")


def test_an_ipv6_server_through_a_proxy(server_cert: CertPaths) -> None:
    """Python 3.11's http.client leaves the brackets out of CONNECT: refused, clearly;
    from 3.12 the proxy is asked for `[addr]:port`."""
    with RecordingProxy() as proxy:
        url = f"https://[::1]:{free_port()}"
        context = tls_context(str(server_cert.ca))
        with (
            HttpClient(url, context=context, proxy=proxy.url) as c,
            pytest.raises(HttpError) as info,
        ):
            c.request("GET", "/")
        if sys.version_info < (3, 12):
            assert "IPv6 address through a proxy needs Python 3.12" in str(info.value)
            assert proxy.requests == []
        else:
            assert proxy.requests[0].request_line.startswith("CONNECT [::1]:")


@pytest.mark.parametrize(
    ("no_proxy", "host", "port", "direct"),
    [
        ("example.com:", "api.example.com", 8443, True),  # no port after ':': any port
        ("[fd00::5]", "fd00::5", 443, False),  # brackets without a port: a name, never an IP
        ("10.0.0.0/255.0.0.0", "10.1.2.3", 443, False),  # Go takes prefix lengths only
        ("", "::ffff:127.0.0.1", 443, True),  # IPv4-mapped loopback is loopback
    ],
)
def test_no_proxy_corners_as_go_reads_them(
    no_proxy: str, host: str, port: int, direct: bool
) -> None:
    environ = {"HTTPS_PROXY": HTTPS_P, "NO_PROXY": no_proxy}
    assert environment_proxy("https", host, port, environ) == (None if direct else HTTPS_P)


def test_a_proxy_port_that_is_not_a_number_names_the_proxy_not_the_password() -> None:
    with pytest.raises(ValueError, match=r"proxy http://proxy.corp:x") as info:
        Proxy.parse("http://user:hunter2@proxy.corp:x")
    assert "hunter2" not in str(info.value)
