"""vLLM's render endpoints: a request's prompt as token ids, without generating.

`POST /v1/chat/completions/render` answers one object and `POST /v1/completions/render` a list
(one per prompt), each in the shape of vLLM's `GenerateRequest`: `token_ids` (the prompt exactly as
the engine would get it: chat template, tools, special tokens), the `sampling_params` the request
resolves to, and the request's `model` and `stream`. vllm-router posts every request here first and
routes on the token ids (its cache-aware and KV-aware policies match them against what each replica
caches). The body is the generation endpoint's, with the same checks, so a request that would be
refused is refused here too. Nothing reaches the engine.
"""
from __future__ import annotations

import uuid

import msgspec
from fastapi import APIRouter, Request

from common.messages import SamplingParams, TokenizeRequest
from common.validation import check_token_ids
from server.chat import prepare_chat
from server.completions import _prompt_list
from server.generation import admit
from server.json_body import StrictJSONRoute
from server.protocol import ChatCompletionRequest, CompletionRequest
from server.sampling import completion_sampling_params

router = APIRouter(route_class=StrictJSONRoute)

# SamplingParams fields vLLM's SamplingParams has under the same name (ours beyond them stay out)
_VLLM_SAMPLING_FIELDS = (
    "n", "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "top_p", "top_k", "min_p",
    "seed", "stop", "stop_token_ids", "ignore_eos", "max_tokens", "min_tokens", "logprobs",
    "include_stop_str_in_output", "skip_special_tokens", "logit_bias")


def _sampling_dict(params: SamplingParams) -> dict:
    values = msgspec.structs.asdict(params)
    out = {name: values[name] for name in _VLLM_SAMPLING_FIELDS}
    if out["logit_bias"] is not None:
        out["logit_bias"] = {str(k): v for k, v in out["logit_bias"].items()}
    return out


def _generate_request(token_ids: list[int], params: SamplingParams, model: str, body) -> dict:
    return {"request_id": uuid.uuid4().hex, "token_ids": token_ids, "features": None,
            "sampling_params": _sampling_dict(params), "model": model, "stream": bool(body.stream),
            "stream_options": None if body.stream_options is None else body.stream_options.model_dump(),
            "cache_salt": None, "priority": 0, "kv_transfer_params": None}


@router.post("/v1/chat/completions/render")
async def render_chat(body: ChatCompletionRequest, raw: Request) -> dict:
    state = raw.app.state.serving
    ready = admit(state, body)
    params, messages, tools = prepare_chat(state, body, ready)
    answer = await state.client.call(lambda rid: TokenizeRequest(
        request_id=rid, messages=messages, add_special_tokens=False, add_generation_prompt=body.add_generation_prompt,
        continue_final_message=body.continue_final_message, tools=None if tools is None else tools.tools))
    return _generate_request(answer.token_ids, params, state.served_model_name, body)


@router.post("/v1/completions/render")
async def render_completion(body: CompletionRequest, raw: Request) -> list[dict]:
    state = raw.app.state.serving
    ready = admit(state, body)
    params = completion_sampling_params(body, state.generation_defaults, ready.vocab_size, ready.max_model_len)
    out = []
    for prompt in _prompt_list(body.prompt):
        if isinstance(prompt, str):
            answer = await state.client.call(lambda rid, p=prompt: TokenizeRequest(request_id=rid, prompt=p))
            token_ids = answer.token_ids
        else:
            check_token_ids("prompt", prompt, ready.vocab_size)  # InvalidRequest: a 400
            token_ids = prompt
        out.append(_generate_request(token_ids, params, state.served_model_name, body))
    return out
