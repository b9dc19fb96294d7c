// Helpers shared by the kernels of this folder (each built as its own extension; kernels/__init__.py hashes this
// header with each source, so a change here rebuilds both).
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

// The sum of 8 floats in one fixed order: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
inline float hsum8(__m256 s) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
#endif
