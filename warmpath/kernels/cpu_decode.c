/* Decode steps (and short chunks over a cached context) of a Llama-family model on the CPU, over quantized
   weights and warmpath's paged KV cache.

   Why native: a decode step of a small model is bound by reading weights and by per-op overhead. In torch a
   step is ~1,200 small ops (~20 ms of dispatch for SmolLM2) and fp32 weights (530 MB/token); here it is one
   call that reads the checkpoint's own 4-bit blocks (~85 MB/token) with AVX2, and touches each weight once
   for all the step's sequences.

   Numerics: weights are dequantized exactly as the loader does (d * q + m in fp32, no fused multiply-add),
   so the only difference from the fp32 torch path is the order of summation. One stream of bytes per
   weight row, as the file has it (the loader only un-permutes Q/K rows).

   Layouts (all row-major, C-contiguous, built by warmpath/kernels/native.py):
     WP_F32:  data = float[rows][cols]
     WP_Q4_1: data = GGUF's own blocks, rows of cols/32 blocks of 20 bytes: fp16 d, fp16 m, 16 bytes of
              nibbles (byte j = value j in the low nibble, value j+16 in the high one); w = d * q + m
     WP_Q8_0: data = GGUF's own blocks, 34 bytes: fp16 d, 32 int8 q; w = d * q
     KV cache: float[num_layers][2][num_blocks][block_size][num_kv_heads][head_dim]
     rope:     float[2][max_positions][head_dim] (cos, sin), rotate-half layout */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define WP_SIMD 1
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

enum { WP_F32 = 0, WP_Q4_1 = 1, WP_Q8_0 = 2 };

typedef struct {
    int32_t type, rows, cols, _pad;
    const uint8_t *data;
    const float *bias; /* [rows] or NULL */
} wp_matrix;

static inline int64_t row_bytes(const wp_matrix *W) {
    return W->type == WP_Q4_1 ? W->cols / 32 * 20 : W->type == WP_Q8_0 ? W->cols / 32 * 34 : (int64_t)W->cols * 4;
}

/* IEEE half -> float, for the portable path (the SIMD path uses F16C). */
static inline float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            uint32_t m = man;
            do {
                e++;
                m <<= 1;
            } while (!(m & 1024));
            bits = sign | (uint32_t)(127 - 15 - e) << 23 | (m & 1023) << 13;
        }
    } else if (exp == 31) {
        bits = sign | 0x7F800000u | man << 13;
    } else {
        bits = sign | (exp + 127 - 15) << 23 | man << 13;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline float load_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#ifdef WP_SIMD
    return _cvtsh_ss(h);
#else
    return half_to_float(h);
#endif
}

typedef struct {
    const float *input_norm, *post_attention_norm;
    wp_matrix qkv, o, gate_up, down;
} wp_layer;

typedef struct {
    int32_t num_layers, hidden, intermediate, num_heads, num_kv_heads, head_dim, vocab, block_size,
        max_positions, num_kv_blocks;
    float eps, scale;
    const float *embed; /* [vocab][hidden] */
    const float *norm;  /* [hidden] */
    const float *rope;
    const wp_layer *layers;
    wp_matrix head;
} wp_model;


#ifdef WP_SIMD
static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

#define KV_PREFETCH 6 /* tokens ahead */

static inline float dot(const float *a, const float *b, int n) {
    int i = 0;
    float s = 0.f;
#ifdef WP_SIMD
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    s = hsum(acc);
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

#ifdef WP_SIMD

/* Values 8c..8c+7 of block b of weight row `row`, dequantized: d * q + m (Q4_1), d * q (Q8_0). */
static inline __attribute__((always_inline)) __m256 load_chunk(const wp_matrix *W, const int TYPE, int64_t row,
                                                              int64_t b, int c) {
    if (TYPE == WP_Q4_1) {
        const uint8_t *blk = W->data + row * (W->cols / 32 * 20) + b * 20;
        __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 4 + 8 * (c & 1))));
        q = c < 2 ? _mm256_and_si256(q, _mm256_set1_epi32(15)) : _mm256_srli_epi32(q, 4);
        const __m256 dq = _mm256_mul_ps(_mm256_set1_ps(load_half(blk)), _mm256_cvtepi32_ps(q));
        return _mm256_add_ps(dq, _mm256_set1_ps(load_half(blk + 2)));
    }
    if (TYPE == WP_Q8_0) {
        const uint8_t *blk = W->data + row * (W->cols / 32 * 34) + b * 34;
        const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * c)));
        return _mm256_mul_ps(_mm256_set1_ps(load_half(blk)), _mm256_cvtepi32_ps(q));
    }
    return _mm256_loadu_ps((const float *)W->data + row * W->cols + b * 32 + 8 * c);
}

