/* Weight-only quantized matmuls for x86 CPUs with AVX2/FMA: y[M, N] = x[M, K] @ W[N, K]^T in float32.
 *
 * Weights stay in two layouts (see cpu_linear.py):
 *   q4: 4-bit codes, 32-weight groups of 16 bytes (low nibbles = weights 0..15, high = 16..31), the
 *       bytes of each pair of groups interleaved (g0 byte 0, g1 byte 0, g0 byte 1, ...) so that one
 *       32-byte load gives both groups' codes as int16 with shifts and masks;
 *       w = code * scale + bias with one float32 scale and bias per group;
 *   q8: int8 codes, w = code * scale with one float32 scale per `group` (16 or 32) weights.
 *
 * Each call first quantizes the activations once per row to int16 in blocks of 32
 * (dx = max|x| / 32767, qx = round(x / dx)), then takes the products with the codes as integer dot
 * products (madd) and applies the scales per block in float32:
 *   q4: sum(x * w) ~ scale * dx * sum(qx * code) + bias * dx * sum(qx)
 *   q8: sum(x * w) ~ scale * dx * sum(qx * code)
 * Every integer sum is exact (|qx * code| <= 32767 * 128, four per int32 lane, below 2^24 so exact in
 * float32 too), so the result is the product of the de-quantized W with the block-quantized x, rounded
 * in float32: it differs from x @ W^T by at most sum over blocks of dx/2 * sum|w| per output (about
 * 1.5e-5 of the block's largest |x|) plus float32 rounding. llama.cpp quantizes activations to int8
 * (256 times the error); int16 keeps greedy output equal to the float32 path's on the models tested.
 */
#include <immintrin.h>
#include <stdint.h>
#include <math.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define QK 32 /* activation block */
#define QMAX 32767.0f

ALWAYS_INLINE float hsum(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

ALWAYS_INLINE float hmax(__m256 v) {
    __m128 lo = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_max_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_max_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* e^x for x <= 88, to about 2 float32 ulps: Cephes' expf polynomial on 8 lanes. */
ALWAYS_INLINE __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
    __m256 f = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    f = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), f);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(_mm256_mul_ps(y, f), f, _mm256_add_ps(f, _mm256_set1_ps(1.0f)));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}

/* One row of K floats -> int16 codes q, block scales d and d * sum(q) per 32 values. */
static void quantize_row(const float *x, int64_t K, int16_t *q, float *d, float *s) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < K / QK; b++) {
        const float *xb = x + b * QK;
        __m256 v[4];
        __m256 amax = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(xb + 8 * j);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
        }
        const float m = hmax(amax);
        const float db = m / QMAX;
        const __m256 id = _mm256_set1_ps(m > 0.0f ? QMAX / m : 0.0f);
        __m256i i[4];
        for (int j = 0; j < 4; j++)
            i[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], id), _MM_FROUND_TO_NEAREST_INT));
        const __m256i sum = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        /* int32 -> int16 in order: packs interleaves 128-bit lanes, the permute restores the order */
        const __m256i lo = _mm256_permute4x64_epi64(_mm256_packs_epi32(i[0], i[1]), 0xD8);
        const __m256i hi = _mm256_permute4x64_epi64(_mm256_packs_epi32(i[2], i[3]), 0xD8);
        _mm256_storeu_si256((__m256i *)(q + b * QK), lo);
        _mm256_storeu_si256((__m256i *)(q + b * QK + 16), hi);
        d[b] = db;
        s[b] = db * hsum(_mm256_cvtepi32_ps(sum));
    }
}

/* 32 4-bit codes as int16: [0] = weights 0..15, [1] = 16..31 */
ALWAYS_INLINE void q4_codes16(const uint8_t *p, __m256i w[2]) {
    const __m128i bytes = _mm_loadu_si128((const __m128i *)p), mask = _mm_set1_epi8(0x0F);
    w[0] = _mm256_cvtepu8_epi16(_mm_and_si128(bytes, mask));
    w[1] = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask));
}

