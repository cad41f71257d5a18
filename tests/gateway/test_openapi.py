"""The OpenAPI schema the gateway serves describes its JSON APIs truthfully: bodies, id patterns, errors."""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from burnish_server.core.platform.access import PROJECT_REGEX
from burnish_server.core.platform.ids import ID_REGEX
from burnish_server.core.platform.sessions import SESSION_ID_REGEX
from tests.conftest import Gateway


def operation(schema: dict[str, Any], path: str, method: str) -> dict[str, Any]:
    return schema["paths"][path][method]


def test_bodies_id_patterns_and_error_statuses_are_in_the_schema(gateway: Gateway) -> None:
    with gateway.client() as c:
        schema = c.get("/docs/openapi.json").json()
    components = schema["components"]["schemas"]

    reward = operation(schema, "/v1/trajectories/{trajectory_id}/reward", "post")
    assert reward["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/RewardIn")
    assert set(components["RewardIn"]["properties"]) == {"reward", "components"}
    (param,) = [p for p in reward["parameters"] if p["name"] == "trajectory_id"]
    assert param["in"] == "path" and param["schema"]["pattern"] == ID_REGEX
    assert {"400", "404", "409"} <= set(reward["responses"])
    for status in ("400", "404", "409"):
        assert reward["responses"][status]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    assert set(components["ErrorDetail"]["properties"]) == {"message", "type", "param", "code"}

    create = operation(schema, "/admin/policies", "post")
    body = components[create["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]]
    assert body["properties"]["name"]["pattern"] == ID_REGEX
    assert {"400", "401", "409"} <= set(create["responses"])
    rollback = operation(schema, "/admin/policies/{name}/rollback", "post")
    assert {"400", "401", "404"} <= set(rollback["responses"])
    assert operation(schema, "/v1/groups/{group_id}/ruler", "post")["responses"].keys() >= {"400", "404", "409", "502"}


def test_answers_are_typed_in_the_schema(gateway: Gateway) -> None:
    with gateway.client() as c:
        schema = c.get("/docs/openapi.json").json()
    components = schema["components"]["schemas"]

    def answer(path: str, method: str, status: str = "200") -> dict[str, Any]:
        ref = operation(schema, path, method)["responses"][status]["content"]["application/json"]["schema"]["$ref"]
        return components[ref.rsplit("/", 1)[-1]]

    trajectory = answer("/v1/trajectories/{trajectory_id}", "get")
    assert {"id", "group_id", "reward", "calls", "rewards"} <= set(trajectory["properties"])
    assert {"id", "state", "members"} <= set(answer("/v1/groups/{group_id}", "get")["properties"])
    assert {"data", "has_more", "last_id"} <= set(answer("/v1/trajectories", "get")["properties"])
    assert {"served_version", "pending_version", "groups_ready", "lora", "train"} <= set(answer("/admin/policies", "post", "201")["properties"])
    assert {"scores", "judge", "cached"} <= set(answer("/v1/groups/{group_id}/ruler", "post")["properties"])


def _schema(gw: Gateway) -> dict[str, Any]:
    with gw.client() as c:
        r = c.get("/docs/openapi.json")
    assert r.status_code == 200
    return dict(r.json())


def _operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(path, method, op) for path, item in schema["paths"].items() for method, op in item.items() if method in {"get", "post", "patch", "put", "delete"}]


def test_every_operation_documents_its_errors_in_the_gateways_shape(gateway: Gateway) -> None:
    schema = _schema(gateway)
    assert not [p for p in schema["paths"] if p.startswith("/docs")]  # the schema's own pages are not part of the API
    assert '"status_code"' not in json.dumps(schema)  # Litestar's own error shape is documented nowhere
    for path, method, op in _operations(schema):
        statuses = set(op["responses"])
        where = f"{method.upper()} {path}"
        # A route that needs a key: a missing or wrong key, a key without the scope, its limits.
        assert op["security"] == [{"apiKey": []}, {"anthropicKey": []}], where  # Bearer, or x-api-key as Anthropic clients send it
        assert {"401", "403", "429"} <= statuses, where
        path_ids = [p for p in op.get("parameters", []) if p["in"] == "path"]
        if op.get("requestBody") or (path_ids and "/v1/models" not in path) or any(p["in"] == "query" for p in op.get("parameters", [])):
            assert "400" in statuses, where
        if op.get("requestBody"):
            assert "413" in statuses, where
        for status, response in op["responses"].items():
            if status[0] in "45":
                shown = response["content"]["application/json"]["schema"]
                shape = shown["$ref"].rsplit("/", 1)[-1] if "$ref" in shown else shown.get("title")
                assert shape in {"ErrorBody", "ProxyError"}, (where, status)


def test_ids_in_paths_have_their_pattern(gateway: Gateway) -> None:
    schema = _schema(gateway)
    for path, method, op in _operations(schema):
        for p in op.get("parameters", []):
            if p["in"] != "path" or "/v1/models" in path:  # the listing does not read the prefix's ids
                continue
            if p["name"] in ("index", "step"):  # a call's index in its trajectory, a policy's step: integers, not ids
                assert p["schema"]["type"] == "integer", (method, path)
                continue
            expected = {"key_id": r"^key_[0-9a-f]{16}$(?!\n)", "session_id": SESSION_ID_REGEX, "project": PROJECT_REGEX}.get(p["name"], ID_REGEX)
            assert p["schema"]["pattern"] == expected, (method, path, p["name"])


def test_proxy_routes_document_body_headers_answers_and_relayed_errors(gateway: Gateway) -> None:
    schema = _schema(gateway)
    plain = operation(schema, "/v1/chat/completions", "post")
    body = plain["requestBody"]["content"]["application/json"]["schema"]
    assert body["type"] == "object" and body["additionalProperties"] is True
    assert set(body["properties"]) == {"model", "stream"}
    assert {p["name"] for p in plain["parameters"] if p["in"] == "header"} == {"X-Trajectory-Id", "X-Group-Id", "X-Group-Size", "X-Eval"}
    answer = plain["responses"]["200"]
    assert set(answer["content"]) == {"application/json", "text/event-stream"}
    assert answer["headers"]["X-Trajectory-Id"]["required"] is True
    assert {"400", "401", "403", "404", "413", "429", "502", "503", "504", "4XX", "5XX"} <= set(plain["responses"])
    # Under a prefix the path's ids win and the id headers are not read.
    keyed = operation(schema, "/g/{group_id}/t/{trajectory_id}/v1/messages", "post")
    assert {p["name"] for p in keyed["parameters"] if p["in"] == "header"} == {"X-Group-Size", "X-Eval"}
    assert {p["name"] for p in operation(schema, "/eval/t/{trajectory_id}/v1/responses", "post")["parameters"] if p["in"] == "header"} == {"X-Eval"}
    assert "400" not in operation(schema, "/t/{trajectory_id}/v1/models", "get")["responses"]


def test_the_export_is_ndjson_of_trajectories(gateway: Gateway) -> None:
    schema = _schema(gateway)
    export = operation(schema, "/v1/trajectories/export", "get")
    assert set(export["responses"]["200"]["content"]) == {"application/x-ndjson"}
    with gateway.client() as c:
        for t in ("a", "b"):
            assert c.post(f"/t/{t}/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": t}]}).status_code == 200
        r = c.get("/v1/trajectories/export")
    assert r.headers["content-type"].startswith("application/x-ndjson")
    validator = jsonschema.Draft202012Validator({"$ref": "#/components/schemas/TrajectoryView", "components": schema["components"]})
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert {line["id"] for line in lines} == {"a", "b"}
    for line in lines:
        validator.validate(line)


