"""The admission guard over a live socket: auth on every route, Origin, per-key limits, overload and dead backend."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from omni_gateway.gateway.anthropic_errors import MESSAGES_PATH
from omni_gateway.gateway.app import create_app
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.guard import host_allowed, is_public, origin_allowed
from omni_gateway.gateway.http.limits import HttpLimits
from starlette.routing import Route, WebSocketRoute
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.harness.fake_backend import FakeBackend
from tests.harness.live_server import serve

KEY = "sk-guard-key"
TIMEOUT = 15


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT))


async def ws_status(port: int, **kwargs: Any) -> int:
    """101 when the handshake succeeds, else the HTTP status the server refused it with."""
    try:
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime", **kwargs) as ws:
            await ws.recv()
            return 101
    except InvalidStatus as refused:
        return refused.response.status_code


@pytest.fixture(scope="module")
def secured() -> Iterator[int]:
    # Any Host is accepted here, so the Host tricks below reach the key check rather than the Host check.
    with serve(FakeBackend(), GatewayConfig(api_key=KEY, allowed_hosts=("*",))) as port:
        yield port


def test_no_route_but_health_answers_without_the_key(secured: int) -> None:
    app = create_app(FakeBackend(), GatewayConfig(api_key=KEY))
    paths = [
        (m, r.path.replace("{model:path}", "omni-test"))
        for r in app.routes
        if isinstance(r, Route)
        for m in sorted(r.methods - {"HEAD"})
    ]
    assert ("GET", "/health") in paths and ("POST", "/v1/chat/completions") in paths
    # Paths the router might normalise, and Host values that break a URL rebuilt from headers.
    tricks = [
        ("GET", "//v1/models"),
        ("GET", "/v1/models/"),
        ("GET", "/V1/models"),
        ("GET", "/v1/%6dodels"),
        ("GET", "/v1/../v1/models"),
        ("GET", "/nowhere"),
        ("POST", "/v1/chat/completions/"),
    ]
    headers_tried = [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {KEY}"},
        {"Authorization": KEY},
        {"Host": "x/?"},
        {"Host": "x/#"},
        {"Host": "127.0.0.1/health?"},
    ]
    tried = successes = 0
    with httpx.Client(base_url=f"http://127.0.0.1:{secured}") as client:
        for method, path in paths + tricks:
            for headers in headers_tried:
                r = client.request(method, path, headers=headers, json={})
                tried += 1
                if is_public(path):
                    assert r.status_code != 401
                    continue
                successes += r.status_code < 400
                # A Host that is not one host and a port is refused before the key is looked at.
                status, code, kind = (
                    (421, "host_not_allowed", "invalid_request_error")
                    if "Host" in headers
                    else (401, "invalid_api_key", "authentication_error")
                )
                assert r.status_code == status, (method, path, headers, r.status_code)
                error = r.json()["error"]
                if path == MESSAGES_PATH:  # Anthropic's envelope: a type, no code
                    assert error["type"] == kind
                else:
                    assert error["code"] == code
    ws_refused = [
        run(ws_status(secured, **kw))
        for kw in (
            {},
            {"additional_headers": {"Authorization": "Bearer wrong"}},
            {"subprotocols": ["realtime", "openai-insecure-api-key.wrong"]},
            {"additional_headers": {"Host": "x/?"}},
        )
    ]
    ws_routes = [r.path for r in app.routes if isinstance(r, WebSocketRoute)]
    print(
        f"\nauth coverage: {len(paths)} HTTP routes + {len(tricks)} path tricks x {len(headers_tried)} header "
        f"variants = {tried} requests, {len(ws_routes)} WebSocket routes x {len(ws_refused)} handshakes; "
        f"unauthenticated successes: {successes + ws_refused.count(101)}"
    )
    assert successes == 0 and ws_refused[:3] == [401] * 3
    assert ws_refused[3] in (400, 401)  # the HTTP server may refuse the broken Host before the guard sees it
    assert run(ws_status(secured, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"])) == 101
    assert (
        httpx.get(f"http://127.0.0.1:{secured}/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code
        == 200
    )


def test_demo_paths_stay_public(secured: int) -> None:
    # The guard lets /demo through; whether a page is mounted there is the router's business (404, not 401).
    assert httpx.get(f"http://127.0.0.1:{secured}/demo/").status_code in (200, 404)


@pytest.mark.parametrize(
    ("origin", "allowed", "expected"),
    [
        (None, (), 101),  # non-browser clients send no Origin
        ("http://127.0.0.1:{port}", (), 101),  # the server's own page
        ("https://evil.example", (), 403),
        ("null", (), 403),  # sandboxed iframes and file:// pages
        ("https://app.example", ("https://app.example",), 101),
        ("https://evil.example", ("https://app.example",), 403),
        ("https://anything.example", ("*",), 101),
    ],
)
def test_websocket_origin_allow_list(origin: str | None, allowed: tuple[str, ...], expected: int) -> None:
    with serve(FakeBackend(), GatewayConfig(allowed_origins=allowed)) as port:
        kwargs = {} if origin is None else {"origin": origin.format(port=port)}
        assert run(ws_status(port, **kwargs)) == expected


def test_origin_compares_host_and_port_exactly() -> None:
    assert origin_allowed("http://localhost:8000", "localhost:8000", ())
    assert not origin_allowed("http://localhost:8001", "localhost:8000", ())
    assert not origin_allowed("http://localhost:8000.evil.example", "localhost:8000", ())


def test_sessions_beyond_the_per_key_limit_get_429_at_once() -> None:
    async def go(port: int) -> tuple[int, float, int]:
        headers = {"Authorization": f"Bearer {KEY}"}
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime", additional_headers=headers) as first:
            await first.recv()
            t0 = time.perf_counter()
            second = await ws_status(port, additional_headers=headers)
            elapsed = time.perf_counter() - t0
        deadline = time.monotonic() + 3  # the first one's slot frees once the server has torn it down
        while (third := await ws_status(port, additional_headers=headers)) != 101 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return second, elapsed, third

    with serve(FakeBackend(), GatewayConfig(api_key=KEY, max_sessions_per_key=1)) as port:
        second, elapsed, third = run(go(port))
    assert second == 429 and elapsed < 1.0 and third == 101


def _concurrent_posts(port: int, count: int, headers: dict[str, str]) -> list[tuple[int, float, str]]:
    async def one(client: httpx.AsyncClient) -> tuple[int, float, str]:
        t0 = time.perf_counter()
        r = await client.post(
            "/v1/chat/completions",
            headers=headers,
            json={"model": "omni-test", "messages": [{"role": "user", "content": "hi"}]},
        )
        return r.status_code, time.perf_counter() - t0, r.json().get("error", {}).get("code") or ""

    async def go() -> list[tuple[int, float, str]]:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT) as client:
            return list(await asyncio.gather(*(one(client) for _ in range(count))))

    return run(go())


@pytest.mark.parametrize(
    ("config", "status", "code"),
    [
        (GatewayConfig(api_key=KEY, http=HttpLimits(max_requests_per_key=2)), 429, "rate_limit_exceeded"),
        (GatewayConfig(api_key=KEY, http=HttpLimits(max_requests=2)), 503, "server_overloaded"),
    ],
)
def test_requests_beyond_the_in_flight_limits_are_refused_at_once(
    config: GatewayConfig, status: int, code: str
) -> None:
    backend = FakeBackend(chunk_delay=0.3)  # each request holds its slot for ~1.5 s
    with serve(backend, config) as port:
        results = _concurrent_posts(port, 6, {"Authorization": f"Bearer {KEY}"})
    served = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] == status]
    print(
        f"\n6 concurrent requests, limit 2: served {len(served)}, refused {len(refused)} with {status} in at most "
        f"{max(r[1] for r in refused) * 1000:.0f} ms"
    )
    assert len(served) == 2 and len(refused) == 4
    assert all(r[2] == code and r[1] < 1.0 for r in refused)


def test_a_dead_backend_is_answered_with_503_everywhere_but_metrics() -> None:
    backend = FakeBackend(healthy=False)
    with serve(backend, GatewayConfig()) as port:
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/health").status_code == 503
        assert httpx.get(f"{base}/metrics").status_code == 200
        r = httpx.post(f"{base}/v1/chat/completions", json={"model": "omni-test", "messages": []})
        assert r.status_code == 503 and r.json()["error"]["code"] == "server_unavailable"
        assert run(ws_status(port)) == 503
    assert backend.requests == []


def test_cli_sets_the_origin_allow_list_and_per_key_sessions() -> None:
    from omni_gateway.gateway.cli import build_parser, configs

    args = build_parser().parse_args(
        [
            "serve",
            "--allowed-origins",
            "https://a.example",
            "--allowed-origin",
            "https://b.example,https://c.example",
            "--max-sessions-per-key",
            "3",
        ]
    )
    config, _ = configs(args)
    assert config.allowed_origins == ("https://a.example", "https://b.example", "https://c.example")
    assert config.max_sessions_per_key == 3
    assert configs(build_parser().parse_args(["serve"]))[0].allowed_origins == ()


# DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1 sends Host and Origin of its own
# name, which agree with each other; only the Host allow-list tells it from this server's own page.
def _rebinding_headers(port: int, host: str = "evil.example") -> dict[str, str]:
    return {"Host": f"{host}:{port}", "Origin": f"http://{host}:{port}"}


async def ws_status_as(port: int, host: str, origin: str | None = None) -> int:
    """The handshake's status when the client names ``host`` (the Host header) but connects to the server."""
    kwargs: dict[str, Any] = {} if origin is None else {"origin": origin}
    try:
        async with connect(f"ws://{host}/v1/realtime", host="127.0.0.1", port=port, **kwargs) as ws:
            await ws.recv()
            return 101
    except InvalidStatus as refused:
        return refused.response.status_code


