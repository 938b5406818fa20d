/* Paged attention over warmpath's KV cache, for a step's rows of many sequences: the tasks (attention_span.h)
   of a step, and the merge of each row's spans. */
#pragma once

#include "attention_span.h"
#include "attention_amx.h"

/* A step's attention layout, the same for every layer: tasks are (sequence, span of SPLIT tokens) for a
   decode row, all KV heads at once, and (sequence, KV head, span) for a chunk; each writes its partial
   results ([max score, sum of exp, unnormalized output] per query head and row) at its own place in parts.
   Planned and allocated once per forward pass. */
#define MAX_GROUP 16 /* decode rows of one sequence attended together (a verified decode's guesses) */

typedef struct {
    int *first;     /* [S + 1] first task of each sequence */
    int *group_end; /* [S] a decode row leading a group: one past its last row; a row inside a group: -1 */
    int64_t *poff;  /* [S + 1] where its partial results start */
    int *row_seq;   /* [R] the sequence of each row */
    float *parts, *work;
    int64_t scratch;    /* floats of work per thread */
    int amx;            /* every row on AMX tiles (attention_amx.h): their tasks below, none in first / poff */
    int bf16;           /* AVX512-BF16 dot products (attention_bf16.h): decodes' span tasks, and chunks' tasks below */
    int *tile_first;    /* [S + 1] first bf16 chunk task of each sequence (KV heads x tiles of BF16_TQ queries) */
    int *stage_first;   /* [S + 1] first staging piece of each sequence (KV heads x spans) */
    int64_t *stage_off; /* [S + 1] where each sequence's staged spans start in staged */
    uint32_t *staged;   /* per span: K^T then V pairs (hd x SPLIT dwords) */
    float *tile_parts;  /* per thread: a chunk task's partial results, [query][span] */
    int64_t tile_scratch; /* floats of tile_parts per thread */
    int *amx_first;       /* [S + 1] first AMX task of each sequence (KV heads x tiles of 16 queries) */
    int64_t *vt_off;      /* [S + 1] where each staged sequence's V tiles (KV heads x head_dim x vt_ld) start in vt */
    uint16_t *vt;
} attn_plan;

static void free_plan(attn_plan *P) {
    free(P->first), free(P->group_end), free(P->poff), free(P->row_seq), free(P->parts), free(P->work);
    free(P->amx_first), free(P->vt_off), free(P->vt);
    free(P->tile_first), free(P->stage_first), free(P->stage_off), free(P->staged), free(P->tile_parts);
}

#define AMX_FETCH_TILES 8 /* a chunk with at most this many tiles a KV head prefetches its blocks */

/* Keys a sequence's staged V tiles hold: its context rounded up to whole blocks of AMX_KEYS. */
static inline int64_t vt_ld(int64_t ctx) { return (ctx + AMX_KEYS - 1) / AMX_KEYS * AMX_KEYS; }

/* Whether a sequence's V is staged once for its AMX tasks: more than one task a KV head reads it (a decode's one
   task stages each block as it goes). */
static inline int amx_staged(int nrows, int G) { return (nrows * G + 15) / 16 > 1; }

/* Decode rows sq_a and sq_b read the same blocks up to position last (inclusive). */
static int same_blocks(const int32_t *tables, int width, int sq_a, int sq_b, int64_t last, int bs) {
    const int64_t nb = last / bs + 1;
    return nb <= width && !memcmp(tables + (int64_t)sq_a * width, tables + (int64_t)sq_b * width, nb * sizeof(int32_t));
}

