/* Shared by the kernel's parts: the structs native.py mirrors with ctypes (Matrix, Layer, Model), SIMD
   detection (WP_SIMD: AVX2 + FMA + F16C, else the portable path), and small helpers. */
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define WP_SIMD 1
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif
/* WP_VNNI: u8 x s8 products summed into 32-bit lanes in one instruction (vpdpbusd, AVX512-VNNI on 256-bit
   registers, or AVX-VNNI): the same integer sums as AVX2's vpmaddubsw + vpmaddwd, in fewer instructions. */
#if defined(WP_SIMD) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define WP_VNNI 1
#define dpbusd(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#elif defined(WP_SIMD) && defined(__AVXVNNI__)
#define WP_VNNI 1
#define dpbusd(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#endif

/* Matrix kinds (packing.py KINDS) and activation modes. Q4_K, Q5_0, Q6_K, Q4_0 and Q5_K are the GGUF file's own
   blocks, multiplied by int8 activations only (kquants.h). */
enum { WP_F32 = 0, WP_Q4_1 = 1, WP_Q8_0 = 2, WP_Q4_K = 3, WP_Q5_0 = 4, WP_Q6_K = 5, WP_Q4_0 = 6, WP_Q5_K = 7 };
#define WP_ACT_INT8 1

/* KV cache element types (native.py KV_TYPES): the cache is read and written in its own dtype, the one the torch
   path shares it in. */
enum { WP_KV_F32 = 0, WP_KV_BF16 = 1, WP_KV_F16 = 2, WP_KV_I8 = 3 };

/* The model as native.py hands it over (its ctypes structs Matrix, Layer, Model mirror these). A fused matrix
   whose members come in different kinds (Q4_K_M's Q4_K q/k beside a Q6_K v) is a chain of parts, each with its
   own kind: `next` holds the rows after this part's. */
typedef struct wp_matrix {
    int32_t type, rows, cols, act; /* act: WP_ACT_INT8 for int8 activations, else 0; rows: this part's */
    const uint8_t *data;
    const float *bias;            /* [rows] or NULL */
    const struct wp_matrix *next; /* the next part, or NULL */
} wp_matrix;

typedef struct {
    const float *input_norm, *post_attention_norm;
    wp_matrix qkv, o, gate_up, down;
} wp_layer;

typedef struct {
    int32_t num_layers, hidden, intermediate, num_heads, num_kv_heads, head_dim, vocab, block_size, max_positions,
        num_kv_blocks, kv_type;
    float eps, scale;
    const float *embed;     /* [vocab][hidden], or NULL: token rows are read out of embed_blocks */
    wp_matrix embed_blocks; /* the table as packed weights (the tied head's, or the checkpoint's Q8_0 blocks) */
    const float *norm;      /* [hidden] */
    const float *rope;
    const wp_layer *layers;
    wp_matrix head;
    int32_t attention; /* WP_ATTN_*: how a chunk's rows attend */
} wp_model;

/* Attention of a chunk's rows: fp32 products over the cache (exact up to summation order), or, for a model with
   int8 activations over a bf16 cache, bf16 products on AMX tiles where the CPU has them (attention_amx.h). */
enum { WP_ATTN_F32 = 0, WP_ATTN_BF16 = 1 };

/* Kernels the compiler must inline: their shape parameters become constants. */
#define AI static inline __attribute__((always_inline))

/* Rows of per-row work (norms, RoPE, SiLU, residuals) are split over the threads when there are many
   (a prompt chunk); a few decode rows are not worth a parallel region. */
#define PAR_ROWS 16

/* IEEE half -> float, for the portable path (the SIMD path uses F16C). */
static inline float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            uint32_t m = man;
            do {
                e++;
                m <<= 1;
            } while (!(m & 1024));
            bits = sign | (uint32_t)(127 - 15 - e) << 23 | (m & 1023) << 13;
        }
    } else if (exp == 31) {
        bits = sign | 0x7F800000u | man << 13;
    } else {
        bits = sign | (exp + 127 - 15) << 23 | man << 13;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline float load_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#ifdef WP_SIMD
    return _cvtsh_ss(h);
#else
    return half_to_float(h);
#endif
}

#ifdef WP_SIMD
/* Pins a value to a register (`__asm__("" : PIN(v))`): any of the 32 with AVX-512 ("v"), of the 16 AVX2 ones ("x")
   otherwise; GCC can then neither spill a sum nor fold a load meant for several multiply-adds into each of them. */
#ifdef __AVX512F__
#define PIN(v) "+v"(v)
#else
#define PIN(v) "+x"(v)
#endif

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

#ifdef WP_SIMD
/* exp(x) for 8 floats: Cephes' polynomial (about 1 ulp over the range softmax and SiLU use). */
static inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    const __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    const __m256 z = _mm256_mul_ps(x, x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_add_ps(_mm256_fmadd_ps(y, z, x), _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
#endif
