// Fused CPU ops for the decoder step, over bf16 or fp32 storage with fp32 arithmetic.
//
// Eager PyTorch runs a Gemma-3 decode step as ~50 small ops per layer, each paying its
// dispatch (5-20 us) over a few KB of data: at batch 1 that overhead is a third of the step.
// Each op here does one such chain in a single pass. They round to the storage dtype at the
// points where the eager ops store their results (a norm's output, each RoPE product, the
// residual sum), so fused and eager results agree up to fp32 summation order.
//
// Reductions and products run on ATen's own SIMD vectors (at::vec::Vectorized: AVX-512 or AVX2
// as the build defines CPU_CAPABILITY for this machine, scalar lanes otherwise).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace {

using fVec = at::vec::Vectorized<float>;
constexpr int64_t kVec = fVec::size();  // 16 fp32 lanes with AVX-512, 8 with AVX2

inline float to_f(float v) { return v; }
inline float to_f(c10::BFloat16 v) { return static_cast<float>(v); }

inline fVec load_f(const float* p) { return fVec::loadu(p); }
inline fVec load_f(const c10::BFloat16* p) {
  fVec out;
  at::vec::load_to_float<c10::BFloat16>(p, out);
  return out;
}

// The sum of v's lanes, by shuffles (a store and a serial sum cost ~4x more per dot product).
inline float lane_sum(const fVec& v) {
  return at::vec::vec_reduce_all<float>([](const fVec& a, const fVec& b) { return a + b; }, v);
}

// v rounded as storing it in T rounds it (identity for float).
template <typename T>
inline float round_as(float v) {
  return static_cast<float>(static_cast<T>(v));
}

template <typename T>
inline float sum_squares(const T* x, int64_t n) {
  fVec acc(0.0f);
  int64_t i = 0;
  for (; i + kVec <= n; i += kVec) {
    const fVec v = load_f(x + i);
    acc = at::vec::fmadd(v, v, acc);
  }
  float s = lane_sum(acc);
  for (; i < n; ++i) s += to_f(x[i]) * to_f(x[i]);
  return s;
}

// Stores kVec values, rounded to T (round to nearest even, as torch's casts).
inline void store_as(float* dst, const fVec& v) { v.store(dst); }
inline void store_as(c10::BFloat16* dst, const fVec& v) {
  at::vec::convert_from_float<c10::BFloat16>(v, v).store(dst, kVec);
}

// v rounded to T and back (identity for float).
template <typename T>
inline fVec round_vec(const fVec& v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    return std::get<0>(at::vec::convert_to_float<T>(at::vec::convert_from_float<T>(v, v)));
  }
}

// x[i] <- exp(x[i] - top); -> their sum. exp_u20: ATen's polynomial exp, within 20 fp32 ulp
// (1.2e-6 relative), no libm call.
inline float exp_shifted(float* x, int64_t n, float top) {
  const fVec t(top);
  fVec sum(0.0f);
  int64_t i = 0;
  for (; i + kVec <= n; i += kVec) {
    const fVec e = (fVec::loadu(x + i) - t).exp_u20();
    e.store(x + i);
    sum = sum + e;
  }
  float s = lane_sum(sum);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - top);
    s += x[i];
  }
  return s;
}

// 1 / sqrt(mean(x^2) + eps), the RMSNorm factor of one row.
template <typename T>
inline float inv_rms(const T* x, int64_t n, float eps) {
  return 1.0f / std::sqrt(sum_squares(x, n) / static_cast<float>(n) + eps);
}

// out = T(x * r * w)
template <typename T>
inline void scale_row(const T* x, float r, const float* w, T* out, int64_t n) {
  const fVec rv(r);
  int64_t i = 0;
  for (; i + kVec <= n; i += kVec) store_as(out + i, load_f(x + i) * rv * fVec::loadu(w + i));
  for (; i < n; ++i) out[i] = static_cast<T>(to_f(x[i]) * r * w[i]);
}

// out = T(x * inv_rms(x) * w), as F.rms_norm over the fp32 row, cast once.
template <typename T>
inline void norm_row(const T* x, const float* w, T* out, int64_t n, float eps) {
  scale_row(x, inv_rms(x, n, eps), w, out, n);
}