def test_body_structs_are_documented_as_strictly_as_they_are_decoded(gateway: Gateway) -> None:
    components = _schema(gateway)["components"]["schemas"]
    for name in ("PolicyIn", "PolicyPatch", "RollbackIn", "KeyIn", "RewardIn", "RulerIn", "LoraSettings", "TrainSettings", "RulerSettings"):
        assert components[name]["additionalProperties"] is False, name
    # Bounds of 0, which Litestar drops from optional fields.
    assert components["KeyIn"]["properties"]["expires_in"]["exclusiveMinimum"] == 0
    assert components["TrainSettings"]["properties"]["max_staleness"]["minimum"] == 0
    assert components["TrainSettings"]["properties"]["adam_betas"]["minItems"] == components["TrainSettings"]["properties"]["adam_betas"]["maxItems"] == 2
    parts = components["RewardIn"]["properties"]["components"]
    assert parts["maxProperties"] == 64 and parts["propertyNames"] == {"type": "string", "minLength": 1, "maxLength": 64}
    assert components["PolicyPatch"]["properties"]["train"] == {"oneOf": [{"$ref": "#/components/schemas/TrainSettings"}]}

    with gateway.admin() as c:
        # Litestar's lax decoding took a string for a number and 0 for false; the schema does not.
        assert c.post("/admin/keys", json={"name": "k", "rpm_limit": "5"}).json()["error"]["code"] == "invalid_key"
        r = c.post("/admin/policies", json={"name": "p", "base_model": "m", "paused": 0})
        assert r.status_code == 400 and r.json()["error"]["param"] == "paused", r.text
        # JSON Schema's integer takes 5.0, and so does the gateway.
        r = c.post("/admin/keys", json={"name": "k", "rpm_limit": 5.0})
        assert r.status_code == 201 and r.json()["rpm_limit"] == 5, r.text
        assert c.post("/admin/policies", json={"name": "p", "base_model": "m", "lora": {"rank": 8.0}}).status_code == 201
        assert c.patch("/admin/policies/p", json={"lora": {"rank": 4.0}}).json()["lora"]["rank"] == 4
        for body, words in (
            (b'{"name": "k", "x": "\xff"}', "it is not UTF-8 (byte 20)"),
            (b"[" * 100_000, "nested too deeply"),
            (b'{"name": "k", "rpm_limit": 1e999}', "out of range"),
        ):
            r = c.post("/admin/keys", content=body)
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json" and words in r.json()["error"]["message"], r.text
        # (a key was made: the gateway is closed now; the admin token has every scope)
        assert c.post("/t/t1/v1/chat/completions", json={"model": "m", "messages": []}).status_code == 200
        r = c.post("/v1/trajectories/t1/reward", json={"reward": "1.5"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_reward", r.text


def test_ruler_body_is_optional_and_names_what_it_refuses(gateway: Gateway) -> None:
    body = operation(_schema(gateway), "/v1/groups/{group_id}/ruler", "post")["requestBody"]
    assert body["required"] is False
    schema = body["content"]["application/json"]["schema"]
    assert {name: p["not"] for name, p in schema["properties"].items()} == {"judge_base_url": {}, "judge_api_key": {}}


def test_options_lists_every_method_of_a_path(gateway: Gateway) -> None:
    """Litestar 2 listed only the first handler's methods (litestar-org/litestar#4169)."""
    with gateway.client() as c:
        for path, methods in (
            ("/admin/keys", "GET, OPTIONS, POST"),
            ("/admin/policies/p", "GET, OPTIONS, PATCH"),
            ("/admin/keys/key_0123456789abcdef", "DELETE, GET, OPTIONS"),
        ):
            r = c.options(path)
            assert r.status_code == 204 and r.headers["allow"] == methods, (path, r.headers)


def test_every_prefix_of_a_surface_documents_one_shape(gateway: Gateway) -> None:
    """/v1/..., /t/{t}/v1/..., /g/{g}/t/{t}/v1/... and each under /eval: the same body, answers
    and error statuses; the filing headers only where the path does not carry the ids."""
    from burnish_server.core.protocols.surfaces import SURFACES
    from burnish_server.gateway.routes.proxy import PREFIXES

    with gateway.client() as c:
        paths = c.get("/docs/openapi.json").json()["paths"]
    for surface in SURFACES:
        shapes = set()
        for prefix in PREFIXES:
            template = f"{prefix}/v1/{surface.path}".replace(":str}", "}")
            op = paths[template]["post"]
            headers = tuple(sorted(p["name"] for p in op["parameters"] if p["in"] == "header"))
            expected = ("X-Eval",) if "trajectory_id" in template and "group_id" not in template else None
            if expected is not None:
                assert headers == expected, (template, headers)
            shapes.add((str(sorted(op["responses"])), str(op["requestBody"])))
        assert len(shapes) == 1, (surface.name, shapes)