@pytest.fixture(scope="module")
def open_server() -> Iterator[int]:
    with serve(FakeBackend(), GatewayConfig()) as port:  # the default: no API key, bound to loopback
        yield port


@pytest.mark.parametrize("path", ["/v1/models", "/health", "/metrics", "/demo/"])
def test_http_requests_naming_a_foreign_host_get_421(open_server: int, path: str) -> None:
    r = httpx.get(f"http://127.0.0.1:{open_server}{path}", headers=_rebinding_headers(open_server))
    assert r.status_code == 421
    assert r.json()["error"] == {
        "type": "invalid_request_error",
        "code": "host_not_allowed",
        "param": None,
        "message": r.json()["error"]["message"],
    }
    assert "allowed_hosts" in r.json()["error"]["message"]
    r = httpx.post(
        f"http://127.0.0.1:{open_server}/v1/chat/completions",
        headers=_rebinding_headers(open_server),
        json={"model": "omni-test", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 421


def test_a_websocket_handshake_naming_a_foreign_host_gets_403(open_server: int) -> None:
    headers = _rebinding_headers(open_server)
    assert run(ws_status_as(open_server, headers["Host"], headers["Origin"])) == 403
    assert run(ws_status_as(open_server, headers["Host"])) == 403


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "localhost:{port}",
        "127.0.0.1",
        "127.0.0.1:{port}",
        "[::1]",
        "[::1]:{port}",
        "LOCALHOST:{port}",
        "localhost.:{port}",
    ],
)
def test_the_loopback_names_are_served_with_or_without_the_port(open_server: int, host: str) -> None:
    host = host.format(port=open_server)
    assert httpx.get(f"http://127.0.0.1:{open_server}/v1/models", headers={"Host": host}).status_code == 200
    assert run(ws_status_as(open_server, host, f"http://{host}")) == 101


