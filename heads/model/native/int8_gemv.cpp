// Products of a few rows against weights stored as int8 groups of 32 along K, the layout
// GGUF's Q8_0 / Q5_0 / Q4_K blocks dequantise to:
//
//   w[n, k] = scale[n, k / 32] * q[n, k] + offset[n, k / 32]      (offset: Q4_K's minimum)
//
// At one client the step is memory-bound, so its time is the bytes it reads: a Q8_0 row of
// 640 values is 680 bytes where bf16 is 1280. Each group of x is quantised to int16 with its
// own scale (max |x| / 32767: a relative error of 2^-15, far below the bf16 activations' own
// 2^-8), so the inner product is exact integer arithmetic (vpmaddwd: int8 weights widened to
// int16, pairs summed into int32, no overflow for |q| <= 127), scaled once per group in fp32.
// The offset term needs only x's plain sum per group: sum_k offset * x = offset * sum(x).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__AVX512BW__)
#include <immintrin.h>

namespace {

constexpr int64_t kGroup = 32;
constexpr int64_t kMaxRows = 4;           // rows of x per pass over the weight
constexpr int64_t kMaxGroups = 512;       // K <= 16384

struct QuantX {  // x [B, K] as int16 groups: x ~ xq * xd, with each group's exact sum xs
  std::vector<int16_t> xq;  // [B, K]
  std::vector<float> xd;    // [B, K / 32]
  std::vector<float> xs;    // [B, K / 32]
};

template <typename T>
QuantX quantise_x(const T* x, int64_t b, int64_t k) {
  const int64_t groups = k / kGroup;
  QuantX out{std::vector<int16_t>(b * k), std::vector<float>(b * groups),
             std::vector<float>(b * groups)};
  for (int64_t i = 0; i < b * groups; ++i) {
    const T* g = x + i * kGroup;
    float amax = 0.f, sum = 0.f;
    for (int64_t j = 0; j < kGroup; ++j) {
      const float v = static_cast<float>(g[j]);
      amax = std::max(amax, std::fabs(v));
      sum += v;
    }
    const float d = amax / 32767.f;
    const float inv = d > 0.f ? 1.f / d : 0.f;
    for (int64_t j = 0; j < kGroup; ++j)
      out.xq[i * kGroup + j] = static_cast<int16_t>(std::lrintf(static_cast<float>(g[j]) * inv));
    out.xd[i] = d;
    out.xs[i] = sum;
  }
  return out;
}

inline __m512 load_scales(const float* s, __mmask16 m) { return _mm512_maskz_loadu_ps(m, s); }
inline __m512 load_scales(const c10::Half* s, __mmask16 m) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, s));  // F16C widening, 16 at a time
}

// Row n of out [B, N] (fp32). The row's groups are read in order, one row after the other: a
// plain sequential stream, which the hardware prefetchers run at the full read bandwidth.
// (Interleaving four rows, as a GEMV often does, read at a third of it on a Zen 4 core.)
// kAcc independent accumulators per row of x hide the FMA latency. sx holds each (x row,
// group)'s combined scale, widened and multiplied up front, so per group the loop does one
// widening load, then per row of x one vpmaddwd, one conversion and one FMA.
template <int B, typename S>
void row_q8(const QuantX& x, const int8_t* q, const S* scale, const float* offset, float* out,
            int64_t n, int64_t k, int64_t n_total) {
  constexpr int kAcc = B == 1 ? 4 : 2;
  const int64_t groups = k / kGroup;
  alignas(64) float sx[B][kMaxGroups];
  for (int64_t c = 0; c < groups; c += 16) {
    const __mmask16 m = static_cast<__mmask16>((1u << std::min<int64_t>(16, groups - c)) - 1);
    const __m512 s = load_scales(scale + n * groups + c, m);
    for (int b = 0; b < B; ++b)
      _mm512_mask_storeu_ps(&sx[b][c], m,
                            _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, &x.xd[b * groups + c])));
  }
  const int16_t* xq = x.xq.data();
  const int8_t* w = q + n * k;
  __m512 acc[B][kAcc];
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < kAcc; ++j) acc[b][j] = _mm512_setzero_ps();
  auto group = [&](int64_t c, int j) {
    const __m512i wv =
        _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + c * kGroup)));
    for (int b = 0; b < B; ++b) {
      const __m512i xv = _mm512_loadu_si512(xq + b * k + c * kGroup);
      const __m512 dot = _mm512_cvtepi32_ps(_mm512_madd_epi16(wv, xv));
      acc[b][j] = _mm512_fmadd_ps(dot, _mm512_set1_ps(sx[b][c]), acc[b][j]);
    }
  };
  int64_t c = 0;
  for (; c + kAcc <= groups; c += kAcc)
    for (int j = 0; j < kAcc; ++j) group(c + j, j);
  for (; c < groups; ++c) group(c, 0);
  for (int b = 0; b < B; ++b) {
    __m512 sum = acc[b][0];
    for (int j = 1; j < kAcc; ++j) sum = _mm512_add_ps(sum, acc[b][j]);
    float v = _mm512_reduce_add_ps(sum);
    if (offset != nullptr)
      for (int64_t g = 0; g < groups; ++g) v += offset[n * groups + g] * x.xs[b * groups + g];
    out[b * n_total + n] = v;
  }
}

