/* One attention task's work over warmpath's paged KV cache: a span of SPLIT context tokens, for a group of
   decode rows (read in place) or a chunk's rows (K/V staged as floats). attention.h plans the tasks. */
#pragma once

#include "common.h"
#include "kv.h"

#define SPLIT 64 /* context tokens per attention task (split-K "flash decoding"): enough tasks for all threads */

#define KV_PREFETCH 6    /* tokens ahead */
#define ONE_ROW_AHEAD 16 /* tokens ahead, for a decode row */

/* v[i] = exp(v[i] - mx) for i < n; returns their sum. */
static float exp_shifted(float *v, int n, float mx) {
    int i = 0;
    float sum = 0.f;
#ifdef WP_SIMD
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(v + i), _mm256_set1_ps(mx)));
        _mm256_storeu_ps(v + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    sum = hsum(acc);
#endif
    for (; i < n; i++) sum += (v[i] = expf(v[i] - mx));
    return sum;
}

/* The largest of v[0..n) (-inf for n = 0). */
static inline float max_of(const float *v, int n) {
    int i = 0;
    float mx = -INFINITY;
#ifdef WP_SIMD
    if (n >= 8) {
        __m256 m = _mm256_loadu_ps(v);
        for (i = 8; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(v + i));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        mx = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    }
#endif
    for (; i < n; i++) mx = v[i] > mx ? v[i] : mx;
    return mx;
}

/* NR decode rows' G query heads each (q[r]: row r's G heads) over tokens t0..t1 (visible to all NR), K/V read
   where they lie in the cache (KV type KVT; kc, vc: this KV head's first row, tok bytes from one token to the
   next): each K/V row read once for the NR x G queries, the rows after the first finding it in L1. Row r's
   numbers are the same whatever NR: its own chains, in the same order. s holds NR x G x SPLIT scores; part[r]
   gets row r's G partial results. Prefetches bytes pf0..pf1 of each token's K and V rows (relative to this
   head's): the first KV head of a task fetches whole rows, the others find them in cache. */
AI void one_row(const float *const *q, int NR, const uint8_t *kc, const uint8_t *vc, const int32_t *table, int bs,
                int64_t tok, int G, int hd, float scale, int64_t t0, int64_t t1, float *s, float *const *part,
                int64_t pf0, int64_t pf1, const int KVT) {
    const int n = (int)(t1 - t0);
    const uint8_t *rows[SPLIT]; /* where each token's K (and, at the same offset, V) row lies */
    for (int t = 0; t < n; t++) rows[t] = kc + ((int64_t)table[(t0 + t) / bs] * bs + (t0 + t) % bs) * tok;
    const int64_t v_off = vc - kc;
    /* K/V rows are scattered over blocks and a decode step's whole cache is read once from memory: fetch
       ONE_ROW_AHEAD tokens ahead of use (the first ones now). */
    for (int u = 0; u < n && u < ONE_ROW_AHEAD; u++)
        for (int64_t o = pf0; o < pf1; o += 64)
            __builtin_prefetch(rows[u] + o), __builtin_prefetch(rows[u] + v_off + o);
    int t = 0;
#ifdef WP_SIMD
    if (hd % 8 == 0)
        for (; t + 8 <= n; t += 8) { /* 8 tokens at a time: 8 independent chains, reduced to 8 scores at once */
            for (int u = t + ONE_ROW_AHEAD; u < t + 8 + ONE_ROW_AHEAD && u < n; u++)
                for (int64_t o = pf0; o < pf1; o += 64)
                    __builtin_prefetch(rows[u] + o), __builtin_prefetch(rows[u] + v_off + o);
            for (int j = 0; j < NR * G; j++) { /* query j: row j / G, head j % G */
                __m256 acc[8];
                for (int u = 0; u < 8; u++) acc[u] = _mm256_setzero_ps();
                for (int d = 0; d < hd; d += 8) {
                    const __m256 qv = _mm256_loadu_ps(q[j / G] + j % G * hd + d);
                    for (int u = 0; u < 8; u++) acc[u] = _mm256_fmadd_ps(qv, kv8(rows[t + u], d, hd, KVT), acc[u]);
                }
                const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
                const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
                const __m256 sc =
                    _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
                _mm256_storeu_ps(s + j * SPLIT + t, _mm256_mul_ps(sc, _mm256_set1_ps(scale)));
            }
        }
#endif
    for (; t < n; t++)
        for (int j = 0; j < NR * G; j++) s[j * SPLIT + t] = dot_kv(q[j / G] + j % G * hd, rows[t], hd, KVT) * scale;
    for (int j = 0; j < NR * G; j++) {
        float *sj = s + j * SPLIT, *pj = part[j / G] + j % G * (hd + 2), *o = pj + 2;
        const float mx = max_of(sj, n);
        pj[0] = mx;
        pj[1] = exp_shifted(sj, n, mx);
        int d0 = 0;
#ifdef WP_SIMD
        for (; d0 + 64 <= hd; d0 += 64) { /* 64 output values in 8 registers over the span: 8 chains */
            __m256 acc[8];
            for (int c = 0; c < 8; c++) acc[c] = _mm256_setzero_ps();
            for (int u = 0; u < n; u++) {
                const uint8_t *v = rows[u] + v_off;
                const __m256 p = _mm256_set1_ps(sj[u]);
                for (int c = 0; c < 8; c++) acc[c] = _mm256_fmadd_ps(p, kv8(v, d0 + 8 * c, hd, KVT), acc[c]);
            }
            for (int c = 0; c < 8; c++) _mm256_storeu_ps(o + d0 + 8 * c, acc[c]);
        }
        for (; d0 + 8 <= hd; d0 += 8) {
            __m256 acc = _mm256_setzero_ps();
            for (int u = 0; u < n; u++)
                acc = _mm256_fmadd_ps(_mm256_set1_ps(sj[u]), kv8(rows[u] + v_off, d0, hd, KVT), acc);
            _mm256_storeu_ps(o + d0, acc);
        }
#endif
        for (int d = d0; d < hd; d++) o[d] = 0.f;
        for (int u = 0; u < n && d0 < hd; u++)
            for (int d = d0; d < hd; d++) o[d] += sj[u] * kv_at(rows[u] + v_off, d, hd, KVT);
    }
}

