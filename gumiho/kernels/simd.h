// Helpers shared by the kernels of this folder (each built as its own extension; kernels/__init__.py hashes this
// header with each source, so a change here rebuilds every one).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <c10/util/BFloat16.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

// bf16 rows as torch converts them (c10::BFloat16, which the scalar tails use): widening to fp32 is exact;
// narrowing rounds to nearest, ties to even, and makes any NaN 0x7fc0. The vector loops do c10's arithmetic lane by
// lane, so a row comes out the same whatever its length or the instruction set.
inline void from_bf16_row(const uint16_t* x, int64_t n, float* out) {
    int64_t i = 0;
#if defined(__AVX2__)
    for (; i + 8 <= n; i += 8) {
        const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_slli_epi32(wide, 16));
    }
#endif
    for (; i < n; ++i) out[i] = static_cast<float>(c10::BFloat16(x[i], c10::BFloat16::from_bits()));
}

inline void to_bf16_row(const float* x, int64_t n, uint16_t* out) {
    int64_t i = 0;
#if defined(__AVX2__)
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), nan = _mm256_set1_epi32(0x7fc0);
    for (; i + 16 <= n; i += 16) {
        __m256i halves[2];
        for (int j = 0; j < 2; ++j) {
            const __m256 v = _mm256_loadu_ps(x + i + 8 * j);
            const __m256i bits = _mm256_castps_si256(v);
            const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), one);
            const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(bias, odd)), 16);
            halves[j] = _mm256_blendv_epi8(rounded, nan, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
        }
        // packus works within 128-bit lanes: put the eight pairs back in order
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(halves[0], halves[1]), 0xd8);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), packed);
    }
#endif
    for (; i < n; ++i) out[i] = c10::BFloat16(x[i]).x;
}

// fn(std::integral_constant<int, R>{}) with R = rows, 1 to 8 (more count as 8): a kernel templated on its number of
// input rows, called for a run-time count.
template <typename F>
inline void with_rows(int64_t rows, const F& fn) {
    switch (rows) {
        case 1: fn(std::integral_constant<int, 1>{}); break;
        case 2: fn(std::integral_constant<int, 2>{}); break;
        case 3: fn(std::integral_constant<int, 3>{}); break;
        case 4: fn(std::integral_constant<int, 4>{}); break;
        case 5: fn(std::integral_constant<int, 5>{}); break;
        case 6: fn(std::integral_constant<int, 6>{}); break;
        case 7: fn(std::integral_constant<int, 7>{}); break;
        default: fn(std::integral_constant<int, 8>{}); break;
    }
}

// A buffer of at least n T's that the calling thread keeps between calls (Tag tells apart two of one type). Its
// data pointer is what a parallel_for's lambda must use: named there, a thread_local is each worker's own.
template <typename T, int Tag = 0>
T* kept_buffer(size_t n) {
    thread_local std::vector<T> buffer;
    if (buffer.size() < n) buffer.resize(n);
    return buffer.data();
}

// One input row rounded to 8 bits per block of 32 (llama.cpp's Q8 activations): xq [K] int8 in [-127, 127], the
// block's scale dx = absmax / 127 and, where `sx` is given, dx times the block's sum of xq (for weights with a
// minimum). Each row is rounded alone, so a row's products never depend on the rows beside it.
// With AVX2, a block is four vectors: every operation is the scalar code's, element by element (the absolute
// maximum is exact in any order and skips a NaN as std::max does; the conversion rounds to nearest even, as
// nearbyint does, and gives INT_MIN where the cast does), so both give the same bytes. Scalar, an 800-row prompt's
// rounding took a third of its 4-bit products' time (2-core Zen 5 EPYC).
inline void quantize_row(const float* x, int64_t K, int8_t* xq, float* dx, float* sx = nullptr) {
    constexpr int64_t BLOCK = 32;
    for (int64_t b = 0; b < K / BLOCK; ++b) {
        const float* xb = x + b * BLOCK;
#if defined(__AVX2__)
        __m256 v[4], top = _mm256_setzero_ps();
        const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        for (int i = 0; i < 4; ++i) {
            v[i] = _mm256_loadu_ps(xb + 8 * i);
            top = _mm256_max_ps(_mm256_and_ps(v[i], magnitude), top);  // a NaN in the first operand is skipped
        }
        __m128 half = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
        half = _mm_max_ps(half, _mm_movehl_ps(half, half));
        const float amax = _mm_cvtss_f32(_mm_max_ss(half, _mm_movehdup_ps(half)));
#else
        float amax = 0.f;
        for (int i = 0; i < BLOCK; ++i) amax = std::max(amax, std::fabs(xb[i]));
#endif
        const float d = amax / 127.f, inverse = amax > 0.f ? 127.f / amax : 0.f;
        int32_t sum = 0;
#if defined(__AVX2__)
        __m256i q[4], total = _mm256_setzero_si256();
        for (int i = 0; i < 4; ++i) {
            q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(inverse)));
            q[i] = _mm256_min_epi32(_mm256_max_epi32(q[i], _mm256_set1_epi32(-127)), _mm256_set1_epi32(127));
            total = _mm256_add_epi32(total, q[i]);
        }
        // Packing works within 128-bit lanes: its dwords hold the four vectors' first halves, then their second.
        const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + b * BLOCK),
                            _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        sum = _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1)));
