// Row-consistent attention for decode steps and tree verification on a CPU (gumiho/kernels/__init__.py).
//
// Each query row's output is computed by the same sequence of float operations whatever the number of rows in the
// call and whatever keys are masked: scores are dot products in a fixed order, the softmax takes its maximum over
// the row's visible keys only, and masked keys enter the sums as exact zeros (x + 0 = x). So a node of a verified
// tree gets, bit for bit, the attention output that a one-token decode step at that position would give, and a
// path whose matrix products are row-consistent too (int4.py) makes greedy speculation equal its AR exactly.
//
// The cache holds fp32 or fp16 keys and values (T below): fp16 halves the bytes a step reads, widened to fp32 as
// they are loaded, so the arithmetic is the same.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "amx.h"
#include "simd.h"

namespace {

using Half = at::Half;

#if defined(__AVX2__) && defined(__FMA__)
// A vector's worth of cache entries (fp32 or fp16) as fp32.
inline __m256 widen(Floats8, const float* p) { return _mm256_loadu_ps(p); }
inline __m256 widen(Floats8, const Half* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
#else
struct Floats8 {  // plain C++: the weighted sums' slices of 16 outputs
    static constexpr int lanes = 8;
};
#endif

// The 512-bit build (AVX-512 F and BW, where the processor has them; kernels/__init__.py's WIDE) does the same float
// operations per score, per exp and per output as the 256-bit code, in the same order, only more of them per
// instruction: its numbers are the 256-bit build's, bit for bit (tests/test_kernels.py builds both and compares).
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define GUMIHO_WIDE 1
inline __m512 widen(Floats16, const float* p) { return _mm512_loadu_ps(p); }
inline __m512 widen(Floats16, const Half* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
#endif

constexpr int64_t KEY_CHUNK = 64;
// Query rows per KV head (R: a group's members times the new tokens) from which a call's scores take key tiles (a
// chunk's keys transposed once for every row, `tile_scores`) and its weighted sums whole rows (`weighted_rows`).
// Both give the numbers of the paths they replace, bit for bit, so the choice may follow the row count. On the 2-core
// Zen 5 EPYC, CNN/DM prompts (450-1,200 cached tokens), median verification of 3 / 4 / 6 / 7 tokens 7.0 / 7.4 / 9.1 /
// 11.0 -> 6.4 / 6.9 / 8.3 / 10.1 ms (Gumiho's trees); at 2 tokens (6 rows) no gain, and a one-token step (3 rows)
// unchanged: there, transposing the keys costs what it saves.
constexpr int64_t TREE_ROWS = 9;
// A call splits its work across torch's threads from this many multiply-adds (B * H * R * total * d). Measured on
// the 2-core Zen 4 EPYC with each layer's cache cold, as in a forward: splitting paid from about 170k (a one-token
// step at 300 keys: 25 -> 17 us; at 1,000 keys 135 -> 80 us, where one core cannot draw the keys from memory fast
// enough) and cost a little below about 150k (a parallel region's start outweighs the work).
constexpr int64_t SPLIT_WORK = int64_t(1) << 17;

// fn(begin, end) over [0, units): across torch's threads for a call of at least SPLIT_WORK multiply-adds, else in the
// calling thread with no parallel region at all.
template <typename F>
inline void split(int64_t units, int64_t work, const F& fn) {
    if (work < SPLIT_WORK || at::get_num_threads() < 2)
        fn(0, units);
    else
        at::parallel_for(0, units, 1, fn);
}

// out[r] = sum_i q[r][i] * key[i] for ROWS query rows of length d (a multiple of 16 on AVX2), each dot product
// always computed by the same operations in the same order (two partial sums over strides of 16, then a fixed
// horizontal sum) whatever the number of rows: the loads of `key` are shared, the arithmetic is not.
template <int ROWS, typename T>
inline void dots(const float* q, const T* key, int64_t d, float* out) {
#if defined(__AVX2__) && defined(__FMA__)
    __m256 s0[ROWS], s1[ROWS];
    for (int r = 0; r < ROWS; ++r) s0[r] = s1[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 16) {
        const __m256 k0 = widen(Floats8{}, key + i), k1 = widen(Floats8{}, key + i + 8);
        for (int r = 0; r < ROWS; ++r) {
            s0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * d + i), k0, s0[r]);
            s1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * d + i + 8), k1, s1[r]);
        }
    }
    for (int r = 0; r < ROWS; ++r) out[r] = hsum8(_mm256_add_ps(s0[r], s1[r]));
#else
    for (int r = 0; r < ROWS; ++r) {
        float acc = 0.f;
        for (int64_t i = 0; i < d; ++i) acc += q[r * d + i] * static_cast<float>(key[i]);
        out[r] = acc;
    }
#endif
}

template <typename T>
inline void dots(const float* q, int64_t rows, const T* key, int64_t d, float* out) {
    switch (rows) {
        case 1: dots<1>(q, key, d, out); break;
        case 2: dots<2>(q, key, d, out); break;
        case 3: dots<3>(q, key, d, out); break;
        default: dots<4>(q, key, d, out); break;
    }
}