@pytest.mark.parametrize(
    ("config", "host", "served"),
    [
        (GatewayConfig(allowed_hosts=("box.lan",)), "box.lan", True),
        (GatewayConfig(allowed_hosts=("box.lan:9000",)), "box.lan", True),  # an entry's port is not compared
        (GatewayConfig(allowed_hosts=("box.lan",)), "evil.example", False),
        (GatewayConfig(allowed_hosts=("*",)), "evil.example", True),
        (GatewayConfig(host="0.0.0.0"), "evil.example", True),  # every interface, no list: any (warned at startup)
        (GatewayConfig(host="0.0.0.0", allowed_hosts=("box.lan",)), "evil.example", False),
        (GatewayConfig(host="0.0.0.0", allowed_hosts=("box.lan",)), "localhost", True),
    ],
)
def test_allowed_hosts_extend_the_list(config: GatewayConfig, host: str, served: bool) -> None:
    with serve(FakeBackend(), config) as port:
        headers = _rebinding_headers(port, host)
        status = httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=headers).status_code
        ws = run(ws_status_as(port, headers["Host"], headers["Origin"]))
    assert (status, ws) == ((200, 101) if served else (421, 403))


def test_the_host_is_checked_before_the_key() -> None:
    # A page reached through rebinding learns nothing from the key check's answer.
    with serve(FakeBackend(), GatewayConfig(api_key=KEY)) as port:
        r = httpx.get(
            f"http://127.0.0.1:{port}/v1/models", headers={**_rebinding_headers(port), "Authorization": f"Bearer {KEY}"}
        )
    assert r.status_code == 421