static int plan_attention(const wp_model *M, int S, const int32_t *seq_rows, const int64_t *start,
                          const int32_t *tables, int width, int nthreads, attn_plan *P) {
    const int KVH = M->num_kv_heads, hd = M->head_dim, G = M->num_heads / KVH;
    memset(P, 0, sizeof(*P));
    P->first = (int *)malloc((size_t)(S + 1) * sizeof(int));
    P->group_end = (int *)malloc((size_t)S * sizeof(int) + 1);
    P->poff = (int64_t *)malloc((size_t)(S + 1) * sizeof(int64_t));
    P->row_seq = (int *)malloc((size_t)seq_rows[S] * sizeof(int) + 1);
    if (!P->first || !P->group_end || !P->poff || !P->row_seq) return free_plan(P), -1;
    P->scratch = 2 * (int64_t)hd * SPLIT + (int64_t)(G > SPAN_NQ ? G : SPAN_NQ) * SPLIT;
    const int fit = (int)(P->scratch / ((int64_t)G * SPLIT)), max_group = fit < MAX_GROUP ? fit : MAX_GROUP;
    /* Groups: a decode row at the next position over the same blocks as the previous decode row (a verified
       decode's guesses) joins its group; the group's tasks (one per span) attend all its rows at once. */
    for (int sq = 0, lead = -1; sq < S; sq++) {
        const int decode = seq_rows[sq + 1] - seq_rows[sq] == 1;
        if (decode && lead >= 0 && sq - lead < max_group && start[sq] == start[lead] + (sq - lead) &&
            same_blocks(tables, width, lead, sq, start[sq], M->block_size))
            P->group_end[lead] = sq + 1, P->group_end[sq] = -1;
        else P->group_end[sq] = sq + 1, lead = decode ? sq : -1;
    }
#ifdef WP_AMX_ATTN
    /* every row, decodes too: a row's numbers must not depend on whether it is a step's only row, a verified
       guess or a chunk's (a prompt's last token computed alone after a cache hit gets a chunk's logits) */
    P->amx = M->attention == WP_ATTN_BF16 && M->kv_type == WP_KV_BF16 && M->block_size % 16 == 0 && hd % 64 == 0 &&
             hd <= 128 && amx_usable();
#endif
#ifdef WP_BF16_ATTN
    P->bf16 = !P->amx && M->attention == WP_ATTN_BF16 && M->kv_type == WP_KV_BF16 && (hd == 64 || hd == 128);
#endif
    if (P->amx) {
        P->amx_first = (int *)malloc((size_t)(S + 1) * sizeof(int));
        P->vt_off = (int64_t *)malloc((size_t)(S + 1) * sizeof(int64_t));
        if (!P->amx_first || !P->vt_off) return free_plan(P), -1;
        P->amx_first[0] = 0, P->vt_off[0] = 0;
        for (int sq = 0; sq < S; sq++) {
            const int nrows = seq_rows[sq + 1] - seq_rows[sq];
            P->amx_first[sq + 1] = P->amx_first[sq] + KVH * ((nrows * G + 15) / 16);
            P->vt_off[sq + 1] =
                P->vt_off[sq] + (amx_staged(nrows, G) ? (int64_t)KVH * hd * vt_ld(start[sq] + nrows) : 0);
        }
        P->vt = (uint16_t *)malloc((size_t)P->vt_off[S] * 2 + 1);
        if (!P->vt) return free_plan(P), -1;
    }
    P->first[0] = 0, P->poff[0] = 0;
    for (int sq = 0; sq < S; sq++) {
        const int nrows = seq_rows[sq + 1] - seq_rows[sq];
        if (P->amx) { /* AMX tasks: no span tasks, no partial results */
            for (int r = seq_rows[sq]; r < seq_rows[sq + 1]; r++) P->row_seq[r] = sq;
            P->first[sq + 1] = P->first[sq], P->poff[sq + 1] = P->poff[sq];
            continue;
        }
        const int nspan = (int)((start[sq] + nrows + SPLIT - 1) / SPLIT);
        for (int r = seq_rows[sq]; r < seq_rows[sq + 1]; r++) P->row_seq[r] = sq;
        if (P->bf16 && nrows > 1) { /* bf16_chunks' tasks: no span tasks, no partial results here */
            P->first[sq + 1] = P->first[sq], P->poff[sq + 1] = P->poff[sq];
            continue;
        }
        int tasks = KVH * nspan;
        if (nrows == 1) { /* a decode group's task: one span, all KV heads, all rows (the last sees the most) */
            const int end = P->group_end[sq];
            tasks = end < 0 ? 0 : (int)((start[end - 1] + 1 + SPLIT - 1) / SPLIT);
        }
        P->first[sq + 1] = P->first[sq] + tasks;
        P->poff[sq + 1] = P->poff[sq] + (int64_t)KVH * nspan * nrows * G * (hd + 2);
    }
    P->parts = (float *)malloc((size_t)P->poff[S] * sizeof(float));
    P->work = (float *)malloc((size_t)nthreads * P->scratch * sizeof(float));
    if (!P->parts || !P->work) return free_plan(P), -1;
#ifdef WP_BF16_ATTN
    if (P->bf16) {
        P->tile_first = (int *)malloc((size_t)(S + 1) * sizeof(int));
        P->stage_first = (int *)malloc((size_t)(S + 1) * sizeof(int));
        P->stage_off = (int64_t *)malloc((size_t)(S + 1) * sizeof(int64_t));
        if (!P->tile_first || !P->stage_first || !P->stage_off) return free_plan(P), -1;
        P->tile_first[0] = 0, P->stage_first[0] = 0, P->stage_off[0] = 0;
        int64_t max_span = 0;
        for (int sq = 0; sq < S; sq++) {
            const int nrows = seq_rows[sq + 1] - seq_rows[sq], chunk = nrows > 1;
            const int nspan = (int)((start[sq] + nrows + SPLIT - 1) / SPLIT);
            P->tile_first[sq + 1] = P->tile_first[sq] + (chunk ? KVH * ((nrows * G + BF16_TQ - 1) / BF16_TQ) : 0);
            P->stage_first[sq + 1] = P->stage_first[sq] + (chunk ? KVH * nspan : 0);
            P->stage_off[sq + 1] = P->stage_off[sq] + (chunk ? (int64_t)KVH * nspan * hd * SPLIT : 0);
            if (chunk && nspan > max_span) max_span = nspan;
        }
        P->tile_scratch = (int64_t)BF16_TQ * max_span * (hd + 2);
        P->staged = (uint32_t *)malloc((size_t)P->stage_off[S] * 4 + 1);
        P->tile_parts = (float *)malloc((size_t)nthreads * P->tile_scratch * sizeof(float) + 1);
        if (!P->staged || !P->tile_parts) return free_plan(P), -1;
    }
#endif
    return 0;
}

