"""Prompts in, token ids out: the model's chat template and tokenizer, from the model folder.

Bad input (a conversation the template refuses, a token id outside the vocabulary) raises
InvalidRequest naming the field, which the worker turns into a 400.
"""
from __future__ import annotations

from collections.abc import Sequence

import jinja2

from common.errors import InvalidRequest
from common.messages import ChatMessage
from common.validation import check_token_ids
from common.tool_format import CALL_CLOSE, CALL_OPEN
from tokenizer_worker.tool_prompt import template_has_hermes_tools, with_hermes_tools, with_template_tools


class PromptTokenizer:
    def __init__(self, model_dir: str):
        from transformers import AutoTokenizer  # imported in the worker process only

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.template_has_tools = template_has_hermes_tools(self.tokenizer.chat_template)
        # a tokenizer whose <tool_call> is a special token would drop it from the text the parser reads
        special = set(self.tokenizer.all_special_tokens)
        self.tool_tags_are_special = CALL_OPEN in special or CALL_CLOSE in special

    def chat_prompt_ids(self, messages: Sequence[ChatMessage], add_generation_prompt: bool,
                        tools: list[dict] | None = None, continue_final_message: bool = False,
                        template_kwargs: dict | None = None) -> list[int]:
        return self.chat_text_ids(self.chat_text(messages, add_generation_prompt, tools, continue_final_message,
                                                 template_kwargs))

    def chat_text(self, messages: Sequence[ChatMessage], add_generation_prompt: bool,
                  tools: list[dict] | None = None, continue_final_message: bool = False,
                  template_kwargs: dict | None = None) -> str:
        """The conversation through the model's chat template; with `continue_final_message` the
        text ends inside the last message (no end-of-turn after it), for the model to go on.
        `template_kwargs` are the template's own variables (the server checked that none is one
        of ours)."""
        if not self.tokenizer.chat_template:
            raise InvalidRequest("messages", "this model has no chat template; use /v1/completions with a prompt")
        extra: dict = dict(template_kwargs or {})
        if continue_final_message:
            extra["continue_final_message"] = True
        if self.template_has_tools:
            conversation = with_template_tools(messages)
            if tools:
                extra["tools"] = tools
        else:
            conversation = with_hermes_tools(messages, tools)
        try:
            return self.tokenizer.apply_chat_template(conversation, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt, **extra)
        except jinja2.TemplateError as exc:  # e.g. `raise_exception('roles must alternate')`
            raise InvalidRequest("messages", f"the model's chat template refused them: {exc}") from None
        except ValueError as exc:  # continue_final_message: the last message is not in the text as sent
            raise InvalidRequest("continue_final_message", str(exc)) from None

    def chat_text_ids(self, text: str) -> list[int]:
        # The template already wrote the special tokens it wants (BOS, role markers).
        return self.tokenizer.encode(text, add_special_tokens=False)

    def text_prompt_ids(self, prompt: str | list[int], add_special_tokens: bool = True) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        return list(prompt)

    def token_strs(self, token_ids: Sequence[int]) -> list[str]:
        return self.tokenizer.convert_ids_to_tokens(list(token_ids))

    def decode(self, token_ids: Sequence[int], vocab_size: int) -> str:
        check_token_ids("tokens", token_ids, vocab_size)
        return self.tokenizer.decode(list(token_ids))
