/* Weight-only quantized matmuls for x86 CPUs with AVX2/FMA: y[M, N] = x[M, K] @ W[N, K]^T in float32.
 *
 * Weights stay in two layouts (see cpu_linear.py):
 *   q4: 4-bit codes, 32-weight groups of 16 bytes (low nibbles = weights 0..15, high = 16..31),
 *       w = code * scale + bias with one float32 scale and bias per group;
 *   q8: int8 codes, w = code * scale with one float32 scale per `group` (16 or 32) weights.
 * Each weight is decoded with one fused multiply-add, which gives the same float32 value the
 * reference de-quantizer computes (the product code * scale is exact for every GGUF type read here),
 * and the dot products accumulate in float32.
 */
#include <immintrin.h>
#include <stdint.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE float hsum(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

ALWAYS_INLINE void q4_decode(const uint8_t *p, float s, float b, __m256 w[4]) {
    const __m128i bytes = _mm_loadu_si128((const __m128i *)p);
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(bytes, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
    const __m256 vs = _mm256_set1_ps(s), vb = _mm256_set1_ps(b);
    w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), vs, vb);
    w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), vs, vb);
    w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), vs, vb);
    w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), vs, vb);
}

ALWAYS_INLINE __m256 q8_decode8(const int8_t *p, __m256 vs) {
    const __m128i bytes = _mm_loadl_epi64((const __m128i *)p);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), vs);
}

/* One weight row n against MT activation rows; CH independent accumulators per activation row so
 * that a single row is not bound by the FMA latency. */
#define Q4_ROW(MT, CH)                                                                             \
    ALWAYS_INLINE void q4_row_##MT(const float *x, int64_t K, const uint8_t *row, const float *sc,     \
                                   const float *bi, float *y, int64_t N) {                           \
        __m256 acc[MT][CH];                                                                        \
        for (int i = 0; i < MT; i++)                                                               \
            for (int c = 0; c < CH; c++) acc[i][c] = _mm256_setzero_ps();                          \
        const int64_t groups = K / 32;                                                             \
        for (int64_t g = 0; g < groups; g++) {                                                     \
            __m256 w[4];                                                                           \
            q4_decode(row + g * 16, sc[g], bi[g], w);                                              \
            for (int i = 0; i < MT; i++) {                                                         \
                const float *xi = x + i * K + g * 32;                                              \
                for (int j = 0; j < 4; j++)                                                        \
                    acc[i][j % CH] = _mm256_fmadd_ps(_mm256_loadu_ps(xi + 8 * j), w[j], acc[i][j % CH]); \
            }                                                                                      \
        }                                                                                          \
        for (int i = 0; i < MT; i++) {                                                             \
            __m256 t = acc[i][0];                                                                  \
            for (int c = 1; c < CH; c++) t = _mm256_add_ps(t, acc[i][c]);                          \
            y[i * N] = hsum(t);                                                                    \
        }                                                                                          \
    }
Q4_ROW(1, 4)
Q4_ROW(2, 2)
Q4_ROW(4, 2)
Q4_ROW(8, 1)

#define Q8_ROW(MT, CH)                                                                             \
    ALWAYS_INLINE void q8_row_##MT(const float *x, int64_t K, const int8_t *row, const float *sc,      \
                                   int64_t group, float *y, int64_t N) {                           \
        __m256 acc[MT][CH];                                                                        \
        for (int i = 0; i < MT; i++)                                                               \
            for (int c = 0; c < CH; c++) acc[i][c] = _mm256_setzero_ps();                          \
        for (int64_t k = 0; k < K; k += 16) {                                                      \
            const __m256 vs = _mm256_set1_ps(sc[k / group]);                                       \
            const __m256 w0 = q8_decode8(row + k, vs), w1 = q8_decode8(row + k + 8, vs);           \
            for (int i = 0; i < MT; i++) {                                                         \
                const float *xi = x + i * K + k;                                                   \
                acc[i][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xi), w0, acc[i][0]);                   \
                acc[i][CH - 1] = _mm256_fmadd_ps(_mm256_loadu_ps(xi + 8), w1, acc[i][CH - 1]);     \
            }                                                                                      \
        }                                                                                          \
        for (int i = 0; i < MT; i++) {                                                             \
            __m256 t = acc[i][0];                                                                  \
            if (CH > 1) t = _mm256_add_ps(t, acc[i][CH - 1]);                                      \
            y[i * N] = hsum(t);                                                                    \
        }                                                                                          \
    }
Q8_ROW(1, 2)
Q8_ROW(2, 2)
Q8_ROW(4, 2)
Q8_ROW(8, 1)

/* Rows of W are split over threads; each thread walks its rows once per tile of 8 activation rows. */
void q4_linear(const float *x, int64_t M, int64_t K, const uint8_t *packed, const float *scale,
               const float *bias, int64_t N, float *y, int threads) {
    const int64_t groups = K / 32;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const uint8_t *row = packed + n * groups * 16;
        const float *sc = scale + n * groups, *bi = bias + n * groups;
        int64_t m = 0;
        for (; m + 8 <= M; m += 8) q4_row_8(x + m * K, K, row, sc, bi, y + m * N + n, N);
        if (m + 4 <= M) { q4_row_4(x + m * K, K, row, sc, bi, y + m * N + n, N); m += 4; }
        if (m + 2 <= M) { q4_row_2(x + m * K, K, row, sc, bi, y + m * N + n, N); m += 2; }
        if (m < M) q4_row_1(x + m * K, K, row, sc, bi, y + m * N + n, N);
    }
}

void q8_linear(const float *x, int64_t M, int64_t K, const int8_t *codes, const float *scale, int64_t group,
               int64_t N, float *y, int threads) {
    const int64_t groups = K / group;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const int8_t *row = codes + n * K;
        const float *sc = scale + n * groups;
        int64_t m = 0;
        for (; m + 8 <= M; m += 8) q8_row_8(x + m * K, K, row, sc, group, y + m * N + n, N);
        if (m + 4 <= M) { q8_row_4(x + m * K, K, row, sc, group, y + m * N + n, N); m += 4; }
        if (m + 2 <= M) { q8_row_2(x + m * K, K, row, sc, group, y + m * N + n, N); m += 2; }
        if (m < M) q8_row_1(x + m * K, K, row, sc, group, y + m * N + n, N);
    }
}

/* Float32 copies of W (rows [0, N)) for large batches, where a float GEMM beats decoding per tile. */
void q4_dequantize(const uint8_t *packed, const float *scale, const float *bias, int64_t N, int64_t K, float *out,
                   int threads) {
    const int64_t groups = K / 32;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        for (int64_t g = 0; g < groups; g++) {
            __m256 w[4];
            q4_decode(packed + (n * groups + g) * 16, scale[n * groups + g], bias[n * groups + g], w);
            for (int j = 0; j < 4; j++) _mm256_storeu_ps(out + n * K + g * 32 + 8 * j, w[j]);
        }
    }
}

void q8_dequantize(const int8_t *codes, const float *scale, int64_t group, int64_t N, int64_t K, float *out,
                   int threads) {
    const int64_t groups = K / group;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        for (int64_t k = 0; k < K; k += 8) {
            const __m256 vs = _mm256_set1_ps(scale[n * groups + k / group]);
            _mm256_storeu_ps(out + n * K + k, q8_decode8(codes + n * K + k, vs));
        }
    }
}
