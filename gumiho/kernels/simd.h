// Helpers shared by the kernels of this folder (each built as its own extension; kernels/__init__.py hashes this
// header with each source, so a change here rebuilds every one).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

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

// One input row rounded to 8 bits per block of 32 (llama.cpp's Q8 activations): xq [K] int8 in [-127, 127], the
// block's scale dx = absmax / 127 and, where `sx` is given, dx times the block's sum of xq (for weights with a
// minimum). Each row is rounded alone, so a row's products never depend on the rows beside it.
inline void quantize_row(const float* x, int64_t K, int8_t* xq, float* dx, float* sx = nullptr) {
    constexpr int64_t BLOCK = 32;
    for (int64_t b = 0; b < K / BLOCK; ++b) {
        const float* xb = x + b * BLOCK;
        float amax = 0.f;
        for (int i = 0; i < BLOCK; ++i) amax = std::max(amax, std::fabs(xb[i]));
        const float d = amax / 127.f, inverse = amax > 0.f ? 127.f / amax : 0.f;
        int32_t sum = 0;
        for (int i = 0; i < BLOCK; ++i) {
            const int32_t q = static_cast<int32_t>(std::nearbyint(xb[i] * inverse));
            xq[b * BLOCK + i] = static_cast<int8_t>(std::clamp(q, -127, 127));
            sum += xq[b * BLOCK + i];
        }
        dx[b] = d;
        if (sx) sx[b] = d * static_cast<float>(sum);
    }
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

// The sum of 8 floats in one fixed order: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
inline float hsum8(__m256 s) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

// exp(x) for 8 floats (Cephes' expf: range reduction by ln 2, a degree-5 polynomial); every element goes through
// this same code, tails included (padded), so a value's exp never depends on where it sits.
inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(_mm256_mul_ps(y, x), x, _mm256_add_ps(x, _mm256_set1_ps(1.f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
#endif

#if defined(__AVX512F__)
// exp8's operations on 16 floats: each element's result is exp8's, bit for bit.
inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
    __m512 fx = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                     _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(_mm512_mul_ps(y, x), x, _mm512_add_ps(x, _mm512_set1_ps(1.f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}
#endif
