/* kvscope.core._derotate: the compiled kernels of `kvscope inspect --stats`: statistics of K/V rows
 * in one pass over their bytes, plain (f16, bf16, f32, q8_0, q4_0) or Hadamard-rotated (q8_0, q4_0),
 * and the float32 decode of the plain types.
 *
 * llama.cpp (2026-04 and later) stores the rows of a quantized K/V cache multiplied, block by
 * block, by the orthonormal Walsh-Hadamard matrix (kvscope.core.reader.rotation). `kvscope inspect
 * --stats` needs the extremes of the de-rotated values, which numpy only gets by materialising
 * the whole transform (several passes over memory per value). This module decodes q8_0 / q4_0
 * blocks (or takes float32 values) and transforms one rotation block at a time in registers and
 * a small buffer: the three lowest index bits by shuffles inside a vector of eight, the others by
 * butterflies between vectors, the last stage folded into the extremes. The sum of the squares
 * and the sum of each block's first stored value (times sqrt(n) it is the sum of the de-rotated
 * values: every other Hadamard row sums to zero) come along.
 *
 * The block layouts are ggml's (q8_0: f16 scale, 32 int8; q4_0: f16 scale, 16 bytes of nibbles,
 * low nibbles first, value = nibble - 8); the Python side (kvscope.core.derotate_kernel) calls
 * this only after checking them against gguf-py's GGML_QUANT_SIZES. The products d*q are the
 * float32 products gguf-py forms; the transform is exact up to float32 rounding (built with
 * -ffp-contract=off: no fused multiply-adds).
 *
 * stats(kind, data, block) -> (ok, min, max, sum_first, sum_squares, n_values)
 *   kind 0: float32 values; 1: q8_0 blocks; 2: q4_0 blocks. `data` is a contiguous buffer of
 *   whole rotation blocks of `block` values (a power of two, 16..MAX_BLOCK). ok is False, and the
 *   rest meaningless, when a value or a block's scale is not finite or the squares overflow
 *   float32: the caller then takes its exact numpy path.
 *
 * values(kind, data, row_bytes, el, flags) -> (n_values, n_nan, n_inf, first_bad, min, max, sum,
 *                                             sum_squares, n_zero)
 *   kind as above, 3: f16, 4: bf16; `data` is whole elements / blocks in rows of row_bytes bytes.
 *   NaN and Inf are counted exactly and first_bad is the flat index of the first (-1: none);
 *   min/max/sum/sum_squares are of the finite values (min inf, max -inf when there are none).
 *   el == 0: flags[r] = row r is all zero bytes; el > 0 (a transposed V, rows are columns of
 *   el-byte cells): flags[j] = cell j is zero bytes in every row. n_zero counts the flags set.
 *   Nothing is left to the caller: every value is decoded as numpy decodes it (below).
 *
 * decode(kind, data, out) -> n_values: the float32 values of `data` (kinds 0-4) into `out`.
 *
 * KERNEL is "avx2" where the kernels run, None elsewhere (every function then raises RuntimeError).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_BLOCK 512
#define QK 32

/* The kernels are written for AVX2 (x86-64 CPUs since 2013, picked at run time); elsewhere the
 * module loads with KERNEL = None and kvscope keeps its numpy path (a portable build of these
 * loops ran slower than numpy). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_KERNELS 1
#include <immintrin.h>
#define TARGET __attribute__((target("avx2,f16c")))

#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define SHUF(v, ...) __builtin_shufflevector(v, v, __VA_ARGS__)
#else
#define SHUF(v, ...) __builtin_shuffle(v, (v8i){__VA_ARGS__})
#endif

#define UNROLL _Pragma("GCC unroll 16")  /* the block loops, whole for 64 and 128 values */

/* eight floats: the vector the butterflies work on (one AVX register) */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

typedef struct {
    v8f mn, mx, sq;  /* per lane: extremes (unnormalised), sum of squares since the last flush */
    double sum_first, sum_sq;
    int since_flush;
    int bad;
} acc_t;

