/* Decode steps, short chunks over a cached context and short prompts of a Llama-family model on the CPU, over
   quantized weights and warmpath's paged KV cache.

   Why native: a decode step of a small model is bound by reading weights and by per-op overhead. In torch a
   step is ~1,200 small ops (~20 ms of dispatch for SmolLM2) and fp32 weights (530 MB/token); here it is one
   call that reads the checkpoint's own 4-bit blocks (~85 MB/token) with AVX2, and touches each weight once
   for all the step's sequences (a short prompt's rows included: many rows go through converted panels at
   GEMM speed, in the same pass as the step's decodes).

   Numerics: the weights are the checkpoint's own quantized values (q, and per block of 32 the scale d and
   min m the loader dequantizes with), with the block's scale applied to the block's sum (see "Packed
   weights" below); every output is computed in the same order whatever the batch, so a sequence's logits do
   not depend on what it is batched with.

   Layouts (all row-major, C-contiguous, built by warmpath/kernels/native.py):
     weights:  packed in groups of 8 rows, see "Packed weights" below
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
    int32_t type, rows, cols, act; /* act: WP_ACT_INT8 for int8 activations (Q4_1), else 0 */
    const uint8_t *data;
    const float *bias; /* [rows] or NULL */
} wp_matrix;

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
#define ONE_ROW_AHEAD 16 /* tokens ahead, for a decode row */

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

/* Packed weights (native.py pack()): rows in groups of 8, one AVX2 vector of outputs; a group is a run of its
   cols/32 blocks, each block the group's 8 rows interleaved so one load serves all 8 at one column:
     WP_Q4_1: 160 bytes: fp16 d[8], fp16 m[8], then for each column pair p: 8 bytes, byte j = q[j][2p] | q[j][2p+1] << 4
     WP_Q8_0: 272 bytes: fp16 d[8], then for each column k: 8 int8, q[j][k]
     WP_F32:  1024 bytes: float w[k][8]
   Rows are padded with zeros to a multiple of 8.

   Numerics, the same for every output whatever the batch (bit for bit; native.py's tests pin it): with
   w = d * q (exact in fp32: a 4- or 8-bit integer times an fp16 scale),
     y = S + M,  S = sum over all columns k, in order, of w_k * x_k (one fused multiply-add chain from 0),
                 M = sum over blocks b, in order, of m_b * X_b (Q4_1's min times the block's sum of x; 0 else);
   F32: S alone. Then + bias. One chain per output and no per-block step inside it keeps the inner loops
   pure multiply-adds, whether the weights are converted in registers (tile) or once into a panel (panel_tile).

   Int8 activations (a Q4_1 or Q8_0 matrix with act = WP_ACT_INT8, native.py pack(..., int8_activations=True)):
   each row of x is quantized per block of 32 columns, xq = round(x / dx) with dx = max|x| / 127 (llama.cpp's
   Q8 activations; round to nearest, ties to even), and
     y = S8 + M,  S8 = sum over blocks b, in order, of (d_b * dx_b) * I_b (one fused multiply-add chain from 0),
                  I_b = the block's sum of q_k * xq_k (exact, in integers); M as above, from the fp32 x.
   Integer products run 32 multiply-adds per instruction (vpmaddubsw) where fp32 runs 8 per FMA: ~2x the
   many-row products on AVX2 without AVX-512 / AMX, ~3x one row's, at a lower precision (like bf16).
   Batch-invariant too: a row's quantization depends on the row alone. The blocks, in 4-column quads:
     WP_Q4_1: 160 bytes: fp16 d[8], fp16 m[8], then 4 x 32 bytes; vector v, byte 4j + i =
              q[j][8v + i] | q[j][8v + 4 + i] << 4 (row j, i = 0..3): the low nibbles are 8 rows x columns
              8v..8v+3, the high ones 8 rows x columns 8v+4..8v+7
     WP_Q8_0: 272 bytes: fp16 d[8], then 8 x 32 bytes; vector v, byte 4j + i = q[j][4v + i] */
#define WP_ACT_INT8 1
#define TILE_R 6       /* most rows of x in one register tile */
#define PANEL_ROWS 8   /* rows of x from which the panel path (panel_rows) is taken */
#define PANEL_ROW_BLOCK 96 /* rows of x per pass over the weights in the panel path: 96 x 256 columns, 96 KB (L2) */
#define PANEL_BLOCKS 8 /* blocks of 32 columns per panel pass: 2 groups x 256 columns x 8 rows = 16 KB */
/* Rows of per-row work (norms, RoPE, SiLU, residuals) are split over the threads when there are many
   (a prompt chunk); a few decode rows are not worth a parallel region. */
#define PAR_ROWS 16
static inline int64_t block_bytes(int type) { return type == WP_Q4_1 ? 160 : type == WP_Q8_0 ? 272 : 1024; }

/* The block sums X_b of each row of x (Q4_1's min term), in one fixed order. */
static void block_sums(const float *x, int D, int64_t K, float *xs) {
    const int64_t nb = K / 32;
    for (int r = 0; r < D; r++)
        for (int64_t b = 0; b < nb; b++) {
            const float *p = x + (int64_t)r * K + b * 32;
#ifdef WP_SIMD
            const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)),
                                           _mm256_add_ps(_mm256_loadu_ps(p + 16), _mm256_loadu_ps(p + 24)));
            xs[r * nb + b] = hsum(s);
#else
            float s = 0.f;
            for (int k = 0; k < 32; k++) s += p[k];
            xs[r * nb + b] = s;
#endif
        }
}

#ifdef WP_SIMD
#define AI static inline __attribute__((always_inline))

/* Q4_1's min term of G groups x R rows: M = sum over blocks b, in order, of m_b * X_b (one chain from 0). */
AI void add_min_terms(const uint8_t *w, int64_t gs, const float *xs, int64_t nb, const int G, const int R,
                      __m256 s[][TILE_R], int first_group) {
    __m256 mt[8][TILE_R];
#pragma GCC unroll 8
    for (int i = 0; i < G; i++)
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) mt[i][r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++)
#pragma GCC unroll 8
        for (int i = 0; i < G; i++) {
            const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + (first_group + i) * gs + b * 160 + 16)));