def test_host_allow_list_of_the_config() -> None:
    assert GatewayConfig().host_allow_list() == ("localhost", "127.0.0.1", "[::1]")
    assert GatewayConfig(host="10.1.2.3", allowed_hosts=("Box.LAN.",)).host_allow_list() == (
        "localhost",
        "127.0.0.1",
        "[::1]",
        "10.1.2.3",
        "box.lan",
    )
    assert GatewayConfig(host="::1").host_allow_list() == ("localhost", "127.0.0.1", "[::1]")
    assert GatewayConfig(host="::").host_allow_list() is None
    assert GatewayConfig(host="", allowed_hosts=("*",)).host_allow_list() is None
    with pytest.raises(TypeError, match="allowed_hosts"):
        GatewayConfig(allowed_hosts="box.lan")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("header", "allowed"),
    [
        ("localhost:8000", True),
        ("[::1]:8000", True),
        ("127.0.0.1", True),
        (None, True),
        ("127.0.0.1.evil.example", False),
        ("localhost@evil.example", False),
        ("evil.example:8000", False),
        ("localhost:8000:80", False),
        ("", False),
        ("[::1", False),
        ("localhost.:8000", True),
        ("127.0.0.1:18800@evil.example", False),
        ("127.0.0.1:18800, evil.example", False),
        ("127.0.0.1, evil.example", False),
        (" 127.0.0.1", False),
        ("127.0.0.1 ", False),
        ("127.0.0.1:", False),
        ("127.0.0.1:123456", False),
        ("127.0.0.1/x", False),
        ("user@localhost", False),
        ("[::1]x", False),
    ],
)
def test_host_allowed(header: str | None, allowed: bool) -> None:
    assert host_allowed(header, GatewayConfig().host_allow_list()) == allowed


@pytest.mark.parametrize("header", ["127.0.0.1:18800@evil.example", "a.example, b.example", " a.example", "a b"])
def test_a_host_header_that_is_not_one_host_is_refused_even_where_any_host_is_served(header: str) -> None:
    assert host_allowed("a.example:8000", None)
    assert not host_allowed(header, None)


def test_open_sessions_are_counted_once_by_the_guard() -> None:
    from omni_gateway.gateway import metrics

    async def go(port: int) -> tuple[int, float, float]:
        before = metrics.SESSIONS_OPEN._value.get()
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime") as first:
            await first.recv()
            during = metrics.SESSIONS_OPEN._value.get()
            second = await ws_status(port)
        return second, during - before, before

    with serve(FakeBackend(), GatewayConfig(max_sessions=1)) as port:
        second, opened, before = run(go(port))
        deadline = time.monotonic() + 3
        while metrics.SESSIONS_OPEN._value.get() != before and time.monotonic() < deadline:
            time.sleep(0.02)
        after = metrics.SESSIONS_OPEN._value.get()
    assert second == 503 and opened == 1 and after == before


def test_admitted_and_refused_sessions_are_counted_with_the_refusal_s_reason() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    headers = {"Authorization": f"Bearer {KEY}"}

    def counts(port: int) -> dict[str, float]:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", headers=headers).text
        found: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "omni_realtime_sessions_admitted_total":
                    found["admitted"] = s.value
                elif s.name == "omni_realtime_sessions_refused_total":
                    found[s.labels["reason"]] = s.value
        return found

    async def go(port: int) -> tuple[int, int]:
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime", additional_headers=headers) as first:
            await first.recv()
            return await ws_status(port, additional_headers=headers), await ws_status(port)

    with serve(FakeBackend(), GatewayConfig(api_key=KEY, max_sessions_per_key=1)) as port:
        before = counts(port)
        statuses = run(go(port))
        after = counts(port)
    assert statuses == (429, 401)
    assert {k: after[k] - before[k] for k in after} == {
        "admitted": 1,
        "max_sessions_per_key": 1,
        "api_key": 1,
        **{
            reason: 0
            for reason in (
                "host",
                "origin",
                "backend_down",
                "max_sessions",
                "max_voice_sessions",
                "voice_falling_behind",
            )
        },
    }


def test_every_session_refusal_is_counted_under_a_known_reason() -> None:
    import ast
    import inspect
    import textwrap

    from omni_gateway.gateway import guard, metrics

    refusals = [
        node
        for method in (guard.Guard._refusal, guard.Guard._voice_refusal)
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(method))))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Refusal"
    ]
    codes = {node.args[1].value for node in refusals if isinstance(node.args[1], ast.Constant)}
    named = {
        keyword.value.value
        for node in refusals
        for keyword in node.keywords
        if keyword.arg == "counted_as" and isinstance(keyword.value, ast.Constant)
    }
    assert len(codes) >= 7 and named, f"the refusals were not found in the guard: {codes}, {named}"
    assert codes <= set(guard._SESSION_REFUSALS), codes - set(guard._SESSION_REFUSALS)
    assert sorted({*guard._SESSION_REFUSALS.values(), *named}) == sorted(metrics.REFUSAL_REASONS)
