/* A forward pass of a Llama-family model on the CPU (a step's decodes, chunks over a cached context, prompts),
   over quantized weights and warmpath's paged KV cache.

   Why native: a decode step of a small model is bound by reading weights and by per-op overhead. In torch a
   step is a long series of small ops, each paying its dispatch, over fp32 weights; here it is one call that
   reads the checkpoint's own 4-bit blocks (a fraction of the fp32 bytes) with AVX2, and touches each weight
   once for all the step's sequences (a short prompt's rows included: many rows go through converted panels at
   GEMM speed, in the same pass as the step's decodes). Measured speeds: README, benchmarks/results/.

   Numerics: the weights are the checkpoint's own quantized values (q, and per block of 32 the scale d and
   min m the loader dequantizes with), with the block's scale applied to the block's sum (see "Packed
   weights" in matmul.h); every output is computed in the same order whatever the batch, so a sequence's logits do
   not depend on what it is batched with.

   Layouts (all row-major, C-contiguous, built by warmpath/kernels/native.py):
     weights:  packed in groups of 8 rows, see "Packed weights" in matmul.h
     KV cache: [num_layers][2][num_blocks][block_size][num_kv_heads][head_dim] of float, bf16 or fp16, or int8
               with each row's fp16 scale after its head_dim values
               (kv_type; kv.h converts on the way in and out)
     rope:     float[2][max_positions][head_dim] (cos, sin), rotate-half layout

   This file is the one translation unit (the forward glue and the exported wp_forward / wp_matmul); the parts
   are headers of static functions it includes once, so the compiler sees them whole and inlines across them:
   common.h (structs, helpers), matmul.h (products; tiles.h, panels.h, portable.h, amx.h), attention.h (its tasks
   in attention_span.h, a chunk's on AMX in attention_amx.h; kv.h, the cache's element types). */

#include "common.h"
#include "matmul.h"
#include "attention.h"

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
   new token. Decodes (one token each), chunks over a cached context (a warm prefix + the few new tokens of an
   edit) and prompts: which sequences come here is the runner's choice (route()). Returns 0, -1 out of memory,
   -2 bad shape. */
int wp_forward(const wp_model *M, int S, const int32_t *seq_rows, const int64_t *tokens, const int64_t *start,
               const int32_t *tables, int width, void *kv, float *logits, int nthreads) {
    const int Hd = M->hidden, I = M->intermediate, hd = M->head_dim, H = M->num_heads, KVH = M->num_kv_heads;
    const int qkv_w = (H + 2 * KVH) * hd, R = seq_rows[S];
    if (H % KVH || hd % 2) return -2;
    const int64_t need = (int64_t)R * (2 * Hd + qkv_w + H * hd + 2 * I + I) + (int64_t)S * Hd;
    float *buf = (float *)malloc(need * sizeof(float));
    if (!buf) return -1;
    float *x = buf, *h = x + (int64_t)R * Hd, *qkv = h + (int64_t)R * Hd, *att = qkv + (int64_t)R * qkv_w;
    float *gu = att + (int64_t)R * H * hd, *act = gu + (int64_t)R * 2 * I, *last = act + (int64_t)R * I;

    for (int r = 0; r < R; r++) {
        if (M->embed) memcpy(x + (int64_t)r * Hd, M->embed + tokens[r] * Hd, Hd * sizeof(float));
        else matrix_row(&M->embed_blocks, tokens[r], x + (int64_t)r * Hd);
    }
    const float *cos_t = M->rope, *sin_t = M->rope + (int64_t)M->max_positions * hd;
    attn_plan plan;
    if (plan_attention(M, S, seq_rows, start, tables, width, nthreads, &plan)) {
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
            for (int j = 0; j < H + KVH; j++)
                rope(qkv + (int64_t)r * qkv_w + j * hd, cos_t + p * hd, sin_t + p * hd, hd);
        }
        attention(M, l, S, seq_rows, start, tables, width, qkv, (uint8_t *)kv, att, nthreads, &plan);
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
int wp_matmul(const wp_matrix *W, const float *x, int D, float *y, int nthreads) {
    return matmul(W, x, D, y, nthreads);
}

/* AMX tiles on (1) or off (0) for the products of many rows (tests compare both); returns whether they run. */
int wp_set_amx(int on) {
#ifdef WP_AMX
    amx_enabled = on;
    return amx_usable();
#else
    (void)on;
    return 0;
#endif
}

/* Which attention a model with WP_ATTN_BF16 over a bf16 cache gets here: 2 AMX tiles, 1 AVX512-BF16 dot products,
   0 the fp32 spans (the startup line says it; tests pick their cases by it). */
int wp_bf16_attention(void) {
#ifdef WP_AMX_ATTN
    if (amx_usable()) return 2;
#endif
#ifdef WP_BF16_ATTN
    return 1;
#else
    return 0;
#endif
}

/* rows x hd floats -> KV rows of type kvt, as the forward pass writes them (tests of the rounding). */
void wp_store_kv(void *dst, const float *src, int rows, int hd, int kvt) {
    store_kv((uint8_t *)dst, src, rows, hd, kvt);
}

/* Rows rows[0..n) of a packed matrix as floats, as the forward pass reads token embeddings (tests). */
void wp_matrix_rows(const wp_matrix *W, const int64_t *rows, int n, float *out) {
    for (int i = 0; i < n; i++) matrix_row(W, rows[i], out + (int64_t)i * W->cols);
}