#pragma GCC unroll 6
            for (int r = 0; r < R; r++) mt[i][r] = _mm256_fmadd_ps(m, _mm256_broadcast_ss(xs + r * nb + b), mt[i][r]);
        }
#pragma GCC unroll 8
    for (int i = 0; i < G; i++)
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) s[i][r] = _mm256_add_ps(s[i][r], mt[i][r]);
}

/* A register tile's accumulators to zero; the next tile's block b (bytes of all its groups) fetched ahead. */
AI void zero_tile(__m256 s[][TILE_R], const int G, const int R) {
#pragma GCC unroll 8
    for (int i = 0; i < G; i++)
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) s[i][r] = _mm256_setzero_ps();
}

AI void fetch_ahead(const uint8_t *pf, int64_t b, int64_t bytes) {
    if (pf)
        for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(pf + b * bytes + o);
}

/* A register tile: G groups (8 output rows each, at w, gs bytes apart) times R rows of x (K apart). G x R
   chains of fused multiply-adds hide their latency; the quants of a group are converted once for all R rows.
   y[r * ldy + 8 i + j] for output row j of group i. pf: the next tile's weights, fetched ahead a block at a
   time (a decode step streams the weights from memory once). */
AI void tile(const int TYPE, const uint8_t *w, int64_t gs, const float *x, int64_t K, const float *xs, const int G,
             const int R, float *y, int64_t ldy, const uint8_t *pf) {
    const int64_t nb = K / 32, bb = block_bytes(TYPE);
    __m256 s[8][TILE_R];
    float dv[8][8] __attribute__((aligned(32))); /* the block's scales of each group, as floats */
    zero_tile(s, G, R);
    for (int64_t b = 0; b < nb; b++) {
        fetch_ahead(pf, b, G * bb);
        const float *xb = x + b * 32;
        const uint8_t *blk = w + b * bb;
        if (TYPE != WP_F32)
#pragma GCC unroll 8
            for (int i = 0; i < G; i++)
                _mm256_store_ps(dv[i], _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + i * gs))));
        if (TYPE == WP_Q4_1) {
#pragma GCC unroll 2
            for (int p = 0; p < 16; p++) {
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) { /* column 2p + h: the low nibble, then the high one */
                    __m256 xv[TILE_R];
#pragma GCC unroll 4
                    for (int r = 0; r < R; r++) xv[r] = _mm256_broadcast_ss(xb + r * K + 2 * p + h);
#pragma GCC unroll 8
                    for (int i = 0; i < G; i++) {
                        const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + i * gs + 32 + 8 * p)));
                        const __m256 qf = _mm256_cvtepi32_ps(h ? _mm256_srli_epi32(q, 4) : _mm256_and_si256(q, _mm256_set1_epi32(15)));
                        const __m256 wv = _mm256_mul_ps(qf, _mm256_load_ps(dv[i])); /* d * q: exact in fp32 */
#pragma GCC unroll 4
                        for (int r = 0; r < R; r++) s[i][r] = _mm256_fmadd_ps(wv, xv[r], s[i][r]);
                    }
                }
            }
        } else { /* Q8_0 (d * q) and F32: one column at a time */
#pragma GCC unroll 4
            for (int k = 0; k < 32; k++) {
                __m256 xv[TILE_R];
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) xv[r] = _mm256_broadcast_ss(xb + r * K + k);
#pragma GCC unroll 8
                for (int i = 0; i < G; i++) {
                    const __m256 wv =
                        TYPE == WP_Q8_0
                            ? _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                _mm_loadl_epi64((const __m128i *)(blk + i * gs + 16 + 8 * k)))),
                                            _mm256_load_ps(dv[i]))
                            : _mm256_loadu_ps((const float *)(blk + i * gs) + 8 * k);
#pragma GCC unroll 4
                    for (int r = 0; r < R; r++) s[i][r] = _mm256_fmadd_ps(wv, xv[r], s[i][r]);
                }
            }
        }
    }
    if (TYPE == WP_Q4_1) add_min_terms(w, gs, xs, nb, G, R, s, 0);
#pragma GCC unroll 8
    for (int i = 0; i < G; i++)
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) _mm256_storeu_ps(y + r * ldy + 8 * i, s[i][r]);
}

/* Many rows of x (a batch of decodes, a prompt chunk): a pair of groups is converted to weights (d * q) once,
   PANEL_BLOCKS blocks at a time, into an L1 panel [column][8 rows] per group; tiles of up to 6 rows of x run
   over it (12 chains; 2 panel loads and 6 broadcasts per 12 multiply-adds), their sums carried from one
   panel to the next through y. Every output sees exactly tile()'s operations in tile()'s order, so the path
   taken does not change a single bit. */
AI void panel_tile(const int TYPE, const float *p0, const float *p1, const uint8_t *w, int64_t gs, const float *x,
                   int64_t K, const float *xs, int64_t b0, int64_t b1, const int G, const int R, float *y,
                   int64_t ldy) {
    const int64_t nb = K / 32;
    __m256 s[2][TILE_R];
#pragma GCC unroll 2
    for (int i = 0; i < G; i++)
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) s[i][r] = b0 ? _mm256_loadu_ps(y + r * ldy + 8 * i) : _mm256_setzero_ps();
    const float *xb = x + b0 * 32;
    const int64_t n = (b1 - b0) * 32;
#pragma GCC unroll 4
    for (int64_t k = 0; k < n; k++) {
        const __m256 w0 = _mm256_load_ps(p0 + 8 * k), w1 = G == 2 ? _mm256_load_ps(p1 + 8 * k) : w0;
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m256 xv = _mm256_broadcast_ss(xb + r * K + k);
            s[0][r] = _mm256_fmadd_ps(w0, xv, s[0][r]);
            if (G == 2) s[1][r] = _mm256_fmadd_ps(w1, xv, s[1][r]);
        }
    }
    if (TYPE == WP_Q4_1 && b1 == nb) add_min_terms(w, gs, xs, nb, G, R, s, 0);
#pragma GCC unroll 2
    for (int i = 0; i < G; i++)
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) _mm256_storeu_ps(y + r * ldy + 8 * i, s[i][r]);
}

/* All D rows of x times the whole groups g0..g1 (y at group g0's outputs), through panels of PANEL_BLOCKS
   blocks (2 groups: 16 KB, L1). panel: 2 x PANEL_BLOCKS x 256 floats, 32-byte aligned. */
