"""Prometheus metrics of the gateway, exported at /metrics.

The objects live in this module's own registry so that any part of the gateway (HTTP routes, the
realtime sessions) increments the same series; the backend's numbers are read at scrape time.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterator

from omni_gateway.gateway.realtime.voice_timing import Playback
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
SESSIONS_OPEN = Gauge(
    "omni_realtime_sessions_open",
    "Realtime sessions currently open (WebSocket sessions and WebRTC calls).",
    registry=REGISTRY,
)
SESSIONS_ADMITTED = Counter(
    "omni_realtime_sessions_admitted",
    "Realtime sessions (WebSocket or WebRTC call) the admission guard let in.",
    registry=REGISTRY,
)
SESSIONS_REFUSED = Counter(
    "omni_realtime_sessions_refused",
    "WebSocket sessions the admission guard refused, by reason.",
    ["reason"],
    registry=REGISTRY,
)
# Every reason the guard gives, so each series exists (at 0) before its first refusal.
REFUSAL_REASONS = (
    "host",
    "origin",
    "api_key",
    "backend_down",
    "max_sessions_per_key",
    "max_sessions",
    "max_voice_sessions",
    "voice_falling_behind",
)
for _reason in REFUSAL_REASONS:
    SESSIONS_REFUSED.labels(_reason)

TURN_DECISION = Histogram(
    "omni_realtime_turn_decision_seconds",
    "Time the turn detector took to end a turn after the speech ended (the silence it waited out).",
    ["turn_detection"],
    registry=REGISTRY,
    buckets=(0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 8.0),
)
SPEECH_END_TO_FIRST_AUDIO = Histogram(
    "omni_realtime_speech_end_to_first_audio_seconds",
    "Time from the end of the user's speech to the first audio delta of the response answering that turn.",
    registry=REGISTRY,
    buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0),
)
STREAM_RTF = Histogram(
    "omni_realtime_stream_rtf",
    "Per spoken response: time from its first to its last audio delta over the audio's duration.",
    registry=REGISTRY,
    buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0),
)
AUDIO_UNDERRUNS = Counter(
    "omni_realtime_audio_underruns",
    "Audio deltas sent after everything sent before them had played at real time (the client ran dry).",
    registry=REGISTRY,
)
AUDIO_GAP = Histogram(
    "omni_realtime_audio_gap_seconds",
    "Per spoken response: the longest silence of its real-time playback (0: it never ran dry).",
    registry=REGISTRY,
    buckets=(0.0, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0),
)


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


class VoiceMetrics:
    """The voice timings of realtime sessions (a ``voice_timing.VoiceSink``) as the series above."""

    def turn_decision(self, detection: str, seconds: float) -> None:
        TURN_DECISION.labels(detection).observe(seconds)

    def first_audio(self, seconds: float) -> None:
        SPEECH_END_TO_FIRST_AUDIO.observe(seconds)

    def playback(self, playback: Playback) -> None:
        rtf = playback.rtf
        if rtf is not None:
            STREAM_RTF.observe(rtf)
        AUDIO_UNDERRUNS.inc(playback.underruns)
        AUDIO_GAP.observe(playback.longest_gap_s)


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


class _VoiceWindowCollector:
    """The p90 RTF of the voice admission's window, read at scrape time so that it ages with the window."""

    def __init__(self, rtf_p90: Callable[[], float | None]) -> None:
        self._rtf_p90 = rtf_p90

    def collect(self) -> Iterator[Metric]:
        p90 = self._rtf_p90()
        yield GaugeMetricFamily(
            "omni_realtime_voice_rtf_p90",
            "p90 real-time factor of the latest spoken replies that voice admission judges (NaN: none in its window).",
            value=math.nan if p90 is None else p90,
        )


def exposition(
    read_backend: Callable[[], dict[str, float]],
    healthy: Callable[[], bool],
    voice_rtf_p90: Callable[[], float | None] | None = None,
) -> bytes:
    """The Prometheus text exposition of the gateway's series followed by the backend's."""
    scraped = CollectorRegistry()
    if voice_rtf_p90 is not None:
        scraped.register(_VoiceWindowCollector(voice_rtf_p90))
    scraped.register(_BackendCollector(read_backend, healthy))
    return generate_latest(REGISTRY) + generate_latest(scraped)
