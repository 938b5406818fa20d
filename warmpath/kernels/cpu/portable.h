/* Part of matmul.h (where WP_SIMD is off): tiles, tiles_i8 and quantize_rows in plain C. */
#pragma once

#include "layout.h"

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
                    for (int64_t b = 0; b < nb; b++)
                        mins += load_half(W->data + g * gs + b * bb + 16 + 2 * j) * xs[r * nb + b];
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
                    for (int64_t b = 0; b < nb; b++)
                        mins += load_half(W->data + g * gs + b * bb + 16 + 2 * j) * xs[r * nb + b];
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

/* The GGUF file's own blocks (kquants.h's numbers): one output at a time. */
static void tiles_kq(const wp_matrix *W, const int8_t *xq, const float *dx, const float *xs, const int32_t *xi, int R,
                     float *y, int64_t ldy, int64_t g0, int64_t g1, int fetch) {
    (void)fetch, (void)xi;
    const int T = W->type, off = kq_offset(T), per = T == WP_Q6_K ? 16 : 32;
    const int64_t K = W->cols, nb = K / 32, gs = nb * block_bytes(T);
    for (int64_t g = g0; g < g1; g++)
        for (int j = 0; j < 8; j++)
            for (int r = 0; r < R; r++) {
                const uint8_t *grp = W->data + g * gs;
                float sum = 0.f, mins = 0.f;
                for (int64_t b = 0; b < nb; b++)
                    for (int k0 = 0; k0 < 32; k0 += per) {
                        int32_t s = 0;
                        for (int k = k0; k < k0 + per; k++)
                            s += (kq_quant(T, grp, b, j, k) - off) * xq[(int64_t)r * K + b * 32 + k];
                        sum = fmaf(kq_scale(T, grp, b, j, k0) * dx[r * nb + b], (float)s, sum);
                    }
                if (has_min_term(T))
                    for (int64_t b = 0; b < nb; b++) mins = fmaf(-kq_min(T, grp, b, j), xs[r * nb + b], mins);
                y[(int64_t)r * ldy + 8 * (g - g0) + j] = sum + mins;
            }
}