AI void panel_rows_t(const wp_matrix *W, const int TYPE, const float *x, const float *xs, int D, float *y,
                     int64_t ldy, int64_t g0, int64_t g1, float *panel) {
    const int64_t K = W->cols, nb = K / 32, bb = block_bytes(TYPE), gs = nb * bb;
    /* Rows of x in blocks of <= PANEL_ROW_BLOCK (their slice of a panel's columns stays in L2 while every
       group pair passes over it), each block in tiles of <= 6 rows, as even as possible. */
    for (int rb0 = 0; rb0 < D; rb0 += PANEL_ROW_BLOCK) {
        const int DB = D - rb0 < PANEL_ROW_BLOCK ? D - rb0 : PANEL_ROW_BLOCK, T = (DB + 5) / 6;
        for (int64_t b0 = 0; b0 < nb; b0 += PANEL_BLOCKS) {
            for (int64_t g = g0; g < g1; g += 2) {
                const int64_t b1 = b0 + PANEL_BLOCKS < nb ? b0 + PANEL_BLOCKS : nb;
                const int G = g1 - g >= 2 ? 2 : 1;
                const uint8_t *wg = W->data + g * gs;
                const float *p[2] = {panel, panel + PANEL_BLOCKS * 256};
                if (TYPE == WP_F32) { /* already floats in this layout */
                    p[0] = (const float *)(wg + b0 * bb), p[1] = (const float *)(wg + gs + b0 * bb);
                } else {
                    for (int i = 0; i < G; i++)
                        for (int64_t b = b0; b < b1; b++) {
                            const uint8_t *q = wg + i * gs + b * bb;
                            float *out = panel + i * PANEL_BLOCKS * 256 + (b - b0) * 256;
                            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)q));
                            if (TYPE == WP_Q4_1)
                                for (int c = 0; c < 16; c++) {
                                    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 32 + 8 * c)));
                                    const __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15)));
                                    _mm256_store_ps(out + 16 * c, _mm256_mul_ps(lo, d));
                                    _mm256_store_ps(out + 16 * c + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)), d));
                                }
                            else
                                for (int k = 0; k < 32; k++)
                                    _mm256_store_ps(out + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                                     _mm_loadl_epi64((const __m128i *)(q + 16 + 8 * k)))), d));
                        }
                }
                for (int t = 0, r0 = rb0; t < T; t++) {
                    const int R = DB / T + (t < DB % T);
                    const float *xr = x + (int64_t)r0 * K, *xsr = xs + (int64_t)r0 * nb;
                    float *yr = y + 8 * (g - g0) + (int64_t)r0 * ldy;
#define PANEL(G_, R_) panel_tile(TYPE, p[0], p[1], wg, gs, xr, K, xsr, b0, b1, G_, R_, yr, ldy)
                    switch (G * 8 + R) {
                        case 17: PANEL(2, 1); break;
                        case 18: PANEL(2, 2); break;
                        case 19: PANEL(2, 3); break;
                        case 20: PANEL(2, 4); break;
                        case 21: PANEL(2, 5); break;
                        case 22: PANEL(2, 6); break;
                        case 9: PANEL(1, 1); break;
                        case 10: PANEL(1, 2); break;
                        case 11: PANEL(1, 3); break;
                        case 12: PANEL(1, 4); break;
                        case 13: PANEL(1, 5); break;
                        default: PANEL(1, 6); break;
                    }
#undef PANEL
                    r0 += R;
                }
            }
        }
    }
}

static int panel_rows(const wp_matrix *W, const float *x, const float *xs, int D, float *y, int64_t ldy, int64_t g0,
                      int64_t g1) {
    float *panel = W->type == WP_F32 ? NULL : (float *)aligned_alloc(32, 2 * PANEL_BLOCKS * 256 * sizeof(float));
    if (W->type != WP_F32 && !panel) return -1;
    switch (W->type) {
        case WP_Q4_1: panel_rows_t(W, WP_Q4_1, x, xs, D, y, ldy, g0, g1, panel); break;
        case WP_Q8_0: panel_rows_t(W, WP_Q8_0, x, xs, D, y, ldy, g0, g1, panel); break;
        default: panel_rows_t(W, WP_F32, x, xs, D, y, ldy, g0, g1, panel); break;
    }
    free(panel);
    return 0;
}

/* Int8 activations (a Q4_1 or Q8_0 matrix packed with act = WP_ACT_INT8; see "Int8 activations" above): a
   register tile of G groups x R rows, 32 multiply-adds per instruction (vpmaddubsw: unsigned x signed bytes,
   pairs summed into 16 bits), a block's integer sums then scaled into one fp32 chain per output. Q4_1: the
   nibbles unpacked to bytes in registers (0..15), a block's 8 products per 16-bit lane summed there (< 32,767).
   Q8_0: signed weights, so |w| times x with w's sign (vpsignb), each product pair widened to 32 bits at once
   (two would overflow 16). */
AI void tile_i8(const int TYPE, const uint8_t *w, int64_t gs, const int8_t *xq, int64_t K, const float *dx,
                const float *xs, const int G, const int R, float *y, int64_t ldy, const uint8_t *pf) {
    const int64_t nb = K / 32, bb = block_bytes(TYPE);
    const __m256i low = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    __m256 acc[8][TILE_R]; /* G <= 4 here; 8 keeps tiles_t's (unused) wider shapes in bounds */
    zero_tile(acc, G, R);
    for (int64_t b = 0; b < nb; b++) {
        fetch_ahead(pf, b, G * bb);
        const uint8_t *blk = w + b * bb;
        const int8_t *xb = xq + b * 32;
        __m256i s[8][TILE_R]; /* Q4_1: 16-bit sums of pairs; Q8_0: 32-bit sums */
#pragma GCC unroll 4
        for (int i = 0; i < G; i++)
#pragma GCC unroll 6
            for (int r = 0; r < R; r++) s[i][r] = _mm256_setzero_si256();
        if (TYPE == WP_Q4_1) {
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++)
#pragma GCC unroll 4
                for (int i = 0; i < G; i++) {
                    const __m256i nib = _mm256_loadu_si256((const __m256i *)(blk + i * gs + 32 + 32 * v));
                    const __m256i lo = _mm256_and_si256(nib, low), hi = _mm256_and_si256(_mm256_srli_epi16(nib, 4), low);
#pragma GCC unroll 6
                    for (int r = 0; r < R; r++) {
                        int32_t a, c;
                        memcpy(&a, xb + r * K + 8 * v, 4);
                        memcpy(&c, xb + r * K + 8 * v + 4, 4);
                        s[i][r] = _mm256_add_epi16(s[i][r], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(a)));
                        s[i][r] = _mm256_add_epi16(s[i][r], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(c)));
                        __asm__("" : "+x"(s[i][r])); /* keep the sums in registers: unpinned, GCC computes all
                                                        products first and spills them */
                    }
                }
        } else {
#pragma GCC unroll 4
            for (int v = 0; v < 8; v++)
#pragma GCC unroll 4
                for (int i = 0; i < G; i++) {
                    const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + i * gs + 16 + 32 * v));
                    const __m256i aq = _mm256_abs_epi8(q);
