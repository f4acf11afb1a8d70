"""Errors the engine raises at its public boundary. Each message says what was expected and what arrived."""

from __future__ import annotations


class EngineError(Exception):
    """Base class for engine errors a caller can handle."""


class InvalidRequest(EngineError, ValueError):
    """The request cannot be served as given (prompt too long, bad sampling values, ...)."""


class InvalidConstraint(InvalidRequest):
    """A structured-output constraint (schema, regex, grammar, ...) the grammar compiler rejects."""


class EngineOverloaded(EngineError):
    """The waiting queue is full; retry later."""


class ModelLoadError(EngineError):
    """The model path is missing, unreadable, corrupt or of an unsupported architecture."""


class EngineDead(EngineError):
    """The engine loop has stopped after an internal failure; no new requests are accepted."""