TARGET static inline float half_to_float(uint16_t h) {  /* F16C: every AVX2 CPU has it */
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

/* the float32 squares summed over at most this many blocks before they go into the double */
#define FLUSH_BLOCKS 16

TARGET static void flush(acc_t *acc) {
    float q = 0;
    for (int l = 0; l < 8; l++) q += acc->sq[l];
    if (!isfinite(q)) acc->bad = 1;  /* a NaN/Inf value, or squares past float32 */
    acc->sum_sq += (double)q;
    acc->sq = (v8f){0};
    acc->since_flush = 0;
}

/* lane-wise a > b ? a : b, which is what maxps computes (NaN and equal lanes give b); written as
 * a compare mask, gcc emitted a compare and a variable blend instead */
TARGET static inline v8f select_gt(v8f a, v8f b) {
    return (v8f)_mm256_max_ps((__m256)a, (__m256)b);
}

TARGET static inline v8f select_lt(v8f a, v8f b) {  /* a < b ? a : b: minps */
    return (v8f)_mm256_min_ps((__m256)a, (__m256)b);
}

/* H(8) on each group of eight: the three lowest index bits, by shuffles (x + s*y is x - y
 * exactly when s = -1) */
TARGET static inline __attribute__((always_inline)) v8f wht8(v8f v) {
    const v8f s1 = {1, -1, 1, -1, 1, -1, 1, -1}, s2 = {1, 1, -1, -1, 1, 1, -1, -1},
              s4 = {1, 1, 1, 1, -1, -1, -1, -1};
    v = SHUF(v, 1, 0, 3, 2, 5, 4, 7, 6) + v * s1;
    v = SHUF(v, 2, 3, 0, 1, 6, 7, 4, 5) + v * s2;
    return SHUF(v, 4, 5, 6, 7, 0, 1, 2, 3) + v * s4;
}

/* One block of n values (a multiple of 16, at most 128) in x[0..n/8): the unnormalised transform
 * and the running extremes. The last butterfly stage is not stored: of a + b and a - b the larger
 * is a + |b| and the smaller a - |b| (the same roundings). */
TARGET static inline __attribute__((always_inline)) void block_extremes(v8f *x, const int n, acc_t *acc) {
    const int m = n / 8;
    UNROLL for (int i = 0; i < m; i++) x[i] = wht8(x[i]);
    UNROLL for (int h = 1; h < m / 2; h <<= 1)
        UNROLL for (int i = 0; i < m; i += 2 * h)
            UNROLL for (int j = i; j < i + h; j++) {
                v8f a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    const v8i nosign = {0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff,
                        0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff};
    const int half = m / 2;
    UNROLL for (int j = 0; j < half; j++) {  /* the last stage, folded into candidates in place */
        const v8f a = x[j], b = (v8f)((v8i)x[j + half] & nosign);
        x[j] = a + b;
        x[j + half] = a - b;
    }
    UNROLL for (int w = half / 2; w >= 1; w /= 2)  /* pairwise: independent compares, not one chain */
        UNROLL for (int j = 0; j < w; j++) {
            x[j] = select_gt(x[j], x[j + w]);
            x[half + j] = select_lt(x[half + j], x[half + j + w]);
        }
    acc->mx = select_gt(x[0], acc->mx);
    acc->mn = select_lt(x[half], acc->mn);
}

/* A block's sums, then its extremes. Blocks past 128 values first take their top butterfly stages between halves (H(n) is
 * H(n/128) (x) H(128)), then each 128-value part alone: sixteen vectors and the temporaries fit the
 * registers, thirty-two spilled (half the speed). */
TARGET static inline __attribute__((always_inline)) void block_fold(v8f *x, const int n, acc_t *acc) {
    const int m = n / 8;
    v8f sq = x[0] * x[0];
    UNROLL for (int i = 1; i < m; i++) sq += x[i] * x[i];
    acc->sq += sq;
    acc->sum_first += (double)x[0][0];
    if (++acc->since_flush == FLUSH_BLOCKS) flush(acc);
    if (n <= 128) {
        block_extremes(x, n, acc);
        return;
    }
    for (int h = m / 2; h >= 16; h >>= 1)
        for (int i = 0; i < m; i += 2 * h)
            UNROLL for (int j = i; j < i + h; j++) {
                v8f a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    for (int i = 0; i < m; i += 16) block_extremes(x + i, 128, acc);
}

/* the common block sizes as constants (the loops then unroll) */
#define FOLD(x, n, acc)                                    \
    do {                                                   \
        if ((n) == 64) block_fold((x), 64, (acc));         \
        else if ((n) == 128) block_fold((x), 128, (acc));  \
        else if ((n) == 256) block_fold((x), 256, (acc));  \
        else block_fold((x), (n), (acc));                  \
    } while (0)

TARGET static inline v8f widen(const int8_t *q) {  /* eight int8 to eight floats */
    __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
    v8f r;
    memcpy(&r, &f, sizeof r);
    return r;
}

TARGET static void stats_f32(const float *v, Py_ssize_t nblocks, int n, acc_t *acc) {
    v8f x[MAX_BLOCK / 8];
    for (Py_ssize_t b = 0; b < nblocks && !acc->bad; b++) {
        memcpy(x, v + b * n, (size_t)n * sizeof(float));
        FOLD(x, n, acc);
    }
}

TARGET static void stats_q8_0(const uint8_t *raw, Py_ssize_t nblocks, int n, acc_t *acc) {
    v8f x[MAX_BLOCK / 8];
    const uint8_t *blk = raw;
    for (Py_ssize_t b = 0; b < nblocks && !acc->bad; b++) {
        for (int k = 0; k < n / QK; k++, blk += 2 + QK) {
            uint16_t h = (uint16_t)(blk[0] | (blk[1] << 8));
            if ((h & 0x7c00u) == 0x7c00u) { acc->bad = 1; return; }
            const float d = half_to_float(h);
            const int8_t *q = (const int8_t *)(blk + 2);
            for (int i = 0; i < QK / 8; i++) x[k * (QK / 8) + i] = widen(q + 8 * i) * d;
        }
        FOLD(x, n, acc);
    }
}

TARGET static void decode_q4_0(const uint8_t *p, Py_ssize_t nblocks, float *out);  /* below */

TARGET static void stats_q4_0(const uint8_t *raw, Py_ssize_t nblocks, int n, acc_t *acc) {
    v8f x[MAX_BLOCK / 8];
    float *xf = (float *)x;
    const uint8_t *blk = raw;
    for (Py_ssize_t b = 0; b < nblocks && !acc->bad; b++) {
        for (int k = 0; k < n / QK; k++, blk += 2 + QK / 2) {
            uint16_t h = (uint16_t)(blk[0] | (blk[1] << 8));
            if ((h & 0x7c00u) == 0x7c00u) { acc->bad = 1; return; }
            decode_q4_0(blk, 1, xf + k * QK);
        }
        FOLD(x, n, acc);
    }
}

TARGET static void run(int kind, const void *data, Py_ssize_t nblocks, int n, acc_t *acc) {
    for (int l = 0; l < 8; l++) { acc->mn[l] = INFINITY; acc->mx[l] = -INFINITY; }
    if (kind == 0) stats_f32((const float *)data, nblocks, n, acc);
    else if (kind == 1) stats_q8_0((const uint8_t *)data, nblocks, n, acc);
    else stats_q4_0((const uint8_t *)data, nblocks, n, acc);
    if (!acc->bad) flush(acc);
}

/* ---- plain (not rotated) values: f16, bf16, f32, q8_0, q4_0 ------------------------------------
 *
 * Values are decoded VCHUNK at a time into a float32 buffer that stays in L1 (F16C for f16, a
 * shift for bf16, ggml's float32 products d*q for q8_0/q4_0: the values numpy decodes, bit for
 * bit), then reduced in float32 lanes: extremes, sum, sum of squares. A chunk whose lane sums come
 * out non-finite (a NaN/Inf value, or float32 sums that overflow) is reduced again value by value
 * in double: NaN and Inf counted, the first one's position kept, the finite values summed. */

enum { K_F32 = 0, K_Q8_0 = 1, K_Q4_0 = 2, K_F16 = 3, K_BF16 = 4 };

#define VCHUNK 4096  /* values per chunk: a multiple of QK */

typedef struct {
    Py_ssize_t n_nan, n_inf, first_bad;  /* first_bad: flat index of the first NaN/Inf, -1 when none */
    float mn, mx;
    double sum, sum_sq;
} vacc_t;

TARGET static void decode_f16(const uint8_t *p, Py_ssize_t n, float *out) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * i))));
    for (; i < n; i++) out[i] = half_to_float((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
}

TARGET static void decode_bf16(const uint8_t *p, Py_ssize_t n, float *out) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 2 * i)));
        _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    for (; i < n; i++) {
        const uint32_t b = (uint32_t)(p[2 * i] | (p[2 * i + 1] << 8)) << 16;
        memcpy(out + i, &b, sizeof b);
    }
}