void check_weight(const at::Tensor& w, int64_t n, const char* what) {
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.is_contiguous() && w.dim() == 1 &&
                  w.size(0) == n,
              what, ": expected a contiguous fp32 [", n, "] weight");
}

// Every value of a contiguous int64 tensor within [lo, hi]: a host loop over a few ids costs
// less than the dispatch of a min() and a max().
bool in_range(const at::Tensor& ids, int64_t lo, int64_t hi) {
  const int64_t* p = ids.data_ptr<int64_t>();
  for (int64_t i = 0, n = ids.numel(); i < n; ++i)
    if (p[i] < lo || p[i] > hi) return false;
  return true;
}

void check_storage(const at::Tensor& x, const char* what) {
  TORCH_CHECK(x.device().is_cpu(), what, ": CPU tensors only");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, what,
              ": bfloat16 or float32 only, got ", x.scalar_type());
  TORCH_CHECK(x.is_contiguous(), what, ": expected a contiguous tensor");
}

// ---------------------------------------------------------------------------------------
// rms_norm(x [..., n], weight fp32 [n]) -> [..., n] in x's dtype

template <typename T>
void rms_norm_impl(const at::Tensor& x, const at::Tensor& w, at::Tensor& out, double eps) {
  const int64_t n = x.size(-1), rows = x.numel() / n;
  const T* xp = x.data_ptr<T>();
  const float* wp = w.data_ptr<float>();
  T* op = out.data_ptr<T>();
  at::parallel_for(0, rows, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r)
      norm_row(xp + r * n, wp, op + r * n, n, static_cast<float>(eps));
  });
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_storage(x, "rms_norm");
  check_weight(weight, x.size(-1), "rms_norm");
  at::Tensor out = at::empty_like(x);
  if (x.numel() == 0) return out;
  if (x.scalar_type() == at::kBFloat16)
    rms_norm_impl<c10::BFloat16>(x, weight, out, eps);
  else
    rms_norm_impl<float>(x, weight, out, eps);
  return out;
}

// ---------------------------------------------------------------------------------------
// add_rms_norm(residual [T, n] (updated), update [T, n], post_weight, weight) -> [T, n]
//   residual <- T(residual + T(rms_norm(update) * post_weight)); returns T(rms_norm(residual) *
//   weight): a sublayer's output norm, the residual add and the next sublayer's input norm.

template <typename T>
void add_rms_norm_impl(at::Tensor& res, const at::Tensor& upd, const at::Tensor& post,
                       const at::Tensor& w, at::Tensor& out, double eps) {
  const int64_t n = res.size(-1), rows = res.numel() / n;
  T* rp = res.data_ptr<T>();
  const T* up = upd.data_ptr<T>();
  const float* pp = post.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  T* op = out.data_ptr<T>();
  const float e = static_cast<float>(eps);
  at::parallel_for(0, rows, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* u = up + r * n;
      T* x = rp + r * n;
      const float ru = inv_rms(u, n, e);
      const fVec ruv(ru);
      int64_t i = 0;
      for (; i + kVec <= n; i += kVec)
        store_as(x + i, load_f(x + i) + round_vec<T>(load_f(u + i) * ruv * fVec::loadu(pp + i)));
      for (; i < n; ++i) x[i] = static_cast<T>(to_f(x[i]) + round_as<T>(to_f(u[i]) * ru * pp[i]));
      norm_row(x, wp, op + r * n, n, e);
    }
  });
}

at::Tensor add_rms_norm(at::Tensor residual, const at::Tensor& update,
                        const at::Tensor& post_weight, const at::Tensor& weight, double eps) {
  check_storage(residual, "add_rms_norm");
  check_storage(update, "add_rms_norm");
  TORCH_CHECK(update.sizes() == residual.sizes() &&
                  update.scalar_type() == residual.scalar_type(),
              "add_rms_norm: update must match the residual's shape and dtype");
  check_weight(post_weight, residual.size(-1), "add_rms_norm post_weight");
  check_weight(weight, residual.size(-1), "add_rms_norm weight");
  at::Tensor out = at::empty_like(residual);
  if (residual.numel() == 0) return out;
  if (residual.scalar_type() == at::kBFloat16)
    add_rms_norm_impl<c10::BFloat16>(residual, update, post_weight, weight, out, eps);
  else
    add_rms_norm_impl<float>(residual, update, post_weight, weight, out, eps);
  return out;
}

