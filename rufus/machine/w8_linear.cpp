// int8 weight-only linear layer for the planner's CPU decoder (rufus/machine/int8_kernel.py
// builds and loads this file; the reasons and measurements are there and in docs/benchmarks.md).
//
//   y[M, N] = x[M, K] @ (q[N, K] * s[N])^T      x, y, s: float32; q: int8
//
// Integer arithmetic: each activation row is quantized to int16 (symmetric, its own scale
// max|x| / 32767, round to nearest), the int8 weights are sign-extended to int16 in registers,
// and products are summed in int32 by vpmaddwd (two k's per 32-bit lane), 16 (AVX2) or 32
// (AVX-512) multiply-adds per instruction: twice the float32 FMA's, and the passes of several
// rows (Medusa tree verification) are bound by this arithmetic on AVX2. The int32 sums are
// exact (blocks of KB k's cannot overflow), each block converted to float32 and added in
// k order, then scaled by the row's and the output channel's scales. So a row's result
// depends only on that row (its scale, exact integer sums, a fixed order of float32 adds),
// never on the other rows of the pass, their blocking or the thread count: Medusa's multi-row
// verification passes reproduce one-row greedy decoding exactly (the planner's losslessness).
// The activation rounding adds a relative error of about 2^-16 of the row's largest value per
// element, far below the int8 weights' own.
//
// q is pre-packed by int8_kernel.pack() in tiles of NT = 2 * VW weight rows, each tile stored
// k-pair-major with the pair's two k's of a weight row adjacent ([N/NT][K/2][NT][2]): a pass
// reads the weights as one sequential stream (the hardware prefetcher's best case), and each
// k-pair's 2 * NT weights are two loads, sign-extended so that every 32-bit lane holds
// (q[n][k], q[n][k+1]), multiplied by every activation row's (x[k], x[k+1]) broadcast
// (outer-product form: no horizontal sums, each weight vector serves MB rows).
//
// Compiled per CPU class: -mavx2 -mfma (VW 8) or -mavx512f -mavx512bw -mavx512vl (VW 16;
// with -mavx512vnni the multiply and the add are one vpdpwssd, the same integer sums).
// Parallel over weight tiles with OpenMP; linked against the libgomp torch has loaded,
// so it shares torch's thread pool.
//
// The AVX-512 VNNI build also has int8 activations (w8a8_linear, w8a8_forward; below
// linear()): rows rounded to int8, vpdpbusd on weights packed by quads of k, for the
// planner's passes of many rows. The same rule: a row's result depends on that row alone.
#include <immintrin.h>
#include <stdint.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#if defined(__AVX512F__)
#define VW 16
#define MB_MAX 12
typedef __m512 vf;
typedef __m512i vi;
// 2 * VW int8 weights (VW columns x a k-pair) -> int16, one (q[n][k], q[n][k+1]) per lane
static inline vi ld_w(const int8_t* p) {
  return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)p));
}
static inline vi set1_i(int32_t a) { return _mm512_set1_epi32(a); }
static inline vi izero_() { return _mm512_setzero_si512(); }
// acc + (w[2j] * x[2j] + w[2j+1] * x[2j+1]) per 32-bit lane j
static inline vi dot2_(vi acc, vi w, vi x) {
#if defined(__AVX512VNNI__)
  return _mm512_dpwssd_epi32(acc, w, x);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(w, x));
