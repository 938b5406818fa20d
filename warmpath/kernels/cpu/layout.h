/* The packed weights' layout and numerics (the comment below), and what reads a packed block: the one header
   of the matrix products' layout, included first by every kernel header (tiles.h, kquants.h, panels.h, amx.h,
   portable.h) and by matmul.h. */
#pragma once

#include "common.h"

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
   Integer products run 32 multiply-adds per instruction (vpmaddubsw; vpdpbusd with VNNI, which also sums them
   into 32 bits in the same instruction: the same integers, so the same outputs) where fp32 runs 8 per FMA: faster
   products on AVX2 without AVX-512 / AMX, one row's and many rows' (measured: README, "int8"), at a lower
   precision (like bf16).
   Batch-invariant too: a row's quantization depends on the row alone. The blocks, in 4-column quads:
     WP_Q4_1: 160 bytes: fp16 d[8], fp16 m[8], then 4 x 32 bytes; vector v, byte 4j + i =
              q[j][8v + i] | q[j][8v + 4 + i] << 4 (row j, i = 0..3): the low nibbles are 8 rows x columns
              8v..8v+3, the high ones 8 rows x columns 8v+4..8v+7
     WP_Q8_0: 272 bytes: fp16 d[8], then 8 x 32 bytes; vector v, byte 4j + i = q[j][4v + i]
   The GGUF file's own blocks (int8 activations only; kquants.h has their products and numbers) keep their bytes
   per weight; their quants take Q4_1's nibble order (above), "nibbles" below:
     WP_Q4_0: 144 bytes a block: fp16 d[8], nibbles (128 bytes); w = d (q - 8)
     WP_Q5_0: 176 bytes a block: fp16 d[8], nibbles (128 bytes), the fifth bits (32 bytes: byte 4j + i, bit e: that
              of row j's column 4e + i, e = 0..7); w = d (q - 16)
     WP_Q4_K: 1184 bytes a super-block of 256 columns: fp16 d[8], fp16 dmin[8], u8 sc[8 blocks][8 rows],
              u8 m[8][8], then each block's nibbles; w = (d sc) q - (dmin m)
     WP_Q5_K: 1440 bytes a super-block: as Q4_K's, each block's nibbles followed by its fifth bits (as Q5_0's)
     WP_Q6_K: 1680 bytes a super-block: fp16 d[8], int8 sc[16 halves][8 rows], then per block its low nibbles
              (128 bytes) and the high two bits (2 x 32 bytes; byte n of the first, bits 2e..2e+1: those of byte n
              of the block's unpacked vector e (the low, then the high nibbles of vector 0, then of 1), the second
              for vectors e + 4 (2, 3)); w = (d sc) (q - 32), a scale per 16 columns */
#define TILE_R 6           /* most rows of x in one register tile */
#define PANEL_ROWS 8       /* rows of x from which the panel path (panel_rows) is taken */
#define PANEL_ROW_BLOCK 96 /* rows of x per pass over the weights in the panel path: 96 x 256 columns, 96 KB (L2) */
#define PANEL_BLOCKS 8     /* blocks of 32 columns per panel pass: 2 groups x 256 columns x 8 rows = 16 KB */
/* Bytes of 8 rows x 32 columns (a K-quant's super-block holds 8 of them: its bytes are 8 x these). */
static inline int64_t block_bytes(int type) {
    switch (type) {
        case WP_Q4_1: return 160;
        case WP_Q8_0: return 272;
        case WP_Q5_0: return 176;
        case WP_Q4_K: return 148;
        case WP_Q6_K: return 210;
        case WP_Q4_0: return 144;
        case WP_Q5_K: return 180;
        default: return 1024;
    }
}
static inline int is_file_kind(int type) { return type >= WP_Q4_K; }
static inline int is_super_kind(int type) { return type == WP_Q4_K || type == WP_Q5_K || type == WP_Q6_K; }
/* Whether a kind's products need the rows' block sums of x (its min term) or of xq per 16 columns (q - offset). */
static inline int has_min_term(int type) { return type == WP_Q4_1 || type == WP_Q4_K || type == WP_Q5_K; }
static inline int has_offset(int type) { return type == WP_Q5_0 || type == WP_Q6_K || type == WP_Q4_0; }
static inline int has_fifth_bits(int type) { return type == WP_Q5_0 || type == WP_Q5_K; }
static inline int kq_offset(int type) { return type == WP_Q4_0 ? 8 : type == WP_Q5_0 ? 16 : type == WP_Q6_K ? 32 : 0; }

/* Where a block's fields lie in the file's kinds (b: the block of 32 columns, j: the row in its group). */
static inline const uint8_t *kq_super(int type, const uint8_t *grp, int64_t b) {
    return grp + b / 8 * (8 * block_bytes(type));
}
static inline const uint8_t *kq_nibbles(int type, const uint8_t *grp, int64_t b) {
    if (!is_super_kind(type)) return grp + b * block_bytes(type) + 16;
    const int64_t per = type == WP_Q4_K ? 128 : type == WP_Q5_K ? 160 : 192;
    return kq_super(type, grp, b) + (type == WP_Q6_K ? 144 : 160) + per * (b % 8);
}
/* The unsigned quant of column k (0..31) of row j in block b, as stored (Q5_0: 0..31, Q4_K: 0..15, Q6_K: 0..63). */
static inline int kq_quant(int type, const uint8_t *grp, int64_t b, int j, int k) {
    const uint8_t *nib = kq_nibbles(type, grp, b);
    const int at = 32 * (k / 8) + 4 * j + k % 4, e = 2 * (k / 8) + (k % 8 >= 4);
    int q = k % 8 < 4 ? nib[at] & 15 : nib[at] >> 4;
    if (has_fifth_bits(type)) {
        q |= (nib[128 + 4 * j + k % 4] >> e & 1) << 4;
    } else if (type == WP_Q6_K) {
        q |= (nib[128 + 32 * (e / 4) + 4 * j + k % 4] >> (2 * (e % 4)) & 3) << 4;
    }
    return q;
}
/* Column k's scale (Q4_0 / Q5_0: d; Q4_K / Q5_K: d sc; Q6_K: d sc of its half) and Q4_K / Q5_K's offset dmin m,
   exact in fp32. */
static inline float kq_scale(int type, const uint8_t *grp, int64_t b, int j, int k) {
    if (!is_super_kind(type)) return load_half(grp + b * block_bytes(type) + 2 * j);
    const uint8_t *sb = kq_super(type, grp, b);
    if (type != WP_Q6_K) return load_half(sb + 2 * j) * (float)sb[32 + 8 * (b % 8) + j];
    return load_half(sb + 2 * j) * (float)(int8_t)sb[16 + 8 * (2 * (b % 8) + k / 16) + j];
}
static inline float kq_min(int type, const uint8_t *grp, int64_t b, int j) {
    const uint8_t *sb = kq_super(type, grp, b);
    return load_half(sb + 16 + 2 * j) * (float)sb[96 + 8 * (b % 8) + j];
}

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

/* Row r of a packed matrix (any kind, either quant order) as floats: the values the products multiply by, the
   loader's dequantized weights exactly (d * q, + m for Q4_1: the same two roundings). Token embeddings are read
   out of the table's blocks this way. */
static void matrix_row(const wp_matrix *W, int64_t r, float *out) {
    const int64_t nb = W->cols / 32, bb = block_bytes(W->type), j = r % 8, i8 = W->act == WP_ACT_INT8;
    const uint8_t *grp = W->data + r / 8 * nb * bb;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = grp + b * bb;
        float *o = out + b * 32;
        if (is_file_kind(W->type)) { /* gguf's own dequantization, the same roundings */
            const int off = kq_offset(W->type), mins = has_min_term(W->type);
            const float m = mins ? kq_min(W->type, grp, b, (int)j) : 0.f;
            for (int k = 0; k < 32; k++) {
                const float s = kq_scale(W->type, grp, b, (int)j, k);
                o[k] = mins ? s * (float)kq_quant(W->type, grp, b, (int)j, k) - m
                            : s * (float)(kq_quant(W->type, grp, b, (int)j, k) - off);
            }
        } else if (W->type == WP_F32) {
            for (int k = 0; k < 32; k++) memcpy(o + k, blk + 4 * (8 * k + j), 4);
        } else if (W->type == WP_Q8_0) {
            const float d = load_half(blk + 2 * j);
            for (int k = 0; k < 32; k++)
                o[k] = d * (float)(int8_t)blk[16 + (i8 ? 32 * (k / 4) + 4 * j + k % 4 : 8 * k + j)];
        } else {
            const float d = load_half(blk + 2 * j), m = load_half(blk + 16 + 2 * j);
            for (int k = 0; k < 32; k++) {
                const int byte = blk[32 + (i8 ? 32 * (k / 8) + 4 * j + k % 4 : 8 * (k / 2) + j)];
                const int q = (i8 ? k % 8 < 4 : k % 2 == 0) ? byte & 15 : byte >> 4;
                o[k] = d * (float)q + m;
            }
        }
    }
}
