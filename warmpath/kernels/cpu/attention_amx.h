/* Part of attention.h: every row's attention on AMX bf16 tiles (Sapphire Rapids and later), for a model whose
   products already round (int8 activations) over a bf16 KV cache (wp_model.attention = WP_ATTN_BF16).

   A task is up to 16 queries (a sequence's rows x the query heads of one KV head) over all the keys they see, in blocks
   of 64 keys at positions 64c..64c+63, c = 0, 1, ... in order (flash attention, one pass): scores S^T = K Q^T
   (K's rows straight from the cache, Q rounded to bf16), the running max and sum of each query, the weights
   rounded to bf16, and O = P V into fp32 outputs rescaled block by block. Every query's numbers come from
   its own lane alone, block by block from position 0, and blocks past its position change nothing (weight 0,
   rescale 1, exactly), so a row's output is the same whatever chunk, tile or step it is computed in: prefix
   caching and chunking change no token. */
#pragma once

#include "attention_bf16.h" /* exp512, transpose16 */

#define AMX_KEYS 64 /* keys per block (attention.h sizes the staged V tiles by it on every build) */

#if defined(WP_AMX) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define WP_AMX_ATTN 1
#define AMX_Q 16 /* queries per task: one tile's columns */

/* Every tile 16 rows x 64 bytes. Scores: 0, 4 K (16 keys x 32 dims), 1, 5 Q^T (16 dim pairs x 16 queries), 2, 3,
   6, 7 S^T (16 keys x 16 queries: a block's four quarters). Outputs: 1, 5 P (16 queries x 32 keys: the block's
   halves), 0, 4 V (16 key pairs x 16 dims), 2, 3, 6, 7 O (16 queries x 16 dims). */
static void amx_attn_configure(void) {
    amx_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.colsb[t] = 64, c.rows[t] = 16;
    _tile_loadconfig(&c);
}

/* V of keys t0..t1 (whole blocks of 32 keys) of one KV head (vc: its first element) as AMX value tiles: per block of
   32 keys and 16 dims, 16 rows (key pairs) of 16 dims x 2 keys, so tile (t / 32, i) is VP + ((t / 32) * (hd / 16) +
   i) * 512 (bf16), t counted from t_base (a multiple of 32); keys at ctx and past it are zeros (their weights are zero,
   and 0 x garbage could be NaN). Two keys' rows interleaved by one permute per 16 dims: sequential reads, no gathers.
 */
static void amx_stage_v(const uint16_t *vc, const int32_t *table, int bs, int64_t tok, int hd, int64_t t0, int64_t t1,
                        int64_t ctx, uint16_t *VP, int64_t t_base) {
    __m512i lo, hi; /* elements 0..15 of two sources interleaved, and 16..31 */
    {
        int16_t a[32], b[32];
        for (int i = 0; i < 16; i++) a[2 * i] = i, a[2 * i + 1] = 32 + i, b[2 * i] = 16 + i, b[2 * i + 1] = 48 + i;
        lo = _mm512_loadu_si512(a), hi = _mm512_loadu_si512(b);
    }
    const int ng = hd / 16;
    for (int64_t t = t0; t < t1; t += 2) {
        uint16_t *row = VP + ((t - t_base) / 32 * ng) * 512 + (t % 32) / 2 * 32;
        const uint16_t *v0 = t < ctx ? vc + ((int64_t)table[t / bs] * bs + t % bs) * tok : NULL;
        const uint16_t *v1 = t + 1 < ctx ? v0 + tok : NULL; /* same cache block: t is even, bs a multiple of 16 */
        for (int h = 0; h < hd; h += 32) {
            const __m512i a = v0 ? _mm512_loadu_si512(v0 + h) : _mm512_setzero_si512();
            const __m512i b = v1 ? _mm512_loadu_si512(v1 + h) : _mm512_setzero_si512();
            _mm512_storeu_si512(row + (h / 16) * 512, _mm512_permutex2var_epi16(a, lo, b));
            _mm512_storeu_si512(row + (h / 16 + 1) * 512, _mm512_permutex2var_epi16(a, hi, b));
        }
    }
}

/* One task: nq <= 16 queries q[i] (hd floats, after RoPE) at positions pos[i] of KV head g (kc: its first K
   element) over keys 0..max(pos], V staged in VP (amx_stage_v) or, VP NULL, staged here block by block from vc (the
   same tiles: a task that alone reads its sequence's V, a decode's, saves the round trip through memory); out[i]
   gets query i's output (hd floats). fetch: prefetch blocks ahead (no effect on the numbers). */