/* A register tile: NW weight rows (n..n+NW) times NR rows of x, every weight chunk loaded once for the NR
   rows. NW and NR are constants at every call, so acc[][] lives in registers; NW x NR <= 8 independent
   FMA chains hide the FMA latency. Writes y[r][n+i] = sum_k w x (without the bias). */
static inline __attribute__((always_inline)) void tile(const wp_matrix *W, const int TYPE, const float *x, int64_t n,
                                                       const int NW, const int NR, float *y, int64_t ldy) {
    const int64_t K = W->cols, nb = K / 32;
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < NW; i++)
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) acc[i][r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m256 xv[4];
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) xv[r] = _mm256_loadu_ps(x + r * K + b * 32 + 8 * c);
#pragma GCC unroll 4
            for (int i = 0; i < NW; i++) {
                const __m256 w = load_chunk(W, TYPE, n + i, b, c);
#pragma GCC unroll 4
                for (int r = 0; r < NR; r++) acc[i][r] = _mm256_fmadd_ps(w, xv[r], acc[i][r]);
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NW; i++)
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) y[r * ldy + n + i] = hsum(acc[i][r]);
}

#define PREFETCH_ROWS 16

/* x rows r0.. (nr <= 4) times weight rows n0..n1, for one weight format (a constant: no branch inside). */
static inline __attribute__((always_inline)) void tile_rows_t(const wp_matrix *W, const int TYPE, const float *x,
                                                              int nr, float *y, int64_t ldy, int64_t n0, int64_t n1) {
    int64_t n = n0;
    const int64_t rb = row_bytes(W);
    for (; n + 4 <= n1; n += 4) {
        /* Prefetch the weight rows PREFETCH_ROWS ahead: decode is a stream through memory, and at a few rows
           per step the loop is too slow for the hardware prefetcher alone to keep enough lines in flight. */
        if (n + PREFETCH_ROWS + 4 <= n1) {
            const uint8_t *p = W->data + (n + PREFETCH_ROWS) * rb;
            for (int64_t o = 0; o < 4 * rb; o += 64) __builtin_prefetch(p + o);
        }
        switch (nr) {
            case 1: tile(W, TYPE, x, n, 2, 1, y, ldy); tile(W, TYPE, x, n + 2, 2, 1, y, ldy); break;
            case 2: tile(W, TYPE, x, n, 4, 2, y, ldy); break;
            case 3: tile(W, TYPE, x, n, 2, 3, y, ldy); tile(W, TYPE, x, n + 2, 2, 3, y, ldy); break;
            default: tile(W, TYPE, x, n, 2, 4, y, ldy); tile(W, TYPE, x, n + 2, 2, 4, y, ldy); break;
        }
    }
    for (; n < n1; n++) {
        switch (nr) {
            case 1: tile(W, TYPE, x, n, 1, 1, y, ldy); break;
            case 2: tile(W, TYPE, x, n, 1, 2, y, ldy); break;
            case 3: tile(W, TYPE, x, n, 1, 3, y, ldy); break;
            default: tile(W, TYPE, x, n, 1, 4, y, ldy); break;
        }
    }
}

static void tile_rows(const wp_matrix *W, const float *x, int nr, float *y, int64_t n0, int64_t n1) {
    switch (W->type) {
        case WP_Q4_1: tile_rows_t(W, WP_Q4_1, x, nr, y, W->rows, n0, n1); break;
        case WP_Q8_0: tile_rows_t(W, WP_Q8_0, x, nr, y, W->rows, n0, n1); break;
        default: tile_rows_t(W, WP_F32, x, nr, y, W->rows, n0, n1); break;
    }
}