#ifdef GUMIHO_WIDE
// scale * (q . key) for `blocks` blocks of 16 consecutive fp32 keys (key rows `kstride` apart) and one query row of
// D dimensions, into out[0 .. 16 * blocks). Each dot product is the 256-bit `dots`' own: lane l of a 16-lane sum
// takes dimensions l, l + 16, ... in order (`dots`' two 8-lane sums side by side), then lanes l and l + 8, l and
// l + 4, l and l + 2, l and l + 1 are added as hsum8 adds them; here those additions run for 16 keys at once, the
// keys' sums moved between lanes by shuffles (which move values, never round them).
template <int D>
inline void scores16(const float* q, const float* key, int64_t kstride, int64_t blocks, float scale, float* out) {
    constexpr int C = D / 16;
    __m512 qc[C];
    for (int c = 0; c < C; ++c) qc[c] = _mm512_loadu_ps(q + 16 * c);
    const __m512 vscale = _mm512_set1_ps(scale);
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    for (int64_t block = 0; block < blocks; ++block, key += 16 * kstride, out += 16) {
        __m512 acc[16];
        for (int k = 0; k < 16; ++k) {
            acc[k] = _mm512_fmadd_ps(qc[0], _mm512_loadu_ps(key + k * kstride), _mm512_setzero_ps());
            for (int c = 1; c < C; ++c)
                acc[k] = _mm512_fmadd_ps(qc[c], _mm512_loadu_ps(key + k * kstride + 16 * c), acc[k]);
        }
        __m512 x[8], z[4], u[2];
        for (int k = 0; k < 8; ++k)  // lanes l + l + 8: keys 2k, 2k + 1 in the low, high 256 bits
            x[k] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * k], acc[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_f32x4(acc[2 * k], acc[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
        for (int m = 0; m < 4; ++m)  // + l + 4: keys 4m .. 4m + 3, one per 128 bits
            z[m] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * m], x[2 * m + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(x[2 * m], x[2 * m + 1], _MM_SHUFFLE(3, 1, 3, 1)));
        for (int p = 0; p < 2; ++p)  // + l + 2
            u[p] = _mm512_add_ps(_mm512_shuffle_ps(z[2 * p], z[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(z[2 * p], z[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
        // + l + 1: element 4a + b now holds key a + 4b; put key k at element k.
        const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                          _mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
        _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_permutexvar_ps(order, sums), vscale));
    }
}

// The 16 x 16 block r (row k: 16 dimensions of key k) transposed in place (row i: dimension i of the 16 keys).
inline void transpose16(__m512 r[16]) {
    __m512 t[16], u[16], v[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    const auto lo = [](__m512 a, __m512 b) {
        return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
    };
    const auto hi = [](__m512 a, __m512 b) {
        return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
    };
    for (int i = 0; i < 4; ++i) {
        u[4 * i] = lo(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = hi(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = lo(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = hi(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int h = 0; h < 2; ++h) {  // rows 0-7 (h = 0) and 8-15 of the source
        for (int i = 0; i < 4; ++i) {
            v[8 * h + i] = _mm512_shuffle_f32x4(u[8 * h + i], u[8 * h + 4 + i], 0x88);
            v[8 * h + 4 + i] = _mm512_shuffle_f32x4(u[8 * h + i], u[8 * h + 4 + i], 0xdd);
        }
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm512_shuffle_f32x4(v[i], v[8 + i], 0x88);
        r[8 + i] = _mm512_shuffle_f32x4(v[i], v[8 + i], 0xdd);
        r[4 + i] = _mm512_shuffle_f32x4(v[4 + i], v[12 + i], 0x88);
        r[12 + i] = _mm512_shuffle_f32x4(v[4 + i], v[12 + i], 0xdd);
    }
}

// 16 numbers into a tile, as fp32 or (values that came from fp16 keys, so exactly) as fp16.
inline void put16(float* to, __m512 x) { _mm512_storeu_ps(to, x); }
inline void put16(Half* to, __m512 x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(to), _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}

// `blocks` blocks of 16 keys (key rows `kstride` apart, fp32 or fp16), each as a tile of D x 16 numbers (U: fp32,
// or fp16 for an fp16 cache's kept tiles): tile[block * D * 16 + i * 16 + k] = key 16 * block + k's dimension i.
template <int D, typename T, typename U>
inline void key_tiles(const T* key, int64_t kstride, int64_t blocks, U* tile) {
    for (int64_t block = 0; block < blocks; ++block, key += 16 * kstride, tile += D * 16) {
        for (int c = 0; c < D / 16; ++c) {
            __m512 r[16];
            for (int k = 0; k < 16; ++k) r[k] = widen(Floats16{}, key + k * kstride + 16 * c);
            transpose16(r);
            for (int i = 0; i < 16; ++i) put16(tile + (16 * c + i) * 16, r[i]);
        }
    }
}

// scores16's numbers for ROWS query rows (`qstride` apart) against one tile of 16 keys (key_tiles), into
// out[r * ostride + k]: per key the same operations in the same order (lane partials l over dimensions l, l + 16,
// ..., then (l, l + 8), (l, l + 4), (l, l + 2), (l, l + 1)), with the keys in the lanes instead of the dimensions,
// so that no shuffle sums them, and each tile vector read serves every row.
template <int D, int ROWS, typename U>
inline void tile_scores(const float* q, int64_t qstride, const U* tile, float scale, float* out,
                        int64_t ostride) {
    constexpr int C = D / 16;
    __m512 b[ROWS][4];
    for (int j = 0; j < 4; ++j) {
        __m512 a[ROWS];
        for (int h = 0; h < 2; ++h) {
            const int l = j + 4 * h;
            __m512 p[ROWS], p8[ROWS];
            {
                const __m512 k = widen(Floats16{}, tile + l * 16), k8 = widen(Floats16{}, tile + (l + 8) * 16);
                for (int r = 0; r < ROWS; ++r) {
                    p[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r * qstride + l]), k, _mm512_setzero_ps());
                    p8[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r * qstride + l + 8]), k8, _mm512_setzero_ps());
                }
            }
            for (int c = 1; c < C; ++c) {
                const __m512 k = widen(Floats16{}, tile + (l + 16 * c) * 16);
                const __m512 k8 = widen(Floats16{}, tile + (l + 8 + 16 * c) * 16);
                for (int r = 0; r < ROWS; ++r) {
                    p[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r * qstride + l + 16 * c]), k, p[r]);
                    p8[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r * qstride + l + 8 + 16 * c]), k8, p8[r]);
                }
            }
            for (int r = 0; r < ROWS; ++r) {
                const __m512 sum = _mm512_add_ps(p[r], p8[r]);  // A_l
                if (h == 0)
                    a[r] = sum;
                else
                    b[r][j] = _mm512_add_ps(a[r], sum);  // A_j + A_{j + 4}
            }
        }
    }
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int r = 0; r < ROWS; ++r) {
        const __m512 s = _mm512_add_ps(_mm512_add_ps(b[r][0], b[r][2]), _mm512_add_ps(b[r][1], b[r][3]));
        _mm512_storeu_ps(out + r * ostride, _mm512_mul_ps(s, vscale));
    }
}

// The scores of R query rows (D dimensions each, consecutive) against `blocks` blocks of 16 keys (rows `kstride`
// apart), scaled, into out[r * ostride + k]; `buffer` holds KEY_CHUNK * D floats. A tree's rows (R >= TREE_ROWS)
// read the keys transposed once into tiles for all of them; fewer rows read them as they are, widened to fp32 once
// (an fp16 cache). Both give the same numbers.
// The scores of R query rows (D dimensions each, consecutive) against `blocks` consecutive tiles (key_tiles), into
// out[r * ostride + k], four rows at a time sharing each tile vector.
template <int D, typename U>
void scores_from_tiles(const float* q, int64_t R, const U* tiles, int64_t blocks, float scale, float* out,
                       int64_t ostride) {
    for (int64_t r0 = 0; r0 < R; r0 += 4) {
        with_rows(std::min<int64_t>(4, R - r0), [&](auto count) {
            constexpr int ROWS = decltype(count)::value;
            if constexpr (ROWS <= 4)
                for (int64_t block = 0; block < blocks; ++block)
                    tile_scores<D, ROWS>(q + r0 * D, D, tiles + block * D * 16, scale, out + r0 * ostride + 16 * block,
                                         ostride);
        });
    }
}

template <int D, typename T>
void wide_scores(const float* q, int64_t R, const T* keys, int64_t kstride, int64_t blocks, float scale, float* out,
                 int64_t ostride, float* buffer) {
    if (R >= TREE_ROWS) {
        key_tiles<D>(keys, kstride, blocks, buffer);
        scores_from_tiles<D>(q, R, buffer, blocks, scale, out, ostride);
        return;
    }
    const float* keys32 = buffer;
    int64_t stride32 = D;
    if constexpr (std::is_same_v<T, float>) {
        keys32 = keys;
        stride32 = kstride;
    } else {
        for (int64_t k = 0; k < blocks * 16; ++k)
            for (int64_t i = 0; i < D; i += 16)
                _mm512_storeu_ps(buffer + k * D + i, widen(Floats16{}, keys + k * kstride + i));
    }
    for (int64_t r = 0; r < R; ++r) scores16<D>(q + r * D, keys32, stride32, blocks, scale, out + r * ostride);
}
#endif