#pragma GCC unroll 6
                    for (int r = 0; r < R; r++) {
                        int32_t a;
                        memcpy(&a, xb + r * K + 4 * v, 4);
                        const __m256i p = _mm256_maddubs_epi16(aq, _mm256_sign_epi8(_mm256_set1_epi32(a), q));
                        s[i][r] = _mm256_add_epi32(s[i][r], _mm256_madd_epi16(p, ones));
                        __asm__("" : "+x"(s[i][r]));
                    }
                }
        }
#pragma GCC unroll 4
        for (int i = 0; i < G; i++) {
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + i * gs)));
#pragma GCC unroll 6
            for (int r = 0; r < R; r++) {
                const __m256i sum = TYPE == WP_Q4_1 ? _mm256_madd_epi16(s[i][r], ones) : s[i][r];
                acc[i][r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_broadcast_ss(dx + r * nb + b)),
                                            _mm256_cvtepi32_ps(sum), acc[i][r]);
            }
        }
    }
    if (TYPE == WP_Q4_1) add_min_terms(w, gs, xs, nb, G, R, acc, 0);
#pragma GCC unroll 4
    for (int i = 0; i < G; i++)
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) _mm256_storeu_ps(y + r * ldy + 8 * i, acc[i][r]);
}

/* Groups g0..g1 (whole groups of 8 rows; y at group g0's outputs) times R rows of x, fp32 (x) or int8 (INT8:
   xq, dx): the widest tile that keeps <= 12 accumulators (int8: sums and chains). */
AI void tiles_t(const wp_matrix *W, const int TYPE, const int INT8, const float *x, const float *xs, const int8_t *xq,
                const float *dx, int R, float *y, int64_t ldy, int64_t g0, int64_t g1, int fetch) {
    const int64_t K = W->cols, gs = K / 32 * block_bytes(TYPE);
    const uint8_t *end = W->data + g1 * gs;
    int64_t g = g0;
#define TILE(G_, R_)                                                                                              \
    for (; g + G_ <= g1; g += G_) {                                                                               \
        const uint8_t *next = W->data + (g + G_) * gs, *pf = fetch && next + G_ * gs <= end ? next : NULL;        \
        if (INT8) tile_i8(TYPE, W->data + g * gs, gs, xq, K, dx, xs, G_, R_, y + 8 * (g - g0), ldy, pf);          \
        else tile(TYPE, W->data + g * gs, gs, x, K, xs, G_, R_, y + 8 * (g - g0), ldy, pf);                      \
    }
    if (INT8) switch (R) {
            case 1: TILE(4, 1) TILE(1, 1) break;
            case 2: TILE(2, 2) TILE(1, 2) break;
            case 3: TILE(1, 3) break;
            case 4: TILE(1, 4) break;
            case 5: TILE(1, 5) break;
            default: TILE(1, 6) break;
        }
    else switch (R) {
            case 1: TILE(8, 1) TILE(4, 1) TILE(1, 1) break;
            case 2: TILE(4, 2) TILE(1, 2) break;
            case 3: TILE(3, 3) TILE(1, 3) break;
            default: TILE(2, 4) TILE(1, 4) break;
        }
#undef TILE
}

static void tiles(const wp_matrix *W, const float *x, const float *xs, int R, float *y, int64_t ldy, int64_t g0,
                  int64_t g1, int fetch) {
    switch (W->type) {
        case WP_Q4_1: tiles_t(W, WP_Q4_1, 0, x, xs, NULL, NULL, R, y, ldy, g0, g1, fetch); break;
        case WP_Q8_0: tiles_t(W, WP_Q8_0, 0, x, xs, NULL, NULL, R, y, ldy, g0, g1, fetch); break;
        default: tiles_t(W, WP_F32, 0, x, xs, NULL, NULL, R, y, ldy, g0, g1, fetch); break;
    }
}

static void tiles_i8(const wp_matrix *W, const int8_t *xq, const float *dx, const float *xs, int R, float *y,
                     int64_t ldy, int64_t g0, int64_t g1, int fetch) {
    if (W->type == WP_Q4_1) tiles_t(W, WP_Q4_1, 1, NULL, xs, xq, dx, R, y, ldy, g0, g1, fetch);
    else tiles_t(W, WP_Q8_0, 1, NULL, xs, xq, dx, R, y, ldy, g0, g1, fetch);
}