ALWAYS_INLINE void q8_codes16(const int8_t *p, __m256i w[2]) {
    w[0] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    w[1] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 16)));
}

/* Quantized activations of M rows of K values, one buffer of ACTIVATION_BYTES(M, K):
 * float d[M, K / 32] (block scales), float s[M, K / 32] (d * sum(q)), int16 q[M, K]. */
typedef struct {
    const int16_t *q; /* [M, K] */
    const float *d;  /* [M, K / 32] */
    const float *s;  /* [M, K / 32]: d * sum(q) */
} QX;

/* sum(a[g] * b[g]) over g < n */
ALWAYS_INLINE float dot_f32(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t g = 0;
    for (; g + 8 <= n; g += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + g), _mm256_loadu_ps(b + g), acc);
    float sum = hsum(acc);
    for (; g < n; g++) sum += a[g] * b[g];
    return sum;
}

/* One weight row against MT activation rows. Groups go in pairs into two accumulators per row (hiding
 * the FMA latency; fixed indices keep them in registers); the bias terms (bias * dx * sum(qx)) are one
 * float dot product per row after the loop. */
/* A pair of q4 groups (32 bytes, their bytes interleaved: see cpu_linear.py) as four int16 vectors:
 * the codes of group g (weights 0..15, 16..31), then those of group g + 1. */
ALWAYS_INLINE void q4_pair16(const uint8_t *p, __m256i w[4]) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)p), mask = _mm256_set1_epi16(0x0F);
    w[0] = _mm256_and_si256(v, mask);
    w[1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    w[2] = _mm256_and_si256(_mm256_srli_epi16(v, 8), mask);
    w[3] = _mm256_srli_epi16(v, 12);
}

/* Group g of a row of `groups` q4 groups as two int16 vectors (weights 0..15, 16..31). */
ALWAYS_INLINE void q4_group16(const uint8_t *row, int64_t g, int64_t groups, __m256i w[2]) {
    if (g == groups - 1 && groups % 2 == 1) { /* an odd last group stays as it is */
        q4_codes16(row + g * 16, w);
        return;
    }
    __m256i pair[4];
    q4_pair16(row + (g & ~(int64_t)1) * 16, pair);
    w[0] = pair[2 * (g & 1)], w[1] = pair[2 * (g & 1) + 1];
}

ALWAYS_INLINE __m256i dot16_parts(__m256i w0, __m256i w1, const int16_t *x) {
    return _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256((const __m256i *)x)),
                            _mm256_madd_epi16(w1, _mm256_loadu_si256((const __m256i *)(x + 16))));
}

#define Q4_FMA(ACC, I, P, G) \
    ACC[I] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(P), _mm256_set1_ps(sc[G] * x.d[(I) * groups + (G)]), ACC[I])

/* One weight row against MT activation rows, a pair of groups at a time into two accumulators per row
 * (fixed indices keep them in registers); the bias terms (bias * dx * sum(qx)) are one float dot
 * product per row after the loop. */
