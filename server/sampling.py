"""From an OpenAI request body to SamplingParams: model defaults first, then the checks.

Fields the request leaves unset take the model's generation_config.json values (temperature,
top_p, top_k, min_p, repetition_penalty, max_new_tokens; read by the engine, see
`common.generation_config`, and sent in EngineReady), as `vllm serve` does by default; what
neither sets keeps the OpenAI default. The range checks are the engine's own
(`common.validation`), run here so bad input is a 400 and never reaches the engine.
"""
from __future__ import annotations

from common.errors import InvalidRequest
from common.messages import SamplingParams, StructuredOutputs
from common.validation import MAX_LOGPROBS, validate_sampling_params
from server.errors import bad_request, invalid_request
from server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from server.structured import requested_grammar

MAX_N = 128  # OpenAI's cap on choices per request
MAX_STOP_STRINGS = 64  # each one is matched against every streamed character
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
_INT64_MAX = 2**63 - 1


def chat_sampling_params(body: ChatCompletionRequest, defaults: dict, vocab_size: int,
                         max_model_len: int, structured: StructuredOutputs | None = None) -> SamplingParams:
    if body.top_logprobs is not None and not body.logprobs:
        raise bad_request("top_logprobs: requires logprobs to be true", "top_logprobs")
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    _check_prompt_logprobs(body)
    return _sampling_params(body, defaults, vocab_size, max_model_len, max_tokens, logprobs, structured,
                            body.prompt_logprobs)


def completion_sampling_params(body: CompletionRequest, defaults: dict, vocab_size: int,
                               max_model_len: int) -> SamplingParams:
    max_tokens = body.max_tokens
    if max_tokens is None:
        max_tokens = defaults.get("max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS)
    elif max_tokens == 0 and body.echo:
        max_tokens = 1  # the prompt alone: the engine samples one token that is not shown (vLLM's way)
    _check_prompt_logprobs(body)
    # echo with logprobs shows the prompt tokens' logprobs too: the engine computes the larger k
    prompt_logprobs = body.prompt_logprobs
    if body.echo and body.logprobs is not None:
        prompt_logprobs = max(body.logprobs, prompt_logprobs or 0)
    return _sampling_params(body, defaults, vocab_size, max_model_len, max_tokens, body.logprobs,
                            requested_grammar(body), prompt_logprobs, body.echo)


def _check_prompt_logprobs(body: ChatCompletionRequest | CompletionRequest) -> None:
    if body.prompt_logprobs is not None and body.stream:
        raise bad_request("prompt_logprobs: not available with stream true", "prompt_logprobs")


def _sampling_params(body: SamplingFields, defaults: dict, vocab_size: int, max_model_len: int,
                     max_tokens: int | None, logprobs: int | None, structured: StructuredOutputs | None,
                     prompt_logprobs: int | None = None, echo: bool = False) -> SamplingParams:
    n = 1 if body.n is None else body.n
    if not 1 <= n <= MAX_N:
        raise bad_request(f"n: must be in [1, {MAX_N}], got {n}", "n")
    if max_tokens is None:
        max_tokens = defaults.get("max_tokens")
    # Bounded here because msgpack carries 64-bit integers only; the engine checks the rest.
    for field, value, limit in (("max_tokens", max_tokens, max_model_len),
                                ("min_tokens", body.min_tokens, max_model_len),
                                ("top_k", body.top_k, _INT64_MAX), ("seed", body.seed, 2**64 - 1)):
        if value is not None and abs(value) > limit:
            name = "max_model_len" if limit == max_model_len else "the largest allowed value"
            raise bad_request(f"{field}: {value} exceeds {name} ({limit})", field)
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        field = "top_logprobs" if isinstance(body, ChatCompletionRequest) else "logprobs"
        raise bad_request(f"{field}: must be in [0, {MAX_LOGPROBS}], got {logprobs}", field)
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if any(s == "" for s in stop):
        raise bad_request("stop: stop strings must not be empty", "stop")
    if len(stop) > MAX_STOP_STRINGS:
        raise bad_request(f"stop: at most {MAX_STOP_STRINGS} stop strings", "stop")
    logit_bias = None
    if body.logit_bias is not None:
        try:
            logit_bias = {int(k): v for k, v in body.logit_bias.items()}
        except ValueError:
            raise bad_request("logit_bias: keys must be token ids", "logit_bias") from None

    def pick(field: str, fallback):
        value = getattr(body, field)
        return value if value is not None else defaults.get(field, fallback)

    params = SamplingParams(
        n=n, max_tokens=max_tokens, min_tokens=body.min_tokens, temperature=pick("temperature", 1.0),
        top_k=pick("top_k", 0), top_p=pick("top_p", 1.0), min_p=pick("min_p", 0.0),
        repetition_penalty=pick("repetition_penalty", 1.0), presence_penalty=pick("presence_penalty", 0.0),
        frequency_penalty=pick("frequency_penalty", 0.0), logit_bias=logit_bias, seed=body.seed,
        logprobs=logprobs, stop_token_ids=list(body.stop_token_ids or []), ignore_eos=body.ignore_eos,
        stop=stop, include_stop_str_in_output=body.include_stop_str_in_output or body.no_stop_trim,
        skip_special_tokens=body.skip_special_tokens, structured_outputs=structured,
        batch_invariant=body.batch_invariant, trace=body.trace, prompt_logprobs=prompt_logprobs, echo=echo)
    try:
        validate_sampling_params(params, vocab_size)
    except InvalidRequest as exc:
        raise invalid_request(exc) from None
    return params