/* Rows of x to int8, a block of 32 at a time (see "Int8 activations"); the same values as the portable path. */
static void quantize_rows(const float *x, int D, int64_t K, int8_t *xq, float *dx, int nthreads) {
    const int64_t nb = K / 32;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
#pragma omp parallel for num_threads(nthreads) if (D >= PAR_ROWS) schedule(static)
    for (int r = 0; r < D; r++)
        for (int64_t b = 0; b < nb; b++) {
            const float *p = x + (int64_t)r * K + b * 32;
            __m256 v[4];
            for (int j = 0; j < 4; j++) v[j] = _mm256_loadu_ps(p + 8 * j);
            const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                           _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
            __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            h = _mm_max_ss(h, _mm_movehdup_ps(h));
            const float amax = _mm_cvtss_f32(h);
            dx[r * nb + b] = amax / 127.0f;
            const __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            __m256i q[4];
            for (int j = 0; j < 4; j++) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], id)); /* nearest, ties even */
            const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256((__m256i *)(xq + (int64_t)r * K + b * 32), _mm256_permutevar8x32_epi32(packed, perm));
        }
}
#else
/* The portable path: the same sums, one output at a time. */
static void tiles(const wp_matrix *W, const float *x, const float *xs, int R, float *y, int64_t ldy, int64_t g0,
                  int64_t g1, int fetch) {
    (void)fetch;
    const int64_t K = W->cols, nb = K / 32, bb = block_bytes(W->type), gs = nb * bb;
    for (int64_t g = g0; g < g1; g++)
        for (int j = 0; j < 8; j++)
            for (int r = 0; r < R; r++) {
                const float *xr = x + (int64_t)r * K;
                float sum = 0.f, mins = 0.f;
                for (int64_t b = 0; b < nb; b++) {
                    const uint8_t *blk = W->data + g * gs + b * bb;
                    const float d = W->type == WP_F32 ? 1.f : load_half(blk + 2 * j);
                    for (int k = 0; k < 32; k++) {
                        float wv;
                        if (W->type == WP_Q4_1) {
                            const uint8_t byte = blk[32 + 8 * (k / 2) + j];
                            wv = d * (float)(k % 2 ? byte >> 4 : byte & 15);
                        } else if (W->type == WP_Q8_0) {
                            wv = d * (float)(int8_t)blk[16 + 8 * k + j];
                        } else {
                            memcpy(&wv, blk + 4 * (8 * k + j), 4);
                        }
                        sum += wv * xr[b * 32 + k];
                    }
                }
                if (W->type == WP_Q4_1)
                    for (int64_t b = 0; b < nb; b++) mins += load_half(W->data + g * gs + b * bb + 16 + 2 * j) * xs[r * nb + b];
                y[(int64_t)r * ldy + 8 * (g - g0) + j] = sum + mins;
            }
}

static void tiles_i8(const wp_matrix *W, const int8_t *xq, const float *dx, const float *xs, int R, float *y,
                     int64_t ldy, int64_t g0, int64_t g1, int fetch) {
    (void)fetch;
    const int q4 = W->type == WP_Q4_1;
    const int64_t K = W->cols, nb = K / 32, bb = block_bytes(W->type), gs = nb * bb;
    for (int64_t g = g0; g < g1; g++)
        for (int j = 0; j < 8; j++)
            for (int r = 0; r < R; r++) {
                float sum = 0.f, mins = 0.f;
                for (int64_t b = 0; b < nb; b++) {
                    const uint8_t *blk = W->data + g * gs + b * bb;
                    const int8_t *xb = xq + (int64_t)r * K + b * 32;
                    int32_t s = 0;
                    for (int k = 0; k < 32; k++) {
                        if (q4) {
                            const uint8_t byte = blk[32 + 32 * (k / 8) + 4 * j + k % 4];
                            s += (k % 8 < 4 ? byte & 15 : byte >> 4) * xb[k];
                        } else {
                            s += (int8_t)blk[16 + 32 * (k / 4) + 4 * j + k % 4] * xb[k];
                        }
                    }
                    sum = fmaf(load_half(blk + 2 * j) * dx[r * nb + b], (float)s, sum);
                }
                if (q4)
                    for (int64_t b = 0; b < nb; b++) mins += load_half(W->data + g * gs + b * bb + 16 + 2 * j) * xs[r * nb + b];
                y[(int64_t)r * ldy + 8 * (g - g0) + j] = sum + mins;
            }
}

static void quantize_rows(const float *x, int D, int64_t K, int8_t *xq, float *dx, int nthreads) {
    (void)nthreads;
    const int64_t nb = K / 32;
    for (int r = 0; r < D; r++)
        for (int64_t b = 0; b < nb; b++) {
            const float *p = x + (int64_t)r * K + b * 32;
            float amax = 0.f;
            for (int k = 0; k < 32; k++) amax = fmaxf(amax, fabsf(p[k]));
            dx[r * nb + b] = amax / 127.0f;
            const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
            for (int k = 0; k < 32; k++) xq[(int64_t)r * K + b * 32 + k] = (int8_t)lrintf(p[k] * id);
        }
}
#endif

/* Rows of x from r0 on (R of them) times the groups g0..g1: whole groups through tiles() (tiles_i8() for int8
   activations: xq set; skipped when whole_done), a last group of fewer than 8 real rows through a scratch tile
   so nothing is written past row N. */
static void matmul_groups(const wp_matrix *W, const float *x, const float *xs, const int8_t *xq, const float *dx,
                          int R, float *y, int64_t g0, int64_t g1, int fetch, int whole_done) {
    const int64_t N = W->rows, full = N / 8, g1w = g1 < full ? g1 : full;
    if (!whole_done && g0 < g1w) {
        if (xq) tiles_i8(W, xq, dx, xs, R, y + 8 * g0, N, g0, g1w, fetch);
        else tiles(W, x, xs, R, y + 8 * g0, N, g0, g1w, fetch);
    }
    if (g1 > full) { /* the partial group */
        float tmp[TILE_R * 8];
        if (xq) tiles_i8(W, xq, dx, xs, R, tmp, 8, full, full + 1, 0);
        else tiles(W, x, xs, R, tmp, 8, full, full + 1, 0);
        for (int r = 0; r < R; r++)
            for (int64_t n = 8 * full; n < N; n++) y[(int64_t)r * N + n] = tmp[r * 8 + (n - 8 * full)];
    }
}

/* y[D][rows] = x[D][cols] @ W.T (+ bias): the weight groups split over the threads (each weight read once per
   step, by one thread), every thread running all rows of x: fp32 in tiles of <= 4 rows or, for 8+ rows,
   panels; int8 activations in tiles of <= 6 rows, over blocks of I8_ROW_BLOCK rows x I8_GROUPS groups (both
   in L2 while the tiles pass over them). */