static void amx_attend(const float *const *q, const int64_t *pos, int nq, const uint16_t *kc, const uint16_t *vc,
                       const int32_t *table, int bs, int64_t tok, int hd, float scale, const uint16_t *VP,
                       float *const *out, int fetch) {
    uint16_t vlocal[2 * 8 * 512] __attribute__((aligned(64))); /* one block's value tiles: 2 halves x hd / 16 */
    uint32_t qt[4][16][16] __attribute__((aligned(64)));       /* Q^T per 32 dims: [dim pair][query], bf16 pairs */
    float st[AMX_KEYS][AMX_Q] __attribute__((aligned(64)));
    uint32_t pq[2][16][16] __attribute__((aligned(64))); /* P per half block: [query][key pair], bf16 pairs */
    float pv[4][16][16] __attribute__((aligned(64)));    /* [dims / 16][query][dim] */
    float o[AMX_Q][128] __attribute__((aligned(64)));
    float alpha_q[AMX_Q] __attribute__((aligned(64)));
    const int nh = hd / 32, ng = hd / 16;
    int64_t last = 0, first = INT64_MAX;
    int32_t lane_pos[AMX_Q];
    for (int i = 0; i < AMX_Q; i++) {
        lane_pos[i] = i < nq ? (int32_t)pos[i] : -1;
        if (i < nq) last = pos[i] > last ? pos[i] : last, first = pos[i] < first ? pos[i] : first;
    }
    memset(qt, 0, sizeof qt);
    for (int i = 0; i < nq; i++)
        for (int h = 0; h < nh; h++) {
            const __m512 a = _mm512_loadu_ps(q[i] + 32 * h), b = _mm512_loadu_ps(q[i] + 32 * h + 16);
            uint32_t pairs[16];
            _mm512_storeu_si512(pairs, (__m512i)_mm512_cvtne2ps_pbh(b, a)); /* dims 32h.. in order, as pairs */
            for (int kk = 0; kk < 16; kk++) qt[h][kk][i] = pairs[kk];
        }
    for (int i = 0; i < AMX_Q; i++)
        for (int d = 0; d < hd; d += 16) _mm512_store_ps(o[i] + d, _mm512_setzero_ps());
    const __m512i posv = _mm512_loadu_si512(lane_pos);
    const __m512i inter = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                           21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512 sc = _mm512_set1_ps(scale);
    __m512 m = _mm512_set1_ps(-INFINITY), l = _mm512_setzero_ps();
    amx_attn_configure();
    for (int64_t t0 = 0; t0 <= last; t0 += AMX_KEYS) {
        /* S^T of keys t0.., in four groups of 16 (each one cache block's: bs a multiple of 16) */
        const uint16_t *k[4];
        for (int j = 0; j < 4; j++) {
            const int64_t t = t0 + 16 * j;
            k[j] = t <= last ? kc + ((int64_t)table[t / bs] * bs + t % bs) * tok : NULL;
        }
        const uint16_t *vp = VP + (t0 / 32) * ng * 512; /* the block's value tiles: 2 halves x ng, 1 KB each */
        if (!VP) {
            amx_stage_v(vc, table, bs, tok, hd, t0, t0 + AMX_KEYS, last + 1, vlocal, t0);
            vp = vlocal;
        }
        /* fetch: the next block's K rows and value tiles, for a chunk of few tiles: each block is then read once,
           from memory, and tile loads are not prefetched by the hardware (many tiles find it in L2). */
        const int64_t tp = t0 + AMX_KEYS;
        if (fetch && tp <= last && VP) {
            for (int j = 0; j < 4 && tp + 16 * j <= last; j++) {
                const uint16_t *kp = kc + ((int64_t)table[(tp + 16 * j) / bs] * bs + (tp + 16 * j) % bs) * tok;
                for (int u = 0; u < 16; u++)
                    for (int off = 0; off < hd; off += 32) __builtin_prefetch(kp + u * tok + off);
            }
            for (int64_t off = 0; off < 2 * ng * 512; off += 32) __builtin_prefetch(vp + 2 * ng * 512 + off);
        }
        _tile_zero(2);
        _tile_zero(3);
        _tile_zero(6);
        _tile_zero(7);
        for (int h = 0; h < nh; h += 2) {
            _tile_loadd(1, qt[h], 64);
            _tile_loadd(5, qt[h + 1], 64);
#define AMX_SCORES(j, C)                              \
    if (k[j]) {                                       \
        _tile_loadd(0, k[j] + 32 * h, tok * 2);       \
        _tile_dpbf16ps(C, 0, 1);                      \
        _tile_loadd(4, k[j] + 32 * (h + 1), tok * 2); \
        _tile_dpbf16ps(C, 4, 5);                      \
    }
            AMX_SCORES(0, 2)
            AMX_SCORES(1, 3)
            AMX_SCORES(2, 6)
            AMX_SCORES(3, 7)
#undef AMX_SCORES
        }
        _tile_stored(2, st[0], 64);
        _tile_stored(3, st[16], 64);
        _tile_stored(6, st[32], 64);
        _tile_stored(7, st[48], 64);
        const int all = t0 + AMX_KEYS - 1 <= first; /* every query sees the whole block */
        __mmask16 seen[AMX_KEYS];
        __m512 bmax = _mm512_set1_ps(-INFINITY);
        for (int u = 0; u < AMX_KEYS; u++) {
            seen[u] = all ? 0xFFFF : _mm512_cmple_epi32_mask(_mm512_set1_epi32((int32_t)(t0 + u)), posv);
            bmax = _mm512_mask_max_ps(bmax, seen[u], bmax, _mm512_load_ps(st[u]));
        }
        const __m512 mn = _mm512_max_ps(m, _mm512_mul_ps(bmax, sc));
        const __m512 alpha = exp512(_mm512_sub_ps(m, mn)), neg = _mm512_sub_ps(_mm512_setzero_ps(), mn);
        __m512 sum = _mm512_setzero_ps(), e[2];
        for (int half = 0; half < 2; half++) { /* the weights of 32 keys: [key pair][query], then P = its transpose */
            __m512i pairs[16];
            for (int u = 32 * half; u < 32 * half + 32; u++) {
                e[u & 1] = _mm512_maskz_mov_ps(seen[u], exp512(_mm512_fmadd_ps(_mm512_load_ps(st[u]), sc, neg)));
                sum = _mm512_add_ps(sum, e[u & 1]);
                if (u & 1)
                    pairs[(u % 32) / 2] = _mm512_permutexvar_epi16(inter, (__m512i)_mm512_cvtne2ps_pbh(e[1], e[0]));
            }
            transpose16(pairs);
            for (int i = 0; i < 16; i++) _mm512_store_si512(pq[half][i], pairs[i]);
        }
        l = _mm512_fmadd_ps(l, alpha, sum);
        m = mn;
        _mm512_store_ps(alpha_q, alpha);
        _tile_loadd(1, pq[0], 64);            /* weights of keys t0..t0 + 31 */
        _tile_loadd(5, pq[1], 64);            /* and of t0 + 32.. */
        for (int d0 = 0; d0 < hd; d0 += 64) { /* 64 dims: four independent products, each over the block's halves */
            _tile_zero(2);
            _tile_zero(3);
            _tile_zero(6);
            _tile_zero(7);
#define AMX_VALUES(i, C)                               \
    _tile_loadd(0, vp + (d0 / 16 + i) * 512, 64);      \
    _tile_dpbf16ps(C, 1, 0);                           \
    _tile_loadd(4, vp + (ng + d0 / 16 + i) * 512, 64); \
    _tile_dpbf16ps(C, 5, 4);
            AMX_VALUES(0, 2)
            AMX_VALUES(1, 3)
            AMX_VALUES(2, 6)
            AMX_VALUES(3, 7)
#undef AMX_VALUES
            _tile_stored(2, pv[0], 64);
            _tile_stored(3, pv[1], 64);
            _tile_stored(6, pv[2], 64);
            _tile_stored(7, pv[3], 64);
            for (int i = 0; i < nq; i++) {
                const __m512 a = _mm512_set1_ps(alpha_q[i]);
                for (int j = 0; j < 4; j++)
                    _mm512_store_ps(o[i] + d0 + 16 * j,
                                    _mm512_fmadd_ps(_mm512_load_ps(o[i] + d0 + 16 * j), a, _mm512_load_ps(pv[j][i])));
            }
        }
    }
    _tile_release();
    float inv[AMX_Q];
    _mm512_storeu_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.0f), l));
    for (int i = 0; i < nq; i++)
        for (int d = 0; d < hd; d += 16)
            _mm512_storeu_ps(out[i] + d, _mm512_mul_ps(_mm512_load_ps(o[i] + d), _mm512_set1_ps(inv[i])));
}
#endif
