"""The FastAPI app: generation routers, models, health, metrics, tokenize / detokenize."""
from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI, Path
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from common.messages import DetokenizeRequest, TokenizeRequest
from common.validation import check_token_ids
from server import chat, completions, lora, render, router_info
from server.anthropic_messages import router as anthropic_messages
from server.cors import add_cors
from server.responses import router as responses
from server.errors import ERROR_RESPONSES, bad_request, error_response, install_error_handlers, unavailable
from server.json_body import StrictJSONRoute
from server.lora import lora_info_sample
from server.middleware import ApiKeyMiddleware, BodyLimitMiddleware, HeaderLimitMiddleware
from server.protocol import DetokenizeBody, TokenizeBody
from server.state import ServingState


class MetricsResponse(Response):
    media_type = CONTENT_TYPE_LATEST


def create_app(state: ServingState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        await state.startup()
        try:
            yield
        finally:
            state.shutdown()

    app = FastAPI(title="llm-serve", lifespan=lifespan, responses=ERROR_RESPONSES)
    app.router.route_class = StrictJSONRoute  # for the routes below; the routers set their own
    app.state.serving = state
    install_error_handlers(app)
    app.include_router(chat.router)
    app.include_router(completions.router)
    app.include_router(render.router)  # vLLM's render endpoints, which vllm-router calls first
    app.include_router(router_info.router)  # what a KV-aware router asks a replica it discovers
    app.include_router(responses.router)
    app.include_router(anthropic_messages.router)
    if state.config.allow_runtime_lora_updating:  # as vLLM: without the flag the two routes do not exist
        app.include_router(lora.router)
    # Added innermost first: the header limits run before the key, the key before the body.
    app.add_middleware(BodyLimitMiddleware, read_timeout_s=state.config.body_read_timeout)
    if state.config.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=state.config.api_key)
    app.add_middleware(HeaderLimitMiddleware)
    add_cors(app, state.config.allowed_origins, state.config.allowed_methods, state.config.allowed_headers,
             state.config.allow_credentials)  # outermost: a preflight carries no API key

    # The OpenAPI document says what these answer: no body, and Prometheus text.
    @app.get("/health", response_class=Response, responses={200: {"description": "Ready to serve"}})
    async def health():
        problem = state.health_problem()
        if problem is not None:
            return error_response(unavailable(problem))
        return Response(status_code=200)

    @app.get("/metrics", response_class=MetricsResponse)
    async def metrics():
        body = state.metrics.render()
        return MetricsResponse(body if state.lora is None else body + lora_info_sample(state.lora))

    def model_card(name: str) -> dict:
        ready = state.ready
        lora = state.lora.adapters.get(name) if state.lora is not None else None
        return {"id": name, "object": "model", "created": 0, "owned_by": "llm-serve",
                "root": state.model_dir if lora is None else lora.path,
                "parent": None if lora is None or state.lora is None else state.lora.parents[name],
                "max_model_len": ready.max_model_len if ready is not None else None}

    # 503 until the engine is ready (and while draining), so a readiness probe or a router that
    # polls /v1/models sends no traffic to a replica that cannot serve it yet.
    @app.get("/v1/models")
    async def list_models():
        state.check_accepting()
        adapters = () if state.lora is None else tuple(state.lora.adapters)
        return {"object": "list", "data": [model_card(name) for name in state.served_model_names + adapters]}

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str = Path(examples=[state.served_model_name])):  # noqa: B008 - FastAPI's way
        state.check_accepting()
        state.check_model(model)
        return model_card(model)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeBody):
        ready = state.check_accepting()
        state.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise bad_request("give either prompt or messages", "prompt")
        messages = None
        if body.messages is not None:
            messages = chat.to_chat_messages(body.messages)
        # vLLM's defaults: special tokens for a plain prompt, none beyond the template for chat.
        add_special = body.add_special_tokens if body.add_special_tokens is not None else messages is None
        answer = await state.client.call(lambda rid: TokenizeRequest(
            request_id=rid, prompt=body.prompt, messages=messages, add_special_tokens=add_special,
            add_generation_prompt=body.add_generation_prompt, return_token_strs=body.return_token_strs))
        return {"count": len(answer.token_ids), "max_model_len": ready.max_model_len, "tokens": answer.token_ids,
                "token_strs": answer.token_strs}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeBody):
        ready = state.check_accepting()
        state.check_model(body.model)
        check_token_ids("tokens", body.tokens, ready.vocab_size)  # InvalidRequest: a 400
        answer = await state.client.call(lambda rid: DetokenizeRequest(rid, body.tokens))
        return {"prompt": answer.text}

    return app
