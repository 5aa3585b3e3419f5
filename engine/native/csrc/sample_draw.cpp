// The two passes over the vocabulary of one draw in the sampler's rejection loop
// (engine/sample/filters.py), for float32 probabilities on the CPU: at one row a draw is a few
// dozen torch ops on 49k floats, each with its own dispatch, and costs as much as a tenth of the
// decode step; here each is one pass per row.
//
// inverse_cdf: per row, the token whose slice of the cumulative distribution holds u x total, in
// two levels as the torch path (block sums of 256, then the chosen block): a zero-probability
// token is never chosen (its slice is empty), also where u x total rounds up to the total.
// nucleus_ok: whether each drawn token survives top-p (the probability of the tokens ranked before
// it, higher or equal with a lower id, is below top_p, or top_p >= 1) and min-p (its probability
// is at least min_p x the row's top probability).
// argmax_rows: the greedy rows' choice, as torch.argmax picks it (the first maximum; a NaN counts
// as the largest, the first one wins), one pass per row in parallel over the rows: torch's CPU
// argmax over the last dimension runs its rows in one thread: 1.07 ms at 32 x 49152 (0.11 here), a
// twentieth of a decode step.
#include "aten.h"

#include "kernels.h"
#include "parallel.h"

#include "vec16.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kBlock = 256;

// sum of p[0..n) in 16 float32 lanes
float lane_sum(const float* p, int64_t n) {
  int64_t i = 0;
  float s = 0.f;
#if defined(LLM_SERVE_VEC16)
  llm_serve::f32x16 acc = llm_serve::zero16();
  for (; i + 16 <= n; i += 16) acc = llm_serve::add(acc, llm_serve::load16(p + i));
  s = llm_serve::reduce_add(acc);
#endif
  for (; i < n; ++i) s += p[i];
  return s;
}

// sum of the entries above `x`
float sum_above(const float* p, int64_t n, float x) {
  int64_t i = 0;
  float s = 0.f;
#if defined(LLM_SERVE_VEC16)
  llm_serve::f32x16 acc = llm_serve::zero16();
  for (; i + 16 <= n; i += 16) acc = llm_serve::add(acc, llm_serve::where_greater(llm_serve::load16(p + i), x));
  s = llm_serve::reduce_add(acc);
#endif
  for (; i < n; ++i)
    if (p[i] > x) s += p[i];
  return s;
}

int64_t draw_row(const float* p, int64_t vocab, float u, std::vector<float>& sums) {
  const int64_t num_blocks = (vocab + kBlock - 1) / kBlock;
  sums.resize(num_blocks);
  float total = 0.f;
  for (int64_t b = 0; b < num_blocks; ++b) {
    sums[b] = lane_sum(p + b * kBlock, std::min(kBlock, vocab - b * kBlock));
    total += sums[b];
  }
  const float target = u * total;
  int64_t chosen = -1, last_nonzero = -1;
  float before = 0.f, cdf = 0.f;
  for (int64_t b = 0; b < num_blocks; ++b) {  // a zero block never passes: cdf alone would have before
    if (sums[b] > 0.f) last_nonzero = b;
    if (cdf + sums[b] > target) {
      chosen = b;
      break;
    }
    cdf += sums[b];
  }
  if (chosen < 0) {  // u x total rounded up to the total: the last block that has mass
    if (last_nonzero < 0) return 0;
    chosen = last_nonzero;
    before = total - sums[chosen];
  } else {
    before = cdf;
  }
  const float* q = p + chosen * kBlock;
  const int64_t n = std::min(kBlock, vocab - chosen * kBlock);
  float inner_total = 0.f;  // in the scan's own order, so the scan reaches it
  for (int64_t j = 0; j < n; ++j) inner_total += q[j];
  const float inner_target = std::min(std::max(target - before, 0.f), inner_total * (1.f - 1.f / (1 << 20)));
  float c = 0.f;  // reaches inner_total > inner_target, first at a token of positive probability
  for (int64_t j = 0; j < n; ++j) {
    c += q[j];
    if (c > inner_target) return chosen * kBlock + j;
  }
  return chosen * kBlock + n - 1;  // not reached: the block has mass
}

