"""Pipelined decode (the step after the current one launched before the host reads it) gives exactly
what the unpipelined engine gives: tokens, text, stops, aborts, arrivals, seeded draws. The real runner on
a tiny random Llama; on the CPU the runner's eager launch path, on CUDA the decode graphs."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from omni_gateway.engine import LLM, SamplingParams
from omni_gateway.engine.core.llm_engine import LLMEngine

from tests.harness.checkpoints import save_tiny_checkpoint

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
    ),
]
PROMPTS = [[3 + (i * 7 + j * 11) % 300 for j in range(5 + 6 * i)] for i in range(4)]

Outcome = list[tuple[str, tuple[int, ...], str, str | None, Any]]


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama-pipelined")
    save_tiny_checkpoint("llama", path)
    return path


def engine(directory: Path, device: str, pipeline: str, **kw: Any) -> LLMEngine:
    return LLM(
        model=str(directory), device=device, dtype="float32", max_model_len=128, pipeline_decode=pipeline, **kw
    ).engine


def drive(
    eng: LLMEngine,
    requests: list[tuple[str, list[int], SamplingParams]],
    events: dict[int, Callable[[LLMEngine], None]] | None = None,
) -> Outcome:
    """Add ``requests``, step to the end (running ``events[k]`` before step k) and return every
    finished request's id, tokens, text, finish and stop reasons, sorted by id."""
    for rid, prompt, params in requests:
        eng.add_request(rid, prompt, params)
    done = []
    k = 0
    while eng.has_unfinished():
        if events and k in events:
            events[k](eng)
        eng.step()
        done += eng.pop_finished()
        k += 1
    assert eng.stats()["kv_blocks_used"] == 0
    return sorted(
        (
            o.request_id,
            tuple(o.outputs[0].token_ids),
            o.outputs[0].text,
            o.outputs[0].finish_reason,
            o.outputs[0].stop_reason,
        )
        for o in done
    )


def both(
    directory: Path,
    device: str,
    requests: list[tuple[str, list[int], SamplingParams]],
    events: dict[int, Callable[[LLMEngine], None]] | None = None,
    **kw: Any,
) -> tuple[Outcome, int]:
    """The outcome with pipelining on, checked against pipelining off; and how many steps ran ahead."""
    off = engine(directory, device, "off", **kw)
    on = engine(directory, device, "on", **kw)
    expected = drive(off, requests, events)
    got = drive(on, requests, events)
    assert got == expected
    assert off.num_steps_ahead == 0
    return got, on.num_steps_ahead


def greedy(**kw: Any) -> SamplingParams:
    return SamplingParams(temperature=0.0, **kw)


@pytest.mark.parametrize("device", DEVICES)
def test_lengths_eos_stop_tokens_and_stop_strings_end_where_they_do_unpipelined(directory: Path, device: str) -> None:
    reference = drive(
        engine(directory, device, "off"),
        [(f"r{i}", p, greedy(max_tokens=24, ignore_eos=True)) for i, p in enumerate(PROMPTS)],
    )
    tokens = {rid: toks for rid, toks, *_ in reference}
    texts = {rid: text for rid, _, text, *_ in reference}
    # End r1 on a token it generates mid-way (as a stop token and as EOS by min_tokens), r2 on a stop
    # string from the middle of its text; r0 and r3 run to their (different) lengths.
    stop_token = tokens["r1"][9]
    stop_text = next(
        texts["r2"][i : i + 2] for i in range(8, len(texts["r2"]) - 2) if "\ufffd" not in texts["r2"][i : i + 2]
    )
    requests = [
        ("r0", PROMPTS[0], greedy(max_tokens=24, ignore_eos=True)),
        ("r1", PROMPTS[1], greedy(max_tokens=24, stop_token_ids=[stop_token])),
        ("r2", PROMPTS[2], greedy(max_tokens=30, ignore_eos=True, stop=[stop_text])),
        ("r3", PROMPTS[3], greedy(max_tokens=7, ignore_eos=True)),
    ]
    got, ahead = both(directory, device, requests)
    by_id = {rid: (toks, text, finish, stop) for rid, toks, text, finish, stop in got}
    assert by_id["r0"][0] == tokens["r0"] and by_id["r3"][0] == tokens["r3"][:7]
    first = tokens["r1"].index(stop_token)
    assert by_id["r1"][0] == tokens["r1"][: first + 1] and by_id["r1"][2:] == ("stop", stop_token)
    assert by_id["r2"][2:] == ("stop", stop_text) and stop_text not in by_id["r2"][1]
    assert ahead > 10