// ---------------------------------------------------------------------------------------
// gelu_tanh_mul(gate_up [T, 2I]) -> [T, I]: T(T(gelu_tanh(gate)) * up), GeGLU's activation as
// F.gelu(gate, approximate="tanh") * up computes it, gelu rounded to the storage dtype first.

constexpr float kGeluBeta = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluKappa = 0.044715f;

// 0.5 x (1 + tanh(y)) = x sigmoid(2y) = x / (1 + exp(-2y)), y = beta (x + kappa x^3): one exp
// instead of a tanh (Sleef's vector tanh took 2.5 ns per value here, 2.3x the whole op now).
// exp saturates to +inf for large -2y, giving x / inf = -0 where tanh gives exactly -1.
inline float gelu_tanh(float x) {
  return x / (1.0f + std::exp(-2.0f * kGeluBeta * (x + kGeluKappa * x * x * x)));
}

template <typename T>
void gelu_tanh_mul_impl(const at::Tensor& gu, at::Tensor& out) {
  const int64_t rows = gu.size(0), inner = gu.size(1) / 2;
  const T* src = gu.data_ptr<T>();
  T* dst = out.data_ptr<T>();
  const fVec one(1.0f), minus_two_beta(-2.0f * kGeluBeta), kappa(kGeluKappa);
  at::parallel_for(0, rows, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T *g = src + r * 2 * inner, *u = g + inner;
      T* o = dst + r * inner;
      int64_t i = 0;
      for (; i + kVec <= inner; i += kVec) {
        const fVec x = load_f(g + i);
        const fVec act = x / (one + (minus_two_beta * (x + kappa * x * x * x)).exp_u20());
        store_as(o + i, round_vec<T>(act) * load_f(u + i));
      }
      for (; i < inner; ++i) o[i] = static_cast<T>(round_as<T>(gelu_tanh(to_f(g[i]))) * to_f(u[i]));
    }
  });
}

at::Tensor gelu_tanh_mul(const at::Tensor& gate_up) {
  check_storage(gate_up, "gelu_tanh_mul");
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0,
              "gelu_tanh_mul: gate_up must be [T, 2I]");
  at::Tensor out = at::empty({gate_up.size(0), gate_up.size(1) / 2}, gate_up.options());
  if (out.numel() == 0) return out;
  if (gate_up.scalar_type() == at::kBFloat16)
    gelu_tanh_mul_impl<c10::BFloat16>(gate_up, out);
  else
    gelu_tanh_mul_impl<float>(gate_up, out);
  return out;
}

// ---------------------------------------------------------------------------------------
// qk_norm_rope(qkv [T, (H + 2K) * D], q_weight, k_weight fp32 [D], cos, sin [T, 1, D],
//              k_cache, v_cache [N, bs, K, D], slot_mapping [T])
//   -> q [T, H, D], k [T, K, D] (each head RMS-normed, then RoPE in the rotate-half layout),
//      v [T, K, D]; k and v are also written to the caches at their slots.

template <typename T>
void norm_rope_head(const T* x, const float* w, const T* c, const T* s, T* out, int64_t d,
                    float eps, float* scratch) {
  const float r = inv_rms(x, d, eps);
  const fVec rv(r);
  int64_t i = 0;
  for (; i + kVec <= d; i += kVec)
    round_vec<T>(load_f(x + i) * rv * fVec::loadu(w + i)).store(scratch + i);
  for (; i < d; ++i) scratch[i] = round_as<T>(to_f(x[i]) * r * w[i]);
  // Rotate-half: the first half pairs with minus the second, the second with the first.
  const int64_t half = d / 2;
  for (int64_t part = 0; part < 2; ++part) {
    const int64_t lo = part * half, hi = lo + half, partner = part ? -half : half;
    const float sign = part ? 1.0f : -1.0f;
    const fVec sv(sign);
    int64_t j = lo;
    for (; j + kVec <= hi; j += kVec) {
      const fVec rot = sv * fVec::loadu(scratch + j + partner);
      store_as(out + j, round_vec<T>(fVec::loadu(scratch + j) * load_f(c + j)) +
                            round_vec<T>(rot * load_f(s + j)));
    }
    for (; j < hi; ++j) {
      const float rot = sign * scratch[j + partner];
      out[j] = static_cast<T>(round_as<T>(scratch[j] * to_f(c[j])) + round_as<T>(rot * to_f(s[j])));
    }
  }
}

