/* Part of attention.h: a chunk's attention on AMX bf16 tiles (Sapphire Rapids and later), for a model whose
   products already round (int8 activations) over a bf16 KV cache (wp_model.attention = WP_ATTN_BF16).

   A task is 16 queries (a chunk's rows x the query heads of one KV head) over all the keys they see, in blocks
   of 64 keys at positions 64c..64c+63, c = 0, 1, ... in order (flash attention, one pass): scores S^T = K Q^T
   (K's rows straight from the cache, Q rounded to bf16), the running max and sum of each query, the weights
   rounded to bf16, and O^T = V^T P^T into fp32 outputs rescaled block by block. Every query's numbers come from
   its own lane alone, block by block from position 0, and blocks past its position change nothing (weight 0,
   rescale 1, exactly), so a row's output is the same whatever chunk, tile or step it is computed in: prefix
   caching and chunking change no token. */
#pragma once

#define AMX_KEYS 64 /* keys per block (attention.h sizes the staged V^T by it on every build) */

#if defined(WP_AMX) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define WP_AMX_ATTN 1
#define AMX_Q 16 /* queries per task: one tile's columns */

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

/* Every tile 16 rows x 64 bytes. Scores: 0, 4 K (16 keys x 32 dims), 1, 5 Q^T (16 dim pairs x 16 queries), 2, 3,
   6, 7 S^T (16 keys x 16 queries: a block's four quarters). Outputs: 0, 4 V^T (16 dims x 32 keys), 1, 5 P^T (16 key
   pairs x 16 queries: the block's halves), 2, 3, 6, 7 O^T (16 dims x 16 queries). */
static void amx_attn_configure(void) {
    amx_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.colsb[t] = 64, c.rows[t] = 16;
    _tile_loadconfig(&c);
}

/* V^T of keys t0..t1 (whole blocks of 32 keys) of one KV head (vc: its first element) into VT[d * ld + t] (bf16); keys
   at ctx and past it are zeros (their weights are zero, and 0 x garbage could be NaN). Each half block is 16 keys
   of one cache block (bs a multiple of 16): a gather takes dims 2p, 2p + 1 of its 16 keys at once, two permutes
   split them into the two dims' rows. */
static void amx_stage_vt(const uint16_t *vc, const int32_t *table, int bs, int64_t tok, int hd, int64_t t0, int64_t t1,
                         int64_t ctx, uint16_t *VT, int64_t ld) {
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32((int32_t)(tok * 2)));
    __m512i even, odd; /* 16-bit elements 0, 2, .. 30 of two sources, and 1, 3, .. 31 */
    {
        int16_t e[32], o[32];
        for (int i = 0; i < 16; i++) e[i] = 2 * i, e[16 + i] = 32 + 2 * i, o[i] = 2 * i + 1, o[16 + i] = 33 + 2 * i;
        even = _mm512_loadu_si512(e), odd = _mm512_loadu_si512(o);
    }
    for (int64_t b = t0; b < t1; b += 32) {
        const uint16_t *half[2] = {NULL, NULL};
        __mmask16 live[2] = {0, 0};
        for (int h = 0; h < 2; h++) {
            const int64_t t = b + 16 * h;
            if (t >= ctx) continue;
            half[h] = vc + ((int64_t)table[t / bs] * bs + t % bs) * tok;
            live[h] = ctx - t >= 16 ? 0xFFFF : (__mmask16)((1u << (ctx - t)) - 1);
        }
        for (int d = 0; d < hd; d += 2) {
            const __m512i lo = half[0]
                                   ? _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live[0], idx, half[0] + d, 1)
                                   : _mm512_setzero_si512();
            const __m512i hi = half[1]
                                   ? _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live[1], idx, half[1] + d, 1)
                                   : _mm512_setzero_si512();
            _mm512_storeu_si512(VT + d * ld + b, _mm512_permutex2var_epi16(lo, even, hi));
            _mm512_storeu_si512(VT + (d + 1) * ld + b, _mm512_permutex2var_epi16(lo, odd, hi));
        }
    }
}

