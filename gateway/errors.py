"""The one sanitiser for backend failures on every client path (HTTP bodies, SSE, realtime events).

Server-side failures (5xx) carry exception text from the model side, which can name internals or memory
addresses; clients get a fixed message and keep the machine-readable code. Client errors (4xx) and the
scheduler's overload refusal are composed by our own code and stay as they are: they tell the caller what
to fix or when to retry.
"""

from __future__ import annotations

import dataclasses

from omni_gateway.omni.protocol import Error

SERVER_ERROR = "The server had an error while processing your request."
UNAVAILABLE = "The server cannot take this request now; try again later."


def client_safe(error: Error) -> Error:
    if error.status < 500 or error.code == "overloaded":
        return error
    return dataclasses.replace(error, message=UNAVAILABLE if error.status == 503 else SERVER_ERROR)