template <typename T>
void qk_norm_rope_impl(const at::Tensor& qkv, const at::Tensor& qw, const at::Tensor& kw,
                       const at::Tensor& cos, const at::Tensor& sin, double eps, int64_t h,
                       int64_t kh, at::Tensor& kc, at::Tensor& vc, const at::Tensor& slots,
                       at::Tensor& q, at::Tensor& k, at::Tensor& v) {
  const int64_t t = qkv.size(0), d = qw.size(0), width = (h + 2 * kh) * d;
  const T* src = qkv.data_ptr<T>();
  const T *cp = cos.data_ptr<T>(), *sp = sin.data_ptr<T>();
  const float *qwp = qw.data_ptr<float>(), *kwp = kw.data_ptr<float>();
  const int64_t* slot = slots.data_ptr<int64_t>();
  T *qp = q.data_ptr<T>(), *kp = k.data_ptr<T>(), *vp = v.data_ptr<T>();
  T *kcp = kc.data_ptr<T>(), *vcp = vc.data_ptr<T>();
  const float e = static_cast<float>(eps);
  at::parallel_for(0, t, 4, [&](int64_t lo, int64_t hi) {
    std::vector<float> scratch(d);
    for (int64_t i = lo; i < hi; ++i) {
      const T* row = src + i * width;
      const T *c = cp + i * d, *s = sp + i * d;
      for (int64_t j = 0; j < h; ++j)
        norm_rope_head(row + j * d, qwp, c, s, qp + (i * h + j) * d, d, e, scratch.data());
      for (int64_t j = 0; j < kh; ++j)
        norm_rope_head(row + (h + j) * d, kwp, c, s, kp + (i * kh + j) * d, d, e,
                       scratch.data());
      std::memcpy(vp + i * kh * d, row + (h + kh) * d, sizeof(T) * kh * d);
      std::memcpy(kcp + slot[i] * kh * d, kp + i * kh * d, sizeof(T) * kh * d);
      std::memcpy(vcp + slot[i] * kh * d, vp + i * kh * d, sizeof(T) * kh * d);
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> qk_norm_rope(
    const at::Tensor& qkv, const at::Tensor& q_weight, const at::Tensor& k_weight,
    const at::Tensor& cos, const at::Tensor& sin, double eps, int64_t num_heads,
    int64_t num_kv_heads, at::Tensor k_cache, at::Tensor v_cache,
    const at::Tensor& slot_mapping) {
  for (const at::Tensor* x : {&qkv, &cos, &sin, static_cast<const at::Tensor*>(&k_cache),
                              static_cast<const at::Tensor*>(&v_cache)}) {
    check_storage(*x, "qk_norm_rope");
    TORCH_CHECK(x->scalar_type() == qkv.scalar_type(), "qk_norm_rope: mixed dtypes");
  }
  const int64_t d = q_weight.size(0), t = qkv.size(0);
  check_weight(q_weight, d, "qk_norm_rope q_weight");
  check_weight(k_weight, d, "qk_norm_rope k_weight");
  TORCH_CHECK(d % 2 == 0, "qk_norm_rope: odd head_dim");
  TORCH_CHECK(qkv.dim() == 2 && qkv.size(1) == (num_heads + 2 * num_kv_heads) * d,
              "qk_norm_rope: qkv must be [T, (H + 2K) * D]");
  TORCH_CHECK(cos.numel() == t * d && sin.numel() == t * d, "qk_norm_rope: cos/sin [T, 1, D]");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes() && k_cache.dim() == 4 &&
                  k_cache.size(2) == num_kv_heads && k_cache.size(3) == d,
              "qk_norm_rope: caches must be [N, bs, K, D]");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous() &&
                  slot_mapping.numel() == t,
              "qk_norm_rope: slot_mapping must be int64 [T]");
  TORCH_CHECK(in_range(slot_mapping, 0, k_cache.size(0) * k_cache.size(1) - 1),
              "qk_norm_rope: slot out of range");
  auto opts = qkv.options();
  at::Tensor q = at::empty({t, num_heads, d}, opts), k = at::empty({t, num_kv_heads, d}, opts),
             v = at::empty({t, num_kv_heads, d}, opts);
  if (t == 0) return {q, k, v};
  if (qkv.scalar_type() == at::kBFloat16)
    qk_norm_rope_impl<c10::BFloat16>(qkv, q_weight, k_weight, cos, sin, eps, num_heads,
                                     num_kv_heads, k_cache, v_cache, slot_mapping, q, k, v);
  else
    qk_norm_rope_impl<float>(qkv, q_weight, k_weight, cos, sin, eps, num_heads, num_kv_heads,
                             k_cache, v_cache, slot_mapping, q, k, v);
  return {q, k, v};
}

// ---------------------------------------------------------------------------------------
// paged_decode_attention(q [B, H, D], k_cache, v_cache [N, bs, K, D], block_tables [B, nb],
//                        context_lens [B], window, scale) -> [B, H, D]
//   One query per sequence over its cached keys, read in place through its block table (no
//   gather, no padding). A window > 0 keeps the last `window` keys, the query's own included.
//   Query heads h read KV head h / (H / K). Scores, softmax and the weighted sum are fp32.

constexpr int64_t kTile = 4;  // query heads per pass over a KV head's keys and values

template <typename T>
void decode_attention_impl(const at::Tensor& q, const at::Tensor& kc, const at::Tensor& vc,
                           const at::Tensor& tables, const at::Tensor& lens, int64_t window,
                           double scale, at::Tensor& out) {
  const int64_t b = q.size(0), h = q.size(1), d = q.size(2);
  const int64_t bs = kc.size(1), kh = kc.size(2), nb = tables.size(1), group = h / kh;
  const T *qp = q.data_ptr<T>(), *kp = kc.data_ptr<T>(), *vp = vc.data_ptr<T>();
  const int64_t *tp = tables.data_ptr<int64_t>(), *lp = lens.data_ptr<int64_t>();
  T* op = out.data_ptr<T>();
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, b * kh, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> qf(group * d), acc(group * d), p, total(group);
    std::vector<const T*> keys, vals;
    for (int64_t w = lo; w < hi; ++w) {
      const int64_t s = w / kh, g = w % kh, ctx = lp[s];
      const int64_t first = window > 0 ? std::max<int64_t>(0, ctx - window) : 0, n = ctx - first;
      const int64_t* table = tp + s * nb;
      keys.resize(n);
      vals.resize(n);
      for (int64_t l = 0; l < n; ++l) {
        const int64_t pos = first + l, at = ((table[pos / bs] * bs + pos % bs) * kh + g) * d;
        keys[l] = kp + at;
        vals[l] = vp + at;
      }
      for (int64_t j = 0; j < group * d; ++j) qf[j] = to_f(qp[(s * h + g * group) * d + j]);
      p.resize(group * n);
      // Query heads in tiles of kTile: each key row is read once per tile, into kTile
      // accumulators, and each value element once per tile, with the tile's kTile output
      // lanes in registers across the keys.
      for (int64_t j0 = 0; j0 < group; j0 += kTile) {
        const int64_t nt = std::min(kTile, group - j0);
        const float* qt = qf.data() + j0 * d;
        for (int64_t l = 0; l < n; ++l) {
          fVec a[kTile];
          for (int64_t t = 0; t < kTile; ++t) a[t] = fVec(0.0f);
          int64_t i = 0;
          for (; i + kVec <= d; i += kVec) {
            const fVec kv = load_f(keys[l] + i);
            for (int64_t t = 0; t < nt; ++t) a[t] = at::vec::fmadd(fVec::loadu(qt + t * d + i), kv, a[t]);
          }
          for (int64_t t = 0; t < nt; ++t) {
            float dot_t = lane_sum(a[t]);
            for (int64_t r = i; r < d; ++r) dot_t += qt[t * d + r] * to_f(keys[l][r]);
            p[(j0 + t) * n + l] = dot_t * sc;
          }
        }
        for (int64_t t = 0; t < nt; ++t) {
          float* row = p.data() + (j0 + t) * n;
          total[j0 + t] = exp_shifted(row, n, *std::max_element(row, row + n));
        }
        int64_t i = 0;
        for (; i + kVec <= d; i += kVec) {
          fVec a[kTile];
          for (int64_t t = 0; t < kTile; ++t) a[t] = fVec(0.0f);
          for (int64_t l = 0; l < n; ++l) {
            const fVec vv = load_f(vals[l] + i);
            for (int64_t t = 0; t < nt; ++t)
              a[t] = at::vec::fmadd(fVec(p[(j0 + t) * n + l]), vv, a[t]);
          }
          for (int64_t t = 0; t < nt; ++t) a[t].store(acc.data() + (j0 + t) * d + i);
        }
        for (; i < d; ++i)
          for (int64_t t = 0; t < nt; ++t) {
            float sum = 0.0f;
            for (int64_t l = 0; l < n; ++l) sum += p[(j0 + t) * n + l] * to_f(vals[l][i]);
            acc[(j0 + t) * d + i] = sum;
          }
      }
      for (int64_t j = 0; j < group; ++j) {
        const float inv = total[j] > 0 ? 1.0f / total[j] : 0.0f;
        T* o = op + (s * h + g * group + j) * d;
        for (int64_t i = 0; i < d; ++i) o[i] = static_cast<T>(acc[j * d + i] * inv);
      }
    }
  });
}

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                  const at::Tensor& v_cache, const at::Tensor& block_tables,
                                  const at::Tensor& context_lens, int64_t window,
                                  double scale) {
  for (const at::Tensor* x : {&q, &k_cache, &v_cache}) {
    check_storage(*x, "paged_decode_attention");
    TORCH_CHECK(x->scalar_type() == q.scalar_type(), "paged_decode_attention: mixed dtypes");
  }
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes() &&
                  k_cache.size(3) == q.size(2) && q.size(1) % k_cache.size(2) == 0,
              "paged_decode_attention: q [B, H, D] against caches [N, bs, K, D], K | H");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && block_tables.is_contiguous() &&
                  block_tables.dim() == 2 && block_tables.size(0) == q.size(0),
              "paged_decode_attention: block_tables must be int64 [B, nb]");
  TORCH_CHECK(context_lens.scalar_type() == at::kLong && context_lens.is_contiguous() &&
                  context_lens.numel() == q.size(0),
              "paged_decode_attention: context_lens must be int64 [B]");
  at::Tensor out = at::empty_like(q);
  if (q.size(0) == 0) return out;
  TORCH_CHECK(in_range(context_lens, 1, block_tables.size(1) * k_cache.size(1)),
              "paged_decode_attention: a context is empty or longer than its block table");
  TORCH_CHECK(in_range(block_tables, 0, k_cache.size(0) - 1),
              "paged_decode_attention: block id out of range");
  if (q.scalar_type() == at::kBFloat16)
    decode_attention_impl<c10::BFloat16>(q, k_cache, v_cache, block_tables, context_lens, window,
                                         scale, out);
  else
    decode_attention_impl<float>(q, k_cache, v_cache, block_tables, context_lens, window, scale,
                                 out);
  return out;
}

