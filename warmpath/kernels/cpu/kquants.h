/* Part of matmul.h (AVX2, or AVX-512 VNNI on 256-bit registers): int8-activation
   products over the GGUF file's own blocks (Q4_0, Q5_0, Q4_K, Q5_K, Q6_K; layouts in matmul.h), so the weights keep the
   file's bytes and a decode reads no more than the file holds.

   Numbers, per output (bit for bit whatever the batch; portable.h computes the same sums):
     Q4_0, Q5_0: y = sum over blocks b, in order, of (d_b dx_b) I_b,  I_b = sum_k (q_k - 8 or 16) xq_k
     Q4_K, Q5_K: y = S8 + M as Q4_1's (matmul.h), with the block's scale d sc (exact in fp32) for d, -(dmin m) for m
     Q6_K: y = sum over halves h of 16 columns, in order, of ((d sc_h) dx_b) I_h,  I_h = sum_k (q_k - 32) xq_k
   The offsets (8, 16, 32) come out of the integer sums through the rows' sums of xq per 16 columns (xi): the same
   integers as llama.cpp's signed products, from unsigned quants (u8 x s8 instructions). */
#pragma once

#include "tiles.h"

/* Unpacked vector e (0..7) of a block: byte 4j + i is the quant of row j at column 4e + i. */
AI __m256i kq_vector(const int TYPE, const uint8_t *nib, const int e) {
    const __m256i raw = _mm256_loadu_si256((const __m256i *)(nib + 32 * (e / 2)));
    __m256i q = _mm256_and_si256(e % 2 ? _mm256_srli_epi16(raw, 4) : raw, _mm256_set1_epi8(15));
    if (has_fifth_bits(TYPE)) { /* bit e of the fifth-bits vector, moved to bit 4 */
        const __m256i h = _mm256_loadu_si256((const __m256i *)(nib + 128));
        const __m256i hs = e < 4 ? _mm256_slli_epi16(h, 4 - e) : e > 4 ? _mm256_srli_epi16(h, e - 4) : h;
        q = _mm256_or_si256(q, _mm256_and_si256(hs, _mm256_set1_epi8(0x10)));
    }
    if (TYPE == WP_Q6_K) { /* bits 2s..2s+1 of the high-bits vector, moved to bits 4..5 */
        const __m256i h = _mm256_loadu_si256((const __m256i *)(nib + 128 + 32 * (e / 4)));
        const int s = e % 4;
        const __m256i hs = s == 3 ? _mm256_srli_epi16(h, 2) : s == 2 ? h : _mm256_slli_epi16(h, s ? 2 : 4);
        q = _mm256_or_si256(q, _mm256_and_si256(hs, _mm256_set1_epi8(0x30)));
    }
    return q;
}

/* The 8 rows' scale of block b (Q6_K: of its half h), exact in fp32. */
AI __m256 kq_scales(const int TYPE, const uint8_t *grp, int64_t b, int h) {
    if (!is_super_kind(TYPE)) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(grp + b * block_bytes(TYPE))));
    const uint8_t *sb = kq_super(TYPE, grp, b);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)sb));
    const __m128i sc =
        _mm_loadl_epi64((const __m128i *)(sb + (TYPE != WP_Q6_K ? 32 + 8 * (b % 8) : 16 + 8 * (2 * (b % 8) + h))));
    return _mm256_mul_ps(d, _mm256_cvtepi32_ps(TYPE != WP_Q6_K ? _mm256_cvtepu8_epi32(sc) : _mm256_cvtepi8_epi32(sc)));
}

/* A register tile of G groups x R rows of x (as tile_i8): a block's (Q6_K: a half's) integer sums, then its scale
   times dx into one fp32 chain per output; Q4_K's min term after. */
AI void tile_kq(const int TYPE, const uint8_t *w, int64_t gs, const int8_t *xq, int64_t K, const float *dx,
                const float *xs, const int32_t *xi, const int G, const int R, float *y, int64_t ldy,
                const uint8_t *pf) {
    const int64_t nb = K / 32, bb = block_bytes(TYPE), nh = K / 16;
    const int NH = TYPE == WP_Q6_K ? 2 : 1, OFF = kq_offset(TYPE);
    const int WIDE16 = TYPE == WP_Q4_K || TYPE == WP_Q4_0; /* 4-bit quants: a block's sums fit 16 bits */
    const __m256i ones = _mm256_set1_epi16(1);
    (void)ones, (void)WIDE16; /* not needed with VNNI */
    __m256 acc[8][TILE_R];
    zero_tile(acc, G, R);
    for (int64_t b = 0; b < nb; b++) {
        fetch_ahead(pf, b, G * bb);
        const int8_t *xb = xq + b * 32;
#pragma GCC unroll 2
        for (int h = 0; h < NH; h++) {
            __m256i s[4][TILE_R];
#pragma GCC unroll 4
            for (int i = 0; i < G; i++)
#pragma GCC unroll 6
                for (int r = 0; r < R; r++) s[i][r] = _mm256_setzero_si256();
            const int e0 = 4 * h, e1 = NH == 2 ? 4 * h + 4 : 8;
#pragma GCC unroll 4
            for (int e = e0; e < e1; e += 2)
#pragma GCC unroll 4
                for (int i = 0; i < G; i++) {
                    const uint8_t *nib = kq_nibbles(TYPE, w + i * gs, b);
                    const __m256i q0 = kq_vector(TYPE, nib, e), q1 = kq_vector(TYPE, nib, e + 1);
#pragma GCC unroll 6
                    for (int r = 0; r < R; r++) {
                        int32_t a, c;
                        memcpy(&a, xb + r * K + 4 * e, 4);
                        memcpy(&c, xb + r * K + 4 * e + 4, 4);
#ifdef WP_VNNI
                        s[i][r] = dpbusd(dpbusd(s[i][r], q0, _mm256_set1_epi32(a)), q1, _mm256_set1_epi32(c));
#else /* 4 products of at most 63 x 127 per 16-bit lane: no overflow; 16 of at most 15 x 127 neither */
                        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(q0, _mm256_set1_epi32(a)),
                                                           _mm256_maddubs_epi16(q1, _mm256_set1_epi32(c)));
                        s[i][r] = WIDE16 ? _mm256_add_epi16(s[i][r], p)
                                         : _mm256_add_epi32(s[i][r], _mm256_madd_epi16(p, ones));
#endif
                        __asm__("" : PIN(s[i][r]));
                    }
                }
#pragma GCC unroll 4
            for (int i = 0; i < G; i++) {
                const __m256 d = kq_scales(TYPE, w + i * gs, b, h);
#pragma GCC unroll 6
                for (int r = 0; r < R; r++) {
                    __m256i sum = s[i][r];
#ifndef WP_VNNI
                    if (WIDE16) sum = _mm256_madd_epi16(sum, ones);
#endif
                    if (has_offset(TYPE)) {
                        const int32_t *xh = xi + r * nh + (NH == 2 ? 2 * b + h : 2 * b);
                        sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(OFF * (NH == 2 ? xh[0] : xh[0] + xh[1])));
                    }
                    acc[i][r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_broadcast_ss(dx + r * nb + b)),
                                                _mm256_cvtepi32_ps(sum), acc[i][r]);
                }
            }
        }
    }
    if (has_min_term(TYPE)) { /* M = sum over blocks, in order, of -(dmin m) X_b: one chain from 0 */
        __m256 mt[4][TILE_R];
#pragma GCC unroll 4
        for (int i = 0; i < G; i++)
#pragma GCC unroll 6
            for (int r = 0; r < R; r++) mt[i][r] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++)
