// Products of a few rows against weights stored as integer groups of 32 along K, the layouts
// GGUF's Q8_0 / Q5_0 / Q4_K blocks hold:
//
//   w[n, k] = scale[n, k / 32] * q[n, k] + offset[n, k / 32]      (offset: Q4_K's minimum)
//
// with q an int8 (Q8_0), a 5-bit value in [-16, 15] (Q5_0) or a 4-bit one in [0, 15] (Q4_K).
// 4- and 5-bit values are packed as the file packs them: per group, 16 bytes whose low
// nibbles hold values 0..15 and high nibbles values 16..31, and for 5 bits a 32-bit mask of
// each value's fifth bit (q = nibble + 16 * bit - 16).
//
// At one client the step is memory-bound, so its time is the bytes it reads: a Q8_0 row of
// 640 values is 680 bytes, Q5_0 440, where bf16 is 1280. Each group of x is quantised to int16
// with its own scale (max |x| / 32767: a relative error of 2^-15, far below the bf16
// activations' own 2^-8), so the inner product is exact integer arithmetic (vpmaddwd: weights
// widened to int16, pairs summed into int32, no overflow for |q| <= 127), scaled once per
// group in fp32. The offset term needs only x's plain sum per group: sum_k offset * x =
// offset * sum(x).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__AVX512BW__)
#include <immintrin.h>

namespace {

constexpr int64_t kGroup = 32;
constexpr int64_t kMaxRows = 4;           // rows of x per pass over the weight
constexpr int64_t kMaxGroups = 512;       // K <= 16384

// x [B, K] as integer groups: x ~ xq * xd, with each group's exact sum xs and the sum of its
// integers sq (exact in fp32: |sq| <= 32 * 32767). Q: int16 for the vpmaddwd path, int8 for
// vpdpbusd; the scale is max |x| / Q's largest value.
template <typename Q>
struct QuantX {
  using value_type = Q;
  std::vector<Q> xq;       // [B, K]
  std::vector<float> xd;   // [B, K / 32]
  std::vector<float> xs;   // [B, K / 32]
  std::vector<float> sq;   // [B, K / 32]
};

template <typename Q, typename T>
QuantX<Q> quantise_x(const T* x, int64_t b, int64_t k) {
  const int64_t groups = k / kGroup;
  QuantX<Q> out{std::vector<Q>(b * k), std::vector<float>(b * groups),
                std::vector<float>(b * groups), std::vector<float>(b * groups)};
  for (int64_t i = 0; i < b * groups; ++i) {
    const T* g = x + i * kGroup;
    float amax = 0.f, sum = 0.f;
    for (int64_t j = 0; j < kGroup; ++j) {
      const float v = static_cast<float>(g[j]);
      amax = std::max(amax, std::fabs(v));
      sum += v;
    }
    const float d = amax / static_cast<float>(std::numeric_limits<Q>::max());
    const float inv = d > 0.f ? 1.f / d : 0.f;
    int32_t isum = 0;
    for (int64_t j = 0; j < kGroup; ++j) {
      const Q q = static_cast<Q>(std::lrintf(static_cast<float>(g[j]) * inv));
      out.xq[i * kGroup + j] = q;
      isum += q;
    }
    out.xd[i] = d;
    out.xs[i] = sum;
    out.sq[i] = static_cast<float>(isum);
  }
  return out;
}

inline __m512 load_scales(const float* s, __mmask16 m) { return _mm512_maskz_loadu_ps(m, s); }
inline __m512 load_scales(const c10::Half* s, __mmask16 m) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, s));  // F16C widening, 16 at a time
}

// One group of 32 weights widened to int16. kBits 8: w points at 32 int8; 4 and 5: at 16
// bytes of nibbles (values j and j + 16 in byte j), and for 5 bits `high` at the group's
// fifth-bit mask.
template <int kBits>
inline __m512i load_group(const uint8_t* w, const uint8_t* high) {
  if constexpr (kBits == 8) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
  } else {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
    const __m128i low4 = _mm_set1_epi8(0x0F);
    const __m256i u = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_and_si128(b, low4)),
        _mm_and_si128(_mm_srli_epi16(b, 4), low4), 1);
    const __m512i v = _mm512_cvtepu8_epi16(u);
    if constexpr (kBits == 4) return v;
    uint32_t bits;
    std::memcpy(&bits, high, 4);
    // q = nibble + 16 * bit - 16: subtract 16 where the fifth bit is clear.
    return _mm512_mask_sub_epi16(v, static_cast<__mmask32>(~bits), v, _mm512_set1_epi16(16));
  }
}

constexpr int64_t group_bytes(int bits) { return bits == 8 ? kGroup : kGroup / 2; }

