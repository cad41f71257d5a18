"""What the OpenAPI schema at ``/docs/openapi.json`` says beyond what Litestar derives itself.

Litestar documents the JSON APIs from their typed handlers; what it gets wrong or cannot see
is put right here, and the schema's own settings are here too (``config``):

- ``finish_schema``: a body struct with ``forbid_unknown_fields`` says
  ``additionalProperties: false`` (the gateway answers 400 to an unknown field), and a bound
  of 0 (``ge=0``, ``gt=0``) on an optional field is kept (Litestar drops falsy bounds there).
- ``proxy_operation``: the proxy routes read their bodies by hand (``gateway/proxy/forward.py``), so
  Litestar sees neither their body, their headers, their answers nor their id patterns. Each
  gets them here: the two fields the gateway decodes (``model``, ``stream``; the rest is the
  upstream's to validate), the filing headers (``gateway/proxy/filing.py``) that apply on its path, the
  answer (JSON, or ``text/event-stream`` when streamed), and every error status; an upstream's
  own error status and body are relayed as they came (``4XX``/``5XX``).
- ``StrictRequest``: bodies are decoded as strictly as the schema says (Litestar's lax mode
  would take ``"1.5"`` for a number).
- ``AllowEveryMethod``: Litestar 2's automatic ``OPTIONS`` answer lists only the methods
  of the first handler registered at a path (litestar-org/litestar#4169, fixed in v3 only).

All through Litestar's public API: the generated schema (``app.openapi_schema``), the
request class, a ``before_send`` hook.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request, Router
from litestar.exceptions import ClientException, ValidationException
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import (
    Components,
    OpenAPIHeader,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    Parameter,
    Reference,
    RequestBody,
    Schema,
)
from litestar.routes import HTTPRoute
from litestar.types import Message, Scope

from burnish_server.core.platform.ids import ID_REGEX, ID_RULE
from burnish_server.core.protocols.surfaces import SURFACES, Surface
from burnish_server.core.protocols.surfaces.base import openai_error_body
from burnish_server.gateway.access.admission import PUBLIC, SECURITY_SCHEMES
from burnish_server.gateway.edge.errors import MEANING
from burnish_server.gateway.proxy.call import MAX_MODEL_CHARS
from burnish_server.gateway.proxy.filing import MAX_GROUP_SIZE

if TYPE_CHECKING:
    from litestar import Litestar

__all__ = ["AllowEveryMethod", "StrictRequest", "body_operation", "config", "finish_schema", "models_operation", "proxy_operation"]

_BOUNDS = {"ge": "minimum", "gt": "exclusive_minimum", "le": "maximum", "lt": "exclusive_maximum"}


def config() -> OpenAPIConfig:
    """The schema's settings: its title, the distribution's version, the security schemes."""
    return OpenAPIConfig(
        title="burnish gateway",
        version=version("burnish"),
        # The schema and its pages are public: they describe the API, not anyone's data.
        openapi_router=Router(path="/docs", route_handlers=[], opt={"scope": PUBLIC}, include_in_schema=False),
        components=Components(security_schemes=SECURITY_SCHEMES),
    )


def finish_schema(app: Litestar) -> None:
    """Put right, in the schema Litestar generated from the handlers, what it gets wrong for the
    bodies' msgspec structs: ``additionalProperties: false`` where a struct forbids unknown fields
    (the gateway answers 400 to one), the zero bounds it drops on optional fields (``ge=0``,
    ``gt=0``), dicts' size and key constraints, fixed-length tuples. Litestar builds the schema
    once and serves that object at ``/docs``: the fixes are made there, through
    ``app.openapi_schema``, once, when the app is made."""
    schema = app.openapi_schema
    structs = _structs(app)
    for name, component in (schema.components.schemas or {}).items() if schema.components else ():
        kind = structs.get(name)
        if kind is not None and isinstance(component, Schema):
            _strict_struct(component, kind)


def _structs(app: Litestar) -> dict[str, msgspec.inspect.StructType]:
    """Every msgspec struct a handler takes or answers (and the structs inside them), by name."""
    found: dict[str, msgspec.inspect.StructType] = {}

    def visit(kind: msgspec.inspect.Type) -> None:
        if isinstance(kind, msgspec.inspect.StructType):
            name = kind.cls.__name__
            if name in found:
                return
            found[name] = kind
            for field in kind.fields:
                visit(field.type)
        elif isinstance(kind, msgspec.inspect.UnionType):
            for arm in kind.types:
                visit(arm)
        elif isinstance(kind, msgspec.inspect.Metadata):
            visit(kind.type)
        elif isinstance(kind, msgspec.inspect.ListType | msgspec.inspect.SetType | msgspec.inspect.FrozenSetType | msgspec.inspect.VarTupleType):
            visit(kind.item_type)
        elif isinstance(kind, msgspec.inspect.DictType):
            visit(kind.value_type)

    for route in app.routes:
        for handler in getattr(route, "route_handlers", ()):
            signature = handler.parsed_fn_signature
            annotations = [p.annotation for p in signature.parameters.values()] + [signature.return_type.annotation]
            for annotation in annotations:
                try:
                    visit(msgspec.inspect.type_info(annotation))
                except (TypeError, ValueError):  # not a type msgspec knows (a Request, a Response)
                    continue
    return found


def _strict_struct(schema: Schema, info: msgspec.inspect.StructType) -> None:
    if info.forbid_unknown_fields:
        schema.additional_properties = False
    for field in info.fields:
        prop = (schema.properties or {}).get(field.encode_name)
        if not isinstance(prop, Schema):
            continue
        kind = _unwrap(field.type)
        for bound, key in _BOUNDS.items():
            if getattr(kind, bound, None) == 0 and getattr(prop, key) is None:
                setattr(prop, key, 0.0)
        if isinstance(kind, msgspec.inspect.DictType):
            _dict_bounds(prop, kind)
        elif isinstance(kind, msgspec.inspect.ListType):
            _list_items(prop, kind)
    for prop in (schema.properties or {}).values():
        if isinstance(prop, Schema) and prop.prefix_items and prop.items is None:  # a fixed-length tuple
            prop.min_items = prop.max_items = len(prop.prefix_items)


def documented_as(kind: type[msgspec.Struct]) -> msgspec.Meta:
    """For a ``dict`` field that holds some of a struct's fields (merged into the current ones):
    documented as that struct, whose fields all have defaults."""
    return msgspec.Meta(extra_json_schema={"extra": {"one_of": [{"$ref": f"#/components/schemas/{kind.__name__}"}]}})


def _unwrap(kind: msgspec.inspect.Type) -> msgspec.inspect.Type:
    """A field's type without its metadata and without ``None``."""
    if isinstance(kind, msgspec.inspect.UnionType):
        arms = [t for t in kind.types if not isinstance(t, msgspec.inspect.NoneType)]
        kind = arms[0] if len(arms) == 1 else kind
    return kind.type if isinstance(kind, msgspec.inspect.Metadata) else kind


