/* Part of matmul.h (AVX2 only): the register tiles, fp32 and int8,
   the walker that picks a tile shape for a range of groups, and the int8 quantization of x. */
#pragma once

#include "layout.h"

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
            const __m256 m =
                _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + (first_group + i) * gs + b * 160 + 16)));
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
                        const __m256i q =
                            _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + i * gs + 32 + 8 * p)));
                        const __m256 qf = _mm256_cvtepi32_ps(h ? _mm256_srli_epi32(q, 4)
                                                               : _mm256_and_si256(q, _mm256_set1_epi32(15)));
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
                    const __m256 wv = TYPE == WP_Q8_0
                                          ? _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                                                              (const __m128i *)(blk + i * gs + 16 + 8 * k)))),
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

/* Int8 activations (a Q4_1 or Q8_0 matrix packed with act = WP_ACT_INT8; see "Int8 activations" in matmul.h): a
   register tile of G groups x R rows, 32 multiply-adds per instruction (vpmaddubsw: unsigned x signed bytes,
   pairs summed into 16 bits), a block's integer sums then scaled into one fp32 chain per output. Q4_1: the
   nibbles unpacked to bytes in registers (0..15), a block's 8 products per 16-bit lane summed there (< 32,767).
   Q8_0: signed weights, so |w| times x with w's sign (vpsignb), each product pair widened to 32 bits at once
   (two would overflow 16). */
AI void tile_i8(const int TYPE, const uint8_t *w, int64_t gs, const int8_t *xq, int64_t K, const float *dx,
                const float *xs, const int G, const int R, float *y, int64_t ldy, const uint8_t *pf) {
    const int64_t nb = K / 32, bb = block_bytes(TYPE);
    const __m256i low = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    (void)ones;            /* not needed with VNNI */
    __m256 acc[8][TILE_R]; /* G <= 4 here; 8 keeps tiles_t's (unused) wider shapes in bounds */
    zero_tile(acc, G, R);
    for (int64_t b = 0; b < nb; b++) {
        fetch_ahead(pf, b, G * bb);
        const uint8_t *blk = w + b * bb;
        const int8_t *xb = xq + b * 32;
        __m256i s[8][TILE_R]; /* Q4_1: 16-bit sums of pairs (32-bit with VNNI); Q8_0: 32-bit sums */
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
                    const __m256i lo = _mm256_and_si256(nib, low),
                                  hi = _mm256_and_si256(_mm256_srli_epi16(nib, 4), low);
#pragma GCC unroll 6
                    for (int r = 0; r < R; r++) {
                        int32_t a, c;
                        memcpy(&a, xb + r * K + 8 * v, 4);
                        memcpy(&c, xb + r * K + 8 * v + 4, 4);
#ifdef WP_VNNI
                        s[i][r] = dpbusd(dpbusd(s[i][r], lo, _mm256_set1_epi32(a)), hi, _mm256_set1_epi32(c));
#else
                        s[i][r] = _mm256_add_epi16(s[i][r], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(a)));
                        s[i][r] = _mm256_add_epi16(s[i][r], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(c)));
#endif
                        /* keep the sums in registers: unpinned, GCC computes all products first and spills them */
                        __asm__("" : PIN(s[i][r]));
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
#ifdef WP_VNNI
                        s[i][r] = dpbusd(s[i][r], aq, _mm256_sign_epi8(_mm256_set1_epi32(a), q));
#else
                        const __m256i p = _mm256_maddubs_epi16(aq, _mm256_sign_epi8(_mm256_set1_epi32(a), q));
                        s[i][r] = _mm256_add_epi32(s[i][r], _mm256_madd_epi16(p, ones));
#endif
                        __asm__("" : PIN(s[i][r]));
                    }
                }
        }