TARGET static void decode_q8_0(const uint8_t *p, Py_ssize_t nblocks, float *out) {
    for (Py_ssize_t b = 0; b < nblocks; b++, p += 2 + QK, out += QK) {
        const __m256 d = _mm256_set1_ps(half_to_float((uint16_t)(p[0] | (p[1] << 8))));
        for (int i = 0; i < QK / 8; i++) {
            const __m128i q = _mm_loadl_epi64((const __m128i *)(p + 2 + 8 * i));
            _mm256_storeu_ps(out + 8 * i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d));
        }
    }
}

TARGET static void decode_q4_0(const uint8_t *p, Py_ssize_t nblocks, float *out) {
    const __m128i low4 = _mm_set1_epi8(0x0f);
    const __m256 eight = _mm256_set1_ps(8.0f);
    for (Py_ssize_t b = 0; b < nblocks; b++, p += 2 + QK / 2, out += QK) {
        const __m256 d = _mm256_set1_ps(half_to_float((uint16_t)(p[0] | (p[1] << 8))));
        const __m128i q = _mm_loadu_si128((const __m128i *)(p + 2));
        const __m128i nib[2] = {_mm_and_si128(q, low4), _mm_and_si128(_mm_srli_epi16(q, 4), low4)};
        for (int h = 0; h < 2; h++)  /* low nibbles are values 0..15, high nibbles 16..31 */
            for (int i = 0; i < 2; i++) {
                const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(nib[h], 8 * i)));
                _mm256_storeu_ps(out + 16 * h + 8 * i, _mm256_mul_ps(_mm256_sub_ps(f, eight), d));
            }
    }
}