def _dict_bounds(prop: Schema, kind: msgspec.inspect.DictType) -> None:
    """A dict's size and its keys' constraints, which Litestar leaves out."""
    if kind.min_length is not None and prop.min_properties is None:
        prop.min_properties = kind.min_length
    if kind.max_length is not None and prop.max_properties is None:
        prop.max_properties = kind.max_length
    key = _unwrap(kind.key_type)
    if isinstance(key, msgspec.inspect.StrType) and (key.min_length is not None or key.max_length is not None or key.pattern is not None):
        prop.property_names = Schema(type=OpenAPIType.STRING, min_length=key.min_length, max_length=key.max_length, pattern=key.pattern)


def _list_items(prop: Schema, kind: msgspec.inspect.ListType) -> None:
    """A list's items' constraints (a pattern, a length), which Litestar leaves out."""
    item = _unwrap(kind.item_type)
    if not isinstance(item, msgspec.inspect.StrType) or (item.min_length is None and item.max_length is None and item.pattern is None):
        return
    for arm in [prop, *(a for a in prop.one_of or () if isinstance(a, Schema))]:
        if isinstance(arm.items, Schema):
            arm.items = Schema(type=OpenAPIType.STRING, min_length=item.min_length, max_length=item.max_length, pattern=item.pattern)


