"""One step's flat model inputs, as the runner lays them out (`ModelRunner.prepare_inputs`).

A module of its own so that what reads them (the runner, the request tracer) need not import each
other.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.attention.base import StepInputs
from engine.lora.context import StepLora
from engine.runner.prompt_logprobs import PromptLogprobRows


@dataclass
class ModelInputs:
    request_ids: list[str]  # the scheduled requests in batch order (request i: rows qsl[i]..qsl[i+1])
    input_ids: torch.Tensor  # [num_tokens] int32
    positions: torch.Tensor  # [num_tokens] int64
    attention: StepInputs
    logits_indices: torch.Tensor  # [num_logits] int64: the rows whose logits are sampled
    sampled_request_ids: list[str]
    sampled_rows: np.ndarray  # [num_logits] batch rows, in the order of logits_indices
    sampled_rows_dev: torch.Tensor
    # With drafts in the step: per sampled request its draft, and 1 + len(draft) logits rows
    drafts: list[list[int]] | None = None
    num_logits: np.ndarray | None = None
    # Where the batch-invariant requests' rows start (they come last): in the flat batch and
    # among the logits rows; None when no request in the step asks
    invariant_token_start: int | None = None
    invariant_logits_start: int | None = None
    # The LoRA slot groups of the step's rows; None when no row runs an adapter
    lora: StepLora | None = None
    # Rows whose logits give prompt logprobs (requests that ask, in their prompt); None: none
    prompt_logprob_rows: PromptLogprobRows | None = None