/* n float32 values into g in float32 lanes (two independent chains of eight); 0 (g untouched)
 * when the lane sums are not finite. `wide` (a constant at each call: the compiler keeps two
 * loops) sums the squares in double: bf16 and f32 values as small as 2**-63 have float32 squares
 * below the normal range, whose every product costs a microcode assist (20x slower); in double
 * none does (f16 and ggml's d*q products are never below 2**-24). */
TARGET static inline __attribute__((always_inline)) int reduce_lanes(const float *x, Py_ssize_t n, vacc_t *g,
                                                                      const int wide) {
    __m256 mn0 = _mm256_set1_ps(INFINITY), mn1 = mn0, mx0 = _mm256_set1_ps(-INFINITY), mx1 = mx0;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, q0 = s0, q1 = s0;
    __m256d w[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        mn0 = _mm256_min_ps(mn0, a);
        mn1 = _mm256_min_ps(mn1, b);
        mx0 = _mm256_max_ps(mx0, a);
        mx1 = _mm256_max_ps(mx1, b);
        s0 = _mm256_add_ps(s0, a);
        s1 = _mm256_add_ps(s1, b);
        if (wide) {
            const __m256d d[4] = {_mm256_cvtps_pd(_mm256_castps256_ps128(a)), _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)),
                                  _mm256_cvtps_pd(_mm256_castps256_ps128(b)), _mm256_cvtps_pd(_mm256_extractf128_ps(b, 1))};
            for (int k = 0; k < 4; k++) w[k] = _mm256_add_pd(w[k], _mm256_mul_pd(d[k], d[k]));
        } else {
            q0 = _mm256_add_ps(q0, _mm256_mul_ps(a, a));
            q1 = _mm256_add_ps(q1, _mm256_mul_ps(b, b));
        }
    }
    float mn[8], mx[8], s[8], qf[8];
    double qd[4][4];
    _mm256_storeu_ps(mn, _mm256_min_ps(mn0, mn1));
    _mm256_storeu_ps(mx, _mm256_max_ps(mx0, mx1));
    _mm256_storeu_ps(s, _mm256_add_ps(s0, s1));
    _mm256_storeu_ps(qf, _mm256_add_ps(q0, q1));
    for (int k = 0; k < 4; k++) _mm256_storeu_pd(qd[k], w[k]);
    double sum = 0, sq = 0;
    float lo = INFINITY, hi = -INFINITY;
    for (int l = 0; l < 8; l++) {  /* lane l of a (wide: w[0], w[1]) and of b (w[2], w[3]) */
        sum += s[l];
        sq += wide ? qd[l / 4][l % 4] + qd[2 + l / 4][l % 4] : (double)qf[l];
        lo = mn[l] < lo ? mn[l] : lo;
        hi = mx[l] > hi ? mx[l] : hi;
    }
    for (; i < n; i++) {  /* the last values of the buffer (fewer than 16) */
        sum += x[i];
        sq += (double)x[i] * x[i];
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    if (!isfinite(sum) || !isfinite(sq)) return 0;
    g->sum += sum;
    g->sum_sq += sq;
    g->mn = lo < g->mn ? lo : g->mn;
    g->mx = hi > g->mx ? hi : g->mx;
    return 1;
}