#define Q4_ROW(MT)                                                                                      \
    ALWAYS_INLINE void q4_row_##MT(QX x, int64_t K, const uint8_t *row, const float *sc, const float *bi, \
                                   float *y, int64_t N) {                                               \
        __m256 acc0[MT], acc1[MT];                                                                      \
        for (int i = 0; i < MT; i++) acc0[i] = acc1[i] = _mm256_setzero_ps();                           \
        const int64_t groups = K / QK;                                                                  \
        int64_t g = 0;                                                                                  \
        for (; g + 2 <= groups; g += 2) {                                                               \
            __m256i w[4];                                                                               \
            q4_pair16(row + g * 16, w);                                                                 \
            for (int i = 0; i < MT; i++) {                                                              \
                const int64_t b = i * groups + g;                                                       \
                Q4_FMA(acc0, i, dot16_parts(w[0], w[1], x.q + b * QK), g);                              \
                Q4_FMA(acc1, i, dot16_parts(w[2], w[3], x.q + (b + 1) * QK), g + 1);                    \
            }                                                                                           \
        }                                                                                               \
        if (g < groups) {                                                                               \
            __m256i w[2];                                                                               \
            q4_codes16(row + g * 16, w);                                                                \
            for (int i = 0; i < MT; i++) {                                                              \
                const int64_t b = i * groups + g;                                                       \
                Q4_FMA(acc0, i, dot16_parts(w[0], w[1], x.q + b * QK), g);                              \
            }                                                                                           \
        }                                                                                               \
        for (int i = 0; i < MT; i++)                                                                    \
            y[i * N] = hsum(_mm256_add_ps(acc0[i], acc1[i])) + dot_f32(bi, x.s + i * groups, groups);   \
    }
Q4_ROW(1)
Q4_ROW(2)
Q4_ROW(4)
Q4_ROW(8)

#define Q8_STEP(MT, G, ACC)                                                                             \
    do {                                                                                                \
        __m256i w[2];                                                                                   \
        q8_codes16(row + (G) * QK, w);                                                                  \
        for (int i = 0; i < MT; i++) {                                                                  \
            const int64_t b = i * groups + (G);                                                         \
            const int16_t *xq = x.q + b * QK;                                                           \
            const __m256i p0 = _mm256_madd_epi16(w[0], _mm256_loadu_si256((const __m256i *)xq));        \
            const __m256i p1 = _mm256_madd_epi16(w[1], _mm256_loadu_si256((const __m256i *)(xq + 16))); \
            if (group == 16) { /* a scale per half */                                                   \
                ACC[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(sc[2 * (G)] * x.d[b]), ACC[i]);      \
                ACC[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_set1_ps(sc[2 * (G) + 1] * x.d[b]), ACC[i]);  \
            } else {                                                                                    \
                const __m256 p = _mm256_cvtepi32_ps(_mm256_add_epi32(p0, p1));                          \
                ACC[i] = _mm256_fmadd_ps(p, _mm256_set1_ps(sc[G] * x.d[b]), ACC[i]);                        \
            }                                                                                           \
        }                                                                                               \
    } while (0)

#define Q8_ROW(MT)                                                                                      \
    ALWAYS_INLINE void q8_row_##MT(QX x, int64_t K, const int8_t *row, const float *sc, int64_t group,     \
                                   float *y, int64_t N) {                                               \
        __m256 acc0[MT], acc1[MT];                                                                      \
        for (int i = 0; i < MT; i++) acc0[i] = acc1[i] = _mm256_setzero_ps();                           \
        const int64_t groups = K / QK;                                                                  \
        int64_t g = 0;                                                                                  \
        for (; g + 2 <= groups; g += 2) {                                                               \
            Q8_STEP(MT, g, acc0);                                                                       \
            Q8_STEP(MT, g + 1, acc1);                                                                   \
        }                                                                                               \
        if (g < groups) Q8_STEP(MT, g, acc0);                                                           \
        for (int i = 0; i < MT; i++) y[i * N] = hsum(_mm256_add_ps(acc0[i], acc1[i]));                  \
    }
Q8_ROW(1)
Q8_ROW(2)
Q8_ROW(4)
Q8_ROW(8)

ALWAYS_INLINE QX view(const void *buf, int64_t M, int64_t K) {
    const float *d = (const float *)buf, *s = d + M * (K / QK);
    QX x = {(const int16_t *)(s + M * (K / QK)), d, s};
    return x;
}

ALWAYS_INLINE QX rows_from(QX x, int64_t m, int64_t K) {
    QX r = {x.q + m * K, x.d + m * (K / QK), x.s + m * (K / QK)};
    return r;
}