/* y[r][n] = x[r] . W[n] (+ bias[n]) for the nr rows of x and weight rows n0..n1. */
static void matvec_rows(const wp_matrix *W, const float *x, int nr, float *y, int64_t n0, int64_t n1) {
    const int64_t K = W->cols, N = W->rows, nb = K / 32;
    if (nr > 4 && W->type != WP_F32) {
        /* Many rows: dequantize 4 weight rows at a time (the same values the tiles compute) into an
           L1-sized buffer and run the fp32 tiles over it, so the conversion is paid once per weight, not once
           per 4 rows of x. Every row of x sees the same operations in the same order whatever the batch:
           a sequence's result does not depend on what it is batched with. */
        float *wbuf = (float *)malloc((size_t)4 * K * sizeof(float));
        if (wbuf) {
            for (int64_t g0 = n0; g0 < n1; g0 += 4) {
                const int cnt = n1 - g0 < 4 ? (int)(n1 - g0) : 4;
                for (int i = 0; i < cnt; i++)
                    for (int64_t b = 0; b < nb; b++)
                        for (int c = 0; c < 4; c++) {
                            const __m256 w = W->type == WP_Q4_1 ? load_chunk(W, WP_Q4_1, g0 + i, b, c)
                                                                 : load_chunk(W, WP_Q8_0, g0 + i, b, c);
                            _mm256_storeu_ps(wbuf + i * K + b * 32 + 8 * c, w);
                        }
                const wp_matrix F = {WP_F32, cnt, (int32_t)K, 0, (const uint8_t *)wbuf, NULL};
                for (int r0 = 0; r0 < nr; r0 += 4)
                    tile_rows_t(&F, WP_F32, x + (int64_t)r0 * K, nr - r0 < 4 ? nr - r0 : 4, y + (int64_t)r0 * N + g0, N,
                                0, cnt);
            }
            free(wbuf);
            goto bias;
        }
    }
    /* Weight rows outer, x rows inner: a group of weight rows is read from memory once and stays in L1 while
       every 4 rows of x pass over it. */
    for (int64_t g0 = n0; g0 < n1; g0 += 16) {
        const int64_t g1 = g0 + 16 < n1 ? g0 + 16 : n1;
        for (int r0 = 0; r0 < nr; r0 += 4)
            tile_rows(W, x + (int64_t)r0 * K, nr - r0 < 4 ? nr - r0 : 4, y + (int64_t)r0 * N, g0, g1);
    }
bias:
    if (W->bias)
        for (int r = 0; r < nr; r++)
            for (int64_t n = n0; n < n1; n++) y[(int64_t)r * N + n] += W->bias[n];
}
#else
static float weight_at(const wp_matrix *W, int64_t row, int64_t k) {
    const int64_t b = k / 32, j = k % 32;
    if (W->type == WP_Q4_1) {
        const uint8_t *blk = W->data + row * row_bytes(W) + b * 20;
        const uint8_t byte = blk[4 + j % 16];
        const float dq = load_half(blk) * (float)(j < 16 ? byte & 15 : byte >> 4);
        return dq + load_half(blk + 2);
    }
    if (W->type == WP_Q8_0) {
        const uint8_t *blk = W->data + row * row_bytes(W) + b * 34;
        return load_half(blk) * (float)(int8_t)blk[2 + j];
    }
    return ((const float *)W->data)[row * W->cols + k];
}

static void matvec_rows(const wp_matrix *W, const float *x, int nr, float *y, int64_t n0, int64_t n1) {
    const int64_t K = W->cols, N = W->rows;
    for (int64_t n = n0; n < n1; n++)
        for (int r = 0; r < nr; r++) {
            float s = 0.f;
            for (int64_t k = 0; k < K; k++) s += weight_at(W, n, k) * x[(int64_t)r * K + k];
            if (W->bias) s += W->bias[n];
            y[(int64_t)r * N + n] = s;
        }
}
#endif

