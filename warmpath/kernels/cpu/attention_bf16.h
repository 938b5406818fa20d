/* Part of attention.h: one span's attention with AVX512-BF16 dot products (vdpbf16ps: 32 multiply-adds an
   instruction), on CPUs that have them but no AMX tiles, for a model whose products already round (int8 activations)
   over a bf16 KV cache (wp_model.attention = WP_ATTN_BF16). attention.h keeps its tasks and its merge of spans.

   A span's SPLIT keys of one KV head are staged once for all the queries that read them: K transposed (dim pairs x
   16 keys to a register), V as key pairs (dims x 2 keys). Scores take the queries rounded to bf16, softmax weights
   are rounded to bf16 for the product with V. Every query's numbers come from its own registers over the whole span
   in one fixed order, keys past its position weighted exactly 0: a row gets the same numbers as a decode, in a
   verified decode's group or in a chunk, whatever else is computed beside it. */
#pragma once

#include "attention_span.h" /* SPLIT */

#if defined(WP_SIMD) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#define WP_BF16_ATTN 1
/* Queries per register tile (x 4 groups of 16 keys for scores, x 4 groups of 16 dims for outputs), and per chunk
   task (attention.h: each staged span read from cache once for all of them). */
#define BF16_NQ 6
#define BF16_TQ 12

/* exp(x) for 16 floats, x >= -87.3 (clamped): 2^k times a degree-5 polynomial of 2^f, f in [-1/2, 1/2] (relative
   error ~2e-6; the weights are rounded to bf16 after it). */
static inline __m512 exp512(__m512 x) {
    const __m512 t = _mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(1.44269504088896341f));
    const __m512 k = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), f = _mm512_sub_ps(t, k);
    __m512 y = _mm512_set1_ps(1.3333558146e-3f);
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(9.6181291076e-3f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(5.5504108665e-2f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(2.4022650696e-1f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(6.9314718056e-1f));
    y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(y, k);
}

/* A 16 x 16 matrix of 32-bit elements, rows r[0..15], transposed in place. */
static inline void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4)
        for (int j = 0; j < 2; j++) {
            r[i + 2 * j] = _mm512_unpacklo_epi64(t[i + j], t[i + 2 + j]);
            r[i + 2 * j + 1] = _mm512_unpackhi_epi64(t[i + j], t[i + 2 + j]);
        }
    for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; j++) {
            t[i + j] = _mm512_shuffle_i32x4(r[i + j], r[i + 4 + j], 0x88);
            t[i + 4 + j] = _mm512_shuffle_i32x4(r[i + j], r[i + 4 + j], 0xDD);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xDD);
    }
}

/* Keys t0..t0+n (n <= SPLIT) of one KV head (kc, vc: its first K and V element; tok elements from one token to the
   next) staged: KT[p * SPLIT + t] = dims 2p, 2p+1 of key t; VP[(t / 2) * hd + d] = dim d of keys t, t+1 (t even).
   Keys n..SPLIT are zeros. hd % 32 == 0. */
static void bf16_stage(const uint16_t *kc, const uint16_t *vc, const int32_t *table, int bs, int64_t tok, int hd,
                       int64_t t0, int n, uint32_t *KT, uint32_t *VP) {
    const uint16_t *k[SPLIT]; /* each key's K row; its V row is at the same offset from vc */
    for (int t = 0; t < SPLIT; t++) k[t] = t < n ? kc + ((int64_t)table[(t0 + t) / bs] * bs + (t0 + t) % bs) * tok : 0;
    const int64_t v_off = vc - kc;
    for (int t = 0; t < n; t++) /* every row requested at once: they lie scattered over the cache's blocks */
        for (int h = 0; h < hd; h += 32) __builtin_prefetch(k[t] + h), __builtin_prefetch(k[t] + v_off + h);
    for (int g = 0; g < SPLIT && g < n; g += 16)
        for (int h = 0; h < hd; h += 32) {
            __m512i r[16];
            for (int u = 0; u < 16; u++) r[u] = k[g + u] ? _mm512_loadu_si512(k[g + u] + h) : _mm512_setzero_si512();
            transpose16(r);
            for (int p = 0; p < 16; p++) _mm512_storeu_si512(KT + (int64_t)(h / 2 + p) * SPLIT + g, r[p]);
        }
    for (int g = (n + 15) / 16 * 16; g < SPLIT; g += 16)
        for (int p = 0; p < hd / 2; p++) _mm512_storeu_si512(KT + (int64_t)p * SPLIT + g, _mm512_setzero_si512());
    __m512i lo, hi; /* elements 0..15 of two rows interleaved, and 16..31 */
    {
        int16_t a[32], b[32];
        for (int i = 0; i < 16; i++) a[2 * i] = i, a[2 * i + 1] = 32 + i, b[2 * i] = 16 + i, b[2 * i + 1] = 48 + i;
        lo = _mm512_loadu_si512(a), hi = _mm512_loadu_si512(b);
    }
    for (int t = 0; t < SPLIT; t += 2)
        for (int h = 0; h < hd; h += 32) {
            const __m512i a = k[t] ? _mm512_loadu_si512(k[t] + v_off + h) : _mm512_setzero_si512();
            const __m512i b = k[t + 1] ? _mm512_loadu_si512(k[t + 1] + v_off + h) : _mm512_setzero_si512();
            _mm512_storeu_si512(VP + (int64_t)(t / 2) * hd + h, _mm512_permutex2var_epi16(a, lo, b));
            _mm512_storeu_si512(VP + (int64_t)(t / 2) * hd + h + 16, _mm512_permutex2var_epi16(a, hi, b));
        }
}