#define I8_ROW_BLOCK 96
#define I8_GROUPS 16
static int matmul(const wp_matrix *W, const float *x, int D, float *y, int nthreads) {
    const int64_t N = W->rows, K = W->cols, nb = K / 32, NG = (N + 7) / 8;
    const int int8 = W->act == WP_ACT_INT8 && W->type != WP_F32;
    float *xs = (float *)malloc((size_t)(D * nb + 1) * sizeof(float));
    float *dx = int8 ? (float *)malloc((size_t)(D * nb + 1) * sizeof(float)) : NULL;
    int8_t *xq = int8 ? (int8_t *)malloc((size_t)D * K + 1) : NULL;
    if (!xs || (int8 && (!dx || !xq))) {
        free(xs), free(dx), free(xq);
        return -1;
    }
    if (W->type == WP_Q4_1) block_sums(x, D, K, xs);
    if (int8) quantize_rows(x, D, K, xq, dx, nthreads);
#pragma omp parallel num_threads(nthreads)
    {
        int t = 0, nt = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        /* Contiguous group ranges, a multiple of 4 groups each where possible (whole wide tiles). */
        const int64_t per = ((NG + nt - 1) / nt + 3) / 4 * 4;
        const int64_t g0 = t * per < NG ? t * per : NG, g1 = g0 + per < NG ? g0 + per : NG;
        if (int8) {
            /* A few rows (decodes) stream all the thread's groups once, fetching ahead; many rows go by blocks. */
            const int64_t chunk = D <= TILE_R ? (g1 - g0 > 0 ? g1 - g0 : 1) : I8_GROUPS;
            for (int rb0 = 0; rb0 < D; rb0 += I8_ROW_BLOCK) {
                const int DB = D - rb0 < I8_ROW_BLOCK ? D - rb0 : I8_ROW_BLOCK, T = (DB + TILE_R - 1) / TILE_R;
                for (int64_t c0 = g0; c0 < g1; c0 += chunk) {
                    const int64_t c1 = c0 + chunk < g1 ? c0 + chunk : g1;
                    for (int i = 0, r0 = rb0; i < T; i++) { /* tiles of <= 6 rows, as even as possible */
                        const int R = DB / T + (i < DB % T);
                        matmul_groups(W, NULL, xs + (int64_t)r0 * nb, xq + (int64_t)r0 * K, dx + (int64_t)r0 * nb, R,
                                      y + (int64_t)r0 * N, c0, c1, D <= TILE_R && i == 0, 0);
                        r0 += R;
                    }
                }
            }
        } else {
            int whole_done = 0;
#ifdef WP_SIMD
            const int64_t f1 = g1 < N / 8 ? g1 : N / 8;
            /* many rows: convert each weight once, for all of them (else the tiles below, a failed allocation too) */
            if (D >= PANEL_ROWS && g0 < f1) whole_done = panel_rows(W, x, xs, D, y + 8 * g0, N, g0, f1) == 0;
#endif
            /* x in tiles of <= 4 rows, as even as possible (16 rows: 4 x 4; 6: 3 + 3). */
            const int T = (D + 3) / 4;
            for (int i = 0, r0 = 0; i < T; i++) {
                const int R = D / T + (i < D % T);
                matmul_groups(W, x + (int64_t)r0 * K, xs + (int64_t)r0 * nb, NULL, NULL, R, y + (int64_t)r0 * N, g0,
                              g1, i == 0, whole_done);
                r0 += R;
            }
        }
        if (W->bias)
            for (int r = 0; r < D; r++)
                for (int64_t n = 8 * g0; n < 8 * g1 && n < N; n++) y[(int64_t)r * N + n] += W->bias[n];
    }
    free(xs), free(dx), free(xq);
    return 0;
}

static void rms_norm(const float *x, const float *w, float eps, int D, int H, float *out, int nthreads) {
#pragma omp parallel for num_threads(nthreads) if (D >= PAR_ROWS) schedule(static)
    for (int r = 0; r < D; r++) {
        const float *xr = x + (int64_t)r * H;
        double ss = 0.0;
        for (int i = 0; i < H; i++) ss += (double)xr[i] * xr[i];
        const float inv = 1.0f / sqrtf((float)(ss / H) + eps);
        for (int i = 0; i < H; i++) out[(int64_t)r * H + i] = w[i] * (xr[i] * inv);
    }
}

/* x += h, rows of H values. */
static void add_rows(float *x, const float *h, int R, int H, int nthreads) {
#pragma omp parallel for num_threads(nthreads) if (R >= PAR_ROWS) schedule(static)
    for (int r = 0; r < R; r++)
        for (int i = 0; i < H; i++) x[(int64_t)r * H + i] += h[(int64_t)r * H + i];
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
   each K/V row once for the G heads. s holds G x SPLIT scores. Same output as attend_span. Prefetches
   floats pf0..pf1 of each token's K and V rows (relative to this head's): the first KV head of a task fetches
   whole rows, the others find them in cache. */
static void attend_one_row(const float *q, const float *kc, const float *vc, const int32_t *table, int bs,
                           int64_t tok, int G, int hd, float scale, int64_t t0, int64_t t1, float *s, float *part,
                           int64_t pf0, int64_t pf1) {
    const int n = (int)(t1 - t0);
    const float *rows[SPLIT]; /* where each token's K (and, at the same offset, V) row lies */
    for (int t = 0; t < n; t++) rows[t] = kc + ((int64_t)table[(t0 + t) / bs] * bs + (t0 + t) % bs) * tok;
    const int64_t v_off = vc - kc;
    /* K/V rows are scattered over blocks and a decode step's whole cache is read once from memory: fetch
       ONE_ROW_AHEAD tokens ahead of use (the first ones now). */
    for (int u = 0; u < n && u < ONE_ROW_AHEAD; u++)
        for (int64_t o = pf0; o < pf1; o += 16) __builtin_prefetch(rows[u] + o), __builtin_prefetch(rows[u] + v_off + o);
    int t = 0;
#ifdef WP_SIMD
    if (hd % 8 == 0)
        for (; t + 8 <= n; t += 8) { /* 8 tokens at a time: 8 independent chains, reduced to 8 scores at once */
            for (int u = t + ONE_ROW_AHEAD; u < t + 8 + ONE_ROW_AHEAD && u < n; u++)
                for (int64_t o = pf0; o < pf1; o += 16) __builtin_prefetch(rows[u] + o), __builtin_prefetch(rows[u] + v_off + o);
            for (int j = 0; j < G; j++) {
                __m256 acc[8];
                for (int u = 0; u < 8; u++) acc[u] = _mm256_setzero_ps();
                for (int d = 0; d < hd; d += 8) {
                    const __m256 qv = _mm256_loadu_ps(q + j * hd + d);
                    for (int u = 0; u < 8; u++) acc[u] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows[t + u] + d), acc[u]);
                }
                const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
                const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
                const __m256 sc = _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
                _mm256_storeu_ps(s + j * SPLIT + t, _mm256_mul_ps(sc, _mm256_set1_ps(scale)));
            }
        }