_ANY = Schema()
_NO_CONTROL = r"^[^\u0000-\u001f\u007f-\u009f]*$"  # call.py: parse_head


def _request_schema(name: str, what: str) -> Schema:
    return Schema(
        type=OpenAPIType.OBJECT,
        title=name,
        description=(
            f"{what}. The gateway reads only `model` and `stream` (400 if the body is not a JSON object or they have another type) "
            "and forwards the body as it came; the upstream validates the rest (its 4xx is relayed). For a policy's model, "
            "/v1/responses and /v1/messages are translated to chat completions and their fields are checked by the gateway (400)."
        ),
        properties={
            "model": Schema(
                one_of=[Schema(type=OpenAPIType.STRING, max_length=MAX_MODEL_CHARS, pattern=_NO_CONTROL), Schema(type=OpenAPIType.NULL)],
                description="A policy (`<policy>` or `<policy>@<step>`), or any model of the upstream's, passed through (no control characters)",
            ),
            "stream": Schema(one_of=[Schema(type=OpenAPIType.BOOLEAN), Schema(type=OpenAPIType.NULL)], description="true: answered as server-sent events"),
        },
        additional_properties=True,
    )


# One server-sent event (what a streamed answer is a sequence of).
_EVENT = Schema(
    type=OpenAPIType.OBJECT,
    required=["data"],
    properties={"event": Schema(type=OpenAPIType.STRING), "data": Schema(type=OpenAPIType.STRING)},
    description="Each event of the stream: its data is a JSON object (chat and completions streams end with `data: [DONE]`)",
)
# Inline, not components: Litestar replaces the configured component schemas with its own.
_PROXY_ERROR = Schema(
    type=OpenAPIType.OBJECT,
    title="ProxyError",
    required=["error"],
    properties={"error": _ANY},
    description=(
        "An error on a proxied route. The gateway's own are ErrorBody ({error: {message, type, param, code}}), "
        "on /v1/messages Anthropic's ({type: error, error: {type, message}}); an upstream's error is relayed with its "
        "status and its body as it came (a body that is no JSON error object becomes one)."
    ),
)
# The body of each proxied surface as far as the gateway reads it: ``model`` and ``stream``
# (gateway/proxy/call.py: parse_head). Every other field goes to the upstream untouched.
_REQUESTS = {surface.name: _request_schema(surface.schema_title, surface.schema_description) for surface in SURFACES}

_ID = Schema(type=OpenAPIType.STRING, pattern=ID_REGEX)
_TRAJECTORY_HEADER = Parameter(
    name="X-Trajectory-Id",
    param_in="header",
    schema=_ID,
    description=f"The trajectory this call joins ({ID_RULE}); none: a one-call trajectory with a generated id",
)
_GROUP_HEADER = Parameter(name="X-Group-Id", param_in="header", schema=_ID, description=f"The group the trajectory belongs to ({ID_RULE})")
_GROUP_SIZE_HEADER = Parameter(
    name="X-Group-Size",
    param_in="header",
    schema=Schema(type=OpenAPIType.INTEGER, minimum=1, maximum=MAX_GROUP_SIZE),
    description="The group's expected members (needs a group: X-Group-Id, or the /g/{group_id} prefix)",
)
_EVAL_HEADER = Parameter(
    name="X-Eval",
    param_in="header",
    # gateway/proxy/filing.py: stripped and compared without case.
    schema=Schema(type=OpenAPIType.STRING, pattern=r"^\s*([Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee]|1|0)\s*$"),
    description="true or 1: the call is held out for evaluation (recorded and rewarded, never trained on); false or 0: no mark",
)
_RESPONSE_HEADERS: dict[str, OpenAPIHeader | Reference] = {
    "X-Trajectory-Id": OpenAPIHeader(schema=_ID, description="The trajectory the call was recorded into", required=True),
    "X-Policy-Version": OpenAPIHeader(
        schema=Schema(type=OpenAPIType.STRING), description="The version that answered (`<policy>@<step>`), or the model as asked for when it is no policy"
    ),
}
# Statuses the gateway itself answers on a proxied route (an upstream's own are relayed: 4XX/5XX).
_PROXY_STATUSES = {
    400: "Invalid request: not a JSON object, an id, header or (for a policy) a field that does not fit; or the upstream's 400, relayed",
    401: MEANING[401],
    403: MEANING[403],
    404: "The upstream's 404 (an unknown model), relayed; or a previous_response_id not found",
    413: MEANING[413],
    429: MEANING[429] + "; or the upstream's 429, relayed",
    502: "The upstream could not be reached or broke off its answer",
    503: MEANING[503] + "; or the upstream's 503, relayed",
    504: "The upstream did not answer in time",
}