// Row n of out [B, N] (fp32). The row's groups are read in order, one row after the other: a
// plain sequential stream, which the hardware prefetchers run at the full read bandwidth.
// (Interleaving four rows, as a GEMV often does, read at a third of it on a Zen 4 core.)
// kAcc independent accumulators per row of x hide the FMA latency. sx holds each (x row,
// group)'s combined scale, widened and multiplied up front, so per group the loop does one
// widening load, then per row of x one vpmaddwd, one conversion and one FMA.
template <int B, int kBits, typename S>
void row_q(const QuantX<int16_t>& x, const uint8_t* q, const uint8_t* high, const S* scale,
           const float* offset, float* out, int64_t n, int64_t k, int64_t n_total) {
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
  const uint8_t* w = q + n * groups * group_bytes(kBits);
  const uint8_t* h = kBits == 5 ? high + n * groups * 4 : nullptr;
  __m512 acc[B][kAcc];
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < kAcc; ++j) acc[b][j] = _mm512_setzero_ps();
  auto group = [&](int64_t c, int j) {
    const __m512i wv = load_group<kBits>(w + c * group_bytes(kBits), h ? h + c * 4 : nullptr);
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

#if defined(__AVX512VNNI__)
// Where the CPU has AVX512-VNNI (Zen 4, Ice Lake and later), one vpdpbusd multiplies 64
// unsigned weight bytes by 64 signed activation bytes and sums each four into an int32 lane:
// two groups per instruction, where the int16 path above needs a widening, a vpmaddwd and a
// conversion per group, and is bound by those instructions rather than by memory. x is then
// quantised to int8 per group (max |x| / 127, as llama.cpp quantises its activations), and
// every weight is read as an unsigned u = q + z (z: 128 for int8, 16 for 5 bits, 0 for 4);
// the z * sum(xq) each group owes is subtracted once per row.

// Two consecutive groups' 64 weights as unsigned bytes u = q + z, in value order.
template <int kBits>
inline __m512i load_pair_u8(const uint8_t* w, const uint8_t* high) {
  if constexpr (kBits == 8) {
    return _mm512_xor_si512(_mm512_loadu_si512(w), _mm512_set1_epi8(static_cast<char>(0x80)));
  } else {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i lo = _mm256_and_si256(b, low4);                        // [A 0-15, B 0-15]
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), low4);  // [A 16-31, B 16-31]
    __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    v = _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(3, 1, 2, 0));  // [A 0-15, A 16-31, B ..., B ...]
    if constexpr (kBits == 5) {
      uint64_t bits;
      std::memcpy(&bits, high, 8);
      v = _mm512_mask_add_epi8(v, static_cast<__mmask64>(bits), v, _mm512_set1_epi8(16));
    }
    return v;
  }
}

// One group (a tail): its 32 weights as unsigned bytes in the low half, zeros above.
template <int kBits>
inline __m512i load_one_u8(const uint8_t* w, const uint8_t* high) {
  if constexpr (kBits == 8) {
    const __m256i v = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)),
                                       _mm256_set1_epi8(static_cast<char>(0x80)));
    return _mm512_zextsi256_si512(v);
  } else {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
    const __m128i low4 = _mm_set1_epi8(0x0F);
    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(b, low4)),
                                        _mm_and_si128(_mm_srli_epi16(b, 4), low4), 1);
    if constexpr (kBits == 5) {
      uint32_t bits;
      std::memcpy(&bits, high, 4);
      v = _mm256_mask_add_epi8(v, static_cast<__mmask32>(bits), v, _mm256_set1_epi8(16));
    }
    return _mm512_zextsi256_si512(v);
  }
}

constexpr int zero_of(int bits) { return bits == 8 ? 128 : bits == 5 ? 16 : 0; }