#pragma GCC unroll 4
            for (int i = 0; i < G; i++) {
                const uint8_t *sb = kq_super(TYPE, w + i * gs, b);
                const __m256 m = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + 16))),
                                               _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                                                   _mm_loadl_epi64((const __m128i *)(sb + 96 + 8 * (b % 8))))));
#pragma GCC unroll 6
                for (int r = 0; r < R; r++)
                    mt[i][r] = _mm256_fnmadd_ps(m, _mm256_broadcast_ss(xs + r * nb + b), mt[i][r]);
            }
#pragma GCC unroll 4
        for (int i = 0; i < G; i++)
#pragma GCC unroll 6
            for (int r = 0; r < R; r++) acc[i][r] = _mm256_add_ps(acc[i][r], mt[i][r]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < G; i++)
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) _mm256_storeu_ps(y + r * ldy + 8 * i, acc[i][r]);
}

/* Groups g0..g1 (whole groups; y at group g0's outputs) times R rows of x: tiles_t's int8 shapes on 256 bits. */
AI void tiles_kq_t(const wp_matrix *W, const int TYPE, const int8_t *xq, const float *dx, const float *xs,
                   const int32_t *xi, int R, float *y, int64_t ldy, int64_t g0, int64_t g1, int fetch) {
    const int64_t K = W->cols, gs = K / 32 * block_bytes(TYPE);
    const uint8_t *end = W->data + g1 * gs;
    int64_t g = g0;
#define KTILE(G_, R_)                                                                                      \
    for (; g + G_ <= g1; g += G_) {                                                                        \
        const uint8_t *next = W->data + (g + G_) * gs, *pf = fetch && next + G_ * gs <= end ? next : NULL; \
        tile_kq(TYPE, W->data + g * gs, gs, xq, K, dx, xs, xi, G_, R_, y + 8 * (g - g0), ldy, pf);         \
    }
#if defined(WP_VNNI) && defined(__AVX512F__) /* 32 vector registers */
    switch (R) {
        case 1: KTILE(4, 1) KTILE(1, 1) break;
        case 2: KTILE(2, 2) KTILE(1, 2) break;
        case 3: KTILE(4, 3) KTILE(1, 3) break;
        case 4: KTILE(2, 4) KTILE(1, 4) break;
        case 5: KTILE(2, 5) KTILE(1, 5) break;
        default: KTILE(2, 6) KTILE(1, 6) break;
    }
#else
    switch (R) {
        case 1: KTILE(4, 1) KTILE(1, 1) break;
        case 2: KTILE(2, 2) KTILE(1, 2) break;
        case 3: KTILE(1, 3) break;
        case 4: KTILE(1, 4) break;
        case 5: KTILE(1, 5) break;
        default: KTILE(1, 6) break;
    }
#endif
#undef KTILE
}

static void tiles_kq(const wp_matrix *W, const int8_t *xq, const float *dx, const float *xs, const int32_t *xi, int R,
                     float *y, int64_t ldy, int64_t g0, int64_t g1, int fetch) {
    switch (W->type) {
        case WP_Q5_0: tiles_kq_t(W, WP_Q5_0, xq, dx, xs, xi, R, y, ldy, g0, g1, fetch); break;
        case WP_Q4_K: tiles_kq_t(W, WP_Q4_K, xq, dx, xs, xi, R, y, ldy, g0, g1, fetch); break;
        case WP_Q4_0: tiles_kq_t(W, WP_Q4_0, xq, dx, xs, xi, R, y, ldy, g0, g1, fetch); break;
        case WP_Q5_K: tiles_kq_t(W, WP_Q5_K, xq, dx, xs, xi, R, y, ldy, g0, g1, fetch); break;
        default: tiles_kq_t(W, WP_Q6_K, xq, dx, xs, xi, R, y, ldy, g0, g1, fetch); break;
    }
}
