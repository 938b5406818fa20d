/* The matrix products y = x @ W.T over packed weights (layout.h): the thread split (matmul), over the register
   tiles and panels (tiles.h, kquants.h, panels.h, amx.h; portable.h without AVX2). */
#pragma once

#include "layout.h"
#ifdef WP_SIMD
#include "tiles.h"
#include "kquants.h"
#include "panels.h"
#include "amx.h"
#else
#include "portable.h"
#endif

/* Rows of x from r0 on (R of them) times the groups g0..g1: whole groups through tiles() (tiles_i8() for int8
   activations: xq set, tiles_kq() for the file's kinds; skipped when whole_done), a last group of fewer than 8
   real rows through a scratch tile so nothing is written past the part's last row. y's rows are ldy apart. */
static void matmul_groups(const wp_matrix *W, const float *x, const float *xs, const int8_t *xq, const float *dx,
                          const int32_t *xi, int R, float *y, int64_t ldy, int64_t g0, int64_t g1, int fetch,
                          int whole_done) {
    const int64_t N = W->rows, full = N / 8, g1w = g1 < full ? g1 : full;
    if (!whole_done && g0 < g1w) {
        if (is_file_kind(W->type)) tiles_kq(W, xq, dx, xs, xi, R, y + 8 * g0, ldy, g0, g1w, fetch);
        else if (xq) tiles_i8(W, xq, dx, xs, R, y + 8 * g0, ldy, g0, g1w, fetch);
        else tiles(W, x, xs, R, y + 8 * g0, ldy, g0, g1w, fetch);
    }
    if (g1 > full) { /* the partial group */
        float tmp[TILE_R * 8];
        if (is_file_kind(W->type)) tiles_kq(W, xq, dx, xs, xi, R, tmp, 8, full, full + 1, 0);
        else if (xq) tiles_i8(W, xq, dx, xs, R, tmp, 8, full, full + 1, 0);
        else tiles(W, x, xs, R, tmp, 8, full, full + 1, 0);
        for (int r = 0; r < R; r++)
            for (int64_t n = 8 * full; n < N; n++) y[(int64_t)r * ldy + n] = tmp[r * 8 + (n - 8 * full)];
    }
}

/* The sums of each row's int8 x per 16 columns (the file's kinds with an offset: q - 16, q - 32). */
static void quant_sums(const int8_t *xq, int D, int64_t K, int32_t *xi) {
    for (int r = 0; r < D; r++)
        for (int64_t h = 0; h < K / 16; h++) {
            int32_t s = 0;
            for (int k = 0; k < 16; k++) s += xq[(int64_t)r * K + 16 * h + k];
            xi[(int64_t)r * (K / 16) + h] = s;
        }
}

/* One part's y[D][rows] (rows ldy apart) = x[D][cols] @ W.T (+ bias): the weight groups split over the threads
   (each weight read once per step, by one thread), every thread running all rows of x: fp32 in tiles of <= 4 rows
   or, for 8+ rows, panels; int8 activations in tiles of <= 6 rows, over blocks of I8_ROW_BLOCK rows x I8_GROUPS
   groups (both in L2 while the tiles pass over them). */