#else
        for (int i = 0; i < BLOCK; ++i) {
            const int32_t q = static_cast<int32_t>(std::nearbyint(xb[i] * inverse));
            xq[b * BLOCK + i] = static_cast<int8_t>(std::clamp(q, -127, 127));
            sum += xq[b * BLOCK + i];
        }
#endif
        dx[b] = d;
        if (sx) sx[b] = d * static_cast<float>(sum);
    }
}

// How a product asks for its weights ahead of their use (int4.py's AHEAD and KEEP, measured at each load):
// `fetch(p)` asks for the cache line `ahead` bytes after p (false where ahead is 0: never). The products ask a few
// kilobytes on: a decode step streams its weights, and hardware prefetchers generally stop at each 4 KB page.
// Where the weights do not fit the last-level cache, non-temporally (locality 0): a weight is read once a forward,
// and a forward streams ~90 MB through the 32 MB L3 of the 2-core Zen 5 EPYC, so the weights asked for this way no
// longer push out what a cycle reuses (the draft layers' weights, the caches, the interpreter's own data): there,
// interleaved in one process against locality 3 over 12 and 18 benchmark prompts, AR 1.00x / 1.03x, Gumiho 1.05x /
// 1.04x, EAGLE-2 1.04x / 1.06x, lookup 1.05x / 1.04x. `keep` asks for them into every level (locality 3) instead:
// where the last-level cache holds the whole model (the 2-core Intel Xeon of family 6, model 207, in a 320 MB L3),
// a step then finds the weights the step before it read there, and its 4-bit products took 3.0 ms against 6.5.
struct Fetch {
    int64_t ahead = 0;
    bool keep = false;
    explicit operator bool() const { return ahead != 0; }
    void operator()(const void* p) const {
        const char* line = static_cast<const char*>(p) + ahead;
        if (keep)
            __builtin_prefetch(line, 0, 3);
        else
            __builtin_prefetch(line, 0, 0);
    }
};

#if defined(__AVX2__) && defined(__FMA__)

// The sum of 8 floats in one fixed order: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
inline float hsum8(__m256 s) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

// Float vectors of 8 lanes (Floats8) or, in a 512-bit build, 16 (Floats16): float code written once for both widths,
// each lane computed by the same operations in either.
struct Floats8 {
    using V = __m256;
    static constexpr int lanes = 8;
    static V set1(float x) { return _mm256_set1_ps(x); }
    static V load(const float* p) { return _mm256_loadu_ps(p); }
    static void store(float* to, V x) { _mm256_storeu_ps(to, x); }
    static V add(V a, V b) { return _mm256_add_ps(a, b); }
    static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
    static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
    static V min(V a, V b) { return _mm256_min_ps(a, b); }
    static V max(V a, V b) { return _mm256_max_ps(a, b); }
    static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
    static V fnmadd(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }
    static V floor(V x) { return _mm256_floor_ps(x); }
    // 2^n for whole numbers n, written straight into the exponent field.
    static V pow2(V n) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
                                                     23));
    }
};

#if defined(__AVX512F__)
struct Floats16 {
    using V = __m512;
    static constexpr int lanes = 16;
    static V set1(float x) { return _mm512_set1_ps(x); }
    static V load(const float* p) { return _mm512_loadu_ps(p); }
    static void store(float* to, V x) { _mm512_storeu_ps(to, x); }
    static V add(V a, V b) { return _mm512_add_ps(a, b); }
    static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
    static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
    static V min(V a, V b) { return _mm512_min_ps(a, b); }
    static V max(V a, V b) { return _mm512_max_ps(a, b); }
    static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
    static V fnmadd(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }
    static V floor(V x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
    static V pow2(V n) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)),
                                                     23));
    }
};
#endif

// exp(x) lane by lane (Cephes' expf: range reduction by ln 2, a degree-5 polynomial); every element goes through
// this same code, tails included (padded), so a value's exp never depends on where it sits, nor on the width.
template <typename F>
inline typename F::V exp_lanes(typename F::V x) {
    x = F::min(F::max(x, F::set1(-87.3f)), F::set1(88.3f));
    const typename F::V fx = F::floor(F::fmadd(x, F::set1(1.44269504088896341f), F::set1(0.5f)));
    x = F::fnmadd(fx, F::set1(0.693359375f), x);
    x = F::fnmadd(fx, F::set1(-2.12194440e-4f), x);
    typename F::V y = F::set1(1.9875691500e-4f);
    for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
        y = F::fmadd(y, x, F::set1(c));
    y = F::fmadd(F::mul(y, x), x, F::add(x, F::set1(1.f)));
    return F::mul(y, F::pow2(fx));
}

inline __m256 exp8(__m256 x) { return exp_lanes<Floats8>(x); }
#endif