/* Work split over threads (cpu_pool.c): ranges of rows, `chunk` at a time. */
typedef void (*range_fn)(const void *ctx, int64_t begin, int64_t end, int slot);
void pool_run(range_fn fn, const void *ctx, int64_t n, int64_t chunk, int threads);

/* Rows of a weight per chunk: about four chunks per thread, at least 16 rows. */
static int64_t chunk_rows(int64_t N, int threads) {
    const int64_t chunk = N / (4 * (int64_t)threads);
    return chunk < 16 ? 16 : chunk;
}

typedef struct {
    const float *x, *weight, *add;
    float *residual, *out, eps;
    void *buf;
    int64_t M, K;
} RowsArgs;

static void quantize_rows(const void *ctx, int64_t begin, int64_t end, int slot) {
    const RowsArgs *a = ctx;
    const int64_t K = a->K, G = K / QK;
    float *d = (float *)a->buf, *s = d + a->M * G;
    int16_t *q = (int16_t *)(s + a->M * G);
    (void)slot;
    for (int64_t m = begin; m < end; m++) quantize_row(a->x + m * K, K, q + m * K, d + m * G, s + m * G);
}

void quantize(const float *x, int64_t M, int64_t K, void *buf, int threads) {
    const RowsArgs a = {.x = x, .buf = buf, .M = M, .K = K};
    pool_run(quantize_rows, &a, M, 16, threads);
}

static void norm_rows(const void *ctx, int64_t begin, int64_t end, int slot) {
    const RowsArgs *a = ctx;
    const int64_t K = a->K;
    (void)slot;
    for (int64_t m = begin; m < end; m++) {
        float *r = a->residual + m * K, *o = a->out + m * K;
        __m256 sq = _mm256_setzero_ps();
        for (int64_t k = 0; k < K; k += 8) {
            __m256 v = _mm256_loadu_ps(r + k);
            if (a->add != NULL) {
                v = _mm256_add_ps(v, _mm256_loadu_ps(a->add + m * K + k));
                _mm256_storeu_ps(r + k, v);
            }
            sq = _mm256_fmadd_ps(v, v, sq);
        }
        const __m256 inv = _mm256_set1_ps(1.0f / sqrtf(hsum(sq) / (float)K + a->eps));
        for (int64_t k = 0; k < K; k += 8) {
            const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(r + k), inv);
            _mm256_storeu_ps(o + k, _mm256_mul_ps(v, _mm256_loadu_ps(a->weight + k)));
        }
    }
}

/* residual += x (x may be NULL); out = RMSNorm(residual) * weight; then quantize(out) into buf unless
 * buf is NULL. One pass over rows of a few KB instead of four torch calls. */
void add_rms_norm(const float *x, float *residual, const float *weight, float eps, int64_t M, int64_t K, float *out,
                  void *buf, int threads) {
    const RowsArgs a = {.add = x, .residual = residual, .weight = weight, .eps = eps, .out = out, .M = M, .K = K};
    pool_run(norm_rows, &a, M, 16, threads);
    if (buf != NULL) quantize(out, M, K, buf, threads);
}

static void silu_mul_rows(const void *ctx, int64_t begin, int64_t end, int slot) {
    const RowsArgs *a = ctx;
    const int64_t I = a->K;
    (void)slot;
    for (int64_t m = begin; m < end; m++) {
        const float *g = a->x + m * 2 * I, *u = g + I;
        float *o = a->out + m * I;
        for (int64_t k = 0; k < I; k += 8) {
            const __m256 v = _mm256_loadu_ps(g + k);
            const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), v));
            const __m256 silu = _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
            _mm256_storeu_ps(o + k, _mm256_mul_ps(silu, _mm256_loadu_ps(u + k)));
        }
    }
}

/* out[M, I] = silu(gate) * up for gate_up [M, 2I] = cat(gate, up); then quantize(out) into buf unless
 * buf is NULL (the input of down_proj). */