/* One query's output (hd floats into o) from its partial results over nspan spans, cs floats apart: [max score, sum
   of exp, unnormalized output] each, a span it does not reach having sum 0. Every path merges with this. */
static inline void merge_spans(const float *p0, int64_t cs, int nspan, int hd, float *o) {
    float mx = -INFINITY, sum = 0.f;
    for (int c = 0; c < nspan; c++) mx = p0[c * cs] > mx ? p0[c * cs] : mx;
    for (int d = 0; d < hd; d++) o[d] = 0.f;
    for (int c = 0; c < nspan; c++) {
        const float *pc = p0 + c * cs;
        if (pc[1] == 0.f) continue; /* a span wholly after this row's position */
        const float wt = expf(pc[0] - mx);
        sum += wt * pc[1];
        for (int d = 0; d < hd; d++) o[d] += wt * pc[2 + d];
    }
    const float inv = 1.0f / sum;
    for (int d = 0; d < hd; d++) o[d] *= inv;
}

#ifdef WP_AMX_ATTN
/* Inside attention()'s parallel region: the V tiles of every sequence with several tasks a KV head staged (pieces
   of 256 keys), then every sequence's tasks (a KV head's 16 queries: row i's head j is query i * G + j) attended
   on AMX tiles, straight into out. */
