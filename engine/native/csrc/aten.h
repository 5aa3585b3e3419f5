// The part of ATen the kernels use (tensors, their checks, at::empty / at::empty_like), instead of
// <ATen/ATen.h>: every source compiles once per ISA tier, and the whole of ATen took most of each
// compile (9 s of CPU against 4 s here).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