#if defined(__AVX512BF16__)
// out[b, n] = x[b, :] . w[n, :] for B <= 4 rows of x: bf16 in, fp32 sums (AVX512-BF16 dot
// products), rounded to bf16 once. For B = 1 the product is a pure stream of w; oneDNN's
// kernels read it at about 11 GB/s on one core here where a plain read reaches 14, and the
// software prefetch PREFETCH_BYTES ahead of each of the four rows in flight closes that gap.
constexpr int64_t PREFETCH_BYTES = 8192;

template <int B>
void gemv_rows(const c10::BFloat16* x, const c10::BFloat16* w, c10::BFloat16* out, int64_t n0,
               int64_t n1, int64_t k, int64_t n_total) {
  const int64_t chunks = k / 32;  // 32 bf16 per 512-bit load
  const char* wb = reinterpret_cast<const char*>(w);
  for (int64_t n = n0; n < n1; n += 4) {
    const int rows = static_cast<int>(std::min<int64_t>(4, n1 - n));
    __m512 acc[4][B];
    for (int r = 0; r < 4; ++r)
      for (int b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c) {
      for (int r = 0; r < 4; ++r)
        _mm_prefetch(wb + ((n + r) * k + c * 32) * 2 + PREFETCH_BYTES, _MM_HINT_T0);
      __m512bh xv[B];
      for (int b = 0; b < B; ++b)
        xv[b] = (__m512bh)_mm512_loadu_si512(x + b * k + c * 32);
      for (int r = 0; r < rows; ++r) {
        const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + (n + r) * k + c * 32);
        for (int b = 0; b < B; ++b) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], wv, xv[b]);
      }
    }
    for (int r = 0; r < rows; ++r)
      for (int b = 0; b < B; ++b)
        out[b * n_total + n + r] = c10::BFloat16(_mm512_reduce_add_ps(acc[r][b]));
  }
}