/* y[D][rows] = x[D][cols] @ W.T, weight rows split over the threads: each weight is read once per step. */
static void matmul(const wp_matrix *W, const float *x, int D, float *y, int nthreads) {
    const int64_t N = W->rows;
#pragma omp parallel num_threads(nthreads)
    {
        int t = 0, nt = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        /* Contiguous row ranges, a multiple of 8 rows each, so threads do not share cache lines of y. */
        const int64_t per = ((N + nt - 1) / nt + 7) / 8 * 8;
        const int64_t n0 = t * per < N ? t * per : N, n1 = n0 + per < N ? n0 + per : N;
        matvec_rows(W, x, D, y, n0, n1);
    }
}

static void rms_norm(const float *x, const float *w, float eps, int D, int H, float *out) {
    for (int r = 0; r < D; r++) {
        const float *xr = x + (int64_t)r * H;
        double ss = 0.0;
        for (int i = 0; i < H; i++) ss += (double)xr[i] * xr[i];
        const float inv = 1.0f / sqrtf((float)(ss / H) + eps);
        for (int i = 0; i < H; i++) out[(int64_t)r * H + i] = w[i] * (xr[i] * inv);
    }
}

static void rope(float *v, const float *cos, const float *sin, int hd) {
    const int half = hd / 2;
    for (int i = 0; i < half; i++) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cos[i] - b * sin[i];
        v[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

#define SPLIT 64 /* context tokens per attention task (split-K "flash decoding"): enough tasks for all threads */

#ifdef WP_SIMD
/* exp(x) for 8 floats: Cephes' polynomial (about 1 ulp over the range softmax and SiLU use). */
static inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    const __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    const __m256 z = _mm256_mul_ps(x, x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_add_ps(_mm256_fmadd_ps(y, z, x), _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
#endif

/* v[i] = exp(v[i] - mx) for i < n; returns their sum. */
static float exp_shifted(float *v, int n, float mx) {
    int i = 0;
    float sum = 0.f;
#ifdef WP_SIMD
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(v + i), _mm256_set1_ps(mx)));
        _mm256_storeu_ps(v + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    sum = hsum(acc);
#endif
    for (; i < n; i++) sum += (v[i] = expf(v[i] - mx));
    return sum;
}

/* One decode row's G query heads over tokens t0..t1 (all visible), K/V read where they lie in the cache:
   each K/V row once for the G heads. s holds G x SPLIT scores. Same output as attend_span. */
static void attend_one_row(const float *q, const float *kc, const float *vc, const int32_t *table, int bs,
                           int64_t tok, int G, int hd, float scale, int64_t t0, int64_t t1, float *s, float *part) {
    const int n = (int)(t1 - t0);
    for (int t = 0; t < n; t++) {
        const float *k = kc + ((int64_t)table[(t0 + t) / bs] * bs + (t0 + t) % bs) * tok;
        if (t + KV_PREFETCH < n) { /* K/V rows are scattered over blocks: fetch ahead of use */
            const int64_t ahead = (int64_t)table[(t0 + t + KV_PREFETCH) / bs] * bs + (t0 + t + KV_PREFETCH) % bs;
            for (int o = 0; o < hd; o += 16) {
                __builtin_prefetch(kc + ahead * tok + o);
                __builtin_prefetch(vc + ahead * tok + o);
            }
        }
        for (int j = 0; j < G; j++) s[j * SPLIT + t] = dot(q + j * hd, k, hd) * scale;
    }
    for (int j = 0; j < G; j++) {
        float *sj = s + j * SPLIT, *pj = part + j * (hd + 2), *o = pj + 2, mx = -INFINITY;
        for (int t = 0; t < n; t++) mx = sj[t] > mx ? sj[t] : mx;
        pj[0] = mx;
        pj[1] = exp_shifted(sj, n, mx);
        int d0 = 0;
#ifdef WP_SIMD
        for (; d0 + 32 <= hd; d0 += 32) { /* 32 output values in 4 registers over the span */
            __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
            for (int t = 0; t < n; t++) {
                const float *v = vc + ((int64_t)table[(t0 + t) / bs] * bs + (t0 + t) % bs) * tok + d0;
                const __m256 p = _mm256_set1_ps(sj[t]);
                for (int c = 0; c < 4; c++) acc[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8 * c), acc[c]);
            }
            for (int c = 0; c < 4; c++) _mm256_storeu_ps(o + d0 + 8 * c, acc[c]);
        }
#endif
        for (int d = d0; d < hd; d++) o[d] = 0.f;
        for (int t = 0; t < n && d0 < hd; t++) {
            const float *v = vc + ((int64_t)table[(t0 + t) / bs] * bs + (t0 + t) % bs) * tok;
            for (int d = d0; d < hd; d++) o[d] += sj[t] * v[d];
        }
    }
}

/* NQ (1 or 2) query heads, q[a * hd..], over nv keys of a span staged in Kt [hd][SPLIT] and Vs [SPLIT][hd]:
   scores, softmax pieces and the unnormalized output into part[a * (hd + 2)..]. s holds NQ x SPLIT floats. */
static inline __attribute__((always_inline)) void span_queries(const float *q, int hd, const float *Kt,
                                                               const float *Vs, int nv, float scale, float *s,
                                                               float *part, const int NQ) {
#ifdef WP_SIMD
    for (int t = 0; t < nv; t += 32) { /* 32 keys x NQ queries in registers; Kt is zero-padded to SPLIT */
        __m256 acc[2][4];
        for (int a = 0; a < NQ; a++)
            for (int k = 0; k < 4; k++) acc[a][k] = _mm256_setzero_ps();
        for (int d = 0; d < hd; d++) {
            __m256 b[2];
            for (int a = 0; a < NQ; a++) b[a] = _mm256_set1_ps(q[a * hd + d]);
            const float *row = Kt + d * SPLIT + t;
            for (int k = 0; k < 4; k++) {
                const __m256 kv = _mm256_loadu_ps(row + 8 * k);
                for (int a = 0; a < NQ; a++) acc[a][k] = _mm256_fmadd_ps(b[a], kv, acc[a][k]);
            }
        }
        for (int a = 0; a < NQ; a++)
            for (int k = 0; k < 4; k++)
                _mm256_storeu_ps(s + a * SPLIT + t + 8 * k, _mm256_mul_ps(acc[a][k], _mm256_set1_ps(scale)));
    }
#else
    for (int a = 0; a < NQ; a++)
        for (int t = 0; t < nv; t++) {
            float v = 0.f;
            for (int d = 0; d < hd; d++) v += q[a * hd + d] * Kt[d * SPLIT + t];
            s[a * SPLIT + t] = v * scale;
        }
#endif
    for (int a = 0; a < NQ; a++) {
        float *sa = s + a * SPLIT, mx = -INFINITY;
        for (int t = 0; t < nv; t++) mx = sa[t] > mx ? sa[t] : mx;
        part[a * (hd + 2)] = mx;
        part[a * (hd + 2) + 1] = exp_shifted(sa, nv, mx);
    }
    int d0 = 0;
#ifdef WP_SIMD
    for (; d0 + 32 <= hd; d0 += 32) { /* 32 output values x NQ queries in registers over the span */
        __m256 acc[2][4];
        for (int a = 0; a < NQ; a++)
            for (int k = 0; k < 4; k++) acc[a][k] = _mm256_setzero_ps();
        for (int t = 0; t < nv; t++) {
            __m256 p[2];
            for (int a = 0; a < NQ; a++) p[a] = _mm256_set1_ps(s[a * SPLIT + t]);
            const float *v = Vs + t * hd + d0;
            for (int k = 0; k < 4; k++) {
                const __m256 vv = _mm256_loadu_ps(v + 8 * k);
                for (int a = 0; a < NQ; a++) acc[a][k] = _mm256_fmadd_ps(p[a], vv, acc[a][k]);
            }
        }
        for (int a = 0; a < NQ; a++)
            for (int k = 0; k < 4; k++) _mm256_storeu_ps(part + a * (hd + 2) + 2 + d0 + 8 * k, acc[a][k]);
    }
#endif
    for (int a = 0; a < NQ; a++) {
        float *o = part + a * (hd + 2) + 2;
        for (int d = d0; d < hd; d++) o[d] = 0.f;
        for (int t = 0; t < nv && d0 < hd; t++)
            for (int d = d0; d < hd; d++) o[d] += s[a * SPLIT + t] * Vs[t * hd + d];
    }
}

/* One task: the queries of one sequence's new rows (nrows x G heads of KV head g) over context tokens
   t0..t1. K is transposed into Kt [hd][SPLIT] and V copied into Vs [SPLIT][hd] once, then every query
   reuses them from L1/L2. Row i (position p0 + i) sees tokens t <= p0 + i. Writes per query: [max score, sum
   of exp, unnormalized output (hd values)]. */
static void attend_span(const float *qkv, int qkv_w, int nrows, int64_t p0, const float *kc, const float *vc,
                        const int32_t *table, int bs, int64_t tok, int G, int hd, float scale, int64_t t0,
                        int64_t t1, float *Kt, float *Vs, float *s, float *part) {
    const int n = (int)(t1 - t0);
    if (nrows == 1) { /* decode: too few queries to pay for the transpose; read K/V rows in place */
        attend_one_row(qkv, kc, vc, table, bs, tok, G, hd, scale, t0, t1, s, part);
        return;
    }
    for (int t = 0; t < n; t++) {
        const int64_t slot = (int64_t)table[(t0 + t) / bs] * bs + (t0 + t) % bs;
        const float *k = kc + slot * tok, *v = vc + slot * tok;
        if (t + KV_PREFETCH < n) {
            const int64_t ahead = (int64_t)table[(t0 + t + KV_PREFETCH) / bs] * bs + (t0 + t + KV_PREFETCH) % bs;
            for (int o = 0; o < hd; o += 16) {
                __builtin_prefetch(kc + ahead * tok + o);
                __builtin_prefetch(vc + ahead * tok + o);
            }
        }
        for (int d = 0; d < hd; d++) Kt[d * SPLIT + t] = k[d];
        memcpy(Vs + t * hd, v, hd * sizeof(float));
    }
    for (int d = 0; d < hd; d++)
        for (int t = n; t < SPLIT; t++) Kt[d * SPLIT + t] = 0.f;
    for (int i = 0; i < nrows; i++) {
        const int nv = (int)((p0 + i + 1 < t1 ? p0 + i + 1 : t1) - t0); /* causal: keys this row may see */
        for (int j = 0; j < G; j += 2) { /* two heads of the row at a time: each K/V load feeds two FMAs */
            const int nq = G - j >= 2 ? 2 : 1;
            const float *q = qkv + (int64_t)i * qkv_w + j * hd;
            float *pj = part + ((int64_t)i * G + j) * (hd + 2);
            if (nv <= 0) {
                for (int a = 0; a < nq; a++) {
                    float *pa = pj + a * (hd + 2);
                    pa[0] = -INFINITY, pa[1] = 0.f;
                    for (int d = 0; d < hd; d++) pa[2 + d] = 0.f;
                }
                continue;
            }
            if (nq == 2)
                span_queries(q, hd, Kt, Vs, nv, scale, s, pj, 2);
            else
                span_queries(q, hd, Kt, Vs, nv, scale, s, pj, 1);
        }
    }
}

/* Writes the new rows' K/V into their slots, then attends every query head of every row over its
   sequence's context. Tasks are (sequence, KV head, span of SPLIT tokens); spans are merged with the usual
   max/sum rescaling. Rows of sequence s are seq_rows[s]..seq_rows[s+1], at positions start[s]... */
static int attention(const wp_model *M, int layer, int S, const int32_t *seq_rows, const int64_t *start,
                     const int32_t *tables, int width, const float *qkv, float *kv, float *out, int nthreads) {
    const int H = M->num_heads, KVH = M->num_kv_heads, hd = M->head_dim, bs = M->block_size;
    const int G = H / KVH, qkv_w = (H + 2 * KVH) * hd;
    const int64_t tok = (int64_t)KVH * hd, plane = (int64_t)M->num_kv_blocks * bs * tok;
    float *kc = kv + (int64_t)layer * 2 * plane, *vc = kc + plane;
    int *first = (int *)malloc((size_t)(S + 1) * sizeof(int)); /* first task of each sequence */
    int64_t *poff = (int64_t *)malloc((size_t)(S + 1) * sizeof(int64_t)); /* where its partial results go */
    if (!first || !poff) {
        free(first), free(poff);
        return -1;
    }
    first[0] = 0, poff[0] = 0;
    for (int sq = 0; sq < S; sq++) {
        const int nrows = seq_rows[sq + 1] - seq_rows[sq];
        for (int i = 0; i < nrows; i++) {
            const int64_t p = start[sq] + i, r = seq_rows[sq] + i;
            const int64_t slot = (int64_t)tables[(int64_t)sq * width + p / bs] * bs + p % bs;
            memcpy(kc + slot * tok, qkv + r * qkv_w + H * hd, tok * sizeof(float));
            memcpy(vc + slot * tok, qkv + r * qkv_w + (H + KVH) * hd, tok * sizeof(float));
        }
        const int nspan = (int)((start[sq] + nrows + SPLIT - 1) / SPLIT);
        first[sq + 1] = first[sq] + KVH * nspan;
        poff[sq + 1] = poff[sq] + (int64_t)KVH * nspan * nrows * G * (hd + 2);
    }
    const int tasks = first[S];
    const int64_t scratch = 2 * (int64_t)hd * SPLIT + (int64_t)(G > 2 ? G : 2) * SPLIT;
    float *parts = (float *)malloc((size_t)poff[S] * sizeof(float));
    float *work = (float *)malloc((size_t)nthreads * scratch * sizeof(float));
    if (!parts || !work) {
        free(first), free(poff), free(parts), free(work);
        return -1;
    }
#pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1)
    for (int task = 0; task < tasks; task++) {
        int sq = 0;
        while (first[sq + 1] <= task) sq++;
        const int nrows = seq_rows[sq + 1] - seq_rows[sq];
        const int nspan = (first[sq + 1] - first[sq]) / KVH, g = (task - first[sq]) / nspan;
        const int c = (task - first[sq]) % nspan;
        const int64_t ctx = start[sq] + nrows, t0 = (int64_t)c * SPLIT, t1 = t0 + SPLIT < ctx ? t0 + SPLIT : ctx;
        int thread = 0;
#ifdef _OPENMP
        thread = omp_get_thread_num();
#endif
        float *w = work + (int64_t)thread * scratch;
        attend_span(qkv + (int64_t)seq_rows[sq] * qkv_w + g * G * hd, qkv_w, nrows, start[sq], kc + g * hd, vc + g * hd,
                    tables + (int64_t)sq * width, bs, tok, G, hd, M->scale, t0, t1, w, w + (int64_t)hd * SPLIT,
                    w + 2 * (int64_t)hd * SPLIT,
                    parts + poff[sq] + (int64_t)(task - first[sq]) * nrows * G * (hd + 2));
    }
    for (int sq = 0; sq < S; sq++) {
        const int nrows = seq_rows[sq + 1] - seq_rows[sq], nspan = (first[sq + 1] - first[sq]) / KVH;
        for (int i = 0; i < nrows; i++)
            for (int h = 0; h < H; h++) {
                const int g = h / G, j = h % G;
                const int64_t stride = (int64_t)nrows * G * (hd + 2); /* from one span's task to the next */
                const float *p0 = parts + poff[sq] + (int64_t)g * nspan * stride + ((int64_t)i * G + j) * (hd + 2);
                float mx = -INFINITY, sum = 0.f;
                for (int c = 0; c < nspan; c++) mx = p0[c * stride] > mx ? p0[c * stride] : mx;
                float *o = out + ((int64_t)seq_rows[sq] + i) * H * hd + h * hd;
                for (int d = 0; d < hd; d++) o[d] = 0.f;
                for (int c = 0; c < nspan; c++) {
                    const float *pc = p0 + c * stride;
                    if (pc[1] == 0.f) continue; /* a span wholly after this row's position */
                    const float w = expf(pc[0] - mx);
                    sum += w * pc[1];
                    for (int d = 0; d < hd; d++) o[d] += w * pc[2 + d];
                }
                const float inv = 1.0f / sum;
                for (int d = 0; d < hd; d++) o[d] *= inv;
            }
    }
    free(first), free(poff), free(parts), free(work);
    return 0;
}

static void silu_mul(const float *gu, int R, int I, float *act) {
    for (int r = 0; r < R; r++) {
        const float *g = gu + (int64_t)r * 2 * I, *u = g + I;
        float *a = act + (int64_t)r * I;
        int i = 0;
#ifdef WP_SIMD
        for (; i + 8 <= I; i += 8) {
            const __m256 gv = _mm256_loadu_ps(g + i);
            const __m256 den = _mm256_add_ps(_mm256_set1_ps(1.0f), exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv)));
            _mm256_storeu_ps(a + i, _mm256_mul_ps(_mm256_div_ps(gv, den), _mm256_loadu_ps(u + i)));
        }
#endif
        for (; i < I; i++) a[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* A forward pass over S sequences' new tokens, all rows at once: sequence s has tokens
   tokens[seq_rows[s]..seq_rows[s+1]) at positions start[s]..., and block table tables[s] (width entries).
   Each layer's K/V for the new tokens is written into kv. logits [S][vocab] are for each sequence's last
   new token. For decode (one token each) and short chunks over a cached context (a warm prefix + the few new
   tokens of an edit); long prefills are the torch path's. Returns 0, -1 out of memory, -2 bad shape. */
int wp_forward(const wp_model *M, int S, const int32_t *seq_rows, const int64_t *tokens, const int64_t *start,
               const int32_t *tables, int width, float *kv, float *logits, int nthreads) {
    const int Hd = M->hidden, I = M->intermediate, hd = M->head_dim, H = M->num_heads, KVH = M->num_kv_heads;
    const int qkv_w = (H + 2 * KVH) * hd, R = seq_rows[S];
    if (H % KVH || hd % 2) return -2;
    const int64_t need = (int64_t)R * (2 * Hd + qkv_w + H * hd + 2 * I + I) + (int64_t)S * Hd;
    float *buf = (float *)malloc(need * sizeof(float));
    if (!buf) return -1;
    float *x = buf, *h = x + (int64_t)R * Hd, *qkv = h + (int64_t)R * Hd, *att = qkv + (int64_t)R * qkv_w;
    float *gu = att + (int64_t)R * H * hd, *act = gu + (int64_t)R * 2 * I, *last = act + (int64_t)R * I;

    for (int r = 0; r < R; r++) memcpy(x + (int64_t)r * Hd, M->embed + tokens[r] * Hd, Hd * sizeof(float));
    const float *cos_t = M->rope, *sin_t = M->rope + (int64_t)M->max_positions * hd;
    for (int l = 0; l < M->num_layers; l++) {
        const wp_layer *L = &M->layers[l];
        rms_norm(x, L->input_norm, M->eps, R, Hd, h);
        matmul(&L->qkv, h, R, qkv, nthreads);
        for (int sq = 0; sq < S; sq++)
            for (int r = seq_rows[sq]; r < seq_rows[sq + 1]; r++) {
                const int64_t p = start[sq] + (r - seq_rows[sq]);
                for (int j = 0; j < H + KVH; j++) rope(qkv + (int64_t)r * qkv_w + j * hd, cos_t + p * hd, sin_t + p * hd, hd);
            }
        if (attention(M, l, S, seq_rows, start, tables, width, qkv, kv, att, nthreads)) {
            free(buf);
            return -1;
        }
        matmul(&L->o, att, R, h, nthreads);
        for (int64_t i = 0; i < (int64_t)R * Hd; i++) x[i] += h[i];
        rms_norm(x, L->post_attention_norm, M->eps, R, Hd, h);
        matmul(&L->gate_up, h, R, gu, nthreads);
        silu_mul(gu, R, I, act);
        matmul(&L->down, act, R, h, nthreads);
        for (int64_t i = 0; i < (int64_t)R * Hd; i++) x[i] += h[i];
    }
    for (int sq = 0; sq < S; sq++) memcpy(last + (int64_t)sq * Hd, x + (int64_t)(seq_rows[sq + 1] - 1) * Hd, Hd * sizeof(float));
    rms_norm(last, M->norm, M->eps, S, Hd, h);
    matmul(&M->head, h, S, logits, nthreads);
    free(buf);
    return 0;
}

/* y[D][rows] = x[D][cols] @ W.T alone (tests and benchmarks of the matrix kernels). */
void wp_matmul(const wp_matrix *W, const float *x, int D, float *y, int nthreads) { matmul(W, x, D, y, nthreads); }