def _error(description: str, schema: Reference | Schema) -> OpenAPIResponse:
    return OpenAPIResponse(description=description, content={"application/json": OpenAPIMediaType(schema=schema)})


def _errors(statuses: dict[int, str]) -> dict[str, OpenAPIResponse]:
    out = {str(s): _error(d, _PROXY_ERROR) for s, d in statuses.items()}
    out["4XX"] = _error("The upstream's own error status, relayed with its body", _PROXY_ERROR)
    out["5XX"] = _error("The upstream's own error status, relayed with its body", _PROXY_ERROR)
    return out


def _with_id_patterns(parameters: list[Parameter | Reference] | None) -> list[Parameter | Reference]:
    out: list[Parameter | Reference] = []
    for p in parameters or []:
        if isinstance(p, Parameter) and p.param_in == "path" and p.name in {"trajectory_id", "group_id"}:
            what = p.name.removesuffix("_id")
            p.schema = _ID
            p.description = f"The {what} of every call made with this base URL ({ID_RULE})"
        out.append(p)
    return out


def proxy_operation(surface: Surface) -> type[Operation]:
    """The OpenAPI operation of a proxied surface, for the route decorator's ``operation_class``."""
    body = _REQUESTS[surface.name]

    @dataclass
    class ProxyOperation(Operation):
        def __post_init__(self) -> None:
            path_params = {p.name for p in self.parameters or [] if isinstance(p, Parameter) and p.param_in == "path"}
            headers = []
            if "trajectory_id" not in path_params:  # filing.py: the path's ids come first, and then the headers are not read
                headers += [_TRAJECTORY_HEADER, _GROUP_HEADER, _GROUP_SIZE_HEADER]
            elif "group_id" in path_params:
                headers.append(_GROUP_SIZE_HEADER)
            headers.append(_EVAL_HEADER)
            self.parameters = [*_with_id_patterns(self.parameters), *headers]
            self.request_body = RequestBody(content={"application/json": OpenAPIMediaType(schema=body)}, required=True)
            answer = OpenAPIResponse(
                description="The upstream's answer (for a policy, what the client would have seen without the gateway): JSON, or server-sent events when streamed",
                headers=_RESPONSE_HEADERS,
                content={
                    "application/json": OpenAPIMediaType(schema=Schema(type=OpenAPIType.OBJECT)),
                    "text/event-stream": OpenAPIMediaType(schema=_EVENT),
                },
            )
            self.responses = {"200": answer, **_errors(_PROXY_STATUSES)}
            if surface.errors.body is not openai_error_body:
                self.description = "The gateway's own errors are in this surface's own format (Anthropic's on /v1/messages)."

    ProxyOperation.__name__ = ProxyOperation.__qualname__ = f"ProxyOperation_{surface.name.replace('.', '_')}"
    return ProxyOperation


@dataclass
class ModelsOperation(Operation):
    """``GET .../v1/models``: the policies, then the upstream's listing. The path's ids are not read."""

    def __post_init__(self) -> None:
        for p in self.parameters or []:
            if isinstance(p, Parameter) and p.param_in == "path":
                p.description = "Not read here: the listing is the same under every prefix"
        listing = OpenAPIResponse(
            description="The policies (owned_by burnish), then the upstream's models",
            content={"application/json": OpenAPIMediaType(schema=Schema(type=OpenAPIType.OBJECT))},
        )
        statuses = {s: _PROXY_STATUSES[s] for s in (401, 403, 429, 502, 504)}
        self.responses = {"200": listing, **_errors(statuses)}


models_operation = ModelsOperation