TARGET static int reduce_fast(const float *x, Py_ssize_t n, vacc_t *g) { return reduce_lanes(x, n, g, 0); }

TARGET static int reduce_fast_wide(const float *x, Py_ssize_t n, vacc_t *g) { return reduce_lanes(x, n, g, 1); }

/* the same value by value: NaN/Inf counted and the first one's index (base + i) kept, the
 * finite values summed in double */
static void reduce_slow(const float *x, Py_ssize_t n, Py_ssize_t base, vacc_t *g) {
    for (Py_ssize_t i = 0; i < n; i++) {
        const float v = x[i];
        if (!isfinite(v)) {
            if (isnan(v)) g->n_nan++;
            else g->n_inf++;
            if (g->first_bad < 0) g->first_bad = base + i;
            continue;
        }
        g->sum += v;
        g->sum_sq += (double)v * v;
        g->mn = v < g->mn ? v : g->mn;
        g->mx = v > g->mx ? v : g->mx;
    }
}

/* n values of `kind` at p into buf (VCHUNK floats; n <= VCHUNK, whole blocks for q8_0/q4_0) */
TARGET static void decode_chunk(int kind, const uint8_t *p, Py_ssize_t n, float *buf) {
    switch (kind) {
    case K_F16: decode_f16(p, n, buf); break;
    case K_BF16: decode_bf16(p, n, buf); break;
    case K_Q8_0: decode_q8_0(p, n / QK, buf); break;
    case K_Q4_0: decode_q4_0(p, n / QK, buf); break;
    default: memcpy(buf, p, (size_t)n * sizeof(float));
    }
}

static Py_ssize_t chunk_offset(int kind, Py_ssize_t v) {  /* bytes before value v (whole blocks) */
    switch (kind) {
    case K_F16: case K_BF16: return 2 * v;
    case K_Q8_0: return v / QK * (2 + QK);
    case K_Q4_0: return v / QK * (2 + QK / 2);
    default: return 4 * v;
    }
}