template <int B, typename S>
void span_q8(const QuantX& x, const int8_t* q, const S* scale, const float* offset, float* out,
             int64_t n0, int64_t n1, int64_t k, int64_t n_total) {
  for (int64_t n = n0; n < n1; ++n) row_q8<B>(x, q, scale, offset, out, n, k, n_total);
}

template <typename S>
void product(const QuantX& x, int64_t b, const int8_t* q, const S* scale, const float* offset,
             float* out, int64_t n, int64_t k) {
  const int64_t quads = (n + 3) / 4;
  at::parallel_for(0, quads, 64, [&](int64_t q0, int64_t q1) {
    const int64_t n0 = q0 * 4, n1 = std::min(n, q1 * 4);
    switch (b) {
      case 1: span_q8<1>(x, q, scale, offset, out, n0, n1, k, n); break;
      case 2: span_q8<2>(x, q, scale, offset, out, n0, n1, k, n); break;
      case 3: span_q8<3>(x, q, scale, offset, out, n0, n1, k, n); break;
      default: span_q8<4>(x, q, scale, offset, out, n0, n1, k, n); break;
    }
  });
}

// x [B, K] (bf16 or fp32) against int8 rows q [N, K] with scale [N, K/32] (fp16 or fp32) and
// offset [N, K/32] (fp32, or an empty tensor for none) -> [B, N] in x's dtype. More than
// kMaxRows rows of x take several passes over the weight.
at::Tensor gemv_int8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                     const at::Tensor& offset) {
  TORCH_CHECK(x.dim() == 2 && q.dim() == 2 && x.size(1) == q.size(1) && x.size(1) % kGroup == 0,
              "gemv_int8: x [B, K] against q [N, K], K a multiple of 32");
  TORCH_CHECK(x.size(1) <= kMaxGroups * kGroup, "gemv_int8: K at most ", kMaxGroups * kGroup);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat,
              "gemv_int8: x must be bf16 or fp32");
  TORCH_CHECK(q.scalar_type() == at::kChar && q.is_contiguous(), "gemv_int8: q int8, contiguous");
  const int64_t n = q.size(0), k = q.size(1), groups = k / kGroup;
  TORCH_CHECK(scale.is_contiguous() && scale.dim() == 2 && scale.size(0) == n &&
                  scale.size(1) == groups &&
                  (scale.scalar_type() == at::kHalf || scale.scalar_type() == at::kFloat),
              "gemv_int8: scale [N, K/32], fp16 or fp32, contiguous");
  const bool has_offset = offset.numel() > 0;
  TORCH_CHECK(!has_offset || (offset.scalar_type() == at::kFloat && offset.is_contiguous() &&
                              offset.sizes() == scale.sizes()),
              "gemv_int8: offset [N, K/32] fp32 contiguous, or empty");
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty({x.size(0), n}, x.options().dtype(at::kFloat));
  const int8_t* qp = q.data_ptr<int8_t>();
  const float* op = has_offset ? offset.data_ptr<float>() : nullptr;
  for (int64_t lo = 0; lo < x.size(0); lo += kMaxRows) {
    const int64_t b = std::min(kMaxRows, x.size(0) - lo);
    const QuantX qx = xc.scalar_type() == at::kFloat
                          ? quantise_x(xc.data_ptr<float>() + lo * k, b, k)
                          : quantise_x(xc.data_ptr<c10::BFloat16>() + lo * k, b, k);
    float* dst = out.data_ptr<float>() + lo * n;
    if (scale.scalar_type() == at::kHalf)
      product(qx, b, qp, scale.data_ptr<c10::Half>(), op, dst, n, k);
    else
      product(qx, b, qp, scale.data_ptr<float>(), op, dst, n, k);
  }
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(polyhead, m) {
  m.def("gemv_int8(Tensor x, Tensor q, Tensor scale, Tensor offset) -> Tensor");
}

TORCH_LIBRARY_IMPL(polyhead, CPU, m) { m.impl("gemv_int8", &gemv_int8); }

#endif  // __AVX512BW__