class AllowEveryMethod:
    """A ``before_send`` hook: Litestar 2's automatic ``OPTIONS`` answer lists only the methods
    of the first handler registered at a path (litestar-org/litestar#4169, fixed in v3 only);
    its ``Allow`` is set here to every method the path serves, read from the app's routes once.
    The hook touches only OPTIONS answers (the proxy's calls never reach it)."""

    def __init__(self) -> None:
        self.allowed: dict[str, bytes] | None = None

    async def __call__(self, message: Message, scope: Scope) -> None:
        if message["type"] != "http.response.start" or scope.get("method") != "OPTIONS":
            return
        if self.allowed is None:
            routes = scope["app"].routes
            self.allowed = {r.path_format: ", ".join(sorted(r.methods)).encode() for r in routes if isinstance(r, HTTPRoute) and "OPTIONS" in r.methods}
        # The route's whole path as Litestar matched it (a handler's own paths are relative to its
        # controller's).
        methods = self.allowed.get(scope.get("path_template", ""))
        if methods is not None:
            message["headers"] = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"allow"] + [(b"allow", methods)]


def _number(text: str) -> int | float:
    """A JSON number with a fraction part or exponent: an int where it is one (JSON Schema's
    ``integer`` takes ``2.0``), else a float."""
    value = float(text)
    if math.isinf(value):  # 1e999: what msgspec's own decoder refuses (400 invalid_json)
        raise ValueError("Number out of range")
    return int(value) if value.is_integer() else value


_decode_json = msgspec.json.Decoder(float_hook=_number).decode


class StrictRequest(Request[Any, Any, Any]):
    """The JSON API routers' request class: a body decoded as strictly as the schema says.

    Litestar converts bodies in msgspec's lax mode, which takes ``"1.5"`` for a number and ``0``
    for ``false``; the schema, and so every client generated from it, says otherwise. So the
    body is decoded here once, whole numbers written ``2.0`` taken for integers as JSON Schema
    does, and checked strictly against the route's ``data`` type; Litestar then works on that
    value. A body that does not fit raises the ``ValidationException`` Litestar itself raises
    (``errors.py`` maps it to the route's 400); one that is not JSON (not UTF-8, nested deeper
    than the decoder goes) Litestar's ``ClientException`` (400 ``invalid_json``)."""

    async def json(self) -> Any:
        field = self.route_handler.parsed_fn_signature.parameters.get("data")
        if field is None:  # a route that takes no body
            return await super().json()
        body = await self.body()
        try:
            if not body.isascii():  # UTF-8 checked first, to say where it fails: msgspec does not (0.23)
                body.decode()
            value = _decode_json(body)
        except msgspec.DecodeError as exc:  # errors.py answers a ClientException 400 invalid_json
            raise ClientException(str(exc)) from None
        except UnicodeDecodeError as exc:
            raise ClientException(f"it is not UTF-8 (byte {exc.start})") from None
        except RecursionError:
            raise ClientException("nested too deeply") from None
        try:
            msgspec.convert(value, type=field.annotation, strict=True)
        except msgspec.ValidationError as exc:
            message, _, where = str(exc).partition(" - at `$")
            key = re.sub(r"\[(\d+)\]", r".\1", where.rstrip("`")).lstrip(".") or "data"
            raise ValidationException(detail="Validation failed", extra=[{"message": message, "key": key, "source": "body"}]) from None
        return value


def body_operation(*, optional: bool = False, refused: tuple[str, ...] = ()) -> type[Operation]:
    """For a JSON API route's ``operation_class``: a body that may be left out (Litestar marks
    every body required), and fields its struct declares only to refuse them with a 400 that
    names the setting to use (documented as never valid, so no client sends them)."""

    @dataclass
    class BodyOperation(Operation):
        def __post_init__(self) -> None:
            if not isinstance(self.request_body, RequestBody):
                return
            self.request_body.required = not optional
            if refused and (media := self.request_body.content.get("application/json")) is not None and media.schema is not None:
                media.schema = Schema(
                    all_of=[media.schema],
                    properties={name: Schema(schema_not=_ANY, description="Not accepted: 400") for name in refused},
                )

    return BodyOperation