at::Tensor gemv_bf16(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16,
              "gemv_bf16: bf16 only");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous() && x.dim() == 2 && w.dim() == 2 &&
                  x.size(1) == w.size(1) && x.size(1) % 32 == 0 && x.size(0) <= 4,
              "gemv_bf16: x [B <= 4, K] and w [N, K], contiguous, K a multiple of 32");
  const int64_t b = x.size(0), k = x.size(1), n = w.size(0);
  at::Tensor out = at::empty({b, n}, x.options());
  if (b == 0 || n == 0) return out;
  const auto* xp = x.data_ptr<c10::BFloat16>();
  const auto* wp = w.data_ptr<c10::BFloat16>();
  auto* op = out.data_ptr<c10::BFloat16>();
  const int64_t quads = (n + 3) / 4;
  at::parallel_for(0, quads, 64, [&](int64_t q0, int64_t q1) {
    const int64_t n0 = q0 * 4, n1 = std::min(n, q1 * 4);
    switch (b) {
      case 1: gemv_rows<1>(xp, wp, op, n0, n1, k, n); break;
      case 2: gemv_rows<2>(xp, wp, op, n0, n1, k, n); break;
      case 3: gemv_rows<3>(xp, wp, op, n0, n1, k, n); break;
      default: gemv_rows<4>(xp, wp, op, n0, n1, k, n); break;
    }
  });
  return out;
}
#endif  // __AVX512BF16__

}  // namespace

TORCH_LIBRARY(polyhead, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("gelu_tanh_mul(Tensor gate_up) -> Tensor");
  m.def(
      "add_rms_norm(Tensor(a!) residual, Tensor update, Tensor post_weight, Tensor weight, "
      "float eps) -> Tensor");
  m.def(
      "qk_norm_rope(Tensor qkv, Tensor q_weight, Tensor k_weight, Tensor cos, Tensor sin, "
      "float eps, int num_heads, int num_kv_heads, Tensor(a!) k_cache, Tensor(b!) v_cache, "
      "Tensor slot_mapping) -> (Tensor, Tensor, Tensor)");
  m.def(
      "paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
      "Tensor context_lens, int window, float scale) -> Tensor");
#if defined(__AVX512BF16__)
  m.def("gemv_bf16(Tensor x, Tensor w) -> Tensor");
#endif
}

TORCH_LIBRARY_IMPL(polyhead, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("gelu_tanh_mul", &gelu_tanh_mul);
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("qk_norm_rope", &qk_norm_rope);
  m.impl("paged_decode_attention", &paged_decode_attention);
#if defined(__AVX512BF16__)
  m.impl("gemv_bf16", &gemv_bf16);
#endif
}