/* one_row for the cache's KV type: one specialised copy per type. */
static void attend_rows(const float *const *q, int NR, const uint8_t *kc, const uint8_t *vc, const int32_t *table,
                        int bs, int64_t tok, int G, int hd, float scale, int64_t t0, int64_t t1, float *s,
                        float *const *part, int64_t pf0, int64_t pf1, int kvt) {
    if (kvt == WP_KV_BF16) one_row(q, NR, kc, vc, table, bs, tok, G, hd, scale, t0, t1, s, part, pf0, pf1, WP_KV_BF16);
    else if (kvt == WP_KV_F16)
        one_row(q, NR, kc, vc, table, bs, tok, G, hd, scale, t0, t1, s, part, pf0, pf1, WP_KV_F16);
    else if (kvt == WP_KV_I8) one_row(q, NR, kc, vc, table, bs, tok, G, hd, scale, t0, t1, s, part, pf0, pf1, WP_KV_I8);
    else one_row(q, NR, kc, vc, table, bs, tok, G, hd, scale, t0, t1, s, part, pf0, pf1, WP_KV_F32);
}

/* Queries per register tile of span_queries (x 4 keys for scores, x 32 values for outputs: 8 accumulators, each
   K/V load feeding two FMAs); more gained little. A query's numbers are the same whatever tile it is in. */
#define SPAN_NQ 2

#ifdef WP_SIMD
/* NQ rows x 32 columns of a small product in registers: acc[j][k] holds columns 8k..8k+7 of the sum over
   i < n, in order, of a[j][i] times the 32 floats at m + i * ldm + off (one fused multiply-add chain each).
   Here: softmax weights times Vs's rows. */
