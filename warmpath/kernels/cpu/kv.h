/* KV cache elements (float, bf16, fp16 or int8: wp_model.kv_type) to and from the floats attention computes with. */
#pragma once

#include "common.h"

/* KV elements <-> float. To 16 bits: round to nearest, ties to even, as torch's .to(torch.bfloat16) /
   .to(torch.float16) round (c10's round_to_nearest_even and fp16_ieee_from_fp32_value), so K/V the kernel writes
   equal what the torch path writes from the same fp32 values. */
static inline uint16_t float_to_bf16(float f) {
    if (f != f) return 0x7FC0; /* NaN: torch's quiet NaN */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static inline float bf16_to_float(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t float_to_half(float f) {
#ifdef WP_SIMD
    return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    /* FP16's fp16_ieee_from_fp32_value (torch's own): the float unit rounds the mantissa to 10 bits */
    uint32_t w, bits;
    memcpy(&w, &f, 4);
    const float scale_to_inf = 0x1.0p+112f, scale_to_zero = 0x1.0p-110f;
    float base = (fabsf(f) * scale_to_inf) * scale_to_zero;
    const uint32_t shl1_w = w + w, sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    const uint32_t b = (bias >> 1) + 0x07800000u;
    float bf;
    memcpy(&bf, &b, 4);
    base = bf + base;
    memcpy(&bits, &base, 4);
    const uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
#endif
}

/* Bytes per element of a KV row, and of one token's row for one KV head: an int8 row (WP_KV_I8) is head_dim values
   then its own fp16 scale, so a row's numbers never depend on what else shares its block or its step. */
#define KV_ES(KVT) ((KVT) == WP_KV_F32 ? 4 : (KVT) == WP_KV_I8 ? 1 : 2)
static inline int kv_row_bytes(int kvt, int hd) { return KV_ES(kvt) * hd + (kvt == WP_KV_I8 ? 2 : 0); }

/* Element i of a KV row of type KVT and length hd (row: its first byte), as a float; int8: value x scale. */
AI float kv_at(const uint8_t *row, int64_t i, int hd, const int KVT) {
    if (KVT == WP_KV_F32) {
        float f;
        memcpy(&f, row + 4 * i, 4);
        return f;
    }
    if (KVT == WP_KV_I8) return (float)(int8_t)row[i] * load_half(row + hd);
    if (KVT == WP_KV_F16) return load_half(row + 2 * i);
    uint16_t h;
    memcpy(&h, row + 2 * i, 2);
    return bf16_to_float(h);
}

#ifdef WP_SIMD
/* Elements d..d+8 of a KV row as floats: bf16 is the top half of a float, fp16 goes through F16C, int8 is widened
   and multiplied by its row's scale (the same product kv_at makes). */
AI __m256 kv8(const uint8_t *row, int d, int hd, const int KVT) {
    if (KVT == WP_KV_F32) return _mm256_loadu_ps((const float *)row + d);
    if (KVT == WP_KV_I8) {
        const __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + d)));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(w), _mm256_set1_ps(load_half(row + hd)));
    }
    const __m128i h = _mm_loadu_si128((const __m128i *)(row + 2 * d));
    if (KVT == WP_KV_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}
#endif

/* a . row over its n elements: 8-lane partial sums, then the tail one at a time. */
AI float dot_kv(const float *a, const uint8_t *row, int n, const int KVT) {
    int i = 0;
    float s = 0.f;
#ifdef WP_SIMD
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), kv8(row, i, n, KVT), acc);
    s = hsum(acc);
#endif
    for (; i < n; i++) s += a[i] * kv_at(row, i, n, KVT);
    return s;
}

/* A KV row's n elements into dst as floats (the staging of a span's K/V). */
AI void kv_row(float *dst, const uint8_t *row, int n, const int KVT) {
    if (KVT == WP_KV_F32) {
        memcpy(dst, row, (size_t)n * sizeof(float));
        return;
    }
    int i = 0;
#ifdef WP_SIMD
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, kv8(row, i, n, KVT));
#endif
    for (; i < n; i++) dst[i] = kv_at(row, i, n, KVT);
}

/* One int8 row: scale = amax / 127 rounded to fp16, each value src / scale rounded to nearest even (torch's
   round) and clamped: models/kv_quant.py writes the same bytes. */
static void store_kv_i8(uint8_t *dst, const float *src, int hd) {
    float amax = 0.f;
    for (int i = 0; i < hd; i++) amax = fabsf(src[i]) > amax ? fabsf(src[i]) : amax;
    const uint16_t h = float_to_half(amax / 127.f);
    memcpy(dst + hd, &h, 2);
    const float scale = load_half(dst + hd);
    for (int i = 0; i < hd; i++) {
        const float q = scale > 0.f ? nearbyintf(src[i] / scale) : 0.f;
        dst[i] = (uint8_t)(int8_t)(q > 127.f ? 127.f : q < -127.f ? -127.f : q);
    }
}

/* rows x hd floats (one token's KV heads) into rows KV rows of type kvt: 16 bits rounded to nearest even (above),
   int8 with a scale per row. */
static void store_kv(uint8_t *dst, const float *src, int rows, int hd, int kvt) {
    const int64_t n = (int64_t)rows * hd;
    if (kvt == WP_KV_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    if (kvt == WP_KV_I8) {
        for (int r = 0; r < rows; r++) store_kv_i8(dst + (int64_t)r * (hd + 2), src + (int64_t)r * hd, hd);
        return;
    }
    int64_t i = 0;
    uint16_t h;
    if (kvt == WP_KV_F16) {
#ifdef WP_SIMD
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128((__m128i *)(dst + 2 * i),
                             _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
        for (; i < n; i++) h = float_to_half(src[i]), memcpy(dst + 2 * i, &h, 2);
    } else {
        for (; i < n; i++) h = float_to_bf16(src[i]), memcpy(dst + 2 * i, &h, 2);
    }
}