// out[r * ostride + i] = sum_j p[r * stride + j] * value[j * vstride + i] for the 2 x F::lanes outputs i of a slice,
// keys j in order, ROWS rows sharing each value slice; and sums[r] = sum_j p[r * stride + j], key by key: the one
// order that a one-token step and every tree node agree on (a masked key adds an exact zero). Per output the same
// multiply-adds whatever the width.
template <typename F, int ROWS, typename T>
inline void weighted_sums(const float* p, int64_t stride, const T* value, int64_t vstride, int64_t total,
                          float* out, int64_t ostride, float* sums) {
    constexpr int W = F::lanes;
    float s[ROWS];
    for (int r = 0; r < ROWS; ++r) s[r] = 0.f;
#if defined(__AVX2__) && defined(__FMA__)
    typename F::V a0[ROWS], a1[ROWS];
    for (int r = 0; r < ROWS; ++r) a0[r] = a1[r] = F::set1(0.f);
    for (int64_t j = 0; j < total; ++j) {
        const typename F::V v0 = widen(F{}, value + j * vstride), v1 = widen(F{}, value + j * vstride + W);
        for (int r = 0; r < ROWS; ++r) {
            const float pj = p[r * stride + j];
            const typename F::V w = F::set1(pj);
            a0[r] = F::fmadd(w, v0, a0[r]);
            a1[r] = F::fmadd(w, v1, a1[r]);
            s[r] += pj;
        }
    }
    for (int r = 0; r < ROWS; ++r) {
        F::store(out + r * ostride, a0[r]);
        F::store(out + r * ostride + W, a1[r]);
    }
#else
    for (int r = 0; r < ROWS; ++r) {
        float acc[2 * W] = {0.f};
        for (int64_t j = 0; j < total; ++j) {
            for (int i = 0; i < 2 * W; ++i) acc[i] += p[r * stride + j] * static_cast<float>(value[j * vstride + i]);
            s[r] += p[r * stride + j];
        }
        for (int i = 0; i < 2 * W; ++i) out[r * ostride + i] = acc[i];
    }
#endif
    for (int r = 0; r < ROWS; ++r) sums[r] = s[r];
}

#if defined(__AVX2__) && defined(__FMA__)
// The visible lanes of keys seen[j .. j + lanes - 1] (all-ones lanes, or a bit mask in the 512-bit build); `x` where
// visible, else `otherwise` (`keep`), or 0 (`zero_unless`); and the largest lane.
inline __m256 visible(Floats8, const bool* seen) {
    int64_t bytes;
    memcpy(&bytes, seen, 8);
    const __m256i wide = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bytes));
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(wide, _mm256_setzero_si256()));
}
inline __m256 keep(Floats8, __m256 x, __m256 lanes, __m256 otherwise) { return _mm256_blendv_ps(otherwise, x, lanes); }
inline __m256 zero_unless(Floats8, __m256 lanes, __m256 x) { return _mm256_and_ps(x, lanes); }
inline float largest(Floats8, __m256 x) {
    alignas(32) float lane[8];
    _mm256_store_ps(lane, x);
    return *std::max_element(lane, lane + 8);
}
#endif
#ifdef GUMIHO_WIDE
inline __mmask16 visible(Floats16, const bool* seen) {
    return _mm_cmpneq_epi8_mask(_mm_loadu_si128(reinterpret_cast<const __m128i*>(seen)), _mm_setzero_si128());
}
inline __m512 keep(Floats16, __m512 x, __mmask16 lanes, __m512 otherwise) {
    return _mm512_mask_mov_ps(otherwise, lanes, x);
}
inline __m512 zero_unless(Floats16, __mmask16 lanes, __m512 x) { return _mm512_maskz_mov_ps(lanes, x); }
inline float largest(Floats16, __m512 x) { return _mm512_reduce_max_ps(x); }
#endif

// row[j] = visible ? exp(row[j] - top) : 0 for j < total, top being the maximum over the visible keys. The exps
// are computed a vector at a time, a tail through a padded vector, so a value's exp never depends on where it sits
// (nor on the vector's width: `exp_lanes`).
template <typename F>
inline void softmax_numerators(float* row, const bool* seen, int64_t total) {
#if defined(__AVX2__) && defined(__FMA__)
    constexpr int W = F::lanes;
    alignas(64) float pad[W];
    bool pad_seen[W];
    const typename F::V ninf = F::set1(-INFINITY);
    const int64_t full = total / W * W;
    typename F::V best = ninf;
    for (int64_t j = 0; j < full; j += W)
        best = F::max(best, keep(F{}, F::load(row + j), visible(F{}, seen + j), ninf));
    float top = largest(F{}, best);
    for (int64_t j = full; j < total; ++j)
        if (seen[j] && row[j] > top) top = row[j];
    const typename F::V vtop = F::set1(top);
    for (int64_t j = 0; j < total; j += W) {
        const bool tail = j + W > total;
        float* at = tail ? pad : row + j;
        const bool* mask = tail ? pad_seen : seen + j;
        if (tail) {
            for (int64_t i = 0; i < W; ++i) {
                pad[i] = j + i < total ? row[j + i] : 0.f;
                pad_seen[i] = j + i < total && seen[j + i];
            }
        }
        F::store(at, zero_unless(F{}, visible(F{}, mask), exp_lanes<F>(F::sub(F::load(at), vtop))));
        if (tail)
            for (int64_t i = 0; j + i < total; ++i) row[j + i] = pad[i];
    }
#else
    float top = -INFINITY;
    for (int64_t j = 0; j < total; ++j)
        if (seen[j] && row[j] > top) top = row[j];
    for (int64_t j = 0; j < total; ++j) row[j] = seen[j] ? std::exp(row[j] - top) : 0.f;
#endif
}

#ifdef GUMIHO_WIDE
// weighted_sums' numbers for ROWS rows over all 64 output dimensions at once: each value row widened once for the
// rows, each p_j broadcast once per row for its four vectors (weighted_sums over two slices does both twice).
template <int ROWS, typename T>
inline void weighted_rows(const float* p, int64_t stride, const T* value, int64_t vstride, int64_t total, float* out,
                          int64_t ostride, float* sums) {
    __m512 acc[ROWS][4];
    float s[ROWS];
    for (int r = 0; r < ROWS; ++r) {
        s[r] = 0.f;
        for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
    }
    for (int64_t j = 0; j < total; ++j) {
        __m512 v[4];
        for (int c = 0; c < 4; ++c) v[c] = widen(Floats16{}, value + j * vstride + 16 * c);
        for (int r = 0; r < ROWS; ++r) {
            const float pj = p[r * stride + j];
            const __m512 w = _mm512_set1_ps(pj);
            for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_ps(w, v[c], acc[r][c]);
            s[r] += pj;
        }
    }
    for (int r = 0; r < ROWS; ++r) {
        for (int c = 0; c < 4; ++c) _mm512_storeu_ps(out + r * ostride + 16 * c, acc[r][c]);
        sums[r] = s[r];
    }
}
#endif

}  // namespace

// An fp16 cache's keys kept transposed (key_tiles, fp16) for a layer, from one call to the next: `data` [B, KV,
// capacity / 16, d * 16] (strides `b_stride`, `h_stride`), of which the first `*ready` keys are up to date. A call
// transposes the keys committed since (those before its `past`, in whole blocks of 16) and scores every key before
// them from the tiles, for calls of TREE_ROWS rows or more (those that transposed a chunk's keys for themselves):
// a tree then never transposes the same keys again. Fewer rows score from the keys as before, and leave the tiles
// as they are (a run of decode steps builds none); from fp16 tiles they were slower (2-core Zen 4 EPYC, 900-1,100
// cached tokens, a forward with 1 / 2 new tokens 6.72 / 7.68 -> 6.75 / 7.65 ms and 7.04 / 8.41 -> 7.23 / 8.70). The
// cache's owner (llama.StaticCache) lowers `*ready` whenever it changes keys before it. Scores from tiles are the
// other paths' numbers, bit for bit.
struct KeptTiles {
    Half* data = nullptr;
    int64_t b_stride = 0, h_stride = 0;
    int64_t* ready = nullptr;
    int64_t width = 0;  // numbers a block of 16 keys holds: d * 16, or twice that for the AMX path's (amx_attention)
};

