"""Fuzzing the routes from their own schemas: no request gets a 5xx or an answer that shows a path of the machine.

Bodies are drawn by hypothesis from each route's pydantic JSON schema, with any value possibly swapped for a hostile
one (integers beyond 64 bits, NaN, lone surrogates, wrong types, deep nesting) and sometimes replaced by arbitrary
JSON or bytes. The examples are derandomized (the same ones every run) and bounded, so the file runs in seconds;
raise ``FUZZ_EXAMPLES`` locally to search longer.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from server_utils import assert_public

from tinker_cookbook.backends import local_backend
from tinker_cookbook.server import create_app, openai_bodies, tinker_bodies

MODEL = "tinker-cookbook/tiny-smollm2"
FUZZ_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))

HOSTILE = st.sampled_from([
    2**63, 2**64, -(2**63) - 1, 10**30, -1, 0, 1e308, -1e308, 1e-40, 5e-324, math.nan, math.inf, -math.inf, "", "2",
    "\ud800", "a\udfffb", "true", True, False, None, [], {}, [[[[[]]]]], {"a": {"b": {"c": {}}}}, "x" * 300,
])
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | HOSTILE,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
SMALL = st.integers(-2, 4)
# Fields whose realistic values would make the examples slow (long samples) or never reach the engine.
OVERRIDES: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from([MODEL, "no/such-model", "tinker://no-run/sampler_weights/x", ""]),
    "base_model": st.sampled_from([MODEL, "no/such-model", None]),
    "max_tokens": SMALL, "max_completion_tokens": SMALL, "n": SMALL, "num_samples": SMALL, "best_of": SMALL,
    "rank": st.integers(-1, 80), "tokens": st.lists(st.integers(-5, 60_000), max_size=6),
}


def from_schema(schema: dict[str, Any], defs: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values of a pydantic JSON schema (the subset pydantic emits), each possibly swapped for a hostile one."""
    return st.one_of(_proper(schema, defs), HOSTILE) if schema else JSON_VALUES


def _proper(schema: dict[str, Any], defs: dict[str, Any]) -> st.SearchStrategy[Any]:
    if "$ref" in schema:
        return st.deferred(lambda: from_schema(defs[schema["$ref"].rsplit("/", 1)[1]], defs))
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([from_schema(s, defs) for s in schema[key]])
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "object":
        if "properties" not in schema:
            return st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=3)
        required = set(schema.get("required", ()))
        fields = {name: OVERRIDES[name] if name in OVERRIDES else from_schema(sub, defs)
                  for name, sub in schema["properties"].items()}
        return st.fixed_dictionaries({k: v for k, v in fields.items() if k in required},
                                     optional={k: v for k, v in fields.items() if k not in required})
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {}), defs), max_size=3)
    scalars = {"integer": st.integers(-(2**70), 2**70) | SMALL, "number": st.floats() | st.integers(-3, 3),
               "string": st.text(max_size=12), "boolean": st.booleans(), "null": st.none()}
    return scalars.get(kind, JSON_VALUES)  # type: ignore[arg-type]


def body_strategy(model: type[BaseModel]) -> st.SearchStrategy[bytes]:
    schema = model.model_json_schema()
    structured = from_schema(schema, schema.get("$defs", {})).map(lambda v: json.dumps(v).encode())
    return st.one_of(structured, structured, JSON_VALUES.map(lambda v: json.dumps(v).encode()), st.binary(max_size=40))


ROUTES: list[tuple[str, str, type[BaseModel]]] = [
    ("POST", "/v1/completions", openai_bodies.CompletionRequest),
    ("POST", "/v1/chat/completions", openai_bodies.ChatRequest),
    ("POST", "/api/v1/asample", tinker_bodies.SampleBody),
    ("POST", "/api/v1/create_session", tinker_bodies.CreateSessionBody),
    ("POST", "/api/v1/create_model", tinker_bodies.CreateModelBody),
    ("POST", "/api/v1/create_sampling_session", tinker_bodies.CreateSamplingSessionBody),
    ("POST", "/api/v1/save_weights_for_sampler", tinker_bodies.SaveWeightsForSamplerBody),
    ("POST", "/api/v1/load_weights", tinker_bodies.LoadWeightsBody),
    ("POST", "/api/v1/optim_step", tinker_bodies.OptimStepBody),
    ("POST", "/api/v1/weights_info", tinker_bodies.WeightsInfoBody),
    ("POST", "/api/v1/retrieve_future", tinker_bodies.RetrieveFutureBody),
    ("PUT", "/api/v1/training_runs/no-run/checkpoints/weights/x/ttl", tinker_bodies.TtlBody),
]


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(local_backend()), base_url="http://localhost", raise_server_exceptions=False)


@pytest.mark.parametrize(("method", "route", "model"), ROUTES, ids=[r[1] for r in ROUTES])
def test_no_body_gets_a_5xx_or_shows_a_machine_path(client: TestClient, method: str, route: str,
                                                    model: type[BaseModel]) -> None:
    @settings(max_examples=FUZZ_EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(body=body_strategy(model))
    def check(body: bytes) -> None:
        answer = client.request(method, route, content=body, headers={"Content-Type": "application/json"})
        assert answer.status_code < 500, (body[:300], answer.text[:500])
        assert_public(answer)

    check()
