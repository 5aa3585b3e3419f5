"""Server configuration, and the one command line generated from it and from EngineConfig.

Every flag is also an environment variable LLM_<FLAG> (see `common.cli_args`); the positional
MODEL is LLM_MODEL.
"""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass

from common.cli_args import add_dataclass_args, dataclass_from_args, env_name, opt
from common.engine_config import EngineConfig
from server.cors import json_list


def _json_object(text: str) -> dict:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


@dataclass(frozen=True)
class ServerConfig:
    host: str = opt("127.0.0.1", "address to listen on (0.0.0.0 for every interface)")
    port: int = opt(8000, "port to listen on")
    served_model_name: tuple[str, ...] = opt(
        (), "one or more model ids that clients may send, separated by spaces; /v1/models lists each, and "
            "responses and metrics carry the first; default: MODEL as given, or SmolLM2-135M-Instruct for the "
            "embedded model", parse=str, nargs="+", metavar="NAME")
    api_key: str | None = opt(None, "require 'Authorization: Bearer <key>' on /v1/*, /tokenize, /detokenize",
                               secret=True)
    max_queued_requests: int = opt(
        1024, "sequences that may wait beyond --max-num-seqs; more get 503 with Retry-After")
    drain_timeout: float = opt(600.0, "seconds SIGTERM waits for running requests to finish; then the rest are "
                                      "aborted with a 503 error and the server exits")
    header_read_timeout: float = opt(30.0, "seconds a client has to send a request's line and headers; a slower "
                                           "one gets 408 and is disconnected")
    body_read_timeout: float = opt(30.0, "seconds a request body may stop arriving before the request gets 408")
    tool_call_parser: str = opt(
        "auto", "how tool calls are written and read: hermes (<tool_call> JSON blocks, the one format implemented; "
                "auto picks it for every chat template)", choices=("auto", "hermes"))
    reasoning_parser: str | None = opt(
        None, "split the model's <think>...</think> out of its answer: reasoning_content on chat completions, a "
              "reasoning item on /v1/responses, a thinking block on /v1/messages (qwen3: a block the output "
              "opens; deepseek_r1: the prompt opened it)", choices=("qwen3", "deepseek_r1"))
    default_chat_template_kwargs: dict | None = opt(
        None, "JSON object of chat template variables for every request (e.g. '{\"enable_thinking\": false}'); "
              "a request's chat_template_kwargs override them", parse=lambda text: _json_object(text), metavar="JSON")
    max_stored_responses: int = opt(
        1024, "responses of /v1/responses kept in memory for previous_response_id and GET /v1/responses/{id} "
              "(the oldest go first); 0 keeps none")
    detokenize_check: bool = opt(
        True, "compare each finished choice's streamed text with one full decode of its tokens; a difference "
              "counts in llm:detokenize_mismatch_total and is logged with both texts")
    enable_trace: bool = opt(
        False, 'accept "trace": true on the generation endpoints: the response then carries the request\'s '
               "shapes and times at every stop (chat template, tokenization, each operator of layer 0 for the "
               "prefill and one decode step, sampling, detokenization); off, such a request gets a 400")
    allowed_origins: tuple[str, ...] = opt(
        (), 'origins that browsers may call the API from, a JSON list: \'["https://app.example"]\' or \'["*"]\'; '
            "default none: no CORS headers, so pages on other origins cannot read the answers",
        parse=json_list, metavar="JSON")
    allowed_methods: tuple[str, ...] = opt(("*",), "the methods allowed cross-origin (with allowed origins), "
                                                   "a JSON list", parse=json_list, metavar="JSON")
    allowed_headers: tuple[str, ...] = opt(("*",), "the request headers allowed cross-origin (with allowed "
                                                   "origins), a JSON list", parse=json_list, metavar="JSON")
    allow_credentials: bool = opt(False, "allow cookies and Authorization on cross-origin requests (with allowed "
                                         "origins; Access-Control-Allow-Credentials)")
    lora_modules: tuple[str, ...] = opt(
        (), "LoRA adapters served from the start (LoRA enabled), separated by spaces: name=path, or vLLM's "
            'JSON \'{"name": "sql", "path": "/adapters/sql", "base_model_name": "..."}\'; a request\'s model picks one',
        parse=str, nargs="+", metavar="MODULE")
    allow_runtime_lora_updating: bool = opt(
        False, "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's bodies); off, they are 404s")
    log_level: str = opt("info", "debug | info | warning | error")


def build_parser(prog: str = "python -m server") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="OpenAI-compatible server: /v1/chat/completions, /v1/completions, /v1/models, "
                    "/health, /metrics, /tokenize, /detokenize.")
    parser.add_argument("model", nargs="?", default=os.environ.get(env_name("model")),
                        help="local Hugging Face model folder; default: the embedded SmolLM2-135M-Instruct "
                             f"(env {env_name('model')})")
    add_dataclass_args(parser, EngineConfig, skip=("model",))
    add_dataclass_args(parser, ServerConfig)
    return parser


def parse_args(argv: list[str] | None = None, prog: str = "python -m server") -> tuple[ServerConfig, EngineConfig]:
    args = build_parser(prog).parse_args(argv)
    return dataclass_from_args(ServerConfig, args), dataclass_from_args(EngineConfig, args)