#pragma GCC unroll 4
        for (int i = 0; i < G; i++) {
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + i * gs)));
#pragma GCC unroll 6
            for (int r = 0; r < R; r++) {
#ifdef WP_VNNI
                const __m256i sum = s[i][r];
#else
                const __m256i sum = TYPE == WP_Q4_1 ? _mm256_madd_epi16(s[i][r], ones) : s[i][r];
#endif
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

#if defined(WP_VNNI) && defined(__AVX512F__) && defined(__AVX512BW__) && !defined(WP_NO_I8_ZMM) /* tests: off */
#define WP_I8_ZMM 1
/* tile_i8 on 512-bit registers: P pairs of groups, a pair's 16 outputs side by side (group 2p in lanes 0-7, 2p+1 in
   8-15). Every lane does what tile_i8 does for its output (the same integer sums, then the same fp32 chain over
   blocks, the min term after), so a row's outputs are bit for bit tile_i8's whichever tile computes them. */
AI void tile_i8z(const int TYPE, const uint8_t *w, int64_t gs, const int8_t *xq, int64_t K, const float *dx,
                 const float *xs, const int P, const int R, float *y, int64_t ldy, const uint8_t *pf) {
    const int64_t nb = K / 32, bb = block_bytes(TYPE);
    const __m512i low = _mm512_set1_epi8(15);
    __m512 acc[2][TILE_R];
#pragma GCC unroll 2
    for (int p = 0; p < P; p++)
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) acc[p][r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        fetch_ahead(pf, b, 2 * P * bb);
        const uint8_t *blk = w + b * bb;
        const int8_t *xb = xq + b * 32;
        __m512i s[2][TILE_R];
#pragma GCC unroll 2
        for (int p = 0; p < P; p++)
#pragma GCC unroll 6
            for (int r = 0; r < R; r++) s[p][r] = _mm512_setzero_si512();
        const int nv = TYPE == WP_Q4_1 ? 4 : 8, off = TYPE == WP_Q4_1 ? 32 : 16;
#pragma GCC unroll 8
        for (int v = 0; v < nv; v++)
#pragma GCC unroll 2
            for (int p = 0; p < P; p++) {
                const __m512i q = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(blk + 2 * p * gs + off + 32 * v))),
                    _mm256_loadu_si256((const __m256i *)(blk + (2 * p + 1) * gs + off + 32 * v)), 1);
                if (TYPE == WP_Q4_1) {
                    const __m512i lo = _mm512_and_si512(q, low), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), low);
#pragma GCC unroll 6
                    for (int r = 0; r < R; r++) {
                        int32_t a, c;
                        memcpy(&a, xb + r * K + 8 * v, 4);
                        memcpy(&c, xb + r * K + 8 * v + 4, 4);
                        s[p][r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(s[p][r], lo, _mm512_set1_epi32(a)), hi,
                                                      _mm512_set1_epi32(c));
                        __asm__("" : PIN(s[p][r]));
                    }
                } else { /* |q| times x with q's sign (a zero weight's product is 0 either way) */
                    const __m512i aq = _mm512_abs_epi8(q);
                    const __mmask64 neg = _mm512_movepi8_mask(q);
#pragma GCC unroll 6
                    for (int r = 0; r < R; r++) {
                        int32_t a;
                        memcpy(&a, xb + r * K + 4 * v, 4);
                        const __m512i xa = _mm512_set1_epi32(a);
                        s[p][r] =
                            _mm512_dpbusd_epi32(s[p][r], aq, _mm512_mask_sub_epi8(xa, neg, _mm512_setzero_si512(), xa));
                        __asm__("" : PIN(s[p][r]));
                    }
                }
            }
#pragma GCC unroll 2
        for (int p = 0; p < P; p++) {
            const __m512 d = _mm512_cvtph_ps(
                _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(blk + 2 * p * gs))),
                                        _mm_loadu_si128((const __m128i *)(blk + (2 * p + 1) * gs)), 1));
#pragma GCC unroll 6
            for (int r = 0; r < R; r++)
                acc[p][r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(dx[r * nb + b])),
                                            _mm512_cvtepi32_ps(s[p][r]), acc[p][r]);
        }
    }
    if (TYPE == WP_Q4_1) { /* add_min_terms, a pair of groups per register */
        __m512 mt[2][TILE_R];
#pragma GCC unroll 2
        for (int p = 0; p < P; p++)
#pragma GCC unroll 6
            for (int r = 0; r < R; r++) mt[p][r] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++)
#pragma GCC unroll 2
            for (int p = 0; p < P; p++) {
                const __m512 m = _mm512_cvtph_ps(_mm256_inserti128_si256(
                    _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(w + 2 * p * gs + b * 160 + 16))),
                    _mm_loadu_si128((const __m128i *)(w + (2 * p + 1) * gs + b * 160 + 16)), 1));