template <int B, int kBits, typename S>
void row_vnni(const QuantX<int8_t>& x, const uint8_t* q, const uint8_t* high, const S* scale,
              const float* offset, float* out, int64_t n, int64_t k, int64_t n_total) {
  constexpr int kAcc = B == 1 ? 4 : 2;
  const int64_t groups = k / kGroup;
  alignas(64) float sx[B][kMaxGroups];
  // Per lane, what the row adds besides its dot products: the offsets' sum_g offset[g] *
  // xs[g] minus the z * sum_g sx[g] * sq[g] the unsigned weights owe.
  __m512 extra[B];
  for (int b = 0; b < B; ++b) extra[b] = _mm512_setzero_ps();
  const __m512 minus_z = _mm512_set1_ps(-static_cast<float>(zero_of(kBits)));
  for (int64_t c = 0; c < groups; c += 16) {
    const __mmask16 m = static_cast<__mmask16>((1u << std::min<int64_t>(16, groups - c)) - 1);
    const __m512 s = load_scales(scale + n * groups + c, m);
    const __m512 off = offset != nullptr ? _mm512_maskz_loadu_ps(m, offset + n * groups + c)
                                         : _mm512_setzero_ps();
    for (int b = 0; b < B; ++b) {
      const __m512 v = _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, &x.xd[b * groups + c]));
      _mm512_mask_storeu_ps(&sx[b][c], m, v);
      if constexpr (zero_of(kBits) != 0)
        extra[b] = _mm512_fmadd_ps(_mm512_mul_ps(v, minus_z),
                                   _mm512_maskz_loadu_ps(m, &x.sq[b * groups + c]), extra[b]);
      if (offset != nullptr)
        extra[b] = _mm512_fmadd_ps(off, _mm512_maskz_loadu_ps(m, &x.xs[b * groups + c]),
                                   extra[b]);
    }
  }
  const int8_t* xq = x.xq.data();
  const uint8_t* w = q + n * groups * group_bytes(kBits);
  const uint8_t* h = kBits == 5 ? high + n * groups * 4 : nullptr;
  const __m512i halves = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  __m512 acc[B][kAcc];
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < kAcc; ++j) acc[b][j] = _mm512_setzero_ps();
  auto pair = [&](int64_t c, int j) {  // groups c and c + 1
    const __m512i wv = load_pair_u8<kBits>(w + c * group_bytes(kBits), h ? h + c * 4 : nullptr);
    for (int b = 0; b < B; ++b) {
      const __m512i xv = _mm512_loadu_si512(xq + b * k + c * kGroup);
      const __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, xv));
      // lanes 0-7 are group c, 8-15 group c + 1
      const __m512 sv = _mm512_permutexvar_ps(
          halves, _mm512_castpd_ps(_mm512_castpd128_pd512(_mm_load_sd(
                      reinterpret_cast<const double*>(&sx[b][c])))));
      acc[b][j] = _mm512_fmadd_ps(dot, sv, acc[b][j]);
    }
  };
  int64_t c = 0;
  for (; c + 2 * kAcc <= groups; c += 2 * kAcc)
    for (int j = 0; j < kAcc; ++j) pair(c + 2 * j, j);
  for (; c + 2 <= groups; c += 2) pair(c, 0);
  if (c < groups) {  // an odd group out
    const __m512i wv = load_one_u8<kBits>(w + c * group_bytes(kBits), h ? h + c * 4 : nullptr);
    for (int b = 0; b < B; ++b) {
      const __m512i xv = _mm512_zextsi256_si512(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * k + c * kGroup)));
      const __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, xv));
      acc[b][0] = _mm512_fmadd_ps(dot, _mm512_set1_ps(sx[b][c]), acc[b][0]);
    }
  }
  for (int b = 0; b < B; ++b) {
    __m512 sum = extra[b];
    for (int j = 0; j < kAcc; ++j) sum = _mm512_add_ps(sum, acc[b][j]);
    out[b * n_total + n] = _mm512_reduce_add_ps(sum);
  }
}
#endif  // __AVX512VNNI__

#if defined(__AVX512VNNI__)
using XGroups = QuantX<int8_t>;
#define POLYHEAD_ROW row_vnni
#else
using XGroups = QuantX<int16_t>;
#define POLYHEAD_ROW row_q
#endif

template <int B, int kBits, typename S>
void span_q(const XGroups& x, const uint8_t* q, const uint8_t* high, const S* scale,
            const float* offset, float* out, int64_t n0, int64_t n1, int64_t k, int64_t n_total) {
  for (int64_t n = n0; n < n1; ++n)
    POLYHEAD_ROW<B, kBits>(x, q, high, scale, offset, out, n, k, n_total);
}

template <int kBits, typename S>
void product(const XGroups& x, int64_t b, const uint8_t* q, const uint8_t* high, const S* scale,
             const float* offset, float* out, int64_t n, int64_t k) {
  const int64_t quads = (n + 3) / 4;
  at::parallel_for(0, quads, 64, [&](int64_t q0, int64_t q1) {
    const int64_t n0 = q0 * 4, n1 = std::min(n, q1 * 4);
    switch (b) {
      case 1: span_q<1, kBits>(x, q, high, scale, offset, out, n0, n1, k, n); break;
      case 2: span_q<2, kBits>(x, q, high, scale, offset, out, n0, n1, k, n); break;
      case 3: span_q<3, kBits>(x, q, high, scale, offset, out, n0, n1, k, n); break;
      default: span_q<4, kBits>(x, q, high, scale, offset, out, n0, n1, k, n); break;
    }
  });
}

