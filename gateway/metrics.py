"""Prometheus metrics of the gateway, exported at /metrics.

The objects live in this module's own registry so that any part of the gateway (HTTP routes, the
realtime sessions) increments the same series; the backend's numbers are read at scrape time.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

REGISTRY = CollectorRegistry()

HTTP_REQUESTS = Counter(
    "omni_http_requests", "HTTP requests answered, by route and status code.", ["route", "status"], registry=REGISTRY
)
PROMPT_TOKENS = Counter("omni_prompt_tokens", "Prompt tokens processed, by API surface.", ["api"], registry=REGISTRY)
COMPLETION_TOKENS = Counter(
    "omni_completion_tokens", "Completion tokens generated, by API surface.", ["api"], registry=REGISTRY
)
TIME_TO_FIRST_TOKEN = Histogram(
    "omni_time_to_first_token_seconds",
    "Time from accepting a request to its first output token or audio chunk.",
    ["api"],
    registry=REGISTRY,
    buckets=(0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0),
)
INTER_TOKEN_LATENCY = Histogram(
    "omni_inter_token_latency_seconds",
    "Time between consecutive streamed outputs of one request.",
    ["api"],
    registry=REGISTRY,
    buckets=(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5),
)
SESSIONS_OPEN = Gauge("omni_realtime_sessions_open", "Realtime WebSocket sessions currently open.", registry=REGISTRY)


class TokenTimer:
    """Observes time-to-first-output once, then the gap before every further output."""

    def __init__(self, api: str, clock: Callable[[], float] = time.perf_counter) -> None:
        # The labelled series looked up once: tick runs for every chunk of audio or text.
        self._first = TIME_TO_FIRST_TOKEN.labels(api)
        self._gaps = INTER_TOKEN_LATENCY.labels(api)
        self._clock = clock
        self._start = clock()
        self._last: float | None = None

    def tick(self) -> None:
        now = self._clock()
        if self._last is None:
            self._first.observe(now - self._start)
        else:
            self._gaps.observe(now - self._last)
        self._last = now


def count_tokens(api: str, prompt: int, completion: int) -> None:
    PROMPT_TOKENS.labels(api).inc(prompt)
    COMPLETION_TOKENS.labels(api).inc(completion)


_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")


class _BackendCollector:
    """Every number of ``backend.metrics()`` (KV blocks used/free, queue depths, ...) as a gauge."""

    def __init__(self, read: Callable[[], dict[str, float]], healthy: Callable[[], bool]) -> None:
        self._read = read
        self._healthy = healthy

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "omni_backend_healthy", "1 when the backend reports itself healthy.", value=1.0 if self._healthy() else 0.0
        )
        for key, value in sorted(self._read().items()):
            name = "omni_backend_" + _UNSAFE.sub("_", key)
            yield GaugeMetricFamily(name, f"Backend metric '{key}'.", value=float(value))


def exposition(read_backend: Callable[[], dict[str, float]], healthy: Callable[[], bool]) -> bytes:
    """The Prometheus text exposition of the gateway's series followed by the backend's."""
    backend = CollectorRegistry()
    backend.register(_BackendCollector(read_backend, healthy))
    return generate_latest(REGISTRY) + generate_latest(backend)
