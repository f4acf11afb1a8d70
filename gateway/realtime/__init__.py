"""The OpenAI Realtime API over WebSocket: a sans-I/O session (``session``) in a thin asyncio shell
(``connection``), reached through the ``/v1/realtime`` handshake (``endpoint``)."""
