"""Data parallel: N engine cores, each a full copy of the model, behind one ``AsyncEngine`` interface.

Each replica is an ``EngineCoreClient`` (a local process, or a Ray actor), which detects its own core's
death, fails that core's streams and restarts it. This class only chooses (``engine.frontend.router``): a
session's requests go to the replica that holds its prefix cache, and new work goes to live replicas
only, so when one dies its sessions get an error and everything else carries on.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

from omni_gateway.engine.core.sequence import EmbedSpan
from omni_gateway.engine.errors import EngineDead
from omni_gateway.engine.frontend.chat_stream import ChatStreaming
from omni_gateway.engine.frontend.core_client import EngineCoreClient
from omni_gateway.engine.frontend.router import NoLiveReplica, Router
from omni_gateway.engine.outputs import StreamDelta
from omni_gateway.engine.sampling_params import SamplingParams

# Stats that describe a state (a fraction, a lag) are averaged over replicas; every other one is a count.
_AVERAGED = ("kv_waste_fraction", "decode_steps_ahead")


class ReplicatedEngine(ChatStreaming):
    def __init__(self, replicas: Sequence[EngineCoreClient], *, block_size: int = 16) -> None:
        if not replicas:
            raise ValueError("ReplicatedEngine needs at least one replica")
        self.replicas = list(replicas)
        self.router = Router(len(self.replicas), block_size=block_size)
        self._owner: dict[str, int] = {}  # request id -> replica, while it streams

    @property
    def tokenizer(self) -> Any:
        return self.replicas[0].tokenizer

    @property
    def model_name(self) -> str:
        return self.replicas[0].model_name

    @property
    def max_model_len(self) -> int:
        return min(r.max_model_len for r in self.replicas)

    @property
    def device_and_dtype(self) -> tuple[Any, Any]:
        return self.replicas[0].device_and_dtype

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
    ) -> str:
        return self.replicas[0].render_chat(
            messages, tools=tools, add_generation_prompt=add_generation_prompt, chat_template=chat_template
        )

    def pick(self, *, session_id: str | None = None, prompt: str | Sequence[int] = ()) -> int:
        """The replica the next request of this session (or with this prompt) goes to."""
        try:
            return self.router.route(
                alive=[r.alive for r in self.replicas],
                open_requests=[r.num_open_streams for r in self.replicas],
                session_id=session_id,
                prompt=prompt,
            )
        except NoLiveReplica as exc:
            reasons = "; ".join(str(r.health()["error"]) for r in self.replicas)
            raise EngineDead(f"{exc}: {reasons}") from None

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        priority: int = 0,
        embed_spans: Iterable[EmbedSpan] = (),
        add_special_tokens: bool = True,
        session_id: str | None = None,
    ) -> AsyncIterator[StreamDelta]:
        """``AsyncEngine.generate`` on the replica the router picks; ``session_id`` pins a conversation."""
        index = self.pick(session_id=session_id, prompt=prompt)
        stream = self.replicas[index].generate(
            prompt,
            params,
            request_id=request_id,
            priority=priority,
            embed_spans=embed_spans,
            add_special_tokens=add_special_tokens,
        )
        if request_id is not None:
            self._owner[request_id] = index
        try:
            async with contextlib.aclosing(stream) as deltas:
                async for delta in deltas:
                    yield delta
        finally:
            if request_id is not None and self._owner.get(request_id) == index:
                del self._owner[request_id]

    def abort(self, request_id: str) -> None:
        index = self._owner.get(request_id)
        if index is not None:
            self.replicas[index].abort(request_id)

    async def load_lora(self, name: str, path: str) -> None:
        """Load the adapter on every replica; where one refuses it, those that took it unload it again, so a
        refused adapter changes nothing."""
        loaded: list[EngineCoreClient] = []
        try:
            for replica in self.replicas:
                await replica.load_lora(name, path)
                loaded.append(replica)
        except BaseException:
            for replica in loaded:
                with contextlib.suppress(Exception):
                    await replica.unload_lora(name)
            raise

    async def unload_lora(self, name: str) -> None:
        for replica in self.replicas:
            await replica.unload_lora(name)

    def lora_adapters(self) -> dict[str, str]:
        return self.replicas[0].lora_adapters()

    def health(self) -> dict[str, Any]:
        """Alive while any replica serves: the survivors take the new work while a dead one restarts."""
        states = [r.health() for r in self.replicas]
        alive = sum(1 for s in states if s["alive"])
        down = "; ".join(f"replica {i}: {s['error']}" for i, s in enumerate(states) if not s["alive"])
        return {
            "alive": alive > 0,
            "error": down or None,
            "open_streams": sum(s["open_streams"] for s in states),
            "replicas_alive": alive,
            "replicas": len(states),
        }

    def stats(self) -> dict[str, float]:
        total: dict[str, float] = {}
        snapshots = [r.stats() for r in self.replicas]
        for snapshot in snapshots:
            for key, value in snapshot.items():
                total[key] = total.get(key, 0.0) + value
        for key in _AVERAGED:
            if key in total:
                total[key] /= sum(1 for s in snapshots if key in s)
        total["replicas_alive"] = sum(1 for r in self.replicas if r.alive)
        return total

    def kill(self, index: int) -> None:
        """Kill one replica's core as a crash would; it is restarted."""
        self.replicas[index].kill()

    def shutdown(self, timeout: float = 30.0) -> None:
        for replica in self.replicas:
            replica.shutdown(timeout)
