/* Part of matmul.h: int8-activation products of many rows on AMX tiles (Intel
   AMX-INT8: Sapphire Rapids and later), the same numbers as tile_i8 (see "Int8 activations" in matmul.h).

   One tile instruction sums a block's 32 products for 16 rows of x times 16 outputs (two groups) exactly in 32-bit
   integers: I_b, the integers tile_i8 gets from vpdpbusd. Each block's tile is then stored and scaled into the
   same fp32 chain per output as tile_i8's (acc = fma(d_b * dx_b, I_b, acc), block by block, the Q4_1 min term
   after), lane for lane, so a row's outputs are bit for bit those of the register tiles whichever path computes
   them (tests: native AMX on and off).

   Linux hands out the tile registers only to a process that asks (arch_prctl ARCH_REQ_XCOMP_PERM); where it
   refuses, or wp_set_amx(0) turned them off, the register tiles run. */
#pragma once

#include "tiles.h"

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__)
#define WP_AMX 1
#include <sys/syscall.h>
#include <unistd.h>

#define AMX_MIN_ROWS 16 /* rows of x from which products go through AMX: one full tile of rows */

static int amx_enabled = 1;   /* wp_set_amx */
static int amx_permitted = 0; /* 0 not asked yet, 1 granted, -1 refused */

static int amx_usable(void) {
    if (!amx_enabled) return 0;
    if (amx_permitted == 0) /* ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA */
        amx_permitted = syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? 1 : -1;
    return amx_permitted == 1;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed, aligned(64))) amx_config;

/* Tiles: 0, 1 x (16 rows x 32 int8), 2, 3 weights (8 rows of 4-byte column quads x 16 outputs), 4..7 sums
   (16 rows x 16 int32): two pairs of blocks. */
static void amx_configure(void) {
    amx_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 2; t++) c.colsb[t] = 32, c.rows[t] = 16;
    for (int t = 2; t < 4; t++) c.colsb[t] = 64, c.rows[t] = 8;
    for (int t = 4; t < 8; t++) c.colsb[t] = 64, c.rows[t] = 16;
    _tile_loadconfig(&c);
}

/* Groups g, g + 1 (g + 1 < g1, else zeros) of a packed int8-activation matrix as AMX weight tiles: per block, 8
   rows of 64 bytes, row kk holding for each of the 16 outputs its 4 quants at columns 4kk..4kk+3 (tile_i8's
   vectors are these rows' halves); and the blocks' scales d (and Q4_1's mins m) as floats, 16 per block. */
static void amx_panel(const wp_matrix *W, int64_t g, int64_t g1, uint8_t *panel, float *d, float *m) {
    const int64_t nb = W->cols / 32, bb = block_bytes(W->type), gs = nb * bb;
    for (int h = 0; h < 2; h++) {
        const uint8_t *grp = g + h < g1 ? W->data + (g + h) * gs : NULL;
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *rows = panel + b * 512 + 32 * h;
            float *db = d + b * 16 + 8 * h, *mb = m + b * 16 + 8 * h;
            if (!grp) {
                for (int kk = 0; kk < 8; kk++) memset(rows + 64 * kk, 0, 32);
                memset(db, 0, 32), memset(mb, 0, 32);
                continue;
            }
            const uint8_t *blk = grp + b * bb;
            _mm256_storeu_ps(db, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk)));
            if (W->type == WP_Q4_1) {
                _mm256_storeu_ps(mb, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16))));
                const __m256i low = _mm256_set1_epi8(15);
                for (int v = 0; v < 4; v++) { /* low nibbles: columns 8v..8v+3, high: 8v+4..8v+7 */
                    const __m256i nib = _mm256_loadu_si256((const __m256i *)(blk + 32 + 32 * v));
                    _mm256_storeu_si256((__m256i *)(rows + 64 * (2 * v)), _mm256_and_si256(nib, low));
                    _mm256_storeu_si256((__m256i *)(rows + 64 * (2 * v + 1)),
                                        _mm256_and_si256(_mm256_srli_epi16(nib, 4), low));
                }
            } else {
                memset(mb, 0, 32);
                for (int v = 0; v < 8; v++) memcpy(rows + 64 * v, blk + 16 + 32 * v, 32);
            }
        }
    }
}

/* The 16 rows' accumulators are named variables, not an array: GCC kept an array of them on the stack (a load and
   a store per row per block). X(r) for each row r of a tile. */
#define AMX_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)
#define AMX_ROWS_LOW(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define AMX_ROWS_HIGH(X) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)

/* One block's stored sums scaled into the 16 rows' chains: the lanes' operations of tile_i8. */
#define AMX_SCALE_ROW(r)                                                \
    acc##r = _mm512_fmadd_ps(_mm512_mul_ps(dv, _mm512_set1_ps(dxb[r])), \
                             _mm512_cvtepi32_ps(_mm512_load_si512(sums_b + 16 * (r))), acc##r);
#define AMX_SCALE(S, b)                                  \
    {                                                    \
        const int32_t *sums_b = (S);                     \
        const __m512 dv = _mm512_loadu_ps(d + (b) * 16); \
        const float *dxb = dx + (b) * 16;                \
        AMX_ROWS(AMX_SCALE_ROW)                          \
    }

/* 16 rows of x (xq, dx, xs: the tile's first row; dx and xs block-major, 16 rows per block; rows past the real
   ones are zeros, in each) times one panel; y gets the first R rows (ldy apart), 16 outputs (8 when only one
   group is real: n_out). Software-pipelined by pairs of blocks: the unit computes the next pair into the other two
   sum tiles while this pair's stored sums are scaled (a tile's sums are read back only after the unit is done
   with them and the store has landed). */
