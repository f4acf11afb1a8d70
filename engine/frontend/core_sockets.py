"""The two ZeroMQ channels between ``EngineCoreClient`` and its core: commands out (PUSH), outputs in (PULL).

Both are bound here and the core connects: ``ipc://`` sockets in a private folder when the core runs on this
machine, TCP ports on ``host`` otherwise. Messages are ``engine.frontend.ipc``'s pickled plain messages.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

from omni_gateway.engine.frontend import ipc


class CoreSockets:
    def __init__(self, host: str | None) -> None:
        import zmq

        self._ctx = zmq.Context()
        self._commands = self._ctx.socket(zmq.PUSH)
        self._outputs = self._ctx.socket(zmq.PULL)
        self._commands.setsockopt(zmq.SNDHWM, 0)  # bounded upstream by the scheduler's waiting queue
        self._outputs.setsockopt(zmq.RCVHWM, 0)
        self._poller = zmq.Poller()
        self._poller.register(self._outputs, zmq.POLLIN)
        self._ipc_dir: str | None = None
        if host is None:
            self._ipc_dir = tempfile.mkdtemp(prefix="omni-engine-")  # 0700: only this user reaches the sockets
            self.commands_address = f"ipc://{self._ipc_dir}/commands"
            self.outputs_address = f"ipc://{self._ipc_dir}/outputs"
            self._commands.bind(self.commands_address)
            self._outputs.bind(self.outputs_address)
            return
        commands_port = self._commands.bind_to_random_port("tcp://*")
        outputs_port = self._outputs.bind_to_random_port("tcp://*")
        self.commands_address = f"tcp://{host}:{commands_port}"
        self.outputs_address = f"tcp://{host}:{outputs_port}"

    def send(self, message: Any) -> bool:
        """Queue one command without blocking; False when no core is connected to take it."""
        import zmq

        try:
            self._commands.send(ipc.encode(message), zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def receive(self, timeout_s: float) -> list[Any] | None:
        """The outputs that arrived within ``timeout_s`` (none when the core was quiet), decoded; None once
        the sockets are closed."""
        import zmq

        try:
            events = dict(self._poller.poll(int(timeout_s * 1000)))
        except zmq.ZMQError:
            return None  # the socket closed under a shutdown
        messages = []
        if self._outputs in events:
            while True:
                try:
                    frame = self._outputs.recv(zmq.NOBLOCK)
                except (zmq.Again, zmq.ZMQError):
                    break
                messages.append(ipc.decode(frame))
        return messages

    def close(self) -> None:
        self._commands.close(linger=0)
        self._outputs.close(linger=0)
        self._ctx.term()
        if self._ipc_dir is not None:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)
