"""Which replica serves a request: pure logic (no I/O, no torch), fed the replicas' liveness and load.

- A realtime session stays on one replica for its whole life: its conversation's KV blocks live in that
  replica's prefix cache. Its first request goes to the least loaded live replica; if that replica dies,
  the session's next request is placed afresh (the cache is lost with the replica anyway).
- A request without a session (HTTP) goes where the same prompt prefix went before (its leading
  ``prefix_blocks`` KV blocks, hashed), unless that replica is dead or carries ``slack`` more work
  than the least loaded one; otherwise to the least loaded, which then owns the prefix.
- Load is the replica's open requests (from its client) plus the sessions pinned to it that sent a
  request within ``active_s`` (an idle or ended session keeps its replica but weighs nothing: the gateway
  does not tell the engine when a session closes).

Both tables are bounded LRUs: a session that ended (or a prefix nobody sends again) is forgotten once
``capacity`` newer ones arrived.
"""

from __future__ import annotations

import hashlib
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence


class NoLiveReplica(RuntimeError):
    pass


class Router:
    def __init__(
        self,
        num_replicas: int,
        *,
        block_size: int = 16,
        prefix_blocks: int = 4,
        slack: int = 4,
        capacity: int = 65536,
        active_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        self.num_replicas = num_replicas
        self.block_size = block_size
        self.prefix_blocks = prefix_blocks
        self.slack = slack
        self.capacity = capacity
        self.active_s = active_s
        self._clock = clock
        self._sessions: OrderedDict[str, int] = OrderedDict()
        self._recent: OrderedDict[str, tuple[int, float]] = OrderedDict()  # active sessions, by last request
        self._prefixes: OrderedDict[bytes, int] = OrderedDict()
        self._pinned = [0] * num_replicas
        self._next = 0  # rotates ties, so sessions that arrive together spread

    def route(
        self,
        *,
        alive: Sequence[bool],
        open_requests: Sequence[int],
        session_id: str | None = None,
        prompt: str | Sequence[int] = (),
    ) -> int:
        """The replica for one request; raises NoLiveReplica when every replica is down."""
        if len(alive) != self.num_replicas or len(open_requests) != self.num_replicas:
            raise ValueError(
                f"expected {self.num_replicas} replica states, got {len(alive)} alive and {len(open_requests)} loads"
            )
        if not any(alive):
            raise NoLiveReplica("no engine replica is running")
        self._expire()
        loads = [open_requests[i] + self._pinned[i] for i in range(self.num_replicas)]
        if session_id is not None:
            return self._route_session(session_id, alive, loads)
        key = self.prefix_key(prompt)
        if key is None:
            return self._least_loaded(alive, loads)
        owner = self._prefixes.get(key)
        least = self._least_loaded(alive, loads)
        if owner is None or not alive[owner] or loads[owner] > loads[least] + self.slack:
            owner = least
        self._remember(self._prefixes, key, owner)
        return owner

    def session_replica(self, session_id: str) -> int | None:
        return self._sessions.get(session_id)

    def forget_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        self._deactivate(session_id)

    def prefix_key(self, prompt: str | Sequence[int]) -> bytes | None:
        """A hash of the prompt's leading full blocks (characters stand in for tokens in a text prompt);
        None when not one block is full."""
        full = min(len(prompt) // self.block_size, self.prefix_blocks) * self.block_size
        if full == 0:
            return None
        head = prompt[:full]
        data = head.encode() if isinstance(head, str) else array("q", head).tobytes()
        return hashlib.blake2b(data, digest_size=16).digest()

    def _route_session(self, session_id: str, alive: Sequence[bool], loads: list[int]) -> int:
        replica = self._sessions.get(session_id)
        if replica is None or not alive[replica]:
            if session_id in self._recent:  # its replica died: placed afresh
                loads[self._recent[session_id][0]] -= 1
            self._deactivate(session_id)
            replica = self._least_loaded(alive, loads)
        self._sessions[session_id] = replica
        self._sessions.move_to_end(session_id)
        while len(self._sessions) > self.capacity:
            old, _ = self._sessions.popitem(last=False)
            self._deactivate(old)
        if session_id not in self._recent:
            self._pinned[replica] += 1
        self._recent[session_id] = (replica, self._clock())
        self._recent.move_to_end(session_id)
        return replica

    def _deactivate(self, session_id: str) -> None:
        entry = self._recent.pop(session_id, None)
        if entry is not None:
            self._pinned[entry[0]] -= 1

    def _expire(self) -> None:
        horizon = self._clock() - self.active_s
        while self._recent:
            session_id, (_, last) = next(iter(self._recent.items()))
            if last >= horizon:
                return
            self._deactivate(session_id)

    def _least_loaded(self, alive: Sequence[bool], loads: Sequence[int]) -> int:
        n = self.num_replicas
        order = [(self._next + k) % n for k in range(n)]
        best = min((i for i in order if alive[i]), key=lambda i: loads[i])
        self._next = (best + 1) % n
        return best

    def _remember(self, table: OrderedDict[bytes, int], key: bytes, replica: int) -> None:
        table[key] = replica
        table.move_to_end(key)
        while len(table) > self.capacity:
            table.popitem(last=False)
