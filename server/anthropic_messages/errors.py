"""Anthropic's error body: {"type": "error", "error": {"type", "message"}}, on every failure of
the /v1/messages routes (bad input, an unknown model, a wrong key, the engine failing)."""
from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Literal

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from common.errors import InvalidRequest
from server.errors import ApiError, BodyParseError, describe_validation_error
from server.json_body import StrictJSONRoute

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
          529: "overloaded_error"}


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    """Anthropic's error body, for the OpenAPI document."""

    type: Literal["error"]
    error: AnthropicErrorDetail


# What the /v1/messages routes answer besides their success (replacing the app's OpenAI bodies).
ANTHROPIC_ERROR_RESPONSES: dict[int | str, dict] = {
    "4XX": {"model": AnthropicErrorResponse, "description": "Bad input (400), a wrong API key (401), an unknown "
                                                            "model (404), a body too large (413)"},
    503: {"model": AnthropicErrorResponse, "description": "Loading, draining or overloaded; see Retry-After"},
    500: {"model": AnthropicErrorResponse, "description": "The engine or the tokenizer worker failed"},
}


def error_type(status: int) -> str:
    return _TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")


def anthropic_error_body(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def anthropic_error(err: ApiError) -> JSONResponse:
    return JSONResponse(anthropic_error_body(err.status, err.message), status_code=err.status, headers=err.headers)


def as_api_error(exc: Exception) -> ApiError | None:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, InvalidRequest):
        return ApiError(400, str(exc), exc.param)
    if isinstance(exc, RequestValidationError):
        message, param = describe_validation_error(exc)
        return ApiError(400, message[:500], param)
    if isinstance(exc, BodyParseError):
        return ApiError(exc.status_code, exc.detail, exc.param)
    if isinstance(exc, StarletteHTTPException):
        return ApiError(exc.status_code, str(exc.detail), headers=exc.headers)
    return None


class AnthropicRoute(StrictJSONRoute):
    """A route whose refusals take Anthropic's error body instead of OpenAI's."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def anthropic_handler(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:  # noqa: BLE001 - converted, or passed on unchanged
                err = as_api_error(exc)
                if err is None:
                    raise
                return anthropic_error(err)

        return anthropic_handler