AI void span_product(const float *const a[SPAN_NQ], const float *m, int ldm, int off, int n, const int NQ,
                     __m256 acc[SPAN_NQ][4]) {
    for (int j = 0; j < NQ; j++)
        for (int k = 0; k < 4; k++) acc[j][k] = _mm256_setzero_ps();
    for (int i = 0; i < n; i++) {
        __m256 b[SPAN_NQ];
        for (int j = 0; j < NQ; j++) b[j] = _mm256_set1_ps(a[j][i]);
        const float *row = m + i * ldm + off;
        for (int k = 0; k < 4; k++) {
            __m256 v = _mm256_loadu_ps(row + 8 * k);
            __asm__("" : PIN(v)); /* one load for the NQ rows */
            for (int j = 0; j < NQ; j++) acc[j][k] = _mm256_fmadd_ps(b[j], v, acc[j][k]);
        }
    }
}
#endif

#ifdef WP_SIMD
/* Scores of NQ queries against keys t..t+3 (rows of Ks, hd floats each) in one_row's order, so that a chunk's row
   gets a decode row's numbers: 8 lane chains over d, then ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)). */
AI void span_scores4(const float *const q[SPAN_NQ], const float *Ks, int hd, int t, float scale, float *s,
                     const int NQ) {
    __m256 acc[SPAN_NQ][4];
    for (int j = 0; j < NQ; j++)
        for (int u = 0; u < 4; u++) acc[j][u] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d += 8) {
        __m256 k[4];
        for (int u = 0; u < 4; u++) k[u] = _mm256_loadu_ps(Ks + (int64_t)(t + u) * hd + d);
        for (int j = 0; j < NQ; j++) {
            const __m256 qv = _mm256_loadu_ps(q[j] + d);
            for (int u = 0; u < 4; u++) acc[j][u] = _mm256_fmadd_ps(qv, k[u], acc[j][u]);
        }
    }
    for (int j = 0; j < NQ; j++) {
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(acc[j][0], acc[j][1]), _mm256_hadd_ps(acc[j][2], acc[j][3]));
        const __m128 sc = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        _mm_storeu_ps(s + j * SPLIT + t, _mm_mul_ps(sc, _mm_set1_ps(scale)));
    }
}
#endif

/* NQ query heads q[0..NQ) (hd floats each) over nv keys of a span staged in Ks and Vs [SPLIT][hd]: scores,
   softmax pieces and the unnormalized output into part[a * (hd + 2)..], each in one_row's order (a row's numbers
   are the same computed in a chunk or alone). s holds NQ x SPLIT floats. */
AI void span_queries(const float *const q[SPAN_NQ], int hd, const float *Ks, const float *Vs, int nv, float scale,
                     float *s, float *part, const int NQ) {
    int t = 0;
#ifdef WP_SIMD
    if (hd % 8 == 0) /* one_row's groups of 8 keys; the rest one by one, as there */
        for (; t < nv / 8 * 8; t += 4) span_scores4(q, Ks, hd, t, scale, s, NQ);
#endif
    for (; t < nv; t++)
        for (int a = 0; a < NQ; a++)
            s[a * SPLIT + t] = dot_kv(q[a], (const uint8_t *)(Ks + (int64_t)t * hd), hd, WP_KV_F32) * scale;
    const float *w[SPAN_NQ]; /* each query's softmax weights */
    for (int a = 0; a < NQ; a++) {
        float *sa = s + a * SPLIT;
        const float mx = max_of(sa, nv);
        part[a * (hd + 2)] = mx;
        part[a * (hd + 2) + 1] = exp_shifted(sa, nv, mx);
        w[a] = sa;
    }
    int d0 = 0;
#ifdef WP_SIMD
    for (; d0 + 32 <= hd; d0 += 32) { /* 32 output values x NQ queries in registers over the span */
        __m256 acc[SPAN_NQ][4];
        span_product(w, Vs, hd, d0, nv, NQ, acc);
        for (int a = 0; a < NQ; a++)
            for (int k = 0; k < 4; k++) _mm256_storeu_ps(part + a * (hd + 2) + 2 + d0 + 8 * k, acc[a][k]);
    }
    for (; d0 + 8 <= hd; d0 += 8) /* as one_row's last values: one chain per value */
        for (int a = 0; a < NQ; a++) {
            __m256 acc = _mm256_setzero_ps();
            for (int u = 0; u < nv; u++)
                acc = _mm256_fmadd_ps(_mm256_set1_ps(w[a][u]), _mm256_loadu_ps(Vs + u * hd + d0), acc);
            _mm256_storeu_ps(part + a * (hd + 2) + 2 + d0, acc);
        }
#endif
    for (int a = 0; a < NQ; a++) {
        float *o = part + a * (hd + 2) + 2;
        for (int d = d0; d < hd; d++) o[d] = 0.f;
        for (int u = 0; u < nv && d0 < hd; u++)
            for (int d = d0; d < hd; d++) o[d] += w[a][u] * Vs[u * hd + d];
    }
}