#pragma GCC unroll 6
                for (int r = 0; r < R; r++) mt[p][r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xs[r * nb + b]), mt[p][r]);
            }
#pragma GCC unroll 2
        for (int p = 0; p < P; p++)
#pragma GCC unroll 6
            for (int r = 0; r < R; r++) acc[p][r] = _mm512_add_ps(acc[p][r], mt[p][r]);
    }
#pragma GCC unroll 2
    for (int p = 0; p < P; p++)
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) _mm512_storeu_ps(y + r * ldy + 16 * p, acc[p][r]);
}
#endif

/* Groups g0..g1 (whole groups of 8 rows; y at group g0's outputs) times R rows of x, fp32 (x) or int8 (INT8:
   xq, dx): the widest tile that keeps <= 12 accumulators (int8: sums and chains). */
AI void tiles_t(const wp_matrix *W, const int TYPE, const int INT8, const float *x, const float *xs, const int8_t *xq,
                const float *dx, int R, float *y, int64_t ldy, int64_t g0, int64_t g1, int fetch) {
    const int64_t K = W->cols, gs = K / 32 * block_bytes(TYPE);
    const uint8_t *end = W->data + g1 * gs;
    int64_t g = g0;
#define TILE(G_, R_)                                                                                       \
    for (; g + G_ <= g1; g += G_) {                                                                        \
        const uint8_t *next = W->data + (g + G_) * gs, *pf = fetch && next + G_ * gs <= end ? next : NULL; \
        if (INT8) tile_i8(TYPE, W->data + g * gs, gs, xq, K, dx, xs, G_, R_, y + 8 * (g - g0), ldy, pf);   \
        else tile(TYPE, W->data + g * gs, gs, x, K, xs, G_, R_, y + 8 * (g - g0), ldy, pf);                \
    }
#if defined(WP_I8_ZMM)
#define TILEZ(P_, R_)                                                                                              \
    for (; g + 2 * P_ <= g1; g += 2 * P_) {                                                                        \
        const uint8_t *next = W->data + (g + 2 * P_) * gs, *pf = fetch && next + 2 * P_ * gs <= end ? next : NULL; \
        tile_i8z(TYPE, W->data + g * gs, gs, xq, K, dx, xs, P_, R_, y + 8 * (g - g0), ldy, pf);                    \
    }
    /* 32 512-bit registers: two pairs of groups x up to 6 rows (24 sums and chains), an odd last group on 256 */
    if (INT8) switch (R) {
            case 1: TILEZ(2, 1) TILEZ(1, 1) TILE(1, 1) break;
            case 2: TILEZ(2, 2) TILEZ(1, 2) TILE(1, 2) break;
            case 3: TILEZ(2, 3) TILEZ(1, 3) TILE(1, 3) break;
            case 4: TILEZ(2, 4) TILEZ(1, 4) TILE(1, 4) break;
            case 5: TILEZ(2, 5) TILEZ(1, 5) TILE(1, 5) break;
            default: TILEZ(2, 6) TILEZ(1, 6) TILE(1, 6) break;
        }
#undef TILEZ
#elif defined(WP_VNNI) && defined(__AVX512F__)
    /* 32 vector registers: tiles of up to 24 sums and chains */
    if (INT8) switch (R) {
            case 1: TILE(4, 1) TILE(1, 1) break;
            case 2: TILE(2, 2) TILE(1, 2) break;
            case 3: TILE(4, 3) TILE(1, 3) break;
            case 4: TILE(2, 4) TILE(1, 4) break;
            case 5: TILE(2, 5) TILE(1, 5) break;
            default: TILE(2, 6) TILE(1, 6) break;
        }
#else
    if (INT8) switch (R) {
            case 1: TILE(4, 1) TILE(1, 1) break;
            case 2: TILE(2, 2) TILE(1, 2) break;
            case 3: TILE(1, 3) break;
            case 4: TILE(1, 4) break;
            case 5: TILE(1, 5) break;
            default: TILE(1, 6) break;
        }
#endif
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

/* Rows of x to int8, a block of 32 at a time (see "Int8 activations" in matmul.h); the same values as the
   portable path. */
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