// torch.argmax of one row: the first NaN where there is one, else the first maximum
int64_t argmax_row(const float* x, int64_t n) {
  int64_t i = 0;
  float best = -std::numeric_limits<float>::infinity();
#if defined(LLM_SERVE_VEC16)
  llm_serve::f32x16 running = llm_serve::set16(best);
  for (; i + 16 <= n; i += 16) {
    const llm_serve::f32x16 v = llm_serve::load16(x + i);
    if (llm_serve::any_nan(v)) break;  // the scalar scan finds the NaN
    running = llm_serve::max(running, v);
  }
  best = llm_serve::reduce_max(running);
#endif
  for (; i < n; ++i) {  // a tail past the vectors, or from the vector holding a NaN on
    if (std::isnan(x[i])) return i;
    best = std::max(best, x[i]);
  }
  // the first index holding the maximum (n > 0, so one does)
  int64_t j = 0;
#if defined(LLM_SERVE_VEC16)
  for (; j + 16 <= n; j += 16) {
    const int hit = llm_serve::first_equal(llm_serve::load16(x + j), best);
    if (hit >= 0) return j + hit;
  }
#endif
  while (x[j] != best) ++j;
  return j;
}

}  // namespace

at::Tensor argmax_rows(const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.size(1) > 0,
              "argmax_rows: logits [rows, vocab] float32");
  const at::Tensor x = logits.contiguous();
  const int64_t rows = x.size(0), vocab = x.size(1);
  at::Tensor out = at::empty({rows}, at::TensorOptions().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  llm_serve::parallel_for(0, rows, 4, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) op[r] = argmax_row(xp + r * vocab, vocab);
  });
  return out;
}

at::Tensor inverse_cdf(const at::Tensor& probs, const at::Tensor& u) {
  TORCH_CHECK(probs.dim() == 2 && probs.scalar_type() == at::kFloat && u.scalar_type() == at::kFloat &&
                  u.dim() == 1 && u.size(0) == probs.size(0),
              "inverse_cdf: probs [rows, vocab] float32, u [rows] float32");
  const at::Tensor p = probs.contiguous(), uu = u.contiguous();
  const int64_t rows = p.size(0), vocab = p.size(1);
  at::Tensor out = at::empty({rows}, at::TensorOptions().dtype(at::kLong));
  const float* pp = p.data_ptr<float>();
  const float* up = uu.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  llm_serve::parallel_for(0, rows, 8, [&](int64_t lo, int64_t hi) {
    std::vector<float> sums;
    for (int64_t r = lo; r < hi; ++r) op[r] = draw_row(pp + r * vocab, vocab, up[r], sums);
  });
  return out;
}

at::Tensor nucleus_ok(const at::Tensor& probs, const at::Tensor& token, const c10::optional<at::Tensor>& top_p,
                      const c10::optional<at::Tensor>& min_p, const c10::optional<at::Tensor>& top_prob) {
  TORCH_CHECK(probs.dim() == 2 && probs.scalar_type() == at::kFloat && token.scalar_type() == at::kLong &&
                  token.size(0) == probs.size(0),
              "nucleus_ok: probs [rows, vocab] float32, token [rows] int64");
  TORCH_CHECK(!min_p.has_value() || top_prob.has_value(), "nucleus_ok: min_p needs top_prob");
  const at::Tensor p = probs.contiguous(), tok = token.contiguous();
  const int64_t rows = p.size(0), vocab = p.size(1);
  const at::Tensor tp = top_p.has_value() ? top_p->contiguous().to(at::kFloat) : at::Tensor();
  const at::Tensor mp = min_p.has_value() ? min_p->contiguous().to(at::kFloat) : at::Tensor();
  const at::Tensor best = top_prob.has_value() ? top_prob->contiguous().to(at::kFloat) : at::Tensor();
  at::Tensor ok = at::empty({rows}, at::TensorOptions().dtype(at::kBool));
  const float* pp = p.data_ptr<float>();
  const int64_t* tk = tok.data_ptr<int64_t>();
  bool* okp = ok.data_ptr<bool>();
  llm_serve::parallel_for(0, rows, 8, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* row = pp + r * vocab;
      const int64_t t = tk[r];
      const float pt = row[t];
      bool keep = true;
      if (tp.defined()) {
        const float limit = tp.data_ptr<float>()[r];
        if (limit < 1.f) {
          int64_t ties_before = 0;  // equal probability, lower id: ranked before
          for (int64_t i = 0; i < t; ++i) ties_before += row[i] == pt;
          keep = sum_above(row, vocab, pt) + pt * static_cast<float>(ties_before) < limit;
        }
      }
      if (keep && mp.defined()) keep = pt >= mp.data_ptr<float>()[r] * best.data_ptr<float>()[r];
      okp[r] = keep;
    }
  });
  return ok;
}