static void amx_chunks(const wp_model *M, int S, const int32_t *seq_rows, const int64_t *start, const int32_t *tables,
                       int width, const float *qkv, const uint8_t *kc, const uint8_t *vc, float *out,
                       const attn_plan *P) {
    const int H = M->num_heads, KVH = M->num_kv_heads, hd = M->head_dim, G = H / KVH, qkv_w = (H + 2 * KVH) * hd;
    const int64_t tok = (int64_t)KVH * hd;
    int pieces = 0; /* (sequence, KV head, 256 keys) */
    for (int sq = 0; sq < S; sq++)
        if (amx_staged(seq_rows[sq + 1] - seq_rows[sq], G))
            pieces += KVH * (int)((vt_ld(start[sq] + seq_rows[sq + 1] - seq_rows[sq]) + 255) / 256);
#pragma omp for schedule(dynamic, 1)
    for (int piece = 0; piece < pieces; piece++) {
        int sq = 0, rest = piece, n = 0;
        for (;; sq++) {
            const int nrows = seq_rows[sq + 1] - seq_rows[sq];
            n = amx_staged(nrows, G) ? KVH * (int)((vt_ld(start[sq] + nrows) + 255) / 256) : 0;
            if (rest < n) break;
            rest -= n;
        }
        const int64_t ctx = start[sq] + seq_rows[sq + 1] - seq_rows[sq], ld = vt_ld(ctx);
        const int g = rest % KVH;
        const int64_t t0 = (int64_t)(rest / KVH) * 256, t1 = t0 + 256 < ld ? t0 + 256 : ld;
        amx_stage_v((const uint16_t *)vc + g * hd, tables + (int64_t)sq * width, M->block_size, tok, hd, t0, t1, ctx,
                    P->vt + P->vt_off[sq] + (int64_t)g * hd * ld, 0);
    }
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < P->amx_first[S]; task++) {
        int sq = 0;
        while (P->amx_first[sq + 1] <= task) sq++;
        const int nrows = seq_rows[sq + 1] - seq_rows[sq], idx = task - P->amx_first[sq], tiles = (nrows * G + 15) / 16;
        const int g = idx / tiles, a0 = (idx % tiles) * 16, nq = nrows * G - a0 < 16 ? nrows * G - a0 : 16;
        const float *q[16];
        float *o[16];
        int64_t pos[16];
        for (int i = 0; i < nq; i++) {
            const int r = seq_rows[sq] + (a0 + i) / G, h = g * G + (a0 + i) % G;
            q[i] = qkv + (int64_t)r * qkv_w + (int64_t)h * hd;
            o[i] = out + (int64_t)r * H * hd + (int64_t)h * hd;
            pos[i] = start[sq] + (a0 + i) / G;
        }
        const int64_t ld = vt_ld(start[sq] + nrows);
        amx_attend(q, pos, nq, (const uint16_t *)kc + g * hd, (const uint16_t *)vc + g * hd,
                   tables + (int64_t)sq * width, M->block_size, tok, hd, M->scale,
                   amx_staged(nrows, G) ? P->vt + P->vt_off[sq] + (int64_t)g * hd * ld : NULL, o,
                   tiles <= AMX_FETCH_TILES);
    }
}
#endif

#ifdef WP_BF16_ATTN
/* A decode group's span task on AVX512-BF16 (attention_bf16.h): every KV head's span staged once in w for the
   group's rows that reach it, their partial results where the fp32 tasks write them. */