void silu_mul(const float *gate_up, int64_t M, int64_t I, float *out, void *buf, int threads) {
    const RowsArgs a = {.x = gate_up, .out = out, .M = M, .K = I};
    pool_run(silu_mul_rows, &a, M, 16, threads);
    if (buf != NULL) quantize(out, M, I, buf, threads);
}

typedef struct {
    QX x;
    int64_t M, K, group, ldy;
    const void *codes;
    const float *scale, *bias;
    float *y;
} LinearArgs;

/* y[m * ldy + n] for rows n of W and rows m < M of the quantized activations (see quantize); each
 * weight row is walked once per tile of 8 activation rows. */
static void q4_rows(const void *ctx, int64_t begin, int64_t end, int slot) {
    const LinearArgs *a = ctx;
    const int64_t M = a->M, K = a->K, ldy = a->ldy, groups = K / QK;
    (void)slot;
    for (int64_t n = begin; n < end; n++) {
        const uint8_t *row = (const uint8_t *)a->codes + n * groups * 16;
        const float *sc = a->scale + n * groups, *bi = a->bias + n * groups;
        float *yn = a->y + n;
        int64_t m = 0;
        for (; m + 8 <= M; m += 8) q4_row_8(rows_from(a->x, m, K), K, row, sc, bi, yn + m * ldy, ldy);
        if (m + 4 <= M) { q4_row_4(rows_from(a->x, m, K), K, row, sc, bi, yn + m * ldy, ldy); m += 4; }
        if (m + 2 <= M) { q4_row_2(rows_from(a->x, m, K), K, row, sc, bi, yn + m * ldy, ldy); m += 2; }
        if (m < M) q4_row_1(rows_from(a->x, m, K), K, row, sc, bi, yn + m * ldy, ldy);
    }
}

static void q8_rows(const void *ctx, int64_t begin, int64_t end, int slot) {
    const LinearArgs *a = ctx;
    const int64_t M = a->M, K = a->K, ldy = a->ldy, group = a->group, groups = K / group;
    (void)slot;
    for (int64_t n = begin; n < end; n++) {
        const int8_t *row = (const int8_t *)a->codes + n * K;
        const float *sc = a->scale + n * groups;
        float *yn = a->y + n;
        int64_t m = 0;
        for (; m + 8 <= M; m += 8) q8_row_8(rows_from(a->x, m, K), K, row, sc, group, yn + m * ldy, ldy);
        if (m + 4 <= M) { q8_row_4(rows_from(a->x, m, K), K, row, sc, group, yn + m * ldy, ldy); m += 4; }
        if (m + 2 <= M) { q8_row_2(rows_from(a->x, m, K), K, row, sc, group, yn + m * ldy, ldy); m += 2; }
        if (m < M) q8_row_1(rows_from(a->x, m, K), K, row, sc, group, yn + m * ldy, ldy);
    }
}

void q4_linear(const void *qx, int64_t M, int64_t K, const uint8_t *packed, const float *scale, const float *bias,
               int64_t N, float *y, int64_t ldy, int threads) {
    const LinearArgs a = {view(qx, M, K), M, K, QK, ldy, packed, scale, bias, y};
    pool_run(q4_rows, &a, N, chunk_rows(N, threads), threads);
}

void q8_linear(const void *qx, int64_t M, int64_t K, const int8_t *codes, const float *scale, int64_t group,
               int64_t N, float *y, int64_t ldy, int threads) {
    const LinearArgs a = {view(qx, M, K), M, K, group, ldy, codes, scale, NULL, y};
    pool_run(q8_rows, &a, N, chunk_rows(N, threads), threads);
}

/* Float32 copies of W for large batches, where a float GEMM beats the integer products; each weight is
 * code * scale + bias with one fused multiply-add, the reference de-quantizer's value. */