TARGET static void values_run(int kind, const uint8_t *data, Py_ssize_t n_values, vacc_t *g) {
    float buf[VCHUNK] __attribute__((aligned(32)));
    const int wide = kind == K_F32 || kind == K_BF16;  /* values that can be far below 2**-24 */
    g->mn = INFINITY;
    g->mx = -INFINITY;
    g->first_bad = -1;
    /* float32 values on a float's alignment are reduced where they lie (a copy saved: f32 ran at
     * 0.8x f16's bytes per second through the buffer); elsewhere they are copied into it */
    const int in_place = kind == K_F32 && ((uintptr_t)data % sizeof(float)) == 0;
    for (Py_ssize_t v = 0; v < n_values; v += VCHUNK) {
        const Py_ssize_t m = n_values - v < VCHUNK ? n_values - v : VCHUNK;
        const float *x = in_place ? (const float *)data + v : buf;
        if (!in_place) decode_chunk(kind, data + chunk_offset(kind, v), m, buf);
        if (!(wide ? reduce_fast_wide(x, m, g) : reduce_fast(x, m, g))) reduce_slow(x, m, v, g);
    }
}

TARGET static void decode_run(int kind, const uint8_t *data, Py_ssize_t n_values, float *out) {
    for (Py_ssize_t v = 0; v < n_values; v += VCHUNK) {
        const Py_ssize_t m = n_values - v < VCHUNK ? n_values - v : VCHUNK;
        decode_chunk(kind, data + chunk_offset(kind, v), m, out + v);
    }
}

/* flags[r] = row r (row_bytes bytes) is all zero bytes; returns how many are */
TARGET static Py_ssize_t zero_rows(const uint8_t *p, Py_ssize_t nrows, Py_ssize_t row_bytes, uint8_t *flags) {
    Py_ssize_t count = 0;
    for (Py_ssize_t r = 0; r < nrows; r++, p += row_bytes) {
        __m256i acc = _mm256_setzero_si256();
        Py_ssize_t k = 0;
        for (; k + 32 <= row_bytes; k += 32) acc = _mm256_or_si256(acc, _mm256_loadu_si256((const __m256i *)(p + k)));
        uint8_t t = 0;
        for (; k < row_bytes; k++) t |= p[k];
        const int z = _mm256_testz_si256(acc, acc) && !t;
        flags[r] = (uint8_t)z;
        count += z;
    }
    return count;
}

/* flags[j] = element j (el bytes) of the rows is zero bytes in every row (acc: row_bytes scratch) */
TARGET static Py_ssize_t zero_columns(const uint8_t *p, Py_ssize_t nrows, Py_ssize_t row_bytes, int el,
                                      uint8_t *acc, uint8_t *flags) {
    memset(acc, 0, (size_t)row_bytes);
    for (Py_ssize_t r = 0; r < nrows; r++, p += row_bytes) {
        Py_ssize_t k = 0;
        for (; k + 32 <= row_bytes; k += 32) {
            const __m256i a = _mm256_loadu_si256((const __m256i *)(acc + k));
            _mm256_storeu_si256((__m256i *)(acc + k), _mm256_or_si256(a, _mm256_loadu_si256((const __m256i *)(p + k))));
        }
        for (; k < row_bytes; k++) acc[k] |= p[k];
    }
    Py_ssize_t count = 0;
    for (Py_ssize_t j = 0; j < row_bytes / el; j++) {
        uint8_t t = 0;
        for (int b = 0; b < el; b++) t |= acc[j * el + b];
        flags[j] = (uint8_t)!t;
        count += !t;
    }
    return count;
}
#else
typedef struct { float mn[8], mx[8]; double sum_first, sum_sq; int bad; } acc_t;
static void run(int kind, const void *data, Py_ssize_t nblocks, int n, acc_t *acc) {
    (void)kind, (void)data, (void)nblocks, (void)n;
    acc->bad = 1;  /* never called: stats() refuses first */
}
enum { K_F32 = 0, K_Q8_0 = 1, K_Q4_0 = 2, K_F16 = 3, K_BF16 = 4 };
typedef struct { Py_ssize_t n_nan, n_inf, first_bad; float mn, mx; double sum, sum_sq; } vacc_t;
/* never called either: values() and decode() refuse first */
static void values_run(int kind, const uint8_t *data, Py_ssize_t n_values, vacc_t *g) {
    (void)kind, (void)data, (void)n_values, (void)g;
}
static void decode_run(int kind, const uint8_t *data, Py_ssize_t n_values, float *out) {
    (void)kind, (void)data, (void)n_values, (void)out;
}
static Py_ssize_t zero_rows(const uint8_t *p, Py_ssize_t nrows, Py_ssize_t row_bytes, uint8_t *flags) {
    (void)p, (void)nrows, (void)row_bytes, (void)flags;
    return 0;
}
static Py_ssize_t zero_columns(const uint8_t *p, Py_ssize_t nrows, Py_ssize_t row_bytes, int el, uint8_t *acc,
                               uint8_t *flags) {
    (void)p, (void)nrows, (void)row_bytes, (void)el, (void)acc, (void)flags;
    return 0;
}
#endif /* HAVE_KERNELS */