#if defined(GUMIHO_WIDE) && defined(GUMIHO_AMX_TILES)
#define GUMIHO_AMX 1
namespace {
// Decode steps and trees in bf16 products on AMX tiles (`amx_attention`): the queries, the cache's fp16 keys and
// values, and the softmax's numerators rounded to bf16 (to nearest, ties to even), every product summed in fp32.
// A row's numbers depend only on its own query and on the keys and values it sees, in order, never on their slots,
// on the other rows, or on how many there are: so a tree node still gets, bit for bit, the output of a one-token step
// at its position (which sees the same keys at consecutive slots), and greedy speculation on this path equals its AR.
//   - Scores: S = Q K^T, a key's score from its 64 dimensions in two tile products, whatever block it sits in.
//   - The weighted sums run over blocks of 32 keys *counted along the row's visible keys*: the keys before the last
//     whole block under `past` (seen by every row of a tree, at the slots a one-token step has them) as one product
//     for all rows; the rest, per token, gathered from the slots it sees into blocks of their own. A block is the
//     same 32 keys for a tree node and for the step, whichever way it was gathered; and what a row does not see
//     enters as an exact zero.
//   - The sums of the numerators go in the same order: 16 lanes by visible position, blocks in turn.
// The cache keeps each committed block's key and value tiles (KeptTiles of twice the width), so that a call converts
// only its newest keys. On the 2-core Intel Xeon with AMX (model 167), 30 layers over 800 cached tokens, in a forward,
// 1 / 2 / 4 / 8 new tokens: 1.74 / 2.23 / 2.89 / 4.38 ms in fp32, 1.35 / 1.32 / 1.54 / 2.30 on the tiles (converting
// every key in every call instead: 2.32 / 2.27 / 2.56 / 3.26). The load measures which one a machine takes
// (llama.LeanLlama._amx_rows_pay). A head other than 64 dimensions, a group wider than a tile, or an fp32 cache take
// the fp32 path.
constexpr int64_t AMX_ROWS = 16;  // query rows a tile holds
constexpr int64_t AMX_KEYS = 32;  // keys a probability tile's row, and a value tile, covers

// 32 floats (lo: the first 16) as 32 bf16, rounded to nearest, ties to even.
inline __m512i bf16x32(__m512 lo, __m512 hi) { return (__m512i)_mm512_cvtne2ps_pbh(hi, lo); }
// 16 bf16 (the low or high half of such a vector) as floats, exactly.
inline __m512 low_floats(__m512i x) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(x)), 16));
}
inline __m512 high_floats(__m512i x) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(x, 1)), 16));
}

// The 16 keys at key[0], key[kstride], ... (the first `count`; zeros after) as the two B tiles of Q K^T:
// tile[half * 512 + i * 32 + 2k + e] = dimension 32 half + 2i + e of key k, in bf16.
inline void key_pair_tiles(const Half* key, int64_t kstride, int64_t count, uint16_t* tile) {
    __m512 low[16], high[16];
    for (int k = 0; k < 16; ++k) {
        if (k >= count) {
            low[k] = high[k] = _mm512_setzero_ps();
            continue;
        }
        const Half* row = key + k * kstride;
        low[k] = _mm512_castsi512_ps(bf16x32(widen(Floats16{}, row), widen(Floats16{}, row + 16)));
        high[k] = _mm512_castsi512_ps(bf16x32(widen(Floats16{}, row + 32), widen(Floats16{}, row + 48)));
    }
    transpose16(low);  // moves 32-bit pairs, never rounds them
    transpose16(high);
    for (int i = 0; i < 16; ++i) {
        _mm512_storeu_ps(tile + i * 32, low[i]);
        _mm512_storeu_ps(tile + 512 + i * 32, high[i]);
    }
}

// The 32 value rows rows[0 .. 31] (nullptr: zeros) as the four B tiles of P V, tiles 0-1 at `low`, 2-3 at `high`:
// tile c's [i * 32 + 2m + e] = dimension 16c + m of value row 2i + e, in bf16.
inline void value_pair_tiles(const Half* const* rows, uint16_t* low, uint16_t* high) {
    alignas(64) static constexpr uint16_t order[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                                       8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i interleave = _mm512_load_si512(order);
    for (int i = 0; i < 16; ++i) {
        const Half* a = rows[2 * i];
        const Half* b = rows[2 * i + 1];
        for (int c = 0; c < 4; ++c) {
            const __m512 x = a ? widen(Floats16{}, a + 16 * c) : _mm512_setzero_ps();
            const __m512 y = b ? widen(Floats16{}, b + 16 * c) : _mm512_setzero_ps();
            uint16_t* tile = c < 2 ? low + c * 512 : high + (c - 2) * 512;
            _mm512_storeu_si512(tile + i * 32, _mm512_permutexvar_epi16(interleave, bf16x32(x, y)));
        }
    }
}

// A row's numerators p[0 .. 31] as a bf16 row of a probability tile, their sum added to `sum` 16 lanes at a time.
inline void probability_row(const float* p, uint16_t* row, __m512& sum) {
    const __m512i x = bf16x32(_mm512_loadu_ps(p), _mm512_loadu_ps(p + 16));
    _mm512_storeu_si512(row, x);
    sum = _mm512_add_ps(sum, low_floats(x));
    sum = _mm512_add_ps(sum, high_floats(x));
}

// Per thread: every buffer a call's head needs, grown as needed and never shrunk.
struct AmxBuffers {
    std::vector<uint16_t> keys, values, queries, probs, tail;
    std::vector<float> scores, gathered;
    std::vector<int64_t> slots;
    std::vector<const Half*> rows;
    template <typename T>
    static T* sized(std::vector<T>& v, int64_t n) {
        if (static_cast<int64_t>(v.size()) < n) v.resize(n);
        return v.data();
    }
};

}  // namespace