/* One task: nq <= 16 queries q[i] (hd floats, after RoPE) at positions pos[i] of KV head g (kc: its first K
   element) over keys 0..max(pos], V^T staged in VT (ld keys a row); out[i] gets query i's output (hd floats).
   fetch: prefetch blocks ahead (no effect on the numbers). */
static void amx_attend(const float *const *q, const int64_t *pos, int nq, const uint16_t *kc, const int32_t *table,
                       int bs, int64_t tok, int hd, float scale, const uint16_t *VT, int64_t ld, float *const *out,
                       int fetch) {
    uint32_t qt[4][16][16] __attribute__((aligned(64))); /* Q^T per 32 dims: [dim pair][query], bf16 pairs */
    float st[AMX_KEYS][AMX_Q] __attribute__((aligned(64)));
    uint16_t pt[AMX_KEYS / 2][32] __attribute__((aligned(64))); /* P^T: [key pair][query], bf16 pairs */
    float pv[64][AMX_Q] __attribute__((aligned(64)));
    float o[128][AMX_Q] __attribute__((aligned(64)));
    const int nh = hd / 32;
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
    for (int d = 0; d < hd; d++) _mm512_store_ps(o[d], _mm512_setzero_ps());
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
        /* fetch: the next block's K rows and V^T rows, for a chunk of few tiles: each block is then read once, from
           memory, and tile loads are not prefetched by the hardware (many tiles find it in L2). */
        const int64_t tp = t0 + AMX_KEYS;
        if (fetch && tp <= last) {
            for (int j = 0; j < 4 && tp + 16 * j <= last; j++) {
                const uint16_t *kp = kc + ((int64_t)table[(tp + 16 * j) / bs] * bs + (tp + 16 * j) % bs) * tok;
                for (int u = 0; u < 16; u++)
                    for (int off = 0; off < hd; off += 32) __builtin_prefetch(kp + u * tok + off);
            }
            for (int d = 0; d < hd; d++)
                __builtin_prefetch(VT + d * ld + tp), __builtin_prefetch(VT + d * ld + tp + 32);
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
        for (int u = 0; u < AMX_KEYS; u++) {
            e[u & 1] = _mm512_maskz_mov_ps(seen[u], exp512(_mm512_fmadd_ps(_mm512_load_ps(st[u]), sc, neg)));
            sum = _mm512_add_ps(sum, e[u & 1]);
            if (u & 1)
                _mm512_store_si512(pt[u / 2],
                                   _mm512_permutexvar_epi16(inter, (__m512i)_mm512_cvtne2ps_pbh(e[1], e[0])));
        }
        l = _mm512_fmadd_ps(l, alpha, sum);
        m = mn;
        _tile_loadd(1, pt[0], 64);            /* weights of keys t0..t0 + 31 */
        _tile_loadd(5, pt[16], 64);           /* and of t0 + 32.. */
        for (int d0 = 0; d0 < hd; d0 += 64) { /* 64 dims: four independent products, each over the block's halves */
            _tile_zero(2);
            _tile_zero(3);
            _tile_zero(6);
            _tile_zero(7);
#define AMX_VALUES(i, C)                                       \
    _tile_loadd(0, VT + (d0 + 16 * i) * ld + t0, ld * 2);      \
    _tile_dpbf16ps(C, 0, 1);                                   \
    _tile_loadd(4, VT + (d0 + 16 * i) * ld + t0 + 32, ld * 2); \
    _tile_dpbf16ps(C, 4, 5);
            AMX_VALUES(0, 2)
            AMX_VALUES(1, 3)
            AMX_VALUES(2, 6)
            AMX_VALUES(3, 7)
#undef AMX_VALUES
            _tile_stored(2, pv[0], 64);
            _tile_stored(3, pv[16], 64);
            _tile_stored(6, pv[32], 64);
            _tile_stored(7, pv[48], 64);
            for (int d = 0; d < 64; d++)
                _mm512_store_ps(o[d0 + d], _mm512_fmadd_ps(_mm512_load_ps(o[d0 + d]), alpha, _mm512_load_ps(pv[d])));
        }
    }
    _tile_release();
    float inv[AMX_Q];
    _mm512_storeu_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.0f), l));
    for (int i = 0; i < nq; i++)
        for (int d = 0; d < hd; d++) out[i][d] = o[d][i] * inv[i];
}
#endif