static int avx2 = 0;  /* the CPU runs the kernels */

static PyObject *derotate_stats(PyObject *self, PyObject *args) {
    int kind, n;
    Py_buffer buf;
    (void)self;
    if (!avx2) {
        PyErr_SetString(PyExc_RuntimeError, "the de-rotation kernels need an x86-64 CPU with AVX2 and F16C");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "iy*i", &kind, &buf, &n)) return NULL;
    Py_ssize_t unit = 0;  /* bytes of one rotation block */
    if (n >= 16 && n <= MAX_BLOCK && !(n & (n - 1))) {
        if (kind == 0) unit = (Py_ssize_t)n * 4;
        else if (kind == 1 && n % QK == 0) unit = (Py_ssize_t)(n / QK) * (2 + QK);
        else if (kind == 2 && n % QK == 0) unit = (Py_ssize_t)(n / QK) * (2 + QK / 2);
    }
    if (unit == 0 || buf.len % unit != 0 || (kind == 0 && ((uintptr_t)buf.buf % 4) != 0)) {
        PyBuffer_Release(&buf);
        PyErr_Format(PyExc_ValueError, "no whole rotation blocks of %d values of kind %d in %zd bytes", n, kind,
                     buf.len);
        return NULL;
    }
    Py_ssize_t nblocks = buf.len / unit;
    acc_t acc;
    memset(&acc, 0, sizeof acc);
    Py_BEGIN_ALLOW_THREADS
    run(kind, buf.buf, nblocks, n, &acc);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    float mn = INFINITY, mx = -INFINITY;
    for (int l = 0; l < 8; l++) {
        mn = acc.mn[l] < mn ? acc.mn[l] : mn;
        mx = acc.mx[l] > mx ? acc.mx[l] : mx;
    }
    const float scale = (float)(1.0 / sqrt((double)n));  /* the orthonormal matrix's 1/sqrt(n) */
    return Py_BuildValue("(Nddddn)", PyBool_FromLong(!acc.bad), (double)(mn * scale), (double)(mx * scale),
                         acc.sum_first, acc.sum_sq, nblocks * (Py_ssize_t)n);
}

/* bytes and values of one unit (element or block) of a value kind; 0 for an unknown kind */
static int unit_bytes(int kind, int *values) {
    *values = (kind == K_Q8_0 || kind == K_Q4_0) ? QK : 1;
    switch (kind) {
    case K_F32: return 4;
    case K_F16: case K_BF16: return 2;
    case K_Q8_0: return 2 + QK;
    case K_Q4_0: return 2 + QK / 2;
    default: return 0;
    }
}

static int refuse_without_kernels(void) {
    if (avx2) return 0;
    PyErr_SetString(PyExc_RuntimeError, "the kernels need an x86-64 CPU with AVX2 and F16C");
    return 1;
}