@pytest.mark.parametrize("device", DEVICES)
def test_aborts_and_arrivals_while_a_step_is_in_flight(directory: Path, device: str) -> None:
    requests = [(f"r{i}", p, greedy(max_tokens=20, ignore_eos=True)) for i, p in enumerate(PROMPTS[:3])]
    events = {
        4: lambda eng: eng.abort("r1"),
        6: lambda eng: eng.add_request("late", PROMPTS[3], greedy(max_tokens=12, ignore_eos=True)),
        9: lambda eng: eng.abort("r2"),
    }
    got, ahead = both(directory, device, requests, events)
    by_id = {rid: (toks, finish) for rid, toks, _, finish, _ in got}
    assert by_id["r1"][1] == "abort" and by_id["r2"][1] == "abort"
    assert len(by_id["r0"][0]) == 20 and len(by_id["late"][0]) == 12
    # The late request's tokens do not depend on what it shared steps with.
    alone = drive(engine(directory, device, "on"), [("late", PROMPTS[3], greedy(max_tokens=12, ignore_eos=True))])
    assert by_id["late"][0] == alone[0][1]
    assert ahead > 5


@pytest.mark.parametrize("device", DEVICES)
def test_seeded_sampling_is_pipelined_and_draws_what_it_draws_unpipelined(directory: Path, device: str) -> None:
    requests = [
        ("greedy", PROMPTS[0], greedy(max_tokens=12, ignore_eos=True)),
        ("hot", PROMPTS[1], SamplingParams(temperature=1.5, seed=7, max_tokens=12, ignore_eos=True)),
        (
            "nucleus",
            PROMPTS[2],
            SamplingParams(temperature=0.9, top_p=0.8, top_k=20, seed=11, max_tokens=16, ignore_eos=True),
        ),
        ("min-p", PROMPTS[3], SamplingParams(temperature=1.0, min_p=0.05, seed=5, max_tokens=9)),
    ]
    got, ahead = both(directory, device, requests)
    assert ahead > 5
    by_id = {rid: toks for rid, toks, *_ in got}
    assert len(set(by_id["hot"])) > 3  # it did sample: a hot draw over 12 tokens is not one token repeated
    # Unseeded rows share one generator: their draws depend on the batch, so only the lengths compare.
    eng = engine(directory, device, "on")
    unseeded = drive(eng, [("u", PROMPTS[1], SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True))])
    assert len(unseeded[0][1]) == 10 and eng.num_steps_ahead > 0


@pytest.mark.parametrize("device", DEVICES)
def test_logprob_and_penalized_requests_are_not_pipelined_and_match(directory: Path, device: str) -> None:
    requests = [
        ("greedy", PROMPTS[0], greedy(max_tokens=10, ignore_eos=True)),
        ("logprobs", PROMPTS[2], greedy(max_tokens=10, ignore_eos=True, logprobs=2)),
    ]
    _, ahead = both(directory, device, requests)
    assert ahead == 0  # every step has a row whose results need more than the token
    _, ahead = both(
        directory,
        device,
        requests[:1] + [("penalized", PROMPTS[3], greedy(max_tokens=10, ignore_eos=True, repetition_penalty=1.3))],
    )
    assert ahead == 0


@pytest.mark.parametrize("device", DEVICES)
def test_tight_kv_cache_preempts_and_still_matches(directory: Path, device: str) -> None:
    requests = [(f"r{i}", p, greedy(max_tokens=16, ignore_eos=True)) for i, p in enumerate(PROMPTS)]
    got, _ = both(directory, device, requests, num_kv_blocks=9, max_num_batched_tokens=16)
    assert [len(toks) for _, toks, *_ in got] == [16] * 4


def test_pipelining_switches_only_between_requests(directory: Path) -> None:
    eng = engine(directory, "cpu", "on")
    assert eng.pipelined
    eng.add_request("a", PROMPTS[0], greedy(max_tokens=8, ignore_eos=True))
    for _ in range(3):
        eng.step()
    assert eng.num_steps_ahead > 0
    with pytest.raises(RuntimeError, match="while a step of unfinished requests is in flight"):
        eng.pipelined = False
    while eng.has_unfinished():
        eng.step()
    first = eng.pop_finished()[0].outputs[0].token_ids
    eng.pipelined = False  # what is still in flight belongs to a finished request
    assert not eng.pipelined
    ahead = eng.num_steps_ahead
    assert drive(eng, [("b", PROMPTS[0], greedy(max_tokens=8, ignore_eos=True))])[0][1] == tuple(first)
    assert eng.num_steps_ahead == ahead


