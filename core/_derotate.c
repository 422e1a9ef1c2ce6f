/* kvscope.core._derotate: statistics of Hadamard-rotated K/V rows, de-rotated in one pass.
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
 *   float32: the caller then takes its exact numpy path. KERNEL is "avx2" where the kernels
 *   run, None elsewhere (stats() then raises RuntimeError).
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

TARGET static inline v8f select_gt(v8f a, v8f b) {  /* lane-wise max by a compare mask (maxps) */
    const v8i gt = a > b;
    return (v8f)(((v8i)a & gt) | ((v8i)b & ~gt));
}

TARGET static inline v8f select_lt(v8f a, v8f b) {
    const v8i lt = a < b;
    return (v8f)(((v8i)a & lt) | ((v8i)b & ~lt));
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

/* One block of n values (a multiple of 16) in x[0..n/8): its sums, then the unnormalised
 * transform and the running extremes. The last butterfly stage is not stored: of a + b and a - b
 * the larger is a + |b| and the smaller a - |b| (the same roundings). */
TARGET static inline __attribute__((always_inline)) void block_fold(v8f *x, const int n, acc_t *acc) {
    const int m = n / 8;
    v8f sq = x[0] * x[0];
    UNROLL for (int i = 1; i < m; i++) sq += x[i] * x[i];
    acc->sq += sq;
    acc->sum_first += (double)x[0][0];
    if (++acc->since_flush == FLUSH_BLOCKS) flush(acc);
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

/* the common block sizes as constants (the loops then unroll) */
#define FOLD(x, n, acc)                                    \
    do {                                                   \
        if ((n) == 64) block_fold((x), 64, (acc));         \
        else if ((n) == 128) block_fold((x), 128, (acc));  \
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

TARGET static void stats_q4_0(const uint8_t *raw, Py_ssize_t nblocks, int n, acc_t *acc) {
    v8f x[MAX_BLOCK / 8];
    float *xf = (float *)x;
    const uint8_t *blk = raw;
    for (Py_ssize_t b = 0; b < nblocks && !acc->bad; b++) {
        for (int k = 0; k < n / QK; k++, blk += 2 + QK / 2) {
            uint16_t h = (uint16_t)(blk[0] | (blk[1] << 8));
            if ((h & 0x7c00u) == 0x7c00u) { acc->bad = 1; return; }
            const float d = half_to_float(h);
            const uint8_t *q = blk + 2;
            for (int i = 0; i < QK / 2; i++) {
                xf[k * QK + i] = d * (float)((int)(q[i] & 0x0f) - 8);
                xf[k * QK + QK / 2 + i] = d * (float)((int)(q[i] >> 4) - 8);
            }
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
#else
typedef struct { float mn[8], mx[8]; double sum_first, sum_sq; int bad; } acc_t;
static void run(int kind, const void *data, Py_ssize_t nblocks, int n, acc_t *acc) {
    (void)kind, (void)data, (void)nblocks, (void)n;
    acc->bad = 1;  /* never called: stats() refuses first */
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

static PyMethodDef methods[] = {
    {"stats", derotate_stats, METH_VARARGS,
     "stats(kind, data, block) -> (ok, min, max, sum_first, sum_squares, n_values)"},
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