static PyObject *value_stats(PyObject *self, PyObject *args) {
    int kind, el, per_unit;
    Py_ssize_t row_bytes;
    Py_buffer buf, flags;
    (void)self;
    if (refuse_without_kernels()) return NULL;
    if (!PyArg_ParseTuple(args, "iy*niw*", &kind, &buf, &row_bytes, &el, &flags)) return NULL;
    const int unit = unit_bytes(kind, &per_unit);
    const Py_ssize_t nrows = row_bytes > 0 ? buf.len / row_bytes : 0;
    const Py_ssize_t nflags = el > 0 ? (row_bytes % el == 0 ? row_bytes / el : -1) : nrows;
    if (unit == 0 || row_bytes <= 0 || buf.len % unit != 0 || buf.len % row_bytes != 0 || el < 0 || nflags < 0 ||
        flags.len < nflags) {
        PyErr_Format(PyExc_ValueError,
                     "%zd bytes are not whole units of kind %d in rows of %zd bytes (%zd flags, element %d)", buf.len,
                     kind, row_bytes, flags.len, el);
        PyBuffer_Release(&buf);
        PyBuffer_Release(&flags);
        return NULL;
    }
    uint8_t *acc = NULL;
    if (el > 0 && nrows > 0 && (acc = PyMem_RawMalloc((size_t)row_bytes)) == NULL) {
        PyBuffer_Release(&buf);
        PyBuffer_Release(&flags);
        return PyErr_NoMemory();
    }
    const Py_ssize_t n_values = buf.len / unit * per_unit;
    vacc_t g;
    memset(&g, 0, sizeof g);
    Py_ssize_t n_zero = 0;
    Py_BEGIN_ALLOW_THREADS
    values_run(kind, (const uint8_t *)buf.buf, n_values, &g);
    if (nrows > 0)
        n_zero = el > 0 ? zero_columns((const uint8_t *)buf.buf, nrows, row_bytes, el, acc, (uint8_t *)flags.buf)
                        : zero_rows((const uint8_t *)buf.buf, nrows, row_bytes, (uint8_t *)flags.buf);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(acc);
    PyBuffer_Release(&buf);
    PyBuffer_Release(&flags);
    return Py_BuildValue("(nnnnddddn)", n_values, g.n_nan, g.n_inf, g.first_bad, (double)g.mn, (double)g.mx, g.sum,
                         g.sum_sq, n_zero);
}

static PyObject *decode_values(PyObject *self, PyObject *args) {
    int kind, per_unit;
    Py_buffer buf, out;
    (void)self;
    if (refuse_without_kernels()) return NULL;
    if (!PyArg_ParseTuple(args, "iy*w*", &kind, &buf, &out)) return NULL;
    const int unit = unit_bytes(kind, &per_unit);
    const Py_ssize_t n_values = unit ? buf.len / unit * per_unit : 0;
    if (unit == 0 || buf.len % unit != 0 || out.len < n_values * 4 || ((uintptr_t)out.buf % 4) != 0) {
        PyErr_Format(PyExc_ValueError, "%zd bytes are not whole units of kind %d, or no aligned room for their values",
                     buf.len, kind);
        PyBuffer_Release(&buf);
        PyBuffer_Release(&out);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    decode_run(kind, (const uint8_t *)buf.buf, n_values, (float *)out.buf);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    PyBuffer_Release(&out);
    return PyLong_FromSsize_t(n_values);
}

static PyMethodDef methods[] = {
    {"stats", derotate_stats, METH_VARARGS,
     "stats(kind, data, block) -> (ok, min, max, sum_first, sum_squares, n_values)"},
    {"values", value_stats, METH_VARARGS,
     "values(kind, data, row_bytes, el, flags) -> (n_values, n_nan, n_inf, first_bad, min, max, sum, sum_squares, "
     "n_zero)"},
    {"decode", decode_values, METH_VARARGS, "decode(kind, data, out) -> n_values (float32 values written to out)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_derotate",
    "Statistics of Hadamard-rotated K/V rows, de-rotated in one compiled pass (see kvscope.core.reader.rotation).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__derotate(void) {
#ifdef HAVE_KERNELS
    __builtin_cpu_init();
    avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#endif
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject *kernel = avx2 ? PyUnicode_FromString("avx2") : Py_NewRef(Py_None);
    int err = kernel == NULL || PyModule_AddIntConstant(m, "MAX_BLOCK", MAX_BLOCK) < 0 ||
              PyModule_AddObjectRef(m, "KERNEL", kernel) < 0;
    Py_XDECREF(kernel);
    if (err) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
