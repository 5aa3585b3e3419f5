"""OpenAI error bodies: {"error": {"message", "type", "param", "code"}}, for every failure path.

The validation handler replaces FastAPI's default 422, which echoes the input back: a body with
NaN or 1e999 then fails to serialise and turns into a 500. Ours answers 400 and says which field
is wrong without repeating its value.
"""
from __future__ import annotations

import logging
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from common.errors import InvalidRequest

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 1


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers


class BodyParseError(StarletteHTTPException):
    """A body that is not strict JSON (`server.json_body`). An HTTPException, because FastAPI lets
    only those out of its body reading unchanged; it carries the param for the error body."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(status, message)
        self.param = param


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: int | str | None


class ErrorResponse(BaseModel):
    """The error body, for the OpenAPI document."""

    error: ErrorDetail


# What every route of the OpenAPI document may answer besides its success. A "4XX" entry also
# keeps FastAPI from documenting its 422, which this server never sends.
ERROR_RESPONSES: dict[int | str, dict] = {
    "4XX": {"model": ErrorResponse, "description": "Bad input (400), a wrong API key (401), an unknown model or "
                                                   "route (404), a body too large (413), a request header "
                                                   "section too large (431)"},
    503: {"model": ErrorResponse, "description": "Loading, draining or overloaded; see Retry-After"},
    500: {"model": ErrorResponse, "description": "The engine or the tokenizer worker failed"},
}


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param)


def invalid_request(exc: InvalidRequest) -> ApiError:
    """A failed shared check (`common.validation`) as a 400 that names the field."""
    return ApiError(400, str(exc), exc.param)


def unavailable(message: str) -> ApiError:
    return ApiError(503, message, headers={"Retry-After": str(RETRY_AFTER_S)})


def error_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status < 500:
        return "invalid_request_error"
    return "service_unavailable" if status == 503 else "server_error"


def error_body(status: int, message: str, param: str | None = None, code: str | int | None = None) -> dict:
    return {"error": {"message": message, "type": error_type(status), "param": param,
                      "code": code if code is not None else status}}


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(error_body(err.status, err.message, err.param, err.code), status_code=err.status,
                        headers=err.headers)


def describe_validation_error(exc: RequestValidationError) -> tuple[str, str | None]:
    """(message, param) for the first problem: where it is and what is expected, no input."""
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    kind = first.get("type", "")
    loc = [part for part in first.get("loc", ()) if part != "body"]
    if kind == "json_invalid":
        reason = (first.get("ctx") or {}).get("error", "")
        return f"malformed JSON body{': ' + str(reason) if reason else ''}", None
    # Union members show up as loc parts such as "str" or "list[TextPart]"; drop them.
    loc = [part for part in loc if isinstance(part, int) or "[" not in str(part) and part not in ("str", "int")]
    if kind.startswith("invalid_tag:"):  # a tagged union's tag field (server.protocol._tagged) is bad
        loc.append(kind.partition(":")[2])
    param = ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in loc).replace(".[", "[") or None
    if kind == "unsupported_field":
        field = str((first.get("ctx") or {}).get("field", ""))
        return str(first.get("msg", "")), field or None
    if kind == "extra_forbidden":
        return f"{param}: unknown field; it is not supported", param
    if kind in ("missing", "model_attributes_type", "dict_type") and not loc:
        return "the body must be a JSON object, sent with Content-Type: application/json", None
    message = str(first.get("msg", "invalid value"))
    return (f"{param}: {message}" if param else message), param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError):
        return error_response(exc)

    @app.exception_handler(InvalidRequest)
    async def _invalid_request(_request: Request, exc: InvalidRequest):
        return error_response(invalid_request(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError):
        message, param = describe_validation_error(exc)
        return error_response(ApiError(400, message[:500], param))

    @app.exception_handler(BodyParseError)
    async def _body_parse_error(_request: Request, exc: BodyParseError):
        return error_response(ApiError(exc.status_code, exc.detail, exc.param))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException):
        message = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
        return error_response(ApiError(exc.status_code, message, headers=exc.headers))

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception):
        logger.exception("unhandled error")
        return error_response(ApiError(500, "internal server error"))