static void bf16_decode(const wp_model *M, int sq, int64_t t0, const int32_t *seq_rows, const int64_t *start,
                        const float *qkv, const uint8_t *kc, const uint8_t *vc, const int32_t *table, float *w,
                        const attn_plan *P) {
    const int H = M->num_heads, KVH = M->num_kv_heads, hd = M->head_dim, G = H / KVH, qkv_w = (H + 2 * KVH) * hd;
    const int64_t tok = (int64_t)KVH * hd, stride = (int64_t)G * (hd + 2);
    uint32_t *KT = (uint32_t *)w, *VP = KT + (int64_t)hd * SPLIT / 2;
    enum { MAXQ = 96 };
    const float *q[MAXQ];
    int64_t pos[MAXQ];
    float *part[MAXQ];
    const int end = P->group_end[sq]; /* rows sq..end-1 at consecutive positions: the last sees the most */
    const int64_t e = start[end - 1] + 1 < t0 + SPLIT ? start[end - 1] + 1 : t0 + SPLIT;
    for (int64_t t = t0; t < e; t++) { /* a decode step reads its cache once, from memory: every head's rows now */
        const int64_t slot = (int64_t)table[t / M->block_size] * M->block_size + t % M->block_size;
        for (int64_t o = 0; o < tok * 2; o += 64)
            __builtin_prefetch(kc + slot * tok * 2 + o), __builtin_prefetch(vc + slot * tok * 2 + o);
    }
    for (int g = 0; g < KVH; g++) {
        bf16_stage((const uint16_t *)kc + g * hd, (const uint16_t *)vc + g * hd, table, M->block_size, tok, hd, t0,
                   (int)(e - t0), KT, VP);
        int nq = 0;
        for (int r = sq; r < end; r++) {
            if (start[r] < t0) continue; /* this span is after the row's position: no partial result of it */
            const int64_t nsp = (start[r] + 1 + SPLIT - 1) / SPLIT;
            for (int j = 0; j < G; j++) {
                q[nq] = qkv + (int64_t)seq_rows[r] * qkv_w + (int64_t)(g * G + j) * hd;
                pos[nq] = start[r];
                part[nq++] = P->parts + P->poff[r] + (g * nsp + t0 / SPLIT) * stride + j * (hd + 2);
                if (nq == MAXQ) bf16_queries(q, pos, nq, t0, KT, VP, hd, M->scale, part), nq = 0;
            }
        }
        bf16_queries(q, pos, nq, t0, KT, VP, hd, M->scale, part);
    }
}

/* Inside attention()'s parallel region: every chunk's spans staged once (K^T and V pairs of each KV head), then
   tasks of BF16_TQ queries of one KV head, each over the spans its queries reach and merged in the task (merge_spans,
   in span order: a row's output is the one a decode of it gets), straight into out. */
static void bf16_chunks(const wp_model *M, int S, const int32_t *seq_rows, const int64_t *start, const int32_t *tables,
                        int width, const float *qkv, const uint8_t *kc, const uint8_t *vc, float *out,
                        const attn_plan *P, int thread) {
    const int H = M->num_heads, KVH = M->num_kv_heads, hd = M->head_dim, G = H / KVH, qkv_w = (H + 2 * KVH) * hd;
    const int64_t tok = (int64_t)KVH * hd, span = (int64_t)hd * SPLIT; /* dwords of one staged span */
#pragma omp for schedule(dynamic, 1)
    for (int piece = 0; piece < P->stage_first[S]; piece++) {
        int sq = 0;
        while (P->stage_first[sq + 1] <= piece) sq++;
        const int64_t ctx = start[sq] + seq_rows[sq + 1] - seq_rows[sq], nspan = (ctx + SPLIT - 1) / SPLIT;
        const int idx = piece - P->stage_first[sq], g = (int)(idx / nspan);
        const int64_t t0 = (idx % nspan) * SPLIT, n = ctx - t0 < SPLIT ? ctx - t0 : SPLIT;
        uint32_t *KT = P->staged + P->stage_off[sq] + idx * span;
        bf16_stage((const uint16_t *)kc + g * hd, (const uint16_t *)vc + g * hd, tables + (int64_t)sq * width,
                   M->block_size, tok, hd, t0, (int)n, KT, KT + span / 2);
    }
    float *lp = P->tile_parts + (int64_t)thread * P->tile_scratch;
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < P->tile_first[S]; task++) {
        int sq = 0;
        while (P->tile_first[sq + 1] <= task) sq++;
        const int nrows = seq_rows[sq + 1] - seq_rows[sq], idx = task - P->tile_first[sq];
        const int tiles = (nrows * G + BF16_TQ - 1) / BF16_TQ, g = idx / tiles, a0 = (idx % tiles) * BF16_TQ;
        const int nq = nrows * G - a0 < BF16_TQ ? nrows * G - a0 : BF16_TQ;
        const int64_t nspan = (start[sq] + nrows + SPLIT - 1) / SPLIT;
        const float *q[BF16_TQ];
        int64_t pos[BF16_TQ];
        float *part[BF16_TQ];
        for (int u = 0; u < nq; u++) { /* row i's head j is query i * G + j */
            const int a = a0 + u;
            q[u] = qkv + (int64_t)(seq_rows[sq] + a / G) * qkv_w + (int64_t)(g * G + a % G) * hd;
            pos[u] = start[sq] + a / G;
        }
        const int cn = (int)((start[sq] + (a0 + nq - 1) / G) / SPLIT + 1); /* spans its latest query reaches */
        for (int c = 0; c < cn; c++) {
            for (int u = 0; u < nq; u++) part[u] = lp + ((int64_t)u * cn + c) * (hd + 2);
            const uint32_t *KT = P->staged + P->stage_off[sq] + ((int64_t)g * nspan + c) * span;
            bf16_queries(q, pos, nq, (int64_t)c * SPLIT, KT, KT + span / 2, hd, M->scale, part);
        }
        for (int u = 0; u < nq; u++) {
            const int a = a0 + u;
            merge_spans(lp + (int64_t)u * cn * (hd + 2), hd + 2, cn, hd,
                        out + (int64_t)(seq_rows[sq] + a / G) * H * hd + (int64_t)(g * G + a % G) * hd);
        }
    }
}
#endif