/* A span's K and V rows copied into Ks and Vs [SPLIT][hd] as floats. */
AI void stage_span(const uint8_t *kc, const uint8_t *vc, const int32_t *table, int bs, int64_t tok, int hd, int64_t t0,
                   int n, float *Ks, float *Vs, const int KVT) {
    const int64_t v_off = vc - kc;
    const uint8_t *k[SPLIT]; /* each token's K row (its V row at the same offset from vc) */
    for (int t = 0; t < n; t++) k[t] = kc + ((int64_t)table[(t0 + t) / bs] * bs + (t0 + t) % bs) * tok;
    for (int t = 0; t < n; t++) {
        if (t + KV_PREFETCH < n)
            for (int o = 0; o < kv_row_bytes(KVT, hd); o += 64) {
                __builtin_prefetch(k[t + KV_PREFETCH] + o);
                __builtin_prefetch(k[t + KV_PREFETCH] + v_off + o);
            }
        kv_row(Ks + t * hd, k[t], hd, KVT);
        kv_row(Vs + t * hd, k[t] + v_off, hd, KVT);
    }
}

/* One task: the queries of one sequence's new rows (nrows x G heads of KV head g) over context tokens
   t0..t1. K/V are staged as floats (stage_span) once, then every query reuses them from L1/L2. Row i
   (position p0 + i) sees tokens t <= p0 + i. Writes per query: [max score, sum of exp, unnormalized output
   (hd values)]. */
static void attend_span(const float *qkv, int qkv_w, int nrows, int64_t p0, const uint8_t *kc, const uint8_t *vc,
                        const int32_t *table, int bs, int64_t tok, int G, int hd, float scale, int64_t t0, int64_t t1,
                        float *Ks, float *Vs, float *s, float *part, int kvt) {
    const int n = (int)(t1 - t0);
    if (kvt == WP_KV_BF16) stage_span(kc, vc, table, bs, tok, hd, t0, n, Ks, Vs, WP_KV_BF16);
    else if (kvt == WP_KV_F16) stage_span(kc, vc, table, bs, tok, hd, t0, n, Ks, Vs, WP_KV_F16);
    else if (kvt == WP_KV_I8) stage_span(kc, vc, table, bs, tok, hd, t0, n, Ks, Vs, WP_KV_I8);
    else stage_span(kc, vc, table, bs, tok, hd, t0, n, Ks, Vs, WP_KV_F32);
    /* The task's queries (row i's head j is query i * G + j, as in part) in register tiles of up to SPAN_NQ
       that see the same keys: all rows see a span wholly before the chunk, so a tile may take heads of
       several rows; near the chunk's own tokens, where each row sees fewer, a row's heads. */
    const int nq = nrows * G;
    for (int a = 0; a < nq;) {
        const int64_t last = p0 + a / G + 1; /* causal: keys this row may see */
        const int nv = (int)((last < t1 ? last : t1) - t0);
        int c = 1; /* the whole span (then for every later row too), or the rest of this row's heads */
        while (c < SPAN_NQ && a + c < nq && (last >= t1 || (a + c) % G)) c++;
        float *pa = part + (int64_t)a * (hd + 2);
        if (nv <= 0) {
            for (int u = 0; u < c * (hd + 2); u += hd + 2) {
                pa[u] = -INFINITY, pa[u + 1] = 0.f;
                for (int d = 0; d < hd; d++) pa[u + 2 + d] = 0.f;
            }
        } else {
            const float *q[SPAN_NQ];
            for (int u = 0; u < c; u++) q[u] = qkv + (int64_t)((a + u) / G) * qkv_w + (a + u) % G * hd;
            if (c == 2) span_queries(q, hd, Ks, Vs, nv, scale, s, pa, 2);
            else span_queries(q, hd, Ks, Vs, nv, scale, s, pa, 1);
        }
        a += c;
    }
}
