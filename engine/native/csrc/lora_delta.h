// The LoRA delta (lora_delta.cpp) in two halves, for a caller that adds the deltas of many
// projections in one step (decode_layers.cpp): the step's rows grouped by adapter slot once, then
// each projection's delta over those groups.
#pragma once

#include "aten.h"

#include <cstdint>
#include <vector>

constexpr int kLoraBlockRowsMax = 8;  // the most rows of one slot a block holds, on any tier

// Up to a tier's block size of rows of one slot (-1: the base model's rows are in none)
struct LoraRowBlock {
  int64_t slot;
  int64_t rows[kLoraBlockRowsMax];
  int count;
};
using LoraRows = std::vector<LoraRowBlock>;

// The rows' blocks, from each row's slot [rows] int32 (-1..num_slots - 1); runs of one slot in row order
LoraRows lora_rows(const at::Tensor& slots, int64_t num_slots);

// lora_add_delta over rows grouped by lora_rows
void lora_add_delta_rows(const at::Tensor& x, at::Tensor out, const at::Tensor& a, const at::Tensor& bt,
                         const LoraRows& rows, const std::vector<int64_t>& slices);