#endif
}
static inline vf cvt_(vi a) { return _mm512_cvtepi32_ps(a); }
static inline vf abs_(vf a) { return _mm512_abs_ps(a); }
static inline void st_q(int16_t* p, vf v) {  // round to nearest, to int16 (saturating)
  _mm256_storeu_si256((__m256i*)p, _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(
      _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))));
}
static inline vf ld_x(const float* p) { return _mm512_loadu_ps(p); }
static inline void st_x(float* p, vf v) { _mm512_storeu_ps(p, v); }
static inline vf fma_(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf zero_() { return _mm512_setzero_ps(); }
static inline float hsum(vf v) { return _mm512_reduce_add_ps(v); }
static inline vf set1_(float a) { return _mm512_set1_ps(a); }
static inline vf mul_(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf add_(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf sub_(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf div_(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf max_(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf min_(vf a, vf b) { return _mm512_min_ps(a, b); }
static inline vf floor_(vf a) {
  return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
}
static inline vf pow2i(vf n) {  // 2^n for integral n in float range
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23));
}
#elif defined(__AVX2__) && defined(__FMA__)
#define VW 8
#define MB_MAX 6
typedef __m256 vf;
typedef __m256i vi;
static inline vi ld_w(const int8_t* p) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)p));
}
static inline vi set1_i(int32_t a) { return _mm256_set1_epi32(a); }
static inline vi izero_() { return _mm256_setzero_si256(); }
static inline vi dot2_(vi acc, vi w, vi x) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(w, x));
}
static inline vf cvt_(vi a) { return _mm256_cvtepi32_ps(a); }
static inline vf abs_(vf a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
static inline void st_q(int16_t* p, vf v) {  // round to nearest, to int16 (saturating)
  const __m256i i = _mm256_cvttps_epi32(
      _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  _mm_storeu_si128((__m128i*)p, _mm256_castsi256_si128(
      _mm256_permute4x64_epi64(_mm256_packs_epi32(i, i), 0xD8)));
}
static inline vf ld_x(const float* p) { return _mm256_loadu_ps(p); }
static inline void st_x(float* p, vf v) { _mm256_storeu_ps(p, v); }
static inline vf fma_(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf zero_() { return _mm256_setzero_ps(); }
static inline float hsum(vf v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}
static inline vf set1_(float a) { return _mm256_set1_ps(a); }
static inline vf mul_(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf add_(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf sub_(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf div_(vf a, vf b) { return _mm256_div_ps(a, b); }
static inline vf max_(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vf min_(vf a, vf b) { return _mm256_min_ps(a, b); }
static inline vf floor_(vf a) { return _mm256_floor_ps(a); }
static inline vf pow2i(vf n) {  // 2^n for integral n in float range
  return _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23));
}
#else
#error "w8_linear needs AVX2 + FMA or AVX-512"
#endif

#define NT (2 * VW)    // output columns per packed tile
#define PREFETCH 4096  // bytes ahead of the weight stream (DRAM latency at one row)
// k's per exact int32 block: |x| <= 32767 and |q| <= 128, so a lane gains at most
// 2 * 32767 * 128 per k-pair, and 256 pairs stay below 2^31
#define KB 512

// One activation row to int16: q = round(x / scale) with scale = max|x| / 32767 (returned).
// An all-zero row (or one whose max|x| < 1e-30, where 32767 / max|x| could overflow) gives
// scale 0; a row holding a NaN or an infinity gives scale NaN (its outputs NaN, as float32
// arithmetic would give).
static inline float quantize_row(const float* x, int16_t* q, int64_t K) {
  vf m = zero_(), bad = zero_();
  for (int64_t i = 0; i < K; i += VW) {
    const vf v = ld_x(x + i);
    m = max_(m, abs_(v));
    bad = add_(bad, mul_(v, zero_()));  // NaN if any element is NaN or infinite
  }
  float r[VW], amax = 0.0f;
  st_x(r, m);
  for (int j = 0; j < VW; j++) amax = r[j] > amax ? r[j] : amax;
  const bool finite = hsum(bad) == 0.0f;
  if (!finite || amax < 1e-30f) {
    memset(q, 0, K * sizeof(int16_t));
    return finite ? 0.0f : NAN;
  }
  const vf inv = set1_(32767.0f / amax);
  for (int64_t i = 0; i < K; i += VW) st_q(q + i, mul_(ld_x(x + i), inv));
  return amax / 32767.0f;
}

// MB quantized activation rows (xq, their scales xs) x one tile of NT outputs (two vectors),
// outer-product form: per k-pair, the tile's 2 * NT weights are loaded (and sign-extended)
// once and multiplied by each row's (x[k], x[k+1]) broadcast. Every output element is an
// exact int32 sum per block of KB k's, the blocks added in float32 in k order, whatever M,
// MB or the thread count.
template <int MB>
static inline void tile(const int16_t* xq, const float* xs, int64_t K, const int8_t* qt,
                        const float* s, float* y, int64_t N, int64_t n0) {
  vf facc[MB][2];
#pragma GCC unroll 16
  for (int i = 0; i < MB; i++) facc[i][0] = facc[i][1] = zero_();
  for (int64_t k0 = 0; k0 < K; k0 += KB) {
    const int64_t k1 = K - k0 < KB ? K : k0 + KB;
    vi acc[MB][2];  // fully unrolled, so the accumulators stay in registers
#pragma GCC unroll 16
    for (int i = 0; i < MB; i++) acc[i][0] = acc[i][1] = izero_();
    for (int64_t k = k0; k < k1; k += 2) {
      const int8_t* p = qt + k * NT;  // this k-pair's 2 * NT weights
      _mm_prefetch((const char*)(p + PREFETCH), _MM_HINT_T0);
      const vi w0 = ld_w(p), w1 = ld_w(p + 2 * VW);
#pragma GCC unroll 16
      for (int i = 0; i < MB; i++) {
        int32_t pair;
        memcpy(&pair, xq + i * K + k, sizeof pair);
        const vi xb = set1_i(pair);
        acc[i][0] = dot2_(acc[i][0], w0, xb);
        acc[i][1] = dot2_(acc[i][1], w1, xb);
        // keeps this row's update here: without it GCC hoists every row's broadcast and
        // product ahead of the adds and spills accumulators (AVX2 has 16 registers)
        asm("" : "+v"(acc[i][0]), "+v"(acc[i][1]));
      }
    }
#pragma GCC unroll 16
    for (int i = 0; i < MB; i++) {
      facc[i][0] = add_(facc[i][0], cvt_(acc[i][0]));
      facc[i][1] = add_(facc[i][1], cvt_(acc[i][1]));
    }
  }
  const vf s0 = ld_x(s + n0), s1 = ld_x(s + n0 + VW);
  if (N - n0 >= NT) {
#pragma GCC unroll 16
    for (int i = 0; i < MB; i++) {
      const vf r = set1_(xs[i]);
      st_x(y + i * N + n0, mul_(facc[i][0], mul_(s0, r)));
      st_x(y + i * N + n0 + VW, mul_(facc[i][1], mul_(s1, r)));
    }
    return;
  }
  float r[NT];  // the last tile: padding columns are computed and not stored
  for (int i = 0; i < MB; i++) {
    const vf rs = set1_(xs[i]);
    st_x(r, mul_(facc[i][0], mul_(s0, rs)));
    st_x(r + VW, mul_(facc[i][1], mul_(s1, rs)));
    for (int64_t j = 0; j < N - n0; j++) y[i * N + n0 + j] = r[j];
  }
}

// the last M % MB_MAX activation rows
template <int MB>
static inline void tail(int64_t r, const int16_t* xq, const float* xs, int64_t K,
                        const int8_t* qt, const float* s, float* y, int64_t N, int64_t n0) {
  if constexpr (MB > 0) {
    if (r == MB) tile<MB>(xq, xs, K, qt, s, y, N, n0);
    else tail<MB - 1>(r, xq, xs, K, qt, s, y, N, n0);
  }
}

// xq [M, K] and xs [M]: scratch for the quantized rows. One arithmetic for every M (a
// prefill's rows go through the same tiles as a decode's), so a row's result never depends
// on the size of its pass.
static void linear(const float* x, const int8_t* qp, const float* s, float* y, int64_t M,
                   int64_t N, int64_t K, int threads, int16_t* xq, float* xs) {
  const int64_t tiles = (N + NT - 1) / NT;
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < M; r++) xs[r] = quantize_row(x + r * K, xq + r * K, K);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
      const int8_t* qt = qp + t * NT * K;
      int64_t m = 0;
      for (; m + MB_MAX <= M; m += MB_MAX)
        tile<MB_MAX>(xq + m * K, xs + m, K, qt, s, y + m * N, N, t * NT);
      tail<MB_MAX - 1>(M - m, xq + m * K, xs + m, K, qt, s, y + m * N, N, t * NT);
    }
  }
}


// ---------------------------------------------------------------------------------------
// int8 activations (W8A8), AVX-512 VNNI only: vpdpbusd multiplies 4 pairs of bytes per
// 32-bit lane, 64 multiply-adds per instruction, twice vpdpwssd's; a pass of many rows (the
// planner's batched passes) is bound by this arithmetic. Each activation row is quantized to
// int8 (symmetric, its own scale max|x| / 127, round to nearest); the weights are stored
// offset by 128 as unsigned bytes (vpdpbusd's unsigned operand), so a lane sums
// (q[n][k] + 128) * x[k] and the row's 128 * sum(x) is subtracted after: the int32 sum over
// all of K is exact (|sum| <= K * 255 * 127 < 2^31 for K <= 65536), so, as above, a row's
// result depends only on that row. Packed by int8_kernel.pack_a8() in tiles of NT weight
// rows, k-quad-major ([N/NT][K/4][NT][4]): one 4 * NT-byte quad per 4 k's, two loads.
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
#define HAVE_A8 1

// One activation row to int8: q = round(x / scale), scale = max|x| / 127 (returned); qsum:
// the sum of q. Zero and non-finite rows as quantize_row.
static inline float quantize_row8(const float* x, int8_t* q, int32_t* qsum, int64_t K) {
  vf m = zero_(), bad = zero_();
  for (int64_t i = 0; i < K; i += VW) {
    const vf v = ld_x(x + i);
    m = max_(m, abs_(v));
    bad = add_(bad, mul_(v, zero_()));
  }
  const float amax = _mm512_reduce_max_ps(m);
  const bool finite = hsum(bad) == 0.0f;
  *qsum = 0;
  if (!finite || amax < 1e-30f) {
    memset(q, 0, K);
    return finite ? 0.0f : NAN;
  }
  const vf inv = set1_(127.0f / amax);
  vi sum = izero_();
  for (int64_t i = 0; i < K; i += VW) {
    const vi v = _mm512_cvtps_epi32(_mm512_roundscale_ps(
        mul_(ld_x(x + i), inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    sum = _mm512_add_epi32(sum, v);
    _mm_storeu_si128((__m128i*)(q + i), _mm512_cvtsepi32_epi8(v));
  }
  *qsum = _mm512_reduce_add_epi32(sum);
  return amax / 127.0f;
}

template <int MB>
static inline void tile8(const int8_t* xq, const int32_t* xsum, const float* xs, int64_t K,
                         const uint8_t* qt, const float* s, float* y, int64_t N, int64_t n0) {
  vi acc[MB][2];
#pragma GCC unroll 16
  for (int i = 0; i < MB; i++) acc[i][0] = acc[i][1] = izero_();
  for (int64_t k = 0; k < K; k += 4) {
    const uint8_t* p = qt + k * NT;  // this k-quad's 4 * NT weights: two cache lines
    _mm_prefetch((const char*)(p + PREFETCH), _MM_HINT_T0);
    _mm_prefetch((const char*)(p + PREFETCH + 64), _MM_HINT_T0);
    const vi w0 = _mm512_loadu_si512((const void*)p);
    const vi w1 = _mm512_loadu_si512((const void*)(p + 4 * VW));
#pragma GCC unroll 16
    for (int i = 0; i < MB; i++) {
      int32_t quad;
      memcpy(&quad, xq + i * K + k, sizeof quad);
      const vi xb = set1_i(quad);
      acc[i][0] = _mm512_dpbusd_epi32(acc[i][0], w0, xb);
      acc[i][1] = _mm512_dpbusd_epi32(acc[i][1], w1, xb);
      asm("" : "+v"(acc[i][0]), "+v"(acc[i][1]));
    }
  }
  // (every loop over the rows fully unrolled: an indexed accumulator would live in memory)
  const vf s0 = ld_x(s + n0), s1 = ld_x(s + n0 + VW);
  vf out[MB][2];
#pragma GCC unroll 16
  for (int i = 0; i < MB; i++) {
    const vi c = set1_i(128 * xsum[i]);
    const vf rs = set1_(xs[i]);
    out[i][0] = mul_(cvt_(_mm512_sub_epi32(acc[i][0], c)), mul_(s0, rs));
    out[i][1] = mul_(cvt_(_mm512_sub_epi32(acc[i][1], c)), mul_(s1, rs));
  }
  if (N - n0 >= NT) {
#pragma GCC unroll 16
    for (int i = 0; i < MB; i++) {
      st_x(y + i * N + n0, out[i][0]);
      st_x(y + i * N + n0 + VW, out[i][1]);
    }
    return;
  }
  float r[NT];  // the last tile: padding columns are computed and not stored
#pragma GCC unroll 16
  for (int i = 0; i < MB; i++) {
    st_x(r, out[i][0]);
    st_x(r + VW, out[i][1]);
    for (int64_t j = 0; j < N - n0; j++) y[i * N + n0 + j] = r[j];
  }
}

template <int MB>
static inline void tail8(int64_t r, const int8_t* xq, const int32_t* xsum, const float* xs,
                         int64_t K, const uint8_t* qt, const float* s, float* y, int64_t N,
                         int64_t n0) {
  if constexpr (MB > 0) {
    if (r == MB) tile8<MB>(xq, xsum, xs, K, qt, s, y, N, n0);
    else tail8<MB - 1>(r, xq, xsum, xs, K, qt, s, y, N, n0);
  }
}

// As linear(), int8 activations: xq [M, K] int8, xsum [M], xs [M] scratch.
static void linear8(const float* x, const uint8_t* qp, const float* s, float* y, int64_t M,
                    int64_t N, int64_t K, int threads, int8_t* xq, int32_t* xsum, float* xs) {
  const int64_t tiles = (N + NT - 1) / NT;
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < M; r++) xs[r] = quantize_row8(x + r * K, xq + r * K, xsum + r, K);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
      const uint8_t* qt = qp + t * NT * K;
      int64_t m = 0;
      for (; m + MB_MAX <= M; m += MB_MAX)
        tile8<MB_MAX>(xq + m * K, xsum + m, xs + m, K, qt, s, y + m * N, N, t * NT);
      tail8<MB_MAX - 1>(M - m, xq + m * K, xsum + m, xs + m, K, qt, s, y + m * N, N, t * NT);
    }
  }
}
#else
#define HAVE_A8 0
#endif

// One linear layer of the fused stack: int16 activations (linear) or, with A8, int8
// (linear8; the weights packed for it).
template <bool A8>
static inline void layer_linear(const float* x, const void* qp, const float* s, float* y,
                                int64_t M, int64_t N, int64_t K, int threads, int16_t* xq,
                                int32_t* xsum, float* xs) {
#if HAVE_A8
  if constexpr (A8) {
    linear8(x, (const uint8_t*)qp, s, y, M, N, K, threads, (int8_t*)xq, xsum, xs);
    return;
  }
#endif
  (void)xsum;
  linear(x, (const int8_t*)qp, s, y, M, N, K, threads, xq, xs);
}

// ---------------------------------------------------------------------------------------
// The whole decoder stack of one forward pass in one call (w8_forward below): at the
// planner's few rows per pass, PyTorch's ~50 small ops per layer cost as much as the
// weights' bytes. Same rule as above: every row's result depends only on that row's tokens
// and the keys it may see, never on the other rows of the pass or the thread count.

// e^x (Cephes-style range reduction + degree-5 polynomial,
// about 1 ulp on [-87, 88]; -inf gives 0)
static inline vf exp_(vf x) {
  x = max_(min_(x, set1_(88.3762626647949f)), set1_(-88.3762626647949f));
  vf n = floor_(fma_(x, set1_(1.44269504088896341f), set1_(0.5f)));
  x = sub_(x, mul_(n, set1_(0.693359375f)));
  x = sub_(x, mul_(n, set1_(-2.12194440e-4f)));
  vf y = set1_(1.9875691500E-4f);
  y = fma_(y, x, set1_(1.3981999507E-3f));
  y = fma_(y, x, set1_(8.3334519073E-3f));
  y = fma_(y, x, set1_(4.1665795894E-2f));
  y = fma_(y, x, set1_(1.6666665459E-1f));
  y = fma_(y, x, set1_(5.0000001201E-1f));
  y = fma_(y, mul_(x, x), add_(x, set1_(1.0f)));
  return mul_(y, pow2i(n));
}

// out = x / rms(x) * w for one row of H (a multiple of VW) values
static inline void rms_row(const float* x, const float* w, float* out, int64_t H, float eps) {
  vf acc = zero_();
  for (int64_t i = 0; i < H; i += VW) acc = fma_(ld_x(x + i), ld_x(x + i), acc);
  const vf inv = set1_(1.0f / sqrtf(hsum(acc) / (float)H + eps));
  for (int64_t i = 0; i < H; i += VW) st_x(out + i, mul_(mul_(ld_x(x + i), inv), ld_x(w + i)));
}

// rotary embedding of one head in place (rotate-half convention, cos/sin rows of hd values)
static inline void rope(float* v, const float* c, const float* sn, int64_t hd) {
  const int64_t h2 = hd / 2;
  for (int64_t d = 0; d < h2; d++) {
    const float a = v[d], b = v[d + h2];
    v[d] = a * c[d] - b * sn[d];
    v[d + h2] = b * c[d + h2] + a * sn[d + h2];
  }
}

struct Dims { int64_t H, nq, nkv, hd, I, S; };

// One query row and head: softmax(q K^T * scale) V over the keys the row may see, taken in
// slot order. Only visible keys enter the sums, in the same order, so a tree row and the
// one-row pass that decodes the same tokens see identical lists and compute identical sums.
// NB = hd / VW vectors per head, held in registers.
template <int NB>
static void attend_row(const float* q, const float* kc, const float* vc, int64_t end,
                       const uint8_t* mrow, float scale, float* out, float* sc, int32_t* idx) {
  constexpr int64_t hd = NB * VW;
  int64_t n = 0;
  for (int64_t j = 0; j < end; j++)
    if (mrow == nullptr || mrow[j]) idx[n++] = (int32_t)j;
  vf qv[NB];
#pragma GCC unroll 16
  for (int b = 0; b < NB; b++) qv[b] = ld_x(q + b * VW);
  // scores: a pairwise sum over the head's vectors (short dependency chains)
  for (int64_t t = 0; t < n; t++) {
    const float* k = kc + idx[t] * hd;
    vf part[NB];
#pragma GCC unroll 16
    for (int b = 0; b < NB; b++) part[b] = mul_(qv[b], ld_x(k + b * VW));
#pragma GCC unroll 16
    for (int w = 1; w < NB; w *= 2)
#pragma GCC unroll 16
      for (int b = 0; b + w < NB; b += 2 * w) part[b] = add_(part[b], part[b + w]);
    sc[t] = hsum(part[0]) * scale;
  }
  float m = -INFINITY;
  for (int64_t t = 0; t < n; t++) m = sc[t] > m ? sc[t] : m;
  const int64_t np = (n + VW - 1) / VW * VW;
  for (int64_t t = n; t < np; t++) sc[t] = -INFINITY;
  vf sum = zero_();
  const vf mv = set1_(m);
  for (int64_t t = 0; t < np; t += VW) {
    const vf e = exp_(sub_(ld_x(sc + t), mv));
    st_x(sc + t, e);
    sum = add_(sum, e);
  }
  vf o[NB];
#pragma GCC unroll 16
  for (int b = 0; b < NB; b++) o[b] = zero_();
  for (int64_t t = 0; t < n; t++) {
    const vf p = set1_(sc[t]);
    const float* v = vc + idx[t] * hd;
#pragma GCC unroll 16
    for (int b = 0; b < NB; b++) o[b] = fma_(p, ld_x(v + b * VW), o[b]);
  }
  const vf iv = set1_(1.0f / hsum(sum));
#pragma GCC unroll 16
  for (int b = 0; b < NB; b++) st_x(out + b * VW, mul_(o[b], iv));
}

// the head sizes w8_forward takes: 4, 8 or 16 vectors (hd 32..256 with AVX-512, 32..128
// with AVX2)
static bool head_supported(int64_t hd) {
  return hd == 4 * VW || hd == 8 * VW || hd == 16 * VW;
}

static void attend(const float* q, const float* kc, const float* vc, int64_t end,
                   const uint8_t* mrow, int64_t hd, float scale, float* out, float* sc,
                   int32_t* idx) {
  if (hd == 4 * VW) attend_row<4>(q, kc, vc, end, mrow, scale, out, sc, idx);
  else if (hd == 8 * VW) attend_row<8>(q, kc, vc, end, mrow, scale, out, sc, idx);
  else attend_row<16>(q, kc, vc, end, mrow, scale, out, sc, idx);
}

// Every decoder layer of a pass (w8_forward's contract, below); A8: int8 activations.
template <bool A8>
static void forward(float* x, int64_t M, int64_t L, const int64_t* dims, float eps,
                    const void* const* w, float* cache, const int64_t* spans,
                    const uint8_t* const* masks, int64_t nspans, const int64_t* pos,
                    const float* cs, const float* sn, int threads) {
  const Dims d{dims[0], dims[1], dims[2], dims[3], dims[4], dims[5]};
  const int64_t Q = d.nq * d.hd, KV = d.nkv * d.hd, QKV = Q + 2 * KV, g = d.nq / d.nkv;
  const float scale = 1.0f / sqrtf((float)d.hd);
  int64_t max_end = 0;
  for (int64_t s = 0; s < nspans; s++)
    max_end = spans[5 * s + 4] > max_end ? spans[5 * s + 4] : max_end;
  // h: norm outputs, o's output, silu(gate) * up; att: attention, down's output
  std::vector<float> h(M * (d.H > d.I ? d.H : d.I)), qkv(M * QKV), att(M * (Q > d.H ? Q : d.H));
  std::vector<float> gu(M * 2 * d.I);
  // the quantized rows of each linear's input (K is H, Q or I)
  const int64_t kmax = d.H > Q ? (d.H > d.I ? d.H : d.I) : (Q > d.I ? Q : d.I);
  std::vector<int16_t> xq(M * kmax);
  std::vector<int32_t> xsum(M);
  std::vector<float> xs(M);
  // attention scratch, one slice per thread, allocated once per pass (not per layer)
  const int64_t sc_n = (max_end + VW - 1) / VW * VW, idx_n = max_end;
  std::vector<float> sc_all(threads * sc_n);
  std::vector<int32_t> idx_all(threads * idx_n);
  for (int64_t l = 0; l < L; l++) {
    const void* const* lw = w + 10 * l;
    float* kc = cache + (l * 2) * d.nkv * d.S * d.hd;
    float* vc = kc + d.nkv * d.S * d.hd;
#pragma omp parallel for num_threads(threads) if (M >= 8) schedule(static)
    for (int64_t r = 0; r < M; r++)
      rms_row(x + r * d.H, (const float*)lw[8], h.data() + r * d.H, d.H, eps);
    layer_linear<A8>(h.data(), lw[0], (const float*)lw[1], qkv.data(), M, QKV, d.H, threads,
           xq.data(), xsum.data(), xs.data());
    for (int64_t s = 0; s < nspans; s++) {  // rotary, then this pass's K/V into the cache
      const int64_t r0 = spans[5 * s], n = spans[5 * s + 1], base = spans[5 * s + 2];
      const int64_t start = spans[5 * s + 3];
      for (int64_t r = r0; r < r0 + n; r++) {
        float* row = qkv.data() + r * QKV;
        const float* c = cs + pos[r] * d.hd;
        const float* si = sn + pos[r] * d.hd;
        for (int64_t hh = 0; hh < d.nq + d.nkv; hh++) rope(row + hh * d.hd, c, si, d.hd);
        for (int64_t kh = 0; kh < d.nkv; kh++) {
          const int64_t slot = (kh * d.S + base + start + (r - r0)) * d.hd;
          memcpy(kc + slot, row + Q + kh * d.hd, d.hd * sizeof(float));
          memcpy(vc + slot, row + Q + KV + kh * d.hd, d.hd * sizeof(float));
        }
      }
    }
#pragma omp parallel num_threads(threads)
    {
      float* sc = sc_all.data() + omp_get_thread_num() * sc_n;
      int32_t* idx = idx_all.data() + omp_get_thread_num() * idx_n;
#pragma omp for schedule(static)
      for (int64_t t = 0; t < M * d.nq; t++) {
        const int64_t r = t / d.nq, hh = t % d.nq, kh = hh / g;
        int64_t s = 0;
        while (r >= spans[5 * s] + spans[5 * s + 1]) s++;
        const int64_t r0 = spans[5 * s], base = spans[5 * s + 2], end = spans[5 * s + 4];
        const uint8_t* mrow = masks[s] == nullptr ? nullptr : masks[s] + (r - r0) * end;
        attend(qkv.data() + r * QKV + hh * d.hd, kc + (kh * d.S + base) * d.hd,
               vc + (kh * d.S + base) * d.hd, end, mrow, d.hd, scale,
               att.data() + r * Q + hh * d.hd, sc, idx);
      }
    }
    layer_linear<A8>(att.data(), lw[2], (const float*)lw[3], h.data(), M, d.H, Q, threads,
           xq.data(), xsum.data(), xs.data());
    for (int64_t i = 0; i < M * d.H; i++) x[i] += h[i];
#pragma omp parallel for num_threads(threads) if (M >= 8) schedule(static)
    for (int64_t r = 0; r < M; r++)
      rms_row(x + r * d.H, (const float*)lw[9], h.data() + r * d.H, d.H, eps);
    layer_linear<A8>(h.data(), lw[4], (const float*)lw[5], gu.data(), M, 2 * d.I, d.H,
           threads, xq.data(), xsum.data(), xs.data());
#pragma omp parallel for num_threads(threads) if (M >= 8) schedule(static)
    for (int64_t r = 0; r < M; r++) {  // silu(gate) * up, into h
      const float* gr = gu.data() + r * 2 * d.I;
      float* o = h.data() + r * d.I;
      for (int64_t i = 0; i < d.I; i += VW) {
        const vf gv = ld_x(gr + i);
        const vf sig = div_(set1_(1.0f), add_(set1_(1.0f), exp_(sub_(zero_(), gv))));
        st_x(o + i, mul_(mul_(gv, sig), ld_x(gr + d.I + i)));
      }
    }
    layer_linear<A8>(h.data(), lw[6], (const float*)lw[7], att.data(), M, d.H, d.I, threads,
           xq.data(), xsum.data(), xs.data());
    for (int64_t i = 0; i < M * d.H; i++) x[i] += att[i];
  }
}

extern "C" {

// Vector width the packing must use (8 floats for AVX2, 16 for AVX-512).
int w8_vector_width(void) { return VW; }

// Whether w8_forward takes this head size.
int w8_head_supported(int64_t hd) { return head_supported(hd) ? 1 : 0; }

// K must be a multiple of VW (int8_kernel.supports); qp packed for this VW; N rows of output
// (the last tile may hold padding rows, which are computed and not stored).
void w8_linear(const float* x, const int8_t* qp, const float* s, float* y, int64_t M,
               int64_t N, int64_t K, int threads) {
  std::vector<int16_t> xq(M * K);
  std::vector<float> xs(M);
  linear(x, qp, s, y, M, N, K, threads, xq.data(), xs.data());
}

// Selected outputs of w8_linear: y[p] = (x @ (q * s)^T)[rows[p], cols[p]] for p < P (x
// [M, K]; q packed as for w8_linear), with the tiles' arithmetic term for term: the row's
// int16 quantization, exact int32 sums per block of KB k's, float32 block sums in k order,
// the same two products. So each equals the full w8_linear's output bit for bit; the
// planner's decoder takes the logits of the few tokens a grammar allows this way.
void w8_linear_some(const float* x, const int8_t* qp, const float* s, int64_t M, int64_t K,
                    const int64_t* rows, const int64_t* cols, int64_t P, float* y) {
  std::vector<int16_t> xq(M * K);
  std::vector<float> xs(M);
  std::vector<char> done(M, 0);
  for (int64_t p = 0; p < P; p++) {
    const int64_t r = rows[p], c = cols[p];
    if (!done[r]) {
      xs[r] = quantize_row(x + r * K, xq.data() + r * K, K);
      done[r] = 1;
    }
    // column c's pair (q[c][k], q[c][k+1]) sits at byte k * NT + 2 * (c % NT) of its tile
    const int8_t* qc = qp + (c / NT) * NT * K + 2 * (c % NT);
    const int16_t* xr = xq.data() + r * K;
    float f = 0.0f;
    for (int64_t k0 = 0; k0 < K; k0 += KB) {
      const int64_t k1 = K - k0 < KB ? K : k0 + KB;
      int32_t a = 0;
      for (int64_t k = k0; k < k1; k += 2)
        a += (int32_t)xr[k] * qc[k * NT] + (int32_t)xr[k + 1] * qc[k * NT + 1];
      f += (float)a;
    }
    y[p] = f * (s[c] * xs[r]);
  }
}

// Every decoder layer of a Llama model over M rows, x [M, H] updated in place (the input
// is the token embeddings; the output goes to the final norm). Per layer, w holds 10
// pointers: qkv, qkv scales, o, o scales, gate_up, gate_up scales, down, down scales (packed
// int8 and float32, as w8_linear takes them), input norm, post-attention norm.
// dims: H, nq, nkv, hd, I (intermediate), S (cache rows per head: slots * max_len).
// cache: float32 [L, 2, nkv, S, hd]. Span s (spans[5s..5s+4] = first row, rows, region
// base, start, end) writes its rows' K/V at base+start.. and attends over base..base+end;
// masks[s] is its [rows, end] visibility (1 = may attend) or null (every key).
// pos: M positions; cs, sn: [max_len, hd] rotary tables. H, hd and I multiples of VW.
void w8_forward(float* x, int64_t M, int64_t L, const int64_t* dims, float eps,
                const void* const* w, float* cache, const int64_t* spans,
                const uint8_t* const* masks, int64_t nspans, const int64_t* pos,
                const float* cs, const float* sn, int threads) {
  forward<false>(x, M, L, dims, eps, w, cache, spans, masks, nspans, pos, cs, sn, threads);
}

// Whether this build has the int8-activation path (AVX-512 VNNI): w8a8_linear and
// w8a8_forward may be called only where it returns 1.
int w8a8_supported(void) { return HAVE_A8; }

// w8_linear with int8 activations; qp packed by int8_kernel.pack_a8().
void w8a8_linear(const float* x, const uint8_t* qp, const float* s, float* y, int64_t M,
                 int64_t N, int64_t K, int threads) {
#if HAVE_A8
  std::vector<int8_t> xq(M * K);
  std::vector<int32_t> xsum(M);
  std::vector<float> xs(M);
  linear8(x, qp, s, y, M, N, K, threads, xq.data(), xsum.data(), xs.data());
#else
  (void)x; (void)qp; (void)s; (void)y; (void)M; (void)N; (void)K; (void)threads;
  abort();
#endif
}

// w8_forward with int8 activations in the four linear layers (weights packed by pack_a8).
void w8a8_forward(float* x, int64_t M, int64_t L, const int64_t* dims, float eps,
                  const void* const* w, float* cache, const int64_t* spans,
                  const uint8_t* const* masks, int64_t nspans, const int64_t* pos,
                  const float* cs, const float* sn, int threads) {
#if HAVE_A8
  forward<true>(x, M, L, dims, eps, w, cache, spans, masks, nspans, pos, cs, sn, threads);
#else
  (void)x; (void)M; (void)L; (void)dims; (void)eps; (void)w; (void)cache; (void)spans;
  (void)masks; (void)nspans; (void)pos; (void)cs; (void)sn; (void)threads;
  abort();
#endif
}


}  // extern "C"
