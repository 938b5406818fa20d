/* Part of matmul.h (AVX2 only): many rows of x over weights converted once
   into L1 panels. */
#pragma once

#include "tiles.h"

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
AI void panel_rows_t(const wp_matrix *W, const int TYPE, const float *x, const float *xs, int D, float *y, int64_t ldy,
                     int64_t g0, int64_t g1, float *panel) {
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
                                    const __m256i v =
                                        _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 32 + 8 * c)));
                                    const __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15)));
                                    _mm256_store_ps(out + 16 * c, _mm256_mul_ps(lo, d));
                                    _mm256_store_ps(out + 16 * c + 8,
                                                    _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)), d));
                                }
                            else
                                for (int k = 0; k < 32; k++)
                                    _mm256_store_ps(
                                        out + 8 * k,
                                        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                          _mm_loadl_epi64((const __m128i *)(q + 16 + 8 * k)))),
                                                      d));
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
