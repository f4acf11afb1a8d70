"""Bounds the HTTP API enforces before anything reaches the backend."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HttpLimits:
    max_requests: int = 256  # requests in flight in all; beyond it 503 at once
    max_requests_per_key: int = 64  # in flight per key (or, without auth, per client address); beyond it 429
    max_body_bytes: int = 32 * 1024 * 1024  # JSON bodies and multipart uploads alike
    max_n: int = 8
    max_top_logprobs: int = 20
    max_stop_sequences: int = 4
    max_stop_chars: int = 256
    max_prompts: int = 16  # /v1/completions prompt lists: each element is its own generation
    max_messages: int = 1024
    max_media_parts: int = 16  # images + audio clips in one chat request
    max_media_bytes: int = 20 * 1024 * 1024  # one decoded image or audio clip
    max_audio_seconds: float = 600.0  # decoded duration of one audio input, checked from the header
    max_speech_chars: int = 4096
    max_embedding_inputs: int = 2048  # inputs of one /v1/embeddings request, as OpenAI allows
    max_images: int = 4  # images per generation request
    max_image_side: int = 2048
    audio_expires_s: int = 3600  # reported in message.audio.expires_at
