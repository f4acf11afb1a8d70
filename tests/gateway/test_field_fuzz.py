"""The field tables against the parsers, and hostile values generated from the tables.

The tables (``gateway/realtime/schema.py``, ``gateway/http/schema.py``) must list every key a parser
reads: each parser is run on bodies whose dicts record the keys read. The fuzzer
(``benchmarks/fuzz_fields.py``) then derives its cases from the tables; a sample runs here, all of them
in the ``slow`` test and in the benchmark.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from omni_gateway.gateway.field_spec import FieldSpec
from omni_gateway.gateway.http import schema as http_schema
from omni_gateway.gateway.http.errors import ApiError
from omni_gateway.gateway.realtime import schema as rt_schema

from benchmarks import fuzz_fields as fuzz
from tests.harness.session_driver import Driver


class Recording(dict[str, Any]):
    """A decoded JSON object that notes (as ``a.b[].c``) every key looked up in it or below it."""

    def __init__(self, data: dict[str, Any], path: str, seen: set[str]) -> None:
        super().__init__({k: _wrap(v, f"{path}.{k}" if path else k, seen) for k, v in data.items()})
        self._path, self._seen = path, seen

    def _note(self, key: object) -> None:
        self._seen.add(f"{self._path}.{key}" if self._path else str(key))

    def get(self, key: str, default: Any = None) -> Any:
        self._note(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self._note(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self._note(key)
        return super().__contains__(key)


def _wrap(value: Any, path: str, seen: set[str]) -> Any:
    if isinstance(value, dict):
        return Recording(value, path, seen)
    if isinstance(value, list):
        return [_wrap(v, f"{path}[]", seen) for v in value]
    return value


def valid_value(spec: FieldSpec) -> tuple[bool, Any]:
    for _, value in fuzz.hostile_values(spec):
        if not isinstance(value, fuzz.Deep) and fuzz.accepts(spec, value) and value is not None:
            return True, value
    return False, None


def test_the_recorder_sees_nested_reads() -> None:
    seen: set[str] = set()
    body = _wrap({"a": {"b": [{"c": 1}]}}, "", seen)
    assert body["a"]["b"][0].get("c") == 1 and "d" not in body["a"]
    assert seen == {"a", "a.b", "a.b[].c", "a.d"}


def test_every_key_a_realtime_parser_reads_is_in_the_table() -> None:
    unlisted: set[str] = set()
    for event, dialect, spec in fuzz.realtime_fields():
        setup, base = fuzz._realtime_base(event, dialect, spec.path)
        ok, value = valid_value(spec)
        if ok and spec.path != "type":
            fuzz.set_path(base, spec.path, value)
        driver = Driver(dialect)
        for step in setup:
            driver.send(step)
        seen: set[str] = set()
        driver.send(_wrap(base, "", seen))
        unlisted |= {f"{event} [{dialect}] {p}" for p in seen if rt_schema.field_spec(event, dialect, p) is None}
    assert not unlisted, f"parsers read fields missing from gateway/realtime/schema.py: {sorted(unlisted)}"


def test_every_key_an_http_parser_reads_is_in_the_table() -> None:
    listed = {(route, s.path) for s in http_schema.FIELDS for route in s.events}
    unlisted: set[str] = set()
    for route, spec in fuzz.http_fields():
        body = fuzz._http_base(route, spec.path)
        ok, value = valid_value(spec)
        if ok:
            fuzz.set_path(body, spec.path, value)
        seen: set[str] = set()
        try:
            fuzz.http_parse(route, _wrap(body, "", seen))
        except ApiError:
            pass
        unlisted |= {f"{route} {p}" for p in seen if (route, p) not in listed}
    assert not unlisted, f"parsers read fields missing from gateway/http/schema.py: {sorted(unlisted)}"


def test_every_table_entry_is_fuzzed() -> None:
    keys = {key for key, _, _ in fuzz.all_cases()}
    for event, dialect, spec in fuzz.realtime_fields():
        assert f"realtime {event} [{dialect}] {spec.path}" in keys
    for route, spec in fuzz.http_fields():
        assert f"http {route} {spec.path}" in keys
    assert len(keys) == len(fuzz.realtime_fields()) + len(fuzz.http_fields())


def test_the_base_events_are_valid_so_the_oracle_means_something() -> None:
    assert fuzz.realtime_baselines() == []


def _assert_clean(outcomes: list[fuzz.Outcome]) -> None:
    bad = [o for o in outcomes if o.problems or o.exception or o.server_error or o.closed]
    assert not bad, "\n".join(f"{o.surface} {o.field} [{o.label}]: {o.exception} {o.problems}" for o in bad[:20])


def test_a_sample_of_hostile_fields() -> None:
    cases = list(fuzz.all_cases())
    sample = random.Random(7).sample(cases, 400)
    outcomes = [case() for _, case, _ in sample]
    with fuzz.app_client() as client:
        outcomes += [app(client) for _, _, app in sample[:60] if app is not None]
    assert any(o.surface == "http_app" for o in outcomes)
    _assert_clean(outcomes)


@pytest.mark.slow
def test_every_hostile_field() -> None:
    outcomes = []
    with fuzz.app_client() as client:
        for _, case, app in fuzz.all_cases():
            outcomes.append(case())
            if app is not None:
                outcomes.append(app(client))
    _assert_clean(outcomes)


def test_the_oracle_flags_a_parser_that_accepts_an_invalid_value() -> None:
    spec = FieldSpec("temperature", ("number",), (http_schema.CHAT,), lo=0.0, hi=2.0)
    outcome = fuzz.Outcome("http", "temperature", "hi+step")
    fuzz._check(outcome, spec, 2.01, [], "temperature")
    assert outcome.problems == ["invalid value accepted"]


def test_the_app_client_reaches_the_routes() -> None:
    with fuzz.app_client() as client:
        r = client.post(http_schema.COMPLETIONS, json={"model": "omni-test", "prompt": "hi"})
    assert r.status_code == 200, r.text