AI void amx_tile(const int TYPE, const uint8_t *panel, const float *d, const float *m, const int8_t *xq, int64_t K,
                 const float *dx, const float *xs, int R, float *y, int64_t ldy, int n_out) {
    const int64_t nb = K / 32;
    int32_t sums[2][2][256] __attribute__((aligned(64))); /* [pair parity][block of the pair] */
#define AMX_ZERO(r) __m512 acc##r = _mm512_setzero_ps();
    AMX_ROWS(AMX_ZERO)
#undef AMX_ZERO
#define AMX_DP(C, A, B)                         \
    if (TYPE == WP_Q4_1) _tile_dpbsud(C, A, B); \
    else _tile_dpbssd(C, A, B);
#define AMX_ISSUE(b, C0, C1)                             \
    {                                                    \
        _tile_loadd(0, xq + (b) * 32, K);                \
        _tile_loadd(2, panel + (b) * 512, 64);           \
        _tile_zero(C0);                                  \
        AMX_DP(C0, 0, 2)                                 \
        if ((b) + 1 < nb) {                              \
            _tile_loadd(1, xq + ((b) + 1) * 32, K);      \
            _tile_loadd(3, panel + ((b) + 1) * 512, 64); \
            _tile_zero(C1);                              \
            AMX_DP(C1, 1, 3)                             \
        }                                                \
    }
#define AMX_STORE(b, C0, C1, S)                       \
    {                                                 \
        _tile_stored(C0, S[0], 64);                   \
        if ((b) + 1 < nb) _tile_stored(C1, S[1], 64); \
    }
    AMX_ISSUE(0, 4, 5)
    AMX_STORE(0, 4, 5, sums[0])
    for (int64_t b = 0; b < nb; b += 4) { /* two pairs per iteration: tiles 4, 5 then 6, 7 */
        if (b + 2 < nb) AMX_ISSUE(b + 2, 6, 7)
        AMX_SCALE(sums[0][0], b)
        if (b + 1 < nb) AMX_SCALE(sums[0][1], b + 1)
        if (b + 2 >= nb) break;
        AMX_STORE(b + 2, 6, 7, sums[1])
        if (b + 4 < nb) AMX_ISSUE(b + 4, 4, 5)
        AMX_SCALE(sums[1][0], b + 2)
        if (b + 3 < nb) AMX_SCALE(sums[1][1], b + 3)
        if (b + 4 < nb) AMX_STORE(b + 4, 4, 5, sums[0])
    }
#undef AMX_DP
#undef AMX_ISSUE
#undef AMX_STORE
    if (TYPE == WP_Q4_1) { /* the min term: one chain from 0 per output, then added (add_min_terms); 8 rows'
                              chains at a time, interleaved */
#define AMX_MT_ZERO(r) __m512 mt##r = _mm512_setzero_ps();
#define AMX_MT_FMA(r) mt##r = _mm512_fmadd_ps(mv, _mm512_set1_ps(xb[r]), mt##r);
#define AMX_MT_ADD(r) acc##r = _mm512_add_ps(acc##r, mt##r);
#define AMX_MIN_TERM(ROWS)                                 \
    {                                                      \
        ROWS(AMX_MT_ZERO)                                  \
        for (int64_t b = 0; b < nb; b++) {                 \
            const __m512 mv = _mm512_loadu_ps(m + b * 16); \
            const float *xb = xs + b * 16;                 \
            ROWS(AMX_MT_FMA)                               \
        }                                                  \
        ROWS(AMX_MT_ADD)                                   \
    }
        AMX_MIN_TERM(AMX_ROWS_LOW)
        AMX_MIN_TERM(AMX_ROWS_HIGH)
#undef AMX_MIN_TERM
#undef AMX_MT_ZERO
#undef AMX_MT_FMA
#undef AMX_MT_ADD
    }
    const __mmask16 keep = n_out == 16 ? 0xFFFF : 0x00FF;
#define AMX_STORE_ROW(r) \
    if ((r) < R) _mm512_mask_storeu_ps(y + (r) * ldy, keep, acc##r);
    AMX_ROWS(AMX_STORE_ROW)
#undef AMX_STORE_ROW
}

/* Whole groups g0..g1 (y at group g0's outputs) times all D rows of x: a panel of two groups at a time, converted
   once (panel: nb * 512 bytes, d and m: nb * 16 floats each) and multiplied by every 16-row tile of x. xq, dx
   and xs hold D16 >= D rows, the ones past D zero. */
static void amx_groups(const wp_matrix *W, const int8_t *xq, const float *dxt, const float *xst, int D, float *y,
                       int64_t N, int64_t g0, int64_t g1, uint8_t *panel, float *d, float *m) {
    const int64_t K = W->cols, nb = K / 32; /* N: y's row stride */
    amx_configure();
    for (int64_t g = g0; g < g1; g += 2) {
        amx_panel(W, g, g1, panel, d, m);
        const int n_out = g + 1 < g1 ? 16 : 8;
        for (int r0 = 0; r0 < D; r0 += 16) {
            const int R = D - r0 < 16 ? D - r0 : 16;
            float *yt = y + (int64_t)r0 * N + 8 * (g - g0);
            if (W->type == WP_Q4_1)
                amx_tile(WP_Q4_1, panel, d, m, xq + (int64_t)r0 * K, K, dxt + (int64_t)r0 * nb, xst + (int64_t)r0 * nb,
                         R, yt, N, n_out);
            else
                amx_tile(WP_Q8_0, panel, d, m, xq + (int64_t)r0 * K, K, dxt + (int64_t)r0 * nb, xst + (int64_t)r0 * nb,
                         R, yt, N, n_out);
        }
    }
    _tile_release();
}
#endif