// `attention_of`'s outputs for an fp16 cache and heads of 64 dimensions, in bf16 tile products (see above).
torch::Tensor amx_attention(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& values,
                            const bool* vp, int64_t n, int64_t past, double scale, KeptTiles kept) {
    const int64_t B = q.size(0), H = q.size(1), R = q.size(2), D = 64, total = past + n, G = R / n;
    const int64_t common = past / AMX_KEYS * AMX_KEYS;  // keys every row sees at a one-token step's slots
    // Kept tiles (the cache's, where given): per block of 16 keys, its two key tiles (1,024 bf16) and half of its
    // block of 32's value tiles; those of keys [0, ready) are up to date, and this call brings them up to `tiled`.
    const int64_t tiled = kept.data != nullptr ? past / 16 * 16 : 0;
    const int64_t from = kept.data != nullptr ? std::min(*kept.ready, tiled) : 0;
    const int64_t key_blocks = (total + 15) / 16, stride = key_blocks * 16;
    // A tile takes whole tokens: its rows are (token, member) ordered, where q's are (member, token).
    const int64_t group = AMX_ROWS / G * G;
    const auto row_of = [&](int64_t v) { return v % G * n + v / G; };
    auto out = torch::empty_like(q);
    const float* qp = q.data_ptr<float>();
    const Half* kp = keys.data_ptr<Half>();
    const Half* valp = values.data_ptr<Half>();
    float* op = out.data_ptr<float>();
    const int64_t ks0 = keys.stride(0), ks1 = keys.stride(1), ks2 = keys.stride(2);
    const int64_t vs0 = values.stride(0), vs1 = values.stride(1), vs2 = values.stride(2);
    const float fscale = static_cast<float>(scale);
    split(B * H, B * H * R * total * D, [&](int64_t begin, int64_t end) {
        static thread_local AmxBuffers buffers;
        AmxBuffers& buf = buffers;
        uint16_t* scratch_keys = AmxBuffers::sized(buf.keys, key_blocks * 1024);
        uint16_t* scratch_values = AmxBuffers::sized(buf.values, common / AMX_KEYS * 2048 + 1);
        uint16_t* qa = AmxBuffers::sized(buf.queries, AMX_ROWS * D);
        uint16_t* probs = AmxBuffers::sized(buf.probs, AMX_ROWS * common + 1);
        uint16_t* tail = AmxBuffers::sized(buf.tail, AMX_ROWS * AMX_KEYS + 2048);
        float* scores = AmxBuffers::sized(buf.scores, AMX_ROWS * stride);
        float* gathered = AmxBuffers::sized(buf.gathered, AMX_KEYS);
        int64_t* slots = AmxBuffers::sized(buf.slots, total - common + AMX_KEYS);
        const Half** rows = AmxBuffers::sized(buf.rows, AMX_KEYS);
        alignas(64) float acc[AMX_ROWS * 64];
        __m512 sums[AMX_ROWS];
        amx::configure();
        for (int64_t bh = begin; bh < end; ++bh) {
            const int64_t b = bh / H, h = bh % H;
            const Half* key = kp + b * ks0 + h * ks1;
            const Half* value = valp + b * vs0 + h * vs1;
            uint16_t* own = kept.data != nullptr
                ? reinterpret_cast<uint16_t*>(kept.data + b * kept.b_stride + h * kept.h_stride) : nullptr;
            // block b's key tiles, and value tiles c = 0-1 (`low`) and 2-3 (`high`) of block of 32 b
            const auto key_tiles_of = [&](int64_t block) {
                return block < tiled / 16 ? own + block * 2048 : scratch_keys + block * 1024;
            };
            const auto value_tiles_of = [&](int64_t block, bool high) {
                return own != nullptr ? own + (2 * block + high) * 2048 + 1024
                                      : scratch_values + block * 2048 + high * 1024;
            };
            for (int64_t block = from / 16; block < key_blocks; ++block)  // from = 0 where none are kept
                key_pair_tiles(key + block * 16 * ks2, ks2, std::min<int64_t>(16, total - block * 16),
                               key_tiles_of(block));
            for (int64_t block = from / AMX_KEYS; block < common / AMX_KEYS; ++block) {
                for (int k = 0; k < AMX_KEYS; ++k) rows[k] = value + (block * AMX_KEYS + k) * vs2;
                value_pair_tiles(rows, value_tiles_of(block, false), value_tiles_of(block, true));
            }
            for (int64_t v0 = 0; v0 < R; v0 += group) {
                const int64_t count = std::min(group, R - v0);
                // Q as two A tiles (dimensions 0-31, 32-63), bf16; rows past `count` zero.
                for (int64_t r = 0; r < AMX_ROWS; ++r) {
                    for (int c = 0; c < 2; ++c) {
                        const float* query = qp + (bh * R + row_of(v0 + r)) * D + 32 * c;
                        const __m512i x = r < count ? bf16x32(_mm512_loadu_ps(query), _mm512_loadu_ps(query + 16))
                                                    : _mm512_setzero_si512();
                        _mm512_storeu_si512(qa + r * D + 32 * c, x);
                    }
                }
                _tile_loadd(0, qa, D * 2);
                _tile_loadd(1, qa + 32, D * 2);
                for (int64_t block = 0; block < key_blocks; ++block) {  // every score: zero, dims 0-31, 32-63
                    _tile_zero(2);
                    _tile_loadd(3, key_tiles_of(block), 64);
                    _tile_dpbf16ps(2, 0, 3);
                    _tile_loadd(4, key_tiles_of(block) + 512, 64);
                    _tile_dpbf16ps(2, 1, 4);
                    _tile_stored(2, scores + block * 16, stride * 4);
                }
                // Each row's numerators; the common keys' as one probability tile per 32 keys.
                for (int64_t r = 0; r < count; ++r) {
                    float* row = scores + r * stride;
                    const __m512 vscale = _mm512_set1_ps(fscale);
                    for (int64_t j = 0; j < stride; j += 16) _mm512_storeu_ps(row + j, _mm512_mul_ps(
                        _mm512_loadu_ps(row + j), vscale));
                    softmax_numerators<Floats16>(row, vp + (b * n + (v0 + r) / G) * total, total);
                    sums[r] = _mm512_setzero_ps();
                    for (int64_t j = 0; j < common; j += AMX_KEYS)
                        probability_row(row + j, probs + r * common + j, sums[r]);
                }
                _tile_zero(4);
                _tile_zero(5);
                _tile_zero(6);
                _tile_zero(7);
                for (int64_t block = 0; block < common / AMX_KEYS; ++block) {
                    _tile_loadd(0, probs + block * AMX_KEYS, common * 2);
                    const uint16_t* low = value_tiles_of(block, false);
                    const uint16_t* high = value_tiles_of(block, true);
                    _tile_loadd(1, low, 64);
                    _tile_dpbf16ps(4, 0, 1);
                    _tile_loadd(2, low + 512, 64);
                    _tile_dpbf16ps(5, 0, 2);
                    _tile_loadd(3, high, 64);
                    _tile_dpbf16ps(6, 0, 3);
                    _tile_loadd(1, high + 512, 64);
                    _tile_dpbf16ps(7, 0, 1);
                }
                // The rest, per token: the keys it sees from `common` on, gathered into blocks of 32 in order.
                for (int64_t first = 0; first < count; first += G) {
                    const bool* seen = vp + (b * n + (v0 + first) / G) * total;
                    int64_t m = 0;
                    for (int64_t j = common; j < total; ++j)
                        if (seen[j]) slots[m++] = j;
                    for (int64_t k0 = 0; k0 < m; k0 += AMX_KEYS) {
                        const int64_t here = std::min(AMX_KEYS, m - k0);
                        for (int k = 0; k < AMX_KEYS; ++k) rows[k] = k < here ? value + slots[k0 + k] * vs2 : nullptr;
                        uint16_t* vtail = tail + AMX_ROWS * AMX_KEYS;
                        value_pair_tiles(rows, vtail, vtail + 1024);
                        std::memset(tail, 0, AMX_ROWS * AMX_KEYS * 2);
                        for (int64_t r = first; r < first + G; ++r) {
                            const float* row = scores + r * stride;
                            for (int k = 0; k < AMX_KEYS; ++k) gathered[k] = k < here ? row[slots[k0 + k]] : 0.f;
                            probability_row(gathered, tail + r * AMX_KEYS, sums[r]);
                        }
                        _tile_loadd(0, tail, AMX_KEYS * 2);
                        _tile_loadd(1, vtail, 64);
                        _tile_dpbf16ps(4, 0, 1);
                        _tile_loadd(2, vtail + 512, 64);
                        _tile_dpbf16ps(5, 0, 2);
                        _tile_loadd(3, vtail + 1024, 64);
                        _tile_dpbf16ps(6, 0, 3);
                        _tile_loadd(1, vtail + 1536, 64);
                        _tile_dpbf16ps(7, 0, 1);
                    }
                }
                _tile_stored(4, acc, 64 * 4);  // tile 4 + c: dimensions 16c .. 16c + 15 of every row
                _tile_stored(5, acc + 16, 64 * 4);
                _tile_stored(6, acc + 32, 64 * 4);
                _tile_stored(7, acc + 48, 64 * 4);
                for (int64_t r = 0; r < count; ++r) {
                    const float sum = _mm512_reduce_add_ps(sums[r]);
                    float* o = op + (bh * R + row_of(v0 + r)) * D;
                    for (int64_t d = 0; d < D; ++d) o[d] = sum > 0.f ? acc[r * 64 + d] / sum : 0.f;
                }
            }
        }
        _tile_release();
    });
    if (kept.data != nullptr) *kept.ready = tiled;
    return out;
}
#endif

