"""Offline batch generation on top of LLMEngine, like vLLM's `LLM(model).generate(...)`."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import msgspec
from tqdm import tqdm

from common.engine_config import EngineConfig
from common.kv_events_config import KVEventsConfig
from common.speculative_config import SpeculativeConfig
from engine.llm_engine import LLMEngine
from common.messages import LoraRequest, SamplingParams, TokenLogprob
from common.parallel_sampling import fan_out


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | str | None = None
    logprobs: list[list[TokenLogprob]] | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    num_cached_tokens: int = 0
    # With SamplingParams.prompt_logprobs (as vLLM's): per prompt token [it, then the k best], the first None
    prompt_logprobs: list[list[TokenLogprob] | None] | None = None


class LLM:
    """`LLM()` runs the embedded default model; `LLM("path/to/hf-folder", dtype=...)` any
    supported local folder. Keyword arguments are EngineConfig fields."""

    def __init__(self, model: str | None = None, **engine_kwargs):
        spec = engine_kwargs.get("speculative_config")
        if isinstance(spec, dict):  # as vLLM's LLM(..., speculative_config={...})
            engine_kwargs["speculative_config"] = SpeculativeConfig.from_json(json.dumps(spec))
        events = engine_kwargs.get("kv_events_config")
        if isinstance(events, dict):  # as vLLM's LLM(..., kv_events_config={...})
            engine_kwargs["kv_events_config"] = KVEventsConfig.from_json(json.dumps(events))
        self.engine = LLMEngine(EngineConfig(model=model, **engine_kwargs))
        self._tokenizer = None
        self._next_id = 0

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self.engine.model_dir))
        return self._tokenizer

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False,
                 lora_request: LoraRequest | list[LoraRequest | None] | None = None) -> list[RequestOutput]:
        """prompts: a string, a list of strings, or a list of token-id lists. Outputs come back in
        the order of the prompts, each with `n` completions. `lora_request`: the LoRA adapter of
        every prompt or one per prompt (None: the base model; the engine needs enable_lora=True)."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"{len(params_list)} sampling params for {len(prompts)} prompts")
        loras = lora_request if isinstance(lora_request, list) else [lora_request] * len(prompts)
        if len(loras) != len(prompts):
            raise ValueError(f"{len(loras)} LoRA requests for {len(prompts)} prompts")
        params_list = [p if lora is None else msgspec.structs.replace(p, lora=lora)
                       for p, lora in zip(params_list, loras, strict=True)]
        outputs: list[RequestOutput] = []
        children: dict[str, tuple[RequestOutput, CompletionOutput]] = {}
        to_decode: list[tuple[CompletionOutput, bool]] = []  # with its request's skip_special_tokens
        try:
            for prompt, p in zip(prompts, params_list, strict=True):
                text = prompt if isinstance(prompt, str) else None
                ids = self.tokenizer.encode(prompt, add_special_tokens=False) if text is not None else list(prompt)
                request_id = str(self._next_id)
                self._next_id += 1
                out = RequestOutput(request_id, text, ids)
                for i, (child_id, child_params) in enumerate(fan_out(request_id, p)):
                    self.engine.add_request(child_id, ids, child_params)
                    completion = CompletionOutput(i, "", [], None, logprobs=[] if p.logprobs is not None else None)
                    out.outputs.append(completion)
                    children[child_id] = (out, completion)
                    to_decode.append((completion, p.skip_special_tokens))
                outputs.append(out)
        except ValueError:
            for child_id in children:  # a bad prompt or parameter: run none of this batch
                self.engine.abort(child_id)
            raise
        bar = tqdm(total=len(children), desc="generate", disable=not use_tqdm)
        while self.engine.has_unfinished():
            for delta in self.engine.step():
                out, completion = children[delta.request_id]
                completion.token_ids.extend(delta.new_token_ids)
                if delta.logprobs is not None and completion.logprobs is not None:
                    completion.logprobs.extend(delta.logprobs)
                if delta.num_cached_tokens is not None:  # on a request's first delta
                    out.num_cached_tokens = delta.num_cached_tokens
                if delta.prompt_logprobs is not None and out.prompt_logprobs is None:
                    out.prompt_logprobs = [None, *delta.prompt_logprobs]
                if delta.finish_reason is not None:
                    completion.finish_reason, completion.stop_reason = delta.finish_reason, delta.stop_reason
                    bar.update(1)
        bar.close()
        for completion, skip_special_tokens in to_decode:
            completion.text = self.tokenizer.decode(completion.token_ids, skip_special_tokens=skip_special_tokens)
        return outputs