/* NQ queries q[j] (HD floats each) at positions pos[j] >= t0 over a staged span starting at key t0: part[j] gets
   [max score, sum of exp, unnormalized output (HD floats)]. */
AI void bf16_tile(const float *const *q, const int64_t *pos, int64_t t0, const uint32_t *KT, const uint32_t *VP,
                  float scale, float *const *part, const int NQ, const int HD) {
    uint32_t qp[BF16_NQ][64] __attribute__((aligned(64))); /* bf16 dim pairs, HD <= 128 */
    uint32_t wp[BF16_NQ][SPLIT / 2] __attribute__((aligned(64)));
    for (int j = 0; j < NQ; j++)
        for (int d = 0; d < HD; d += 32)
            _mm512_store_si512(qp[j] + d / 2,
                               (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(q[j] + d + 16), _mm512_loadu_ps(q[j] + d)));
    __m512 acc[BF16_NQ][4];
    for (int j = 0; j < NQ; j++)
        for (int i = 0; i < 4; i++) acc[j][i] = _mm512_setzero_ps();
    for (int p = 0; p < HD / 2; p++) {
        __m512bh kt[4];
        for (int i = 0; i < 4; i++) kt[i] = (__m512bh)_mm512_loadu_si512(KT + (int64_t)p * SPLIT + 16 * i);
        for (int j = 0; j < NQ; j++) {
            const __m512bh b = (__m512bh)_mm512_set1_epi32((int)qp[j][p]);
            for (int i = 0; i < 4; i++) acc[j][i] = _mm512_dpbf16_ps(acc[j][i], kt[i], b);
        }
    }
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int j = 0; j < NQ; j++) {
        __mmask16 seen[4];
        __m512 s[4], mx = _mm512_set1_ps(-INFINITY);
        for (int i = 0; i < 4; i++) {
            const __m512i key = _mm512_add_epi32(lane, _mm512_set1_epi32(16 * i));
            seen[i] = _mm512_cmple_epi32_mask(key, _mm512_set1_epi32((int32_t)(pos[j] - t0)));
            s[i] = _mm512_mul_ps(acc[j][i], _mm512_set1_ps(scale));
            mx = _mm512_mask_max_ps(mx, seen[i], mx, s[i]);
        }
        const float m = _mm512_reduce_max_ps(mx);
        __m512 e[4];
        for (int i = 0; i < 4; i++) e[i] = _mm512_maskz_mov_ps(seen[i], exp512(_mm512_sub_ps(s[i], _mm512_set1_ps(m))));
        part[j][0] = m;
        part[j][1] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(e[0], e[1]), e[2]), e[3]));
        _mm512_store_si512(wp[j], (__m512i)_mm512_cvtne2ps_pbh(e[1], e[0]));
        _mm512_store_si512(wp[j] + 16, (__m512i)_mm512_cvtne2ps_pbh(e[3], e[2]));
    }
    for (int d0 = 0; d0 < HD; d0 += 64) { /* 64 output dims of NQ queries in registers over the span's key pairs */
        __m512 o[BF16_NQ][4];
        for (int j = 0; j < NQ; j++)
            for (int i = 0; i < 4; i++) o[j][i] = _mm512_setzero_ps();
        for (int kp = 0; kp < SPLIT / 2; kp++) {
            __m512bh v[4];
            for (int i = 0; i < 4; i++) v[i] = (__m512bh)_mm512_loadu_si512(VP + (int64_t)kp * HD + d0 + 16 * i);
            for (int j = 0; j < NQ; j++) {
                const __m512bh w = (__m512bh)_mm512_set1_epi32((int)wp[j][kp]);
                for (int i = 0; i < 4; i++) o[j][i] = _mm512_dpbf16_ps(o[j][i], v[i], w);
            }
        }
        for (int j = 0; j < NQ; j++)
            for (int i = 0; i < 4; i++) _mm512_storeu_ps(part[j] + 2 + d0 + 16 * i, o[j][i]);
    }
}

/* nq queries over a staged span (bf16_stage) starting at key t0, in register tiles: query j (q[j], at position
   pos[j]) writes part[j]; a query before the span (it sees none of its keys) gets [-inf, 0, zeros], as the fp32 path
   writes it. hd is 64 or 128. */
static void bf16_queries(const float *const *q, const int64_t *pos, int nq, int64_t t0, const uint32_t *KT,
                         const uint32_t *VP, int hd, float scale, float *const *part) {
    const float *tq[BF16_NQ];
    int64_t tp[BF16_NQ];
    float *to[BF16_NQ];
    int c = 0;
    for (int j = 0; j <= nq; j++) {
        if (j < nq && pos[j] < t0) {
            part[j][0] = -INFINITY, part[j][1] = 0.f;
            memset(part[j] + 2, 0, (size_t)hd * sizeof(float));
            continue;
        }
        if (j < nq) tq[c] = q[j], tp[c] = pos[j], to[c] = part[j], c++;
        if (c == BF16_NQ || (j == nq && c)) {
            for (int u = c; u < BF16_NQ; u++) tq[u] = tq[0], tp[u] = tp[0], to[u] = NULL;
            float spare[BF16_NQ][2 + 128];
            for (int u = c; u < BF16_NQ; u++) to[u] = spare[u]; /* a padded tile's unused queries write here */
            if (c <= 3 && hd == 64) bf16_tile(tq, tp, t0, KT, VP, scale, to, 3, 64);
            else if (hd == 64) bf16_tile(tq, tp, t0, KT, VP, scale, to, BF16_NQ, 64);
            else bf16_tile(tq, tp, t0, KT, VP, scale, to, BF16_NQ, 128);
            c = 0;
        }
    }
}
#endif