template <typename T>
torch::Tensor attention_of(torch::Tensor q, torch::Tensor keys, torch::Tensor values, torch::Tensor visible,
                           int64_t n, int64_t past, double scale, KeptTiles kept = {}) {
    q = q.contiguous();
    const int64_t B = q.size(0), H = q.size(1), R = q.size(2), d = q.size(3), total = past + n;
    TORCH_CHECK(d % 16 == 0, "attention: head size must be a multiple of 16");
    TORCH_CHECK(R % n == 0 && keys.size(2) >= total && values.size(2) >= total, "attention: inconsistent shapes");
    const bool causal = visible.numel() == 0;
    torch::Tensor vis;
    if (!causal) {
        vis = visible.to(torch::kBool).contiguous();
        TORCH_CHECK(vis.size(0) == B && vis.size(1) == n && vis.size(2) == total,
                    "attention: visible is not [B, n, total]");
    }
    const bool* vp = causal ? nullptr : vis.data_ptr<bool>();
    auto out = torch::empty_like(q);
    auto probs = torch::empty({B, H, R, total}, q.options());
    const float* qp = q.data_ptr<float>();
    const T* kp = keys.data_ptr<T>();
    const T* valp = values.data_ptr<T>();
    float* pp = probs.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const int64_t ks0 = keys.stride(0), ks1 = keys.stride(1), ks2 = keys.stride(2);
    const int64_t vs0 = values.stride(0), vs1 = values.stride(1), vs2 = values.stride(2);
    const float fscale = static_cast<float>(scale);
    const int64_t work = B * H * R * total * d;

    // 0. The kept tiles brought up to the committed keys' last whole block: keys [0, tiled) are scored from them.
    int64_t tiled = 0;
#ifdef GUMIHO_WIDE
    if constexpr (std::is_same_v<T, Half>) {
        if (kept.data != nullptr && (d == 64 || d == 128) && R >= TREE_ROWS) {
            tiled = past / 16 * 16;
            const int64_t from = std::min(*kept.ready, tiled);
            if (from < tiled) {
                split(B * H, B * H * (tiled - from) * d * 16, [&](int64_t begin, int64_t end) {
                    for (int64_t bh = begin; bh < end; ++bh) {
                        const int64_t b = bh / H, h = bh % H;
                        const Half* key = kp + b * ks0 + h * ks1 + from * ks2;
                        Half* tile = kept.data + b * kept.b_stride + h * kept.h_stride + from * d;
                        if (d == 64)
                            key_tiles<64>(key, ks2, (tiled - from) / 16, tile);
                        else
                            key_tiles<128>(key, ks2, (tiled - from) / 16, tile);
                    }
                });
            }
            *kept.ready = tiled;
        }
    }
#endif

    // 1. Scores, key chunk by key chunk (each key read once for all rows of its head).
    const int64_t chunks = (total + KEY_CHUNK - 1) / KEY_CHUNK;
    split(B * H * chunks, work, [&](int64_t begin, int64_t end) {
#ifdef GUMIHO_WIDE
        std::vector<float> buffer(KEY_CHUNK * d);  // the chunk's keys as fp32: widened, or transposed into tiles
#endif
        for (int64_t w = begin; w < end; ++w) {
            const int64_t bh = w / chunks, c = w % chunks, b = bh / H, h = bh % H;
            int64_t j = c * KEY_CHUNK;
            const int64_t stop = std::min(total, (c + 1) * KEY_CHUNK);
#ifdef GUMIHO_WIDE
            if (j < tiled) {  // from the kept tiles
                const int64_t from_tiles = (std::min(stop, tiled) - j) / 16;
                const Half* tiles = kept.data + b * kept.b_stride + h * kept.h_stride + j * d;
                const auto scores = d == 64 ? scores_from_tiles<64, Half> : scores_from_tiles<128, Half>;
                scores(qp + bh * R * d, R, tiles, from_tiles, fscale, pp + bh * R * total + j, total);
                j += from_tiles * 16;
            }
            // The chunk's (other) whole blocks of 16 keys, for head sizes of 64 and 128 (the others, and a chunk's
            // tail, take `dots` below).
            const int64_t blocks = d == 64 || d == 128 ? (stop - j) / 16 : 0;
            if (blocks) {
                const auto scores = d == 64 ? wide_scores<64, T> : wide_scores<128, T>;
                scores(qp + bh * R * d, R, kp + b * ks0 + h * ks1 + j * ks2, ks2, blocks, fscale,
                       pp + bh * R * total + j, total, buffer.data());
            }
            j += blocks * 16;
#endif
            for (; j < stop; ++j) {
                const T* key = kp + b * ks0 + h * ks1 + j * ks2;
                float score[4];
                for (int64_t r0 = 0; r0 < R; r0 += 4) {
                    const int64_t rows = std::min<int64_t>(4, R - r0);
                    dots(qp + (bh * R + r0) * d, rows, key, d, score);
                    for (int64_t r = 0; r < rows; ++r) pp[(bh * R + r0 + r) * total + j] = score[r] * fscale;
                }
            }
        }
    });
    // 2. Per row: the maximum over visible keys, exp(score - max) (0 where masked), and their sum.
    std::vector<uint8_t> causal_rows(causal ? n * total : 0);
    for (int64_t i = 0; causal && i < n; ++i)
        for (int64_t j = 0; j < total; ++j) causal_rows[i * total + j] = j <= past + i;
    const bool* cp = causal ? reinterpret_cast<const bool*>(causal_rows.data()) : nullptr;
    split(B * H * R, work, [&](int64_t begin, int64_t end) {
        for (int64_t w = begin; w < end; ++w) {
            const int64_t b = w / (H * R), i = (w % R) % n;
            const bool* seen = causal ? cp + i * total : vp + (b * n + i) * total;
#ifdef GUMIHO_WIDE
            softmax_numerators<Floats16>(pp + w * total, seen, total);
#else
            softmax_numerators<Floats8>(pp + w * total, seen, total);
#endif
        }
    });
    // 3. Outputs: sum_j p_j v_j in key order, split by head and by slices of 16 (or 32) output dimensions, four
    // (eight) rows at a time sharing each value slice (a masked key adds p = 0 exactly); then divided by the row's sum
    // (each slice adds up its rows' sums again: a few scalar additions beside the multiply-adds).
#ifdef GUMIHO_WIDE
    const bool wide = d % 32 == 0;
#else
    const bool wide = false;
#endif
#ifdef GUMIHO_WIDE
    // Enough rows (a tree's): whole rows of 64 outputs, six at a time, split by head and by group of rows instead.
    if (d == 64 && R >= TREE_ROWS) {
        constexpr int64_t GROUP = 6;
        const int64_t groups = (R + GROUP - 1) / GROUP;
        split(B * H * groups, work, [&](int64_t begin, int64_t end) {
            float sums[GROUP];
            for (int64_t w = begin; w < end; ++w) {
                const int64_t bh = w / groups, r0 = w % groups * GROUP, b = bh / H, h = bh % H;
                const T* value = valp + b * vs0 + h * vs1;
                const float* prob = pp + (bh * R + r0) * total;
                float* o = op + (bh * R + r0) * d;
                const int64_t count = std::min(GROUP, R - r0);
                with_rows(count, [&](auto rows) {
                    constexpr int ROWS = decltype(rows)::value;
                    if constexpr (ROWS <= GROUP) weighted_rows<ROWS>(prob, total, value, vs2, total, o, d, sums);
                });
                for (int64_t r = 0; r < count; ++r)
                    for (int64_t i = 0; i < d; ++i) o[r * d + i] = sums[r] > 0.f ? o[r * d + i] / sums[r] : 0.f;
            }
        });
        return out;
    }
#endif
    const int64_t width = wide ? 32 : 16, group = wide ? 8 : 4;  // outputs per slice, rows sharing it
    const int64_t slices = d / width;
    split(B * H * slices, work, [&](int64_t begin, int64_t end) {
        std::vector<float> sums(R);
        for (int64_t w = begin; w < end; ++w) {
            const int64_t bh = w / slices, s = w % slices, b = bh / H, h = bh % H;
            const T* value = valp + b * vs0 + h * vs1 + s * width;
            for (int64_t r0 = 0; r0 < R; r0 += group) {
                const float* prob = pp + (bh * R + r0) * total;
                float* o = op + (bh * R + r0) * d + s * width;
                float* sum = &sums[r0];
                with_rows(std::min(group, R - r0), [&](auto rows) {
                    constexpr int ROWS = decltype(rows)::value;
#ifdef GUMIHO_WIDE
                    if (wide) return weighted_sums<Floats16, ROWS>(prob, total, value, vs2, total, o, d, sum);
#endif
                    if constexpr (ROWS <= 4) weighted_sums<Floats8, ROWS>(prob, total, value, vs2, total, o, d, sum);
                });
            }
            for (int64_t r = 0; r < R; ++r) {
                float* o = op + (bh * R + r) * d + s * width;
                const float sum = sums[r];
                for (int64_t i = 0; i < width; ++i) o[i] = sum > 0.f ? o[i] / sum : 0.f;
            }
        }
    });
    return out;
}

