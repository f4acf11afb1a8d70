"""The messages between the gateway and an engine core survive the wire unchanged (no processes here)."""

from __future__ import annotations

import dataclasses

from omni_gateway.engine.errors import EngineOverloaded
from omni_gateway.engine.frontend import ipc
from omni_gateway.engine.outputs import Logprob, StreamDelta
from omni_gateway.engine.sampling_params import SamplingParams, StructuredOutputs


def test_a_step_output_carries_every_field_of_every_delta() -> None:
    full = StreamDelta(
        request_id="r1",
        text="hi",
        token_ids=(5, 6),
        finished=True,
        finish_reason="stop",
        stop_reason="\n",
        num_prompt_tokens=7,
        num_cached_tokens=4,
        num_output_tokens=2,
        logprobs=(Logprob(5, -0.5, ((5, -0.5), (9, -1.5))),),
        error="boom",
        index=1,
        hidden_states=((0.5, -1.0),),  # tensors in use; plain rows compare here
        input_embeds=((0.25, 2.0),),
        hidden_start=3,
        pooled=(0.6, 0.8),
    )
    defaults = {f.name: f.default for f in dataclasses.fields(StreamDelta) if f.name not in ("request_id", "text")}
    assert all(getattr(full, name) != default for name, default in defaults.items())  # every field is exercised
    plain = StreamDelta("r2", "", ())
    message = ipc.decode(ipc.encode(ipc.StepOutput.of(3, [full, plain], {"running": 1.0})))
    assert message.deltas() == [full, plain]
    assert message.epoch == 3 and message.stats == {"running": 1.0}


def test_commands_and_refusals_round_trip() -> None:
    params = SamplingParams(max_tokens=9, temperature=0.3, stop=["x"], structured_outputs=StructuredOutputs(regex="a+"))
    add = ipc.AddRequest(2, "r", [1, 2, 3], params, priority=1, add_special_tokens=False)
    assert ipc.decode(ipc.encode(add)) == add
    refused = ipc.decode(ipc.encode(ipc.Refused(2, "r", EngineOverloaded("queue full"))))
    assert isinstance(refused.error, EngineOverloaded) and str(refused.error) == "queue full"