static void q4_dequantize_rows(const void *ctx, int64_t begin, int64_t end, int slot) {
    const LinearArgs *a = ctx;
    const int64_t K = a->K, groups = K / QK;
    (void)slot;
    for (int64_t n = begin; n < end; n++) {
        for (int64_t g = 0; g < groups; g++) {
            __m256i c[2];
            q4_group16((const uint8_t *)a->codes + n * groups * 16, g, groups, c);
            const __m256 vs = _mm256_set1_ps(a->scale[n * groups + g]), vb = _mm256_set1_ps(a->bias[n * groups + g]);
            for (int j = 0; j < 4; j++) {
                const __m128i part = j & 1 ? _mm256_extracti128_si256(c[j / 2], 1) : _mm256_castsi256_si128(c[j / 2]);
                const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(part));
                _mm256_storeu_ps(a->y + n * K + g * QK + 8 * j, _mm256_fmadd_ps(v, vs, vb));
            }
        }
    }
}

static void q8_dequantize_rows(const void *ctx, int64_t begin, int64_t end, int slot) {
    const LinearArgs *a = ctx;
    const int64_t K = a->K, group = a->group, groups = K / group;
    (void)slot;
    for (int64_t n = begin; n < end; n++) {
        for (int64_t k = 0; k < K; k += 8) {
            const __m256 vs = _mm256_set1_ps(a->scale[n * groups + k / group]);
            const __m128i bytes = _mm_loadl_epi64((const __m128i *)((const int8_t *)a->codes + n * K + k));
            const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
            _mm256_storeu_ps(a->y + n * K + k, _mm256_mul_ps(v, vs));
        }
    }
}

void q4_dequantize(const uint8_t *packed, const float *scale, const float *bias, int64_t N, int64_t K, float *out,
                   int threads) {
    const LinearArgs a = {.K = K, .codes = packed, .scale = scale, .bias = bias, .y = out};
    pool_run(q4_dequantize_rows, &a, N, chunk_rows(N, threads), threads);
}

void q8_dequantize(const int8_t *codes, const float *scale, int64_t group, int64_t N, int64_t K, float *out,
                   int threads) {
    const LinearArgs a = {.K = K, .group = group, .codes = codes, .scale = scale, .y = out};
    pool_run(q8_dequantize_rows, &a, N, chunk_rows(N, threads), threads);
}

typedef struct {
    const float *qkv, *cos_sin, *k_cache, *v_cache;
    const int64_t *positions;
    const int32_t *seq_lens, *block_tables;
    int64_t H, Hkv, D, block_size, max_blocks;
    float scale, *out, *scratch;
} AttentionArgs;

