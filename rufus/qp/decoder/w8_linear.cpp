// int8 weight-only linear layer for the planner's CPU decoder (rufus/qp/decoder/int8_kernel.py
// builds and loads this file; the reasons and measurements are there and in docs/benchmarks.md).
//
//   y[M, N] = x[M, K] @ (q[N, K] * s[N])^T      x, y, s: float32; q: int8
//
// q is pre-packed by int8_kernel.pack(): groups of 4 weight rows, each group's K split into
// VW-wide pieces stored one after another ([N/4][K/VW][4][VW]), so a pass reads the weights
// as one sequential stream (the hardware prefetcher's best case; row-major rows of 576 bytes
// read four at a time were slower: docs/benchmarks.md). The weights are converted to float32
// in registers and accumulated in float32: no bf16 arithmetic, which CPUs without
// avx512_bf16 emulate.
//
// Compiled per CPU class: -mavx2 -mfma (VW 8) or -mavx512f -mavx512bw -mavx512vl (VW 16).
// Parallel over weight-row groups with OpenMP; linked against the libgomp torch has loaded,
// so it shares torch's thread pool.
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#if defined(__AVX512F__)
#define VW 16
#define MB_MAX 6
typedef __m512 vf;
static inline vf ld_w(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}
static inline vf ld_x(const float* p) { return _mm512_loadu_ps(p); }
static inline void st_x(float* p, vf v) { _mm512_storeu_ps(p, v); }
static inline vf fma_(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf zero_() { return _mm512_setzero_ps(); }
static inline float hsum(vf v) { return _mm512_reduce_add_ps(v); }
#elif defined(__AVX2__) && defined(__FMA__)
#define VW 8
#define MB_MAX 3
typedef __m256 vf;
static inline vf ld_w(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
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
#else
#error "w8_linear needs AVX2 + FMA or AVX-512"
#endif

#define G 4            // weight rows per packed group
#define PREFETCH 4096  // bytes ahead of the weight stream (DRAM latency at one row)

// MB activation rows x one group of G weight rows. Every output element is one float32
// accumulator over K in the same order whatever M, MB or the thread count: a row's result
// does not depend on the other rows of the pass, so Medusa's multi-row verification passes
// reproduce one-row greedy decoding exactly (the planner's losslessness).
//
// W: int8_t reads the packed int8 group and converts it in registers; float reads the same
// group already converted (exactly) to float32 in a small buffer, which a pass of many rows
// (a prefill) fills once per group instead of converting it again for every MB rows.
template <int MB, typename W>
static inline void group(const float* x, int64_t K, const W* qg, const float* s,
                         float* y, int64_t N, int64_t n0) {
  // fully unrolled, so the accumulators stay in registers
  vf acc[MB][G];
#pragma GCC unroll 8
  for (int i = 0; i < MB; i++)
#pragma GCC unroll 4
    for (int j = 0; j < G; j++) acc[i][j] = zero_();
  const int64_t kb_n = K / VW;
  for (int64_t kb = 0; kb < kb_n; kb++) {
    if constexpr (sizeof(W) == 1)
      _mm_prefetch((const char*)(qg + kb * G * VW + PREFETCH), _MM_HINT_T0);
    vf xv[MB];
#pragma GCC unroll 8
    for (int i = 0; i < MB; i++) xv[i] = ld_x(x + i * K + kb * VW);
#pragma GCC unroll 4
    for (int j = 0; j < G; j++) {
      vf w;
      if constexpr (sizeof(W) == 1) w = ld_w(qg + (kb * G + j) * VW);
      else w = ld_x(qg + (kb * G + j) * VW);
#pragma GCC unroll 8
      for (int i = 0; i < MB; i++) acc[i][j] = fma_(xv[i], w, acc[i][j]);
    }
  }
  float r[MB][G];
#pragma GCC unroll 8
  for (int i = 0; i < MB; i++)
#pragma GCC unroll 4
    for (int j = 0; j < G; j++) r[i][j] = hsum(acc[i][j]);
  const int valid = N - n0 < G ? (int)(N - n0) : G;
  for (int i = 0; i < MB; i++)
    for (int j = 0; j < valid; j++) y[i * N + n0 + j] = r[i][j] * s[n0 + j];
}

// the last M % MB_MAX activation rows
template <int MB, typename W>
static inline void tail(int64_t r, const float* x, int64_t K, const W* qg, const float* s,
                        float* y, int64_t N, int64_t n0) {
  if constexpr (MB > 0) {
    if (r == MB) group<MB, W>(x, K, qg, s, y, N, n0);
    else tail<MB - 1, W>(r, x, K, qg, s, y, N, n0);
  }
}

// every activation row against one weight group
template <typename W>
static inline void all_rows(const float* x, int64_t M, int64_t K, const W* qg, const float* s,
                            float* y, int64_t N, int64_t n0) {
  int64_t m = 0;
  for (; m + MB_MAX <= M; m += MB_MAX) group<MB_MAX, W>(x + m * K, K, qg, s, y + m * N, N, n0);
  tail<MB_MAX - 1, W>(M - m, x + m * K, K, qg, s, y + m * N, N, n0);
}

extern "C" {

// Vector width the packing must use (8 floats for AVX2, 16 for AVX-512).
int w8_vector_width(void) { return VW; }

// K must be a multiple of VW; qp packed for this VW; N rows of output (the last group
// may hold padding rows, which are computed and not stored).
void w8_linear(const float* x, const int8_t* qp, const float* s, float* y, int64_t M,
               int64_t N, int64_t K, int threads) {
  const int64_t groups = (N + G - 1) / G;
  if (M <= 2 * MB_MAX) {  // decode and tree verification: convert in registers
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t g = 0; g < groups; g++)
      all_rows<int8_t>(x, M, K, qp + g * G * K, s, y, N, g * G);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    // prefill: each group converted once into this thread's buffer (G * K floats)
    float* buf = (float*)aligned_alloc(64, (size_t)(G * K * sizeof(float) + 63) / 64 * 64);
#pragma omp for schedule(static)
    for (int64_t g = 0; g < groups; g++) {
      const int8_t* qg = qp + g * G * K;
      if (buf == nullptr) {
        all_rows<int8_t>(x, M, K, qg, s, y, N, g * G);
        continue;
      }
      for (int64_t e = 0; e < G * K; e += VW) st_x(buf + e, ld_w(qg + e));
      all_rows<float>(x, M, K, buf, s, y, N, g * G);
    }
    free(buf);
  }
}

}  // extern "C"