template <int kBits>
void product_any_scale(const XGroups& x, int64_t b, const uint8_t* q, const uint8_t* high,
                       const at::Tensor& scale, const float* offset, float* out, int64_t n,
                       int64_t k) {
  if (scale.scalar_type() == at::kHalf)
    product<kBits>(x, b, q, high, scale.data_ptr<c10::Half>(), offset, out, n, k);
  else
    product<kBits>(x, b, q, high, scale.data_ptr<float>(), offset, out, n, k);
}

// x [B, K] (bf16 or fp32) against integer rows of `bits` (8: q int8 [N, K]; 4 or 5: q uint8
// [N, K/2] nibbles, and for 5 `high` uint8 [N, K/8]) with scale [N, K/32] (fp16 or fp32) and
// offset [N, K/32] (fp32, or an empty tensor for none) -> [B, N] in x's dtype. More than
// kMaxRows rows of x take several passes over the weight.
at::Tensor gemv_groups(const at::Tensor& x, const at::Tensor& q, const at::Tensor& high,
                       const at::Tensor& scale, const at::Tensor& offset, int64_t bits) {
  TORCH_CHECK(bits == 8 || bits == 5 || bits == 4, "gemv_groups: bits must be 8, 5 or 4");
  const int64_t k = x.size(1), n = q.size(0), groups = k / kGroup;
  TORCH_CHECK(x.dim() == 2 && q.dim() == 2 && k % kGroup == 0 &&
                  q.size(1) * kGroup == k * group_bytes(static_cast<int>(bits)),
              "gemv_groups: x [B, K] against q [N, K] (8 bits) or [N, K/2] (4, 5), K a multiple "
              "of 32");
  TORCH_CHECK(k <= kMaxGroups * kGroup, "gemv_groups: K at most ", kMaxGroups * kGroup);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat,
              "gemv_groups: x must be bf16 or fp32");
  TORCH_CHECK(q.scalar_type() == (bits == 8 ? at::kChar : at::kByte) && q.is_contiguous(),
              "gemv_groups: q int8 (8 bits) or uint8 (4, 5), contiguous");
  TORCH_CHECK(bits != 5 || (high.scalar_type() == at::kByte && high.is_contiguous() &&
                            high.dim() == 2 && high.size(0) == n && high.size(1) == groups * 4),
              "gemv_groups: 5 bits need high uint8 [N, K/8], contiguous");
  TORCH_CHECK(scale.is_contiguous() && scale.dim() == 2 && scale.size(0) == n &&
                  scale.size(1) == groups &&
                  (scale.scalar_type() == at::kHalf || scale.scalar_type() == at::kFloat),
              "gemv_groups: scale [N, K/32], fp16 or fp32, contiguous");
  const bool has_offset = offset.numel() > 0;
  TORCH_CHECK(!has_offset || (offset.scalar_type() == at::kFloat && offset.is_contiguous() &&
                              offset.sizes() == scale.sizes()),
              "gemv_groups: offset [N, K/32] fp32 contiguous, or empty");
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty({x.size(0), n}, x.options().dtype(at::kFloat));
  const uint8_t* qp = static_cast<const uint8_t*>(q.data_ptr());
  const uint8_t* hp = bits == 5 ? high.data_ptr<uint8_t>() : nullptr;
  const float* op = has_offset ? offset.data_ptr<float>() : nullptr;
  for (int64_t lo = 0; lo < x.size(0); lo += kMaxRows) {
    const int64_t b = std::min(kMaxRows, x.size(0) - lo);
    const XGroups qx = xc.scalar_type() == at::kFloat
                           ? quantise_x<XGroups::value_type>(xc.data_ptr<float>() + lo * k, b, k)
                           : quantise_x<XGroups::value_type>(xc.data_ptr<c10::BFloat16>() + lo * k,
                                                             b, k);
    float* dst = out.data_ptr<float>() + lo * n;
    if (bits == 8) product_any_scale<8>(qx, b, qp, hp, scale, op, dst, n, k);
    else if (bits == 5) product_any_scale<5>(qx, b, qp, hp, scale, op, dst, n, k);
    else product_any_scale<4>(qx, b, qp, hp, scale, op, dst, n, k);
  }
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

// How many bits each activation is quantised to: 8 on the VNNI path, 16 otherwise.
int64_t gemv_groups_activation_bits() {
#if defined(__AVX512VNNI__)
  return 8;
#else
  return 16;
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(polyhead, m) {
  m.def("gemv_groups(Tensor x, Tensor q, Tensor high, Tensor scale, Tensor offset, int bits) -> Tensor");
  // no tensor argument to dispatch on: a catch-all kernel
  m.def("gemv_groups_activation_bits() -> int", &gemv_groups_activation_bits);
}

TORCH_LIBRARY_IMPL(polyhead, CPU, m) { m.impl("gemv_groups", &gemv_groups); }

#endif  // __AVX512BW__