// q [B, H, R, d] fp32 contiguous, rows ordered (group member, token): row r is token r % n.
// keys, values [B, H, >= total, d], both fp32 or both fp16, each row of d contiguous (a view of a KV cache).
// visible: bool [B, n, total], or an empty tensor for causal visibility (token i sees keys 0 .. past + i).
// Returns [B, H, R, d] fp32.
// `amx`: in bf16 tile products where this build and process have AMX, the cache is fp16, heads have 64 dimensions
// and a KV head's group fits a tile (`amx_attention`: other numbers, row-consistent too); else as without it.
torch::Tensor attention(torch::Tensor q, torch::Tensor keys, torch::Tensor values, torch::Tensor visible,
                        int64_t n, int64_t past, double scale, KeptTiles kept = {}, bool amx = false) {
    const auto cache = keys.scalar_type();
    TORCH_CHECK(q.scalar_type() == torch::kFloat && (cache == torch::kFloat || cache == torch::kHalf) &&
                values.scalar_type() == cache, "attention: fp32 queries, fp32 or fp16 keys and values");
    TORCH_CHECK(keys.stride(3) == 1 && values.stride(3) == 1, "attention: key and value rows must be contiguous");
#ifdef GUMIHO_AMX
    if (amx && cache == torch::kHalf && q.size(3) == 64 && q.size(2) % n == 0 && q.size(2) / n <= AMX_ROWS &&
        amx::usable()) {
        const int64_t B = q.size(0), total = past + n;
        TORCH_CHECK(keys.size(2) >= total && values.size(2) >= total, "attention: inconsistent shapes");
        const KeptTiles tiles = kept.width == 2 * 64 * 16 ? kept : KeptTiles{};
        if (visible.numel() == 0) {  // causal: token i sees keys 0 .. past + i (the same rows for every batch row)
            std::vector<uint8_t> causal(B * n * total);
            for (int64_t row = 0; row < B * n; ++row)
                for (int64_t j = 0; j < total; ++j) causal[row * total + j] = j <= past + row % n;
            return amx_attention(q.contiguous(), keys, values, reinterpret_cast<const bool*>(causal.data()), n,
                                 past, scale, tiles);
        }
        const torch::Tensor vis = visible.to(torch::kBool).contiguous();
        TORCH_CHECK(vis.size(0) == B && vis.size(1) == n && vis.size(2) == total,
                    "attention: visible is not [B, n, total]");
        return amx_attention(q.contiguous(), keys, values, vis.data_ptr<bool>(), n, past, scale, tiles);
    }
#endif
    if (kept.width != q.size(3) * 16) kept = {};  // the AMX path's tiles, where it does not run
    return cache == torch::kHalf ? attention_of<Half>(q, keys, values, visible, n, past, scale, kept)
                                 : attention_of<float>(q, keys, values, visible, n, past, scale);
}

// Llama's rotary embedding of one head's row: out = x * cos + rotate_half(x) * sin, a multiply and a multiply-add
// per element in a fixed order, the same for every row (rotate_half(x) = [-x[d/2:], x[:d/2]]).
inline void rotate(const float* x, const float* cos, const float* sin, int64_t d, float* out) {
    const int64_t half = d / 2;
    for (int64_t i = 0; i < half; ++i) out[i] = std::fma(-x[i + half], sin[i], x[i] * cos[i]);
    for (int64_t i = half; i < d; ++i) out[i] = std::fma(x[i - half], sin[i], x[i] * cos[i]);
}

// d values into a cache row (fp16: rounded to nearest, ties to even).
inline void store(float* to, const float* from, int64_t d) { std::memcpy(to, from, d * sizeof(float)); }
inline void store(Half* to, const float* from, int64_t d) {
    for (int64_t i = 0; i < d; ++i) to[i] = Half(from[i]);
}

// Rotary and cache writes for `attend` and `rotate`: the queries into q [B, KV, G * n, d] (grouped), the rotated
// keys and the values into the cache's slots [past, past + n). Tokens are independent: a prompt's many are shared
// out among torch's threads (from ROTATE_SPLIT tokens), a decode step's or a tree's few stay on the calling thread.
constexpr int64_t ROTATE_SPLIT = 64;

// qkv's rows: fp32, or bf16 (a prompt whose products run in bf16), widened a token at a time. The queries go to q,
// fp32, or bf16 rounded as torch rounds (for a prompt's attention in bf16, which would round them so).
template <typename T>
void rotate_and_store(const torch::Tensor& qkv, const float* cp, const float* sp, int64_t B, int64_t n,
                      int64_t heads, int64_t KV, int64_t d, int64_t past, torch::Tensor& q, torch::Tensor& keys,
                      torch::Tensor& values) {
    const int64_t G = heads / KV, width = (heads + 2 * KV) * d;
    const bool bf16 = qkv.scalar_type() == torch::kBFloat16;
    const float* xp = bf16 ? nullptr : qkv.data_ptr<float>();
    const uint16_t* hp = bf16 ? reinterpret_cast<const uint16_t*>(qkv.data_ptr<at::BFloat16>()) : nullptr;
    const bool bf16_queries = q.scalar_type() == torch::kBFloat16;
    float* qp = bf16_queries ? nullptr : q.data_ptr<float>();
    uint16_t* qh = bf16_queries ? reinterpret_cast<uint16_t*>(q.data_ptr<at::BFloat16>()) : nullptr;
    T* kp = keys.data_ptr<T>();
    T* vp = values.data_ptr<T>();
    at::parallel_for(0, B * n, ROTATE_SPLIT, [&](int64_t begin, int64_t end) {
        std::vector<float> rotated(d), widened(bf16 ? width : 0);
        for (int64_t token = begin; token < end; ++token) {
            const int64_t b = token / n, t = token % n;
            if (bf16) from_bf16_row(hp + (b * n + t) * width, width, widened.data());
            const float* row = bf16 ? widened.data() : xp + (b * n + t) * width;
            const float* c = cp + (b * n + t) * d;
            const float* s = sp + (b * n + t) * d;
            for (int64_t h = 0; h < heads; ++h) {  // head h = KV head h / G, member h % G: row (member, token)
                const int64_t at = ((b * KV + h / G) * G * n + (h % G) * n + t) * d;
                if (!bf16_queries) {
                    rotate(row + h * d, c, s, d, qp + at);
                    continue;
                }
                rotate(row + h * d, c, s, d, rotated.data());
                to_bf16_row(rotated.data(), d, qh + at);
            }
            for (int64_t k = 0; k < KV; ++k) {
                const int64_t slot = past + t;
                rotate(row + (heads + k) * d, c, s, d, rotated.data());
                store(kp + b * keys.stride(0) + k * keys.stride(1) + slot * keys.stride(2), rotated.data(), d);
                store(vp + b * values.stride(0) + k * values.stride(1) + slot * values.stride(2),
                      row + (heads + KV + k) * d, d);
            }
        }
    });
}