def test_pipelining_defaults_on_for_cuda_runners_and_runs_ahead_on_any_runner() -> None:
    from omni_gateway.engine.config import EngineConfig

    from tests.harness.engine_fakes import FakeRunner, fake_model, make_engine

    class CudaFakeRunner(FakeRunner):
        device = torch.device("cuda")

    assert not make_engine().pipelined  # "auto" off the GPU
    on_cuda = LLMEngine(
        EngineConfig(num_kv_blocks=64, block_size=16),
        model=fake_model(),
        runner_factory=lambda c, m: CudaFakeRunner(c, m),
    )
    assert on_cuda.pipelined  # "auto" where launches are asynchronous
    with pytest.raises(ValueError, match="pipeline_decode must be 'auto', 'on' or 'off', got 'yes'"):
        make_engine(pipeline_decode="yes")
    # The fake runner decodes ahead from the in-flight step's tokens through its simulated KV cache,
    # so a wrong position or slot in the launched-ahead step changes the tokens.
    requests = [(f"r{i}", PROMPTS[i % len(PROMPTS)], greedy(max_tokens=9, ignore_eos=True)) for i in range(3)]
    ahead, plain = make_engine(pipeline_decode="on"), make_engine(pipeline_decode="off")
    assert drive(ahead, requests) == drive(plain, requests)
    assert ahead.num_steps_ahead > 0 and plain.num_steps_ahead == 0


def random_scenario(
    rng: random.Random,
) -> tuple[list[tuple[str, list[int], SamplingParams]], dict[int, Callable[[LLMEngine], None]]]:
    """Requests of mixed kinds (greedy, seeded sampling, logprobs, penalties, stops, lengths) and
    arrivals and aborts at random steps."""

    def params() -> SamplingParams:
        kind = rng.choice(["greedy", "seeded", "logprobs", "penalty", "stop"])
        max_tokens = rng.randint(1, 14)
        common: dict[str, Any] = {
            "max_tokens": max_tokens,
            "ignore_eos": rng.random() < 0.7,
            "min_tokens": min(max_tokens, rng.choice([0, 0, 2])),
        }
        if kind == "seeded":
            return SamplingParams(
                temperature=rng.choice([0.7, 1.3]), top_p=rng.choice([1.0, 0.9]), seed=rng.randint(0, 99), **common
            )
        if kind == "logprobs":
            return greedy(logprobs=rng.randint(0, 3), **common)
        if kind == "penalty":
            return greedy(presence_penalty=0.5, **common)
        if kind == "stop":
            return greedy(stop_token_ids=[rng.randint(2, 300)], stop=["e"], **common)
        return greedy(**common)

    def prompt() -> list[int]:
        return [rng.randint(2, 300) for _ in range(rng.randint(1, 40))]

    requests = [(f"r{i}", prompt(), params()) for i in range(rng.randint(1, 4))]
    events: dict[int, Callable[[LLMEngine], None]] = {}
    for k in rng.sample(range(1, 12), rng.randint(0, 3)):
        if rng.random() < 0.5:
            rid, p, sp = f"late{k}", prompt(), params()
            events[k] = lambda eng, rid=rid, p=p, sp=sp: eng.add_request(rid, p, sp)
        else:
            victim = rng.choice(requests)[0]
            events[k] = lambda eng, victim=victim: eng.abort(victim)
    return requests, events


@pytest.mark.parametrize("seed", range(40))
def test_random_mixes_of_requests_arrivals_and_aborts_match_unpipelined(directory: Path, seed: int) -> None:
    requests, events = random_scenario(random.Random(seed))
    both(directory, "cpu", requests, events, num_kv_blocks=24, max_num_batched_tokens=32)


def test_parallel_samples_of_one_request_match_unpipelined(directory: Path) -> None:
    outcomes, ahead = [], []
    for pipeline in ("off", "on"):
        eng = engine(directory, "cpu", pipeline)
        eng.add_request("n3", PROMPTS[2], SamplingParams(temperature=0.9, seed=3, n=3, max_tokens=12, ignore_eos=True))
        eng.add_request("n2", PROMPTS[1], greedy(n=2, max_tokens=10, ignore_eos=True))
        done = []
        while eng.has_unfinished():
            eng.step()
            done += eng.pop_finished()
        outcomes.append(sorted((o.request_id, [tuple(c.token_ids) for c in o.outputs]) for o in done))
        ahead.append(eng.num_steps_ahead)
    assert outcomes[0] == outcomes[1] and ahead[0] == 0 and ahead[1] > 5
    n2, n3 = dict(outcomes[1])["n2"], dict(outcomes[1])["n3"]
    assert len(n3) == 3 and len(set(n3)) == 3  # three seeds, three different draws
    assert len(n2) == 2 and n2[0] == n2[1]  # greedy siblings agree
