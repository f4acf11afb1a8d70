"""Offline batch generation with vLLM's interface: ``LLM(model=...).generate(prompts, params)``."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.llm_engine import LLMEngine
from omni_gateway.engine.errors import InvalidRequest
from omni_gateway.engine.outputs import RequestOutput
from omni_gateway.engine.sampling_params import SamplingParams

Prompt = str | list[int]
Conversation = Sequence[Mapping[str, Any]]


class LLM:
    def __init__(self, model: str = "default", **engine_config: Any) -> None:
        self.engine = LLMEngine(EngineConfig(model=model, **engine_config))
        self._ids = itertools.count()

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> LLM:
        self = cls.__new__(cls)
        self.engine = engine
        self._ids = itertools.count()
        return self

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: str | list[int] | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = False,
        priority: int = 0,
    ) -> list[RequestOutput]:
        """Outputs in the order of ``prompts``. A single prompt (text or token ids) is accepted too."""
        return self._run(_as_prompt_list(prompts), sampling_params, use_tqdm, priority, add_special_tokens=True)

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """One conversation (a list of messages) or a list of conversations; one output each."""
        if not messages:
            raise InvalidRequest("chat needs at least one message")
        conversations = [messages] if isinstance(messages[0], Mapping) else list(messages)
        tok = self.engine.tokenizer
        prompts: list[Prompt] = []
        for conv in conversations:
            text = self.engine.render_chat(
                conv, tools=tools, add_generation_prompt=add_generation_prompt, chat_template=chat_template
            )
            # The template already writes any BOS; tokenizing with special tokens would double it.
            prompts.append(list(tok.encode(text, add_special_tokens=False)))
        return self._run(prompts, sampling_params, use_tqdm, 0, add_special_tokens=False)

    def _run(
        self,
        prompts: list[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        use_tqdm: bool,
        priority: int,
        *,
        add_special_tokens: bool,
    ) -> list[RequestOutput]:
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise InvalidRequest(
                    f"got {len(params)} sampling params for {len(prompts)} prompts; "
                    f"pass one SamplingParams or one per prompt"
                )
        engine = self.engine
        ids = [f"llm-{next(self._ids)}" for _ in prompts]
        added: list[str] = []
        try:
            for rid, prompt, p in zip(ids, prompts, params):
                engine.add_request(rid, prompt, p, priority=priority, add_special_tokens=add_special_tokens)
                added.append(rid)
            results: dict[str, RequestOutput] = {}
            bar = _progress(len(ids)) if use_tqdm else None
            while engine.has_unfinished():
                engine.step()
                for out in engine.pop_finished():
                    results[out.request_id] = out
                    if bar is not None:
                        bar.update(1)
            if bar is not None:
                bar.close()
        except BaseException:
            for rid in added:
                engine.abort(rid)
            engine.pop_finished()
            raise
        return [results[rid] for rid in ids]


def _as_prompt_list(prompts: str | list[int] | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if not prompts:
        raise InvalidRequest("generate needs at least one prompt")
    if all(isinstance(p, int) and not isinstance(p, bool) for p in prompts):
        return [prompts]  # one prompt given as token ids
    for i, p in enumerate(prompts):
        if not isinstance(p, (str, list)):
            raise InvalidRequest(f"prompts[{i}] must be a string or a list of token ids, got {type(p).__name__}")
    return prompts


def _progress(total: int) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc="requests", unit="req")
