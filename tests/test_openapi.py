"""The OpenAPI schema the gateway serves describes its JSON APIs truthfully: bodies, id patterns, errors."""

from __future__ import annotations

from typing import Any

from burnish_server.core.ids import ID_REGEX
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