#endif
    for (; t < n; t++)
        for (int j = 0; j < G; j++) s[j * SPLIT + t] = dot(q + j * hd, rows[t], hd) * scale;
    for (int j = 0; j < G; j++) {
        float *sj = s + j * SPLIT, *pj = part + j * (hd + 2), *o = pj + 2, mx = -INFINITY;
        for (int u = 0; u < n; u++) mx = sj[u] > mx ? sj[u] : mx;
        pj[0] = mx;
        pj[1] = exp_shifted(sj, n, mx);
        int d0 = 0;
#ifdef WP_SIMD
        for (; d0 + 64 <= hd; d0 += 64) { /* 64 output values in 8 registers over the span: 8 chains */
            __m256 acc[8];
            for (int c = 0; c < 8; c++) acc[c] = _mm256_setzero_ps();
            for (int u = 0; u < n; u++) {
                const float *v = rows[u] + v_off + d0;
                const __m256 p = _mm256_set1_ps(sj[u]);
                for (int c = 0; c < 8; c++) acc[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8 * c), acc[c]);
            }
            for (int c = 0; c < 8; c++) _mm256_storeu_ps(o + d0 + 8 * c, acc[c]);
        }
        for (; d0 + 8 <= hd; d0 += 8) {
            __m256 acc = _mm256_setzero_ps();
            for (int u = 0; u < n; u++)
                acc = _mm256_fmadd_ps(_mm256_set1_ps(sj[u]), _mm256_loadu_ps(rows[u] + v_off + d0), acc);
            _mm256_storeu_ps(o + d0, acc);
        }
#endif
        for (int d = d0; d < hd; d++) o[d] = 0.f;
        for (int u = 0; u < n && d0 < hd; u++)
            for (int d = d0; d < hd; d++) o[d] += sj[u] * rows[u][v_off + d];
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

/* A step's attention layout, the same for every layer: tasks are (sequence, span of SPLIT tokens) for a
   decode row, all KV heads at once, and (sequence, KV head, span) for a chunk; each writes its partial
   results ([max score, sum of exp, unnormalized output] per query head and row) at its own place in parts.
   Planned and allocated once per forward pass. */
typedef struct {
    int *first;    /* [S + 1] first task of each sequence */
    int64_t *poff; /* [S + 1] where its partial results start */
    int *row_seq;  /* [R] the sequence of each row */
    float *parts, *work;
    int64_t scratch; /* floats of work per thread */
} attn_plan;

static void free_plan(attn_plan *P) { free(P->first), free(P->poff), free(P->row_seq), free(P->parts), free(P->work); }

static int plan_attention(const wp_model *M, int S, const int32_t *seq_rows, const int64_t *start, int nthreads,
                          attn_plan *P) {
    const int KVH = M->num_kv_heads, hd = M->head_dim, G = M->num_heads / KVH;
    memset(P, 0, sizeof(*P));
    P->first = (int *)malloc((size_t)(S + 1) * sizeof(int));
    P->poff = (int64_t *)malloc((size_t)(S + 1) * sizeof(int64_t));
    P->row_seq = (int *)malloc((size_t)seq_rows[S] * sizeof(int) + 1);
    if (!P->first || !P->poff || !P->row_seq) return free_plan(P), -1;
    P->first[0] = 0, P->poff[0] = 0;
    for (int sq = 0; sq < S; sq++) {
        const int nrows = seq_rows[sq + 1] - seq_rows[sq];
        const int nspan = (int)((start[sq] + nrows + SPLIT - 1) / SPLIT);
        for (int r = seq_rows[sq]; r < seq_rows[sq + 1]; r++) P->row_seq[r] = sq;
        P->first[sq + 1] = P->first[sq] + (nrows == 1 ? nspan : KVH * nspan); /* a decode row's task: all KV heads */
        P->poff[sq + 1] = P->poff[sq] + (int64_t)KVH * nspan * nrows * G * (hd + 2);
    }
    P->scratch = 2 * (int64_t)hd * SPLIT + (int64_t)(G > 2 ? G : 2) * SPLIT;
    P->parts = (float *)malloc((size_t)P->poff[S] * sizeof(float));
    P->work = (float *)malloc((size_t)nthreads * P->scratch * sizeof(float));
    if (!P->parts || !P->work) return free_plan(P), -1;
    return 0;
}

/* Writes the new rows' K/V into their slots, then attends every query head of every row over its
   sequence's context (the tasks of plan P), then merges each row's spans with the usual max/sum rescaling.
   Rows of sequence s are seq_rows[s]..seq_rows[s+1], at positions start[s]... */