/* Query heads [begin, end) of the flattened (token, head) pairs. */
static void attend(const void *ctx, int64_t begin, int64_t end, int slot) {
    const AttentionArgs *a = ctx;
    const int64_t H = a->H, Hkv = a->Hkv, D = a->D, half = D / 2, width = (H + 2 * Hkv) * D;
    /* this thread's scratch: q, acc (D floats each), scores and cache slots (max_blocks * block_size each) */
    const int64_t positions = (a->max_blocks * a->block_size + 1) / 2 * 2; /* even: slot_of stays aligned */
    float *q = a->scratch + slot * (2 * D + 3 * positions), *acc = q + D, *scores = acc + D;
    int64_t *slot_of = (int64_t *)(scores + positions), slots_of = -1;
    for (int64_t task = begin; task < end; task++) {
        const int64_t t = task / H, h = task % H, kvh = h / (H / Hkv), len = a->seq_lens[t];
        const float *cs = a->cos_sin + a->positions[t] * D, *qs = a->qkv + t * width + h * D;
        if (t != slots_of) { /* the cache slots of this sequence's positions, once per sequence */
            const int32_t *table = a->block_tables + t * a->max_blocks;
            for (int64_t j = 0, block = 0; j < len; block++)
                for (int64_t o = 0; o < a->block_size && j < len; o++, j++)
                    slot_of[j] = (int64_t)table[block] * a->block_size + o;
            slots_of = t;
        }
        for (int64_t i = 0; i < half; i++) {
            q[i] = qs[i] * cs[i] - qs[half + i] * cs[half + i];
            q[half + i] = qs[half + i] * cs[i] + qs[i] * cs[half + i];
        }
        float top = -INFINITY;
        for (int64_t j = 0; j < len; j++) {
            scores[j] = dot_f32(q, a->k_cache + (slot_of[j] * Hkv + kvh) * D, D) * a->scale;
            top = scores[j] > top ? scores[j] : top;
        }
        const __m256 vtop = _mm256_set1_ps(top);
        __m256 sum = _mm256_setzero_ps();
        int64_t j = 0;
        for (; j + 8 <= len; j += 8) {
            const __m256 p = exp256(_mm256_sub_ps(_mm256_loadu_ps(scores + j), vtop));
            _mm256_storeu_ps(scores + j, p);
            sum = _mm256_add_ps(sum, p);
        }
        float total = hsum(sum);
        for (; j < len; j++) {
            scores[j] = _mm256_cvtss_f32(exp256(_mm256_set1_ps(scores[j] - top)));
            total += scores[j];
        }
        for (int64_t i = 0; i < D; i++) acc[i] = 0.0f;
        for (j = 0; j < len; j++) {
            const float *vr = a->v_cache + (slot_of[j] * Hkv + kvh) * D, p = scores[j];
            for (int64_t i = 0; i < D; i++) acc[i] += p * vr[i];
        }
        float *o = a->out + t * H * D + h * D;
        for (int64_t i = 0; i < D; i++) o[i] = acc[i] / total;
    }
}

/* One decode step's attention for T single-query sequences, from the merged q/k/v rows qkv [T, (H + 2 Hkv) D]:
 * rotates q and k (NeoX halves; cos_sin[p] = cat(cos, sin) of position p), writes k and v to the paged
 * caches [blocks, block_size, Hkv, D] at slots[t] (-1: nothing), then attends each query head over its
 * sequence's seq_lens[t] cached positions (block_tables [T, max_blocks]) into out [T, H D]; scratch holds
 * threads * (2 D + 3 P) floats, P = max_blocks * block_size rounded up to even.
 * The same math as the torch path (rotary_write_kv, then a softmax attention) in one call. */
void decode_attention(const float *qkv, int64_t T, int64_t H, int64_t Hkv, int64_t D, const int64_t *positions,
                      const float *cos_sin, float *k_cache, float *v_cache, int64_t block_size, const int64_t *slots,
                      const int32_t *seq_lens, const int32_t *block_tables, int64_t max_blocks, float scale,
                      float *out, float *scratch, int threads) {
    const int64_t width = (H + 2 * Hkv) * D, half = D / 2;
    for (int64_t t = 0; t < T; t++) { /* k and v into the cache first: each query sees its own token */
        if (slots[t] < 0) continue;
        const float *cs = cos_sin + positions[t] * D, *k = qkv + t * width + H * D, *v = k + Hkv * D;
        float *kc = k_cache + slots[t] * Hkv * D, *vc = v_cache + slots[t] * Hkv * D;
        for (int64_t h = 0; h < Hkv; h++)
            for (int64_t i = 0; i < half; i++) {
                const float x1 = k[h * D + i], x2 = k[h * D + half + i];
                kc[h * D + i] = x1 * cs[i] - x2 * cs[half + i];
                kc[h * D + half + i] = x2 * cs[i] + x1 * cs[half + i];
            }
        for (int64_t i = 0; i < Hkv * D; i++) vc[i] = v[i];
    }
    const AttentionArgs a = {qkv, cos_sin, k_cache, v_cache, positions, seq_lens, block_tables, H, Hkv, D,
                             block_size, max_blocks, scale, out, scratch};
    pool_run(attend, &a, T * H, 4, threads);
}