#define I8_ROW_BLOCK 96
#define I8_GROUPS 16
static int matmul_part(const wp_matrix *W, const float *x, int D, float *y, int64_t ldy, int nthreads) {
    const int64_t N = W->rows, K = W->cols, nb = K / 32, NG = (N + 7) / 8;
    const int int8 = is_file_kind(W->type) || (W->act == WP_ACT_INT8 && W->type != WP_F32);
#ifdef WP_AMX
    const int amx = int8 && !is_file_kind(W->type) && D >= AMX_MIN_ROWS && amx_usable();
#else
    const int amx = 0;
#endif
    const int D16 = amx ? (D + 15) / 16 * 16 : D; /* AMX reads whole tiles of 16 rows: the rest are zeros */
    float *xs = (float *)calloc((size_t)(D16 * nb + 1), sizeof(float));
    float *dx = int8 ? (float *)calloc((size_t)(D16 * nb + 1), sizeof(float)) : NULL;
    int8_t *xq = int8 ? (int8_t *)malloc((size_t)D16 * K + 1) : NULL;
    int32_t *xi = has_offset(W->type) ? (int32_t *)malloc(((size_t)D * (K / 16) + 1) * sizeof(int32_t)) : NULL;
    if (!xs || (int8 && (!dx || !xq)) || (has_offset(W->type) && !xi)) {
        free(xs), free(dx), free(xq), free(xi);
        return -1;
    }
    if (has_min_term(W->type)) block_sums(x, D, K, xs);
    if (int8) quantize_rows(x, D, K, xq, dx, nthreads);
    if (xi) quant_sums(xq, D, K, xi);
    if (int8 && D16 > D) memset(xq + (int64_t)D * K, 0, (size_t)(D16 - D) * K);
#ifdef WP_AMX
    /* dx and xs tile by tile, block-major (tile t, block b, row i at (t * nb + b) * 16 + i): the 16 rows' scales
       of a block side by side, read from one pointer */
    float *dxt = amx ? (float *)calloc((size_t)(2 * D16 * nb + 1), sizeof(float)) : NULL;
    float *xst = dxt ? dxt + D16 * nb : NULL;
    if (amx && !dxt) {
        free(xs), free(dx), free(xq), free(xi);
        return -1;
    }
    for (int r = 0; amx && r < D; r++)
        for (int64_t b = 0; b < nb; b++) {
            const int64_t at = ((int64_t)(r / 16) * nb + b) * 16 + r % 16;
            dxt[at] = dx[(int64_t)r * nb + b], xst[at] = xs[(int64_t)r * nb + b];
        }
#endif
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
#ifdef WP_AMX
        uint8_t *panel = amx ? (uint8_t *)aligned_alloc(64, (size_t)nb * (512 + 128)) : NULL;
        if (panel) {
            const int64_t f1 = g1 < N / 8 ? g1 : N / 8;
            float *d = (float *)(panel + nb * 512), *m = d + nb * 16;
            if (g0 < f1) amx_groups(W, xq, dxt, xst, D, y + 8 * g0, ldy, g0, f1, panel, d, m);
            free(panel);
            if (g1 > f1) /* the partial group */
                for (int r0 = 0; r0 < D; r0 += TILE_R) {
                    const int R = D - r0 < TILE_R ? D - r0 : TILE_R;
                    matmul_groups(W, NULL, xs + (int64_t)r0 * nb, xq + (int64_t)r0 * K, dx + (int64_t)r0 * nb, NULL, R,
                                  y + (int64_t)r0 * ldy, ldy, g0, g1, 0, 1);
                }
        } else
#endif
            if (int8) {
            /* A few rows (decodes) stream all the thread's groups once, fetching ahead; many rows go by blocks. */
            const int64_t chunk = D <= TILE_R ? (g1 - g0 > 0 ? g1 - g0 : 1) : I8_GROUPS;
            for (int rb0 = 0; rb0 < D; rb0 += I8_ROW_BLOCK) {
                const int DB = D - rb0 < I8_ROW_BLOCK ? D - rb0 : I8_ROW_BLOCK, T = (DB + TILE_R - 1) / TILE_R;
                for (int64_t c0 = g0; c0 < g1; c0 += chunk) {
                    const int64_t c1 = c0 + chunk < g1 ? c0 + chunk : g1;
                    for (int i = 0, r0 = rb0; i < T; i++) { /* tiles of <= 6 rows, as even as possible */
                        const int R = DB / T + (i < DB % T);
                        matmul_groups(W, NULL, xs + (int64_t)r0 * nb, xq + (int64_t)r0 * K, dx + (int64_t)r0 * nb,
                                      xi ? xi + (int64_t)r0 * (K / 16) : NULL, R, y + (int64_t)r0 * ldy, ldy, c0, c1,
                                      D <= TILE_R && i == 0, 0);
                        r0 += R;
                    }
                }
            }
        } else {
            int whole_done = 0;
#ifdef WP_SIMD
            const int64_t f1 = g1 < N / 8 ? g1 : N / 8;
            /* many rows: convert each weight once, for all of them (else the tiles below, a failed allocation too) */
            if (D >= PANEL_ROWS && g0 < f1) whole_done = panel_rows(W, x, xs, D, y + 8 * g0, ldy, g0, f1) == 0;
#endif
            /* x in tiles of <= 4 rows, as even as possible (16 rows: 4 x 4; 6: 3 + 3). */
            const int T = (D + 3) / 4;
            for (int i = 0, r0 = 0; i < T; i++) {
                const int R = D / T + (i < D % T);
                matmul_groups(W, x + (int64_t)r0 * K, xs + (int64_t)r0 * nb, NULL, NULL, NULL, R, y + (int64_t)r0 * ldy,
                              ldy, g0, g1, i == 0, whole_done);
                r0 += R;
            }
        }
        if (W->bias)
            for (int r = 0; r < D; r++)
                for (int64_t n = 8 * g0; n < 8 * g1 && n < N; n++) y[(int64_t)r * ldy + n] += W->bias[n];
    }
#ifdef WP_AMX
    free(dxt);
#endif
    free(xs), free(dx), free(xq), free(xi);
    return 0;
}

/* y[D][rows of all parts] = x[D][cols] @ W.T (+ bias): each part of the chain into its columns of y. */
static int matmul(const wp_matrix *W, const float *x, int D, float *y, int nthreads) {
    int64_t ldy = 0, at = 0;
    for (const wp_matrix *P = W; P; P = P->next) ldy += P->rows;
    for (const wp_matrix *P = W; P; at += P->rows, P = P->next) {
        const int rc = matmul_part(P, x, D, y + at, ldy, nthreads);
        if (rc) return rc;
    }
    return 0;
}
