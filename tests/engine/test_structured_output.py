"""Grammar-constrained decoding: the constraint's validation, the sampler's masks and the engine's
matchers, over the real runner and a tiny random Llama (whose samples at temperature 1 are noise, so
only the grammar makes them parse)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import jsonschema
import pytest
import torch
from omni_gateway.engine import LLM, InvalidRequest, SamplingParams, StructuredOutputs
from omni_gateway.engine.core.pipelining import may_run_ahead
from omni_gateway.engine.core.sequence import Sequence
from omni_gateway.engine.core.structured_output import GrammarCache
from omni_gateway.engine.runner.sampler import Sampler
from omni_gateway.omni.tools import tool_call_format

from tests.harness.checkpoints import VOCAB, byte_level_tokenizer, save_tiny_checkpoint

SCHEMA = {
    "type": "object",
    "properties": {
        "metric": {"type": "boolean"},
        "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 30},
    },
    "required": ["metric", "city", "days"],  # not sorted: the output follows the schema's order
    "additionalProperties": False,
}
COMPACT_JSON = StructuredOutputs(json=SCHEMA, disable_any_whitespace=True)


# ---- the constraint itself ------------------------------------------------------------------------


def test_exactly_one_constraint_is_required() -> None:
    with pytest.raises(InvalidRequest, match="exactly one"):
        StructuredOutputs()
    with pytest.raises(InvalidRequest, match="exactly one"):
        StructuredOutputs(regex="a+", choice=["a"])
    with pytest.raises(InvalidRequest, match="choice"):
        StructuredOutputs(choice=[])
    with pytest.raises(InvalidRequest, match="choice"):
        StructuredOutputs(choice="yes")


def test_a_schema_keeps_its_property_order() -> None:
    a = StructuredOutputs(json={"type": "object", "required": ["x"]})
    assert a == StructuredOutputs(json='{"type": "object", "required": ["x"]}')
    assert SamplingParams(structured_outputs=a) == SamplingParams(structured_outputs=a)
    ordered = {"type": "object", "properties": {"z": {"const": 1}, "a": {"const": 2}}, "required": ["z", "a"]}
    assert json.loads(StructuredOutputs(json=ordered).json or "") == ordered
    assert list(json.loads(StructuredOutputs(json=ordered).json or "")["properties"]) == ["z", "a"]


def test_constrained_sequences_may_decode_ahead_unless_the_host_reads_their_history() -> None:
    regex = StructuredOutputs(regex="a")
    assert may_run_ahead(Sequence("r", [1, 2], SamplingParams(structured_outputs=regex)))
    assert not may_run_ahead(Sequence("r", [1, 2], SamplingParams(structured_outputs=regex, logprobs=1)))
    assert not may_run_ahead(Sequence("r", [1, 2], SamplingParams(structured_outputs=regex, repetition_penalty=1.2)))


@pytest.fixture(scope="module")
def grammars() -> GrammarCache:
    tok = byte_level_tokenizer()
    return GrammarCache(tok, VOCAB, {tok.eos_token_id})


@pytest.mark.parametrize(
    ("spec", "kind"),
    [
        (StructuredOutputs(json={"type": "object", "properties": {"a": {"type": "no-such-type"}}}), "json"),
        (StructuredOutputs(json="{not json"), "json"),
        (StructuredOutputs(json="[1, 2]"), "json"),
        (StructuredOutputs(regex="(unclosed"), "regex"),
        (StructuredOutputs(grammar="root ::= undefined_rule"), "grammar"),
        (StructuredOutputs(structural_tag='{"type": "structural_tag", "format": {"type": "nope"}}'), "structural_tag"),
    ],
)
def test_a_constraint_xgrammar_rejects_is_an_invalid_request(
    grammars: GrammarCache, spec: StructuredOutputs, kind: str
) -> None:
    with pytest.raises(InvalidRequest, match=f"invalid {kind} constraint"):
        grammars.compile(spec)


def _accepts(grammars: GrammarCache, spec: StructuredOutputs, text: str) -> bool:
    matcher = grammars.matcher(spec)
    return all(matcher.accept_token(t) for t in byte_level_tokenizer().encode(text, add_special_tokens=False))


@pytest.mark.parametrize("bounded", [{"maxLength": 12}, {"minLength": 2}, {}])
def test_json_strings_take_no_raw_control_character(grammars: GrammarCache, bounded: dict[str, int]) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string", **bounded}}, "required": ["city"]}
    spec = StructuredOutputs(json=schema, disable_any_whitespace=True)
    assert _accepts(grammars, spec, '{"city": "Los Angeles"}')
    for control in "\t\x00\x1f\x0b":
        assert not _accepts(grammars, spec, f'{{"city": "Los{control}Angeles"}}'), repr(control)


def test_tool_call_arguments_take_no_raw_control_character(grammars: GrammarCache) -> None:
    params = {"type": "object", "properties": {"q": {"type": "string", "maxLength": 9}}, "required": ["q"]}
    tool = {"type": "function", "function": {"name": "f", "parameters": params}}
    spec = StructuredOutputs(
        structural_tag=json.dumps(tool_call_format("hermes").grammar([tool], required=True, parallel=False))
    )
    call = '<tool_call>\n{{"name": "f", "arguments": {{"q": "a{}b"}}}}\n</tool_call>'
    assert _accepts(grammars, spec, call.format(" "))
    assert not _accepts(grammars, spec, call.format("\t"))


def test_compiled_grammars_are_cached_by_content(grammars: GrammarCache) -> None:
    first = grammars.compile(StructuredOutputs(json={"type": "object", "required": ["a"]}))
    again = grammars.compile(StructuredOutputs(json='{"type": "object", "required": ["a"]}'))
    assert first is again


def test_sampler_masks_constrained_rows_only(grammars: GrammarCache) -> None:
    digits, letters = StructuredOutputs(regex=r"[0-9]+"), StructuredOutputs(regex=r"[x-z]+")
    seqs = [
        Sequence("a", [1], SamplingParams(temperature=0.0, structured_outputs=digits)),
        Sequence("b", [1], SamplingParams(temperature=1.0, seed=3)),
        Sequence("c", [1], SamplingParams(temperature=0.0)),
        Sequence("d", [1], SamplingParams(temperature=1.0, structured_outputs=letters)),
    ]
    seqs[0].grammar = grammars.matcher(digits)
    seqs[3].grammar = grammars.matcher(letters)
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    tokens = Sampler(torch.device("cpu"), seed=7).choose(logits, seqs, logits.argmax(-1)).tolist()

    assert torch.equal(logits, before)  # the raw logits are untouched (logprobs read them)
    tok = byte_level_tokenizer()
    assert re.fullmatch(r"[0-9]+", tok.decode([tokens[0]])), tok.decode([tokens[0]])
    assert re.fullmatch(r"[x-z]+", tok.decode([tokens[3]])), tok.decode([tokens[3]])
    assert tokens[2] == int(logits[2].argmax())  # the stale argmax is not used for a masked batch's others
    # The sampled unconstrained row draws from the shared generator in the same place as without masks.
    plain = [Sequence(s.request_id, [1], dataclasses.replace(s.params, structured_outputs=None)) for s in seqs]
    unmasked = Sampler(torch.device("cpu"), seed=7).choose(logits, plain).tolist()
    assert tokens[1] == unmasked[1]


# ---- the engine -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-llama-structured")
    save_tiny_checkpoint("llama", directory)
    return directory


@pytest.fixture(scope="module")
def llm(checkpoint: Path) -> LLM:
    return LLM(model=str(checkpoint), device="cpu", dtype="float32", max_model_len=256)


def _constrained(spec: StructuredOutputs, **kw: object) -> SamplingParams:
    return SamplingParams(**{"temperature": 1.0, "max_tokens": 120, "structured_outputs": spec, **kw})  # type: ignore[arg-type]


PROMPTS = ["Hello world, the quick", "The end of the story", "def f(x): return", "Grüße aus"]


@pytest.mark.slow
def test_unconstrained_tokens_are_those_it_gets_alone(llm: LLM) -> None:
    plain = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    alone = llm.generate([PROMPTS[0]], plain)[0].outputs[0].token_ids
    mixed = llm.generate(PROMPTS[:2], [plain, _constrained(COMPACT_JSON)])
    assert mixed[0].outputs[0].token_ids == alone
    assert SCHEMA["required"] == list(json.loads(mixed[1].outputs[0].text))


@pytest.mark.slow
def test_json_schema_outputs_parse_and_validate(llm: LLM) -> None:
    outputs = llm.generate(PROMPTS * 2, _constrained(COMPACT_JSON, seed=None))
    for out in outputs:
        completion = out.outputs[0]
        assert completion.finish_reason == "stop", completion.text
        jsonschema.validate(json.loads(completion.text), SCHEMA)


@pytest.mark.slow
def test_regex_and_choice(llm: LLM) -> None:
    regex = StructuredOutputs(regex=r"[a-c]{2,4}-\d{2}")
    choice = StructuredOutputs(choice=["yes", "no", "maybe so"])
    outputs = llm.generate(PROMPTS, [_constrained(regex), _constrained(choice)] * 2)
    for out, pattern in zip(outputs, [r"[a-c]{2,4}-\d{2}", "yes|no|maybe so"] * 2):
        assert re.fullmatch(pattern, out.outputs[0].text), out.outputs[0].text
        assert out.outputs[0].finish_reason == "stop"


@pytest.mark.slow
def test_json_object(llm: LLM) -> None:
    spec = StructuredOutputs(json_object=True, disable_any_whitespace=True)
    for out in llm.generate(PROMPTS, _constrained(spec, max_tokens=200)):
        if out.outputs[0].finish_reason == "stop":
            assert isinstance(json.loads(out.outputs[0].text), dict)
        else:  # a free-form object may run out of tokens; what came is still a prefix of an object
            assert out.outputs[0].text.startswith("{")


@pytest.mark.slow
def test_grammar(llm: LLM) -> None:
    spec = StructuredOutputs(grammar='root ::= "(" num ("+" num)* ")"\nnum ::= [1-9] [0-9]?')
    for out in llm.generate(PROMPTS, _constrained(spec)):
        assert re.fullmatch(r"\([1-9][0-9]?(\+[1-9][0-9]?)*\)", out.outputs[0].text), out.outputs[0].text


@pytest.mark.slow
def test_each_of_n_completions_has_its_own_matcher(llm: LLM) -> None:
    out = llm.generate([PROMPTS[0]], _constrained(COMPACT_JSON, n=4, seed=11))[0]
    assert len(out.outputs) == 4
    texts = [c.text for c in out.outputs]
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)
    assert len(set(texts)) > 1  # independent draws, not one matcher shared


@pytest.mark.slow
def test_stop_string_ends_a_constrained_request(llm: LLM) -> None:
    spec = StructuredOutputs(choice=["alpha beta gamma"])
    out = llm.generate([PROMPTS[0]], _constrained(spec, stop=[" beta"]))[0].outputs[0]
    assert (out.text, out.finish_reason, out.stop_reason) == ("alpha", "stop", " beta")


@pytest.mark.slow
def test_complete_grammar_finishes_even_with_ignore_eos(llm: LLM) -> None:
    out = llm.generate([PROMPTS[1]], _constrained(StructuredOutputs(choice=["done"]), ignore_eos=True))[0]
    assert out.outputs[0].text == "done"
    assert out.outputs[0].finish_reason == "stop"


@pytest.mark.slow
def test_preemption_mid_constraint_keeps_outputs_valid(checkpoint: Path) -> None:
    tight = LLM(model=str(checkpoint), device="cpu", dtype="float32", max_model_len=128, num_kv_blocks=12, block_size=8)
    outputs = tight.generate(PROMPTS * 2, _constrained(COMPACT_JSON, max_tokens=80))
    assert tight.engine.stats()["num_preemptions"] > 0
    for out in outputs:
        assert out.outputs[0].finish_reason == "stop", out.outputs[0].text
        jsonschema.validate(json.loads(out.outputs[0].text), SCHEMA)


@pytest.mark.slow
def test_abort_frees_the_matchers_and_others_go_on(llm: LLM) -> None:
    engine = llm.engine
    engine.add_request("doomed", PROMPTS[0], _constrained(COMPACT_JSON, n=2))
    engine.add_request("kept", PROMPTS[1], _constrained(StructuredOutputs(regex=r"\d{3}")))
    doomed = [seq for seq in engine.scheduler.waiting if seq.request_id == "doomed"]
    texts: dict[str, str] = {}
    deltas = engine.step()
    aborted = engine.abort("doomed")
    assert [d.finish_reason for d in aborted] == ["abort", "abort"]
    assert all(seq.grammar is None for seq in doomed)
    while engine.has_unfinished():
        deltas += engine.step()
    for delta in deltas:
        texts[delta.request_id] = texts.get(delta.request_id, "") + delta.text
    engine.pop_finished()
    assert re.fullmatch(r"\d{3}", texts["kept"])


@pytest.mark.slow
def test_invalid_constraint_queues_nothing(llm: LLM) -> None:
    with pytest.raises(InvalidRequest, match="invalid regex constraint"):
        llm.engine.add_request("bad", PROMPTS[0], _constrained(StructuredOutputs(regex="(")))
    assert not llm.engine.has_unfinished()


@pytest.mark.slow
@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")],
        ),
    ],
)
def test_pipelined_constrained_decode_gives_what_the_unpipelined_engine_gives(checkpoint: Path, device: str) -> None:
    """Launched ahead, a constrained step's masks wait for the token in flight: same tokens, stops and
    finishes, and steps did run ahead."""
    requests = [
        (PROMPTS[0], _constrained(COMPACT_JSON, seed=1)),
        (PROMPTS[1], SamplingParams(temperature=1.0, seed=2, max_tokens=40)),
        (PROMPTS[2], _constrained(StructuredOutputs(choice=["alpha beta gamma"]), seed=3, stop=[" beta"])),
        (PROMPTS[3], _constrained(StructuredOutputs(regex=r"[a-z]{3,30}"), seed=4, n=2)),
    ]
    outcomes = {}
    for mode in ("off", "on"):
        llm = LLM(model=str(checkpoint), device=device, dtype="float32", max_model_len=256, pipeline_decode=mode)
        outputs = llm.generate([p for p, _ in requests], [params for _, params in requests])
        outcomes[mode] = [[(c.token_ids, c.text, c.finish_reason) for c in out.outputs] for out in outputs]
        assert (llm.engine.num_steps_ahead > 0) == (mode == "on")
        assert llm.engine.stats()["kv_blocks_used"] == 0
    assert outcomes["on"] == outcomes["off"]
    jsonschema.validate(json.loads(outcomes["on"][0][0][1]), SCHEMA)
    assert outcomes["on"][2][0][1:] == ("alpha", "stop")