static void attention(const wp_model *M, int layer, int S, const int32_t *seq_rows, const int64_t *start,
                      const int32_t *tables, int width, const float *qkv, float *kv, float *out, int nthreads,
                      const attn_plan *P) {
    const int H = M->num_heads, KVH = M->num_kv_heads, hd = M->head_dim, bs = M->block_size;
    const int G = H / KVH, qkv_w = (H + 2 * KVH) * hd;
    const int64_t tok = (int64_t)KVH * hd, plane = (int64_t)M->num_kv_blocks * bs * tok;
    float *kc = kv + (int64_t)layer * 2 * plane, *vc = kc + plane;
    const int *first = P->first;
    const int64_t *poff = P->poff;
    float *parts = P->parts;
    for (int sq = 0; sq < S; sq++)
        for (int r = seq_rows[sq]; r < seq_rows[sq + 1]; r++) {
            const int64_t p = start[sq] + (r - seq_rows[sq]);
            const int64_t slot = (int64_t)tables[(int64_t)sq * width + p / bs] * bs + p % bs;
            memcpy(kc + slot * tok, qkv + (int64_t)r * qkv_w + H * hd, tok * sizeof(float));
            memcpy(vc + slot * tok, qkv + (int64_t)r * qkv_w + (H + KVH) * hd, tok * sizeof(float));
        }
    const int tasks = first[S];
#pragma omp parallel num_threads(nthreads)
    {
        int thread = 0;
#ifdef _OPENMP
        thread = omp_get_thread_num();
#endif
        float *w = P->work + (int64_t)thread * P->scratch;
#pragma omp for schedule(dynamic, 1)
        for (int task = 0; task < tasks; task++) {
            int sq = 0;
            while (first[sq + 1] <= task) sq++;
            const int nrows = seq_rows[sq + 1] - seq_rows[sq], idx = task - first[sq];
            const int64_t ctx = start[sq] + nrows, nspan = (ctx + SPLIT - 1) / SPLIT;
            const int64_t stride = (int64_t)nrows * G * (hd + 2); /* one (KV head, span)'s partial results */
            const int c = nrows == 1 ? idx : (int)(idx % nspan);
            const int64_t t0 = (int64_t)c * SPLIT, t1 = t0 + SPLIT < ctx ? t0 + SPLIT : ctx;
            const float *q = qkv + (int64_t)seq_rows[sq] * qkv_w;
            const int32_t *table = tables + (int64_t)sq * width;
            if (nrows == 1) { /* decode: too few queries to pay for staging K/V; read them in place, whole rows */
                for (int g = 0; g < KVH; g++)
                    attend_one_row(q + g * G * hd, kc + g * hd, vc + g * hd, table, bs, tok, G, hd, M->scale, t0, t1,
                                   w, parts + poff[sq] + (g * nspan + c) * stride, 0, g ? 0 : tok);
            } else {
                const int g = (int)(idx / nspan);
                attend_span(q + g * G * hd, qkv_w, nrows, start[sq], kc + g * hd, vc + g * hd, table, bs, tok, G,
                            hd, M->scale, t0, t1, w, w + (int64_t)hd * SPLIT, w + 2 * (int64_t)hd * SPLIT,
                            parts + poff[sq] + idx * stride);
            }
        }
        /* The merge, a row per iteration (a prompt chunk has hundreds). */
#pragma omp for schedule(static)
        for (int r = 0; r < seq_rows[S]; r++) {
            const int sq = P->row_seq[r], nrows = seq_rows[sq + 1] - seq_rows[sq], i = r - seq_rows[sq];
            const int nspan = (int)((start[sq] + nrows + SPLIT - 1) / SPLIT);
            const int64_t stride = (int64_t)nrows * G * (hd + 2); /* from one span's task to the next */
            for (int h = 0; h < H; h++) {
                const int g = h / G, j = h % G;
                const float *p0 = parts + poff[sq] + (int64_t)g * nspan * stride + ((int64_t)i * G + j) * (hd + 2);
                float mx = -INFINITY, sum = 0.f;
                for (int c = 0; c < nspan; c++) mx = p0[c * stride] > mx ? p0[c * stride] : mx;
                float *o = out + (int64_t)r * H * hd + h * hd;
                for (int d = 0; d < hd; d++) o[d] = 0.f;
                for (int c = 0; c < nspan; c++) {
                    const float *pc = p0 + c * stride;
                    if (pc[1] == 0.f) continue; /* a span wholly after this row's position */
                    const float wt = expf(pc[0] - mx);
                    sum += wt * pc[1];
                    for (int d = 0; d < hd; d++) o[d] += wt * pc[2 + d];
                }
                const float inv = 1.0f / sum;
                for (int d = 0; d < hd; d++) o[d] *= inv;
            }
        }
    }
}

static void silu_mul(const float *gu, int R, int I, float *act, int nthreads) {
#pragma omp parallel for num_threads(nthreads) if (R >= PAR_ROWS) schedule(static)
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
   new token. For decode (one token each), short chunks over a cached context (a warm prefix + the few new
   tokens of an edit) and short prompts; chunks over long contexts are the torch path's (its attention). Returns 0, -1 out of memory, -2 bad shape. */
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
    attn_plan plan;
    if (plan_attention(M, S, seq_rows, start, nthreads, &plan)) {
        free(buf);
        return -1;
    }
    int rc = 0;
    for (int l = 0; l < M->num_layers && !rc; l++) {
        const wp_layer *L = &M->layers[l];
        rms_norm(x, L->input_norm, M->eps, R, Hd, h, nthreads);
        if ((rc = matmul(&L->qkv, h, R, qkv, nthreads))) break;
#pragma omp parallel for num_threads(nthreads) if (R >= PAR_ROWS) schedule(static)
        for (int r = 0; r < R; r++) {
            const int sq = plan.row_seq[r];
            const int64_t p = start[sq] + (r - seq_rows[sq]);
            for (int j = 0; j < H + KVH; j++) rope(qkv + (int64_t)r * qkv_w + j * hd, cos_t + p * hd, sin_t + p * hd, hd);
        }
        attention(M, l, S, seq_rows, start, tables, width, qkv, kv, att, nthreads, &plan);
        if ((rc = matmul(&L->o, att, R, h, nthreads))) break;
        add_rows(x, h, R, Hd, nthreads);
        rms_norm(x, L->post_attention_norm, M->eps, R, Hd, h, nthreads);
        if ((rc = matmul(&L->gate_up, h, R, gu, nthreads))) break;
        silu_mul(gu, R, I, act, nthreads);
        if ((rc = matmul(&L->down, act, R, h, nthreads))) break;
        add_rows(x, h, R, Hd, nthreads);
    }
    if (!rc) {
        for (int sq = 0; sq < S; sq++)
            memcpy(last + (int64_t)sq * Hd, x + (int64_t)(seq_rows[sq + 1] - 1) * Hd, Hd * sizeof(float));
        rms_norm(last, M->norm, M->eps, S, Hd, h, nthreads);
        rc = matmul(&M->head, h, S, logits, nthreads);
    }
    free_plan(&plan);
    free(buf);
    return rc;
}

/* y[D][rows] = x[D][cols] @ W.T alone (tests and benchmarks of the matrix kernels). */
int wp_matmul(const wp_matrix *W, const float *x, int D, float *y, int nthreads) { return matmul(W, x, D, y, nthreads); }