/* Writes the new rows' K/V into their slots, then attends every query head of every row over its
   sequence's context (the tasks of plan P), then merges each row's spans with the usual max/sum rescaling.
   Rows of sequence s are seq_rows[s]..seq_rows[s+1], at positions start[s]... */
static void attention(const wp_model *M, int layer, int S, const int32_t *seq_rows, const int64_t *start,
                      const int32_t *tables, int width, const float *qkv, uint8_t *kv, float *out, int nthreads,
                      const attn_plan *P) {
    const int H = M->num_heads, KVH = M->num_kv_heads, hd = M->head_dim, bs = M->block_size, kvt = M->kv_type;
    const int G = H / KVH, qkv_w = (H + 2 * KVH) * hd, RB = kv_row_bytes(kvt, hd);
    const int64_t tok = (int64_t)KVH * RB, plane = (int64_t)M->num_kv_blocks * bs * tok; /* bytes */
    uint8_t *kc = kv + (int64_t)layer * 2 * plane, *vc = kc + plane;
    const int *first = P->first;
    const int64_t *poff = P->poff;
    float *parts = P->parts;
    for (int sq = 0; sq < S; sq++)
        for (int r = seq_rows[sq]; r < seq_rows[sq + 1]; r++) {
            const int64_t p = start[sq] + (r - seq_rows[sq]);
            const int64_t slot = (int64_t)tables[(int64_t)sq * width + p / bs] * bs + p % bs;
            store_kv(kc + slot * tok, qkv + (int64_t)r * qkv_w + H * hd, KVH, hd, kvt);
            store_kv(vc + slot * tok, qkv + (int64_t)r * qkv_w + (H + KVH) * hd, KVH, hd, kvt);
        }
    const int tasks = first[S];
#pragma omp parallel num_threads(nthreads)
    {
        int thread = 0;
#ifdef _OPENMP
        thread = omp_get_thread_num();
#endif
        float *w = P->work + (int64_t)thread * P->scratch;
#ifdef WP_AMX_ATTN
        if (P->amx) amx_chunks(M, S, seq_rows, start, tables, width, qkv, kc, vc, out, P);
#endif
#ifdef WP_BF16_ATTN
        if (P->bf16) bf16_chunks(M, S, seq_rows, start, tables, width, qkv, kc, vc, out, P, thread);
#endif
#pragma omp for schedule(dynamic, 1)
        for (int task = 0; task < tasks; task++) {
            int sq = 0;
            while (first[sq + 1] <= task) sq++;
            const int nrows = seq_rows[sq + 1] - seq_rows[sq], idx = task - first[sq];
            const int64_t ctx = start[sq] + nrows, nspan = (ctx + SPLIT - 1) / SPLIT;
            const int64_t stride = (int64_t)nrows * G * (hd + 2); /* one (KV head, span)'s partial results */
            const int c = nrows == 1 ? idx : (int)(idx % nspan);
            const int64_t t0 = (int64_t)c * SPLIT, t1 = t0 + SPLIT < ctx ? t0 + SPLIT : ctx;
            const float *q = qkv + (int64_t)seq_rows[sq] * qkv_w;
            const int32_t *table = tables + (int64_t)sq * width;
#ifdef WP_BF16_ATTN
            if (P->bf16) { /* a decode group's span (chunks are bf16_chunks') */
                bf16_decode(M, sq, t0, seq_rows, start, qkv, kc, vc, table, w, P);
                continue;
            }
#endif
            if (nrows == 1) { /* decode: too few queries to pay for staging K/V; read them in place, whole rows */
                const int end = P->group_end[sq];
                for (int g = 0; g < KVH; g++)
                    for (int r0 = sq, r1; r0 < end; r0 = r1) { /* the group's rows that see the same tokens */
                        const int64_t e0 = start[r0] + 1 < t0 + SPLIT ? start[r0] + 1 : t0 + SPLIT;
                        for (r1 = r0 + 1; r1 < end && (start[r1] + 1 < t0 + SPLIT ? start[r1] + 1 : t0 + SPLIT) == e0;)
                            r1++;
                        if (e0 <= t0) continue; /* this span is after the row's position */
                        const float *qs[MAX_GROUP];
                        float *ps[MAX_GROUP];
                        for (int r = r0; r < r1; r++) {
                            const int64_t nsp = (start[r] + 1 + SPLIT - 1) / SPLIT;
                            qs[r - r0] = qkv + (int64_t)seq_rows[r] * qkv_w + g * G * hd;
                            ps[r - r0] = parts + poff[r] + (g * nsp + c) * stride;
                        }
                        attend_rows(qs, r1 - r0, kc + g * RB, vc + g * RB, table, bs, tok, G, hd, M->scale, t0, e0, w,
                                    ps, 0, g ? 0 : tok, kvt);
                    }
            } else {
                const int g = (int)(idx / nspan);
                attend_span(q + g * G * hd, qkv_w, nrows, start[sq], kc + g * RB, vc + g * RB, table, bs, tok, G, hd,
                            M->scale, t0, t1, w, w + (int64_t)hd * SPLIT, w + 2 * (int64_t)hd * SPLIT,
                            parts + poff[sq] + idx * stride, kvt);
            }
        }
        /* The merge, a row per iteration (a prompt chunk has hundreds). */
#pragma omp for schedule(static)
        for (int r = 0; r < seq_rows[S]; r++) {
            const int sq = P->row_seq[r], nrows = seq_rows[sq + 1] - seq_rows[sq], i = r - seq_rows[sq];
            if (P->amx || (P->bf16 && nrows > 1)) continue; /* written by its AMX or bf16 chunk task */
            const int nspan = (int)((start[sq] + nrows + SPLIT - 1) / SPLIT);
            const int64_t stride = (int64_t)nrows * G * (hd + 2); /* from one span's task to the next */
            for (int h = 0; h < H; h++) {
                const int g = h / G, j = h % G;
                const float *p0 = parts + poff[sq] + (int64_t)g * nspan * stride + ((int64_t)i * G + j) * (hd + 2);
                merge_spans(p0, stride, nspan, hd, out + (int64_t)r * H * hd + h * hd);
            }
        }
    }
}