void check_rotate(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin,
                  const torch::Tensor& keys, const torch::Tensor& values, int64_t heads, int64_t past) {
    const auto cache = keys.scalar_type();
    TORCH_CHECK((qkv.scalar_type() == torch::kFloat || qkv.scalar_type() == torch::kBFloat16) &&
                cos.scalar_type() == torch::kFloat && sin.scalar_type() == torch::kFloat &&
                (cache == torch::kFloat || cache == torch::kHalf) && values.scalar_type() == cache,
                "attend/rotate: fp32 inputs (rotate: qkv fp32 or bf16), an fp32 or fp16 cache");
    const int64_t B = qkv.size(0), n = qkv.size(1), KV = keys.size(1), d = keys.size(3);
    TORCH_CHECK(heads % KV == 0 && qkv.size(2) == (heads + 2 * KV) * d && past >= 0 && keys.size(2) >= past + n &&
                values.size(2) >= past + n && cos.size(0) == B && cos.size(1) == n && cos.size(2) == d,
                "attend/rotate: inconsistent shapes");
    TORCH_CHECK(keys.stride(3) == 1 && values.stride(3) == 1,
                "attend/rotate: key and value rows must be contiguous");
}

// The grouped queries [B, KV, G * n, d] of qkv (as `attend` takes them), its rotated keys and its values written to
// the cache's slots [past, past + n).
torch::Tensor rotate_into(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor keys,
                          torch::Tensor values, int64_t heads, int64_t past, bool bf16_queries) {
    qkv = qkv.contiguous();
    cos = cos.contiguous();
    sin = sin.contiguous();
    check_rotate(qkv, cos, sin, keys, values, heads, past);
    const int64_t B = qkv.size(0), n = qkv.size(1), KV = keys.size(1), d = keys.size(3), G = heads / KV;
    auto q = torch::empty({B, KV, G * n, d}, qkv.options().dtype(bf16_queries ? torch::kBFloat16 : torch::kFloat));
    if (keys.scalar_type() == torch::kHalf)
        rotate_and_store<Half>(qkv, cos.data_ptr<float>(), sin.data_ptr<float>(), B, n, heads, KV, d, past, q, keys,
                               values);
    else
        rotate_and_store<float>(qkv, cos.data_ptr<float>(), sin.data_ptr<float>(), B, n, heads, KV, d, past, q,
                                keys, values);
    return q;
}

// A layer's attention from its fused projection, for the few rows of a decode step, a tree or a draft step:
// qkv [B, n, (H + 2 KV) * d] fp32 before the rotary embedding; cos, sin [B, n, d]; keys, values [B, KV, capacity,
// d] (fp32 or fp16), the layer's cache, whose slots [past, past + n) receive the rotated keys and the values.
// Queries sharing a KV head are grouped as `attention` takes them. Returns [B, n, H * d], ready for the output
// projection. One call instead of a dozen small torch operations per layer (their dispatch cost more than their
// arithmetic).
// `tiles`, `ready`: the cache's kept key tiles of every layer, fp16 [layers, B, KV, capacity / 16, d * 16], and how
// many keys of each layer they hold, int64 [layers] (KeptTiles); this call reads and updates `layer`'s. Empty
// tensors: none kept (the call scores from the keys alone, with the same numbers).
torch::Tensor attend(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, torch::Tensor keys,
                     torch::Tensor values, torch::Tensor visible, int64_t heads, int64_t past, double scale,
                     torch::Tensor tiles, torch::Tensor ready, int64_t layer, bool amx) {
    const auto cache = keys.scalar_type();
    const int64_t B = qkv.size(0), n = qkv.size(1), KV = keys.size(1), d = keys.size(3), G = heads / KV;
    TORCH_CHECK(qkv.scalar_type() == torch::kFloat, "attend: fp32 qkv");
    const torch::Tensor q = rotate_into(qkv, cos, sin, keys, values, heads, past, false);
    KeptTiles kept;
    if (tiles.defined() && tiles.numel() > 0) {
        TORCH_CHECK(cache == torch::kHalf && tiles.scalar_type() == torch::kHalf && tiles.is_contiguous() &&
                    tiles.dim() == 5 && tiles.size(1) == B && tiles.size(2) == KV &&
                    (tiles.size(4) == d * 16 || tiles.size(4) == 2 * d * 16) &&
                    tiles.size(3) * 16 >= past && ready.scalar_type() == torch::kLong && ready.is_contiguous() &&
                    layer >= 0 && layer < tiles.size(0) && ready.numel() == tiles.size(0),
                    "attend: kept tiles fp16 [layers, B, KV, capacity / 16, d * 16 (x2 for amx)] with int64 "
                    "[layers] counts");
        kept = {tiles.data_ptr<Half>() + layer * tiles.stride(0), tiles.stride(1), tiles.stride(2),
                ready.data_ptr<int64_t>() + layer, tiles.size(4)};
    }
    // [B, KV, G * n, d]
    const torch::Tensor grouped = attention(q, keys, values, visible, n, past, scale, kept, amx);
    auto out = torch::empty({B, n, heads * d}, qkv.options());
    const float* gp = grouped.data_ptr<float>();
    float* op = out.data_ptr<float>();
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < n; ++t)
            for (int64_t h = 0; h < heads; ++h)
                std::memcpy(op + ((b * n + t) * heads + h) * d,
                            gp + ((b * KV + h / G) * G * n + (h % G) * n + t) * d, d * sizeof(float));
    return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("attention", [](torch::Tensor q, torch::Tensor keys, torch::Tensor values, torch::Tensor visible, int64_t n,
                          int64_t past, double scale, bool amx) {
              return attention(q, keys, values, visible, n, past, scale, {}, amx);
          }, "Row-consistent attention (fp32 queries, an fp32 or fp16 cache; CPU); `amx`: in bf16 tile products where "
          "it can (`amx()`)", pybind11::arg("q"), pybind11::arg("keys"), pybind11::arg("values"),
          pybind11::arg("visible"), pybind11::arg("n"), pybind11::arg("past"), pybind11::arg("scale"),
          pybind11::arg("amx") = false);
    m.def("rotate", &rotate_into, "A layer's rotary and cache writes alone: the grouped queries [B, KV, G * n, d] "
          "in fp32, or in bf16 where asked (a prompt's, for its causal attention; its qkv fp32 or bf16)",
          pybind11::arg("qkv"), pybind11::arg("cos"), pybind11::arg("sin"), pybind11::arg("keys"),
          pybind11::arg("values"), pybind11::arg("heads"), pybind11::arg("past"),
          pybind11::arg("bf16_queries") = false);
    m.def("attend", &attend, "Rotary, cache writes and row-consistent attention of a layer's fused projection",
          pybind11::arg("qkv"), pybind11::arg("cos"), pybind11::arg("sin"), pybind11::arg("keys"),
          pybind11::arg("values"), pybind11::arg("visible"), pybind11::arg("heads"), pybind11::arg("past"),
          pybind11::arg("scale"), pybind11::arg("tiles") = torch::empty({0}, torch::kHalf),
          pybind11::arg("ready") = torch::empty({0}, torch::kLong),
          pybind11::arg("layer") = 0, pybind11::arg("amx") = false);
    m.def("amx", [] {
#ifdef GUMIHO_AMX
        return amx::usable();
#else
        return false;
#endif
    }, "Whether `amx=True` takes bf16 tile products here (an AMX build, and Linux lets this process use the tiles)");
    m.def("keeps_tiles", [] {
#ifdef GUMIHO_WIDE
        return true;
#else
        return false;
#endif
    }, "Whether this build scores keys from kept tiles (attend's `tiles`: the 512-bit build, heads of 64 or 128)");
}
