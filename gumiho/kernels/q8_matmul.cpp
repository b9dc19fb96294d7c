// Products with a matrix stored as 8-bit blocks (gumiho/kernels/__init__.py): the int4 path's lm_head.
//
// The matrix W [N, K] is held as q int8 [N, K] in [-127, 127] and one fp32 scale per block of 32 along a row,
// d [N, K / 32], so that W = d * q; the default model's tied embedding is exactly such blocks (the GGUF's Q8_0).
// The input rows are rounded to 8 bits per block of 32 as well (simd.h's quantize_row, as the int4 path's 4-bit
// products round theirs; llama.cpp's Q8_0 products do the same), so a block's product is an integer dot product:
// VNNI's dpbusd, or AVX2's maddubs and madd, both exact. One row streams the 28 MB of the default model's head at
// memory speed, and each further row adds a few integer instructions per block instead of a float product: on the
// 2-core Zen 4 EPYC two rows cost about one.
//
// Each output is computed by the same operations whatever the number of rows: per block, eight lane sums of four
// products each, converted and scaled by d * dx into eight lanes; the blocks accumulated in order; then a fixed
// horizontal sum. So a verified tree's rows can be computed together and still equal one-row products bit for bit.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "simd.h"

namespace {

constexpr int64_t BLOCK = 32;
constexpr int64_t MAX_ROWS = 8;  // input rows per pass over the weights

#if defined(__AVX2__) && defined(__FMA__)
// Eight int32 lanes, lane l the sum of a[i] * b[i] over bytes 4l .. 4l + 3; a unsigned (|w|), b signed.
inline __m256i lane_dots(__m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b);
#else
    // Pairs in 16 bits: 127 * 127 * 2 = 32258 fits, so the sums are exact, as dpbusd's.
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
#endif
}
#endif

// out[r * N + v] = x[r] . W[v] for v in [v0, v1), ROWS input rows already rounded (xq [ROWS, K], dx [ROWS, K / 32]).
template <int ROWS>
void rows_times_blocks(const int8_t* xq, const float* dx, int64_t K, const int8_t* q, const float* d, int64_t v0,
                       int64_t v1, float* out, int64_t N, Fetch fetch) {
    const int64_t blocks = K / BLOCK;
    for (int64_t v = v0; v < v1; ++v) {
        const int8_t* qv = q + v * K;
        const float* dv = d + v * blocks;
#if defined(__AVX2__) && defined(__FMA__)
        __m256 acc[ROWS];
        for (int r = 0; r < ROWS; ++r) acc[r] = _mm256_setzero_ps();
        for (int64_t b = 0; b < blocks; ++b) {
            if (fetch) fetch(qv + b * BLOCK);
            const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qv + b * BLOCK));
            const __m256i magnitude = _mm256_abs_epi8(w);
            for (int r = 0; r < ROWS; ++r) {
                const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * K + b * BLOCK));
                const __m256i sums = lane_dots(magnitude, _mm256_sign_epi8(x, w));  // w * x = |w| * (x signed as w)
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(dv[b] * dx[r * blocks + b]), acc[r]);
            }
        }
        for (int r = 0; r < ROWS; ++r) out[r * N + v] = hsum8(acc[r]);
#else
        for (int r = 0; r < ROWS; ++r) {
            float lane[8] = {0.f};
            for (int64_t b = 0; b < blocks; ++b) {
                const float scale = dv[b] * dx[r * blocks + b];
                for (int l = 0; l < 8; ++l) {
                    int32_t sum = 0;
                    for (int i = 4 * l; i < 4 * l + 4; ++i) sum += int32_t(qv[b * BLOCK + i]) * xq[r * K + b * BLOCK + i];
                    lane[l] = std::fma(static_cast<float>(sum), scale, lane[l]);
                }
            }
            out[r * N + v] = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
        }
#endif
    }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define GUMIHO_Q8_PAIRS 1
// `rows_times_blocks` for outputs v0, v0 + 2, ... < v1 (v1 - v0 even), two at a time: output v in a 512-bit
// vector's low half, v + 1 in its high half, each half doing what the 256-bit code does for its output (the same
// exact integer sums, the same scale products and multiply-adds, the same horizontal sum), so every output equals
// the 256-bit build's bit for bit, with about half the instructions per input row.
template <int ROWS>
void rows_times_block_pairs(const int8_t* xq, const float* dx, int64_t K, const int8_t* q, const float* d,
                            int64_t v0, int64_t v1, float* out, int64_t N, Fetch fetch) {
    const int64_t blocks = K / BLOCK;
    for (int64_t v = v0; v < v1; v += 2) {
        const int8_t* qv = q + v * K;
        const float* dv = d + v * blocks;
        __m512 acc[ROWS];
        for (int r = 0; r < ROWS; ++r) acc[r] = _mm512_setzero_ps();
        for (int64_t b = 0; b < blocks; ++b) {
            if (fetch) {
                fetch(qv + b * BLOCK);
                fetch(qv + K + b * BLOCK);
            }
            const __m512i w = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qv + b * BLOCK))),
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qv + K + b * BLOCK)), 1);
            const __m512i magnitude = _mm512_abs_epi8(w);
            const __mmask64 negative = _mm512_movepi8_mask(w);
            const __m512 dw = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(dv[b])),
                                                                  _mm256_castps_pd(_mm256_set1_ps(dv[blocks + b])), 1));
            for (int r = 0; r < ROWS; ++r) {
                const __m512i x = _mm512_broadcast_i64x4(
                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * K + b * BLOCK)));
                // x signed as w: -x where w < 0 (where w = 0, |w| = 0 makes the product 0, as sign_epi8's 0 does)
                const __m512i signed_x = _mm512_mask_sub_epi8(x, negative, _mm512_setzero_si512(), x);
                const __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), magnitude, signed_x);
                const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(dx[r * blocks + b]));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), scale, acc[r]);
            }
        }
        for (int r = 0; r < ROWS; ++r) {
            out[r * N + v] = hsum8(_mm512_castps512_ps256(acc[r]));
            out[r * N + v + 1] = hsum8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r]), 1)));
        }
    }
}
#endif

}  // namespace

// x [M, K] fp32; q int8 [N, K]; d fp32 [N, K / 32]. Returns x @ (d * q).T, [M, N] fp32, x rounded per block.
// `ahead`: bytes ahead of its reads at which a row's weights are asked for (0: never); `keep`: into every cache
// level, else non-temporally (simd.h's Fetch).
torch::Tensor q8_matmul(torch::Tensor x, torch::Tensor q, torch::Tensor d, int64_t ahead, bool keep) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat && q.scalar_type() == torch::kChar && d.scalar_type() == torch::kFloat,
                "q8_matmul: x fp32, q int8, d fp32");
    TORCH_CHECK(x.dim() == 2 && q.dim() == 2 && d.dim() == 2, "q8_matmul: 2-D tensors only");
    x = x.contiguous();
    q = q.contiguous();
    d = d.contiguous();
    const int64_t M = x.size(0), K = x.size(1), N = q.size(0), blocks = K / BLOCK;
    TORCH_CHECK(K % BLOCK == 0 && q.size(1) == K && d.size(0) == N && d.size(1) == blocks,
                "q8_matmul: inconsistent shapes");
    int8_t* const rounded = kept_buffer<int8_t>(M * K);  // no allocation per call, as q4_matmul's
    float* const scales = kept_buffer<float>(M * blocks);
    for (int64_t r = 0; r < M; ++r) quantize_row(x.data_ptr<float>() + r * K, K, rounded + r * K, scales + r * blocks);
    auto out = torch::empty({M, N}, x.options());
    const int8_t* qp = q.data_ptr<int8_t>();
    const float* dp = d.data_ptr<float>();
    float* op = out.data_ptr<float>();
    const Fetch fetch{ahead, keep};
    at::parallel_for(0, N, 512, [&](int64_t v0, int64_t v1) {
        for (int64_t m = 0; m < M; m += MAX_ROWS) {
            const int8_t* xm = rounded + m * K;
            const float* dm = scales + m * blocks;
            float* om = op + m * N;
            const int64_t rows = std::min<int64_t>(MAX_ROWS, M - m);
            int64_t start = v0;
#ifdef GUMIHO_Q8_PAIRS
            start = v0 + (v1 - v0) / 2 * 2;  // the pairs, then an odd output left over (256-bit code)
            with_rows(rows, [&](auto R) {
                rows_times_block_pairs<decltype(R)::value>(xm, dm, K, qp, dp, v0, start, om, N, fetch);
            });
#endif
            with_rows(rows, [&](auto R) {
                rows_times_blocks<decltype(R)::value>(xm, dm, K, qp, dp, start, v1, om, N, fetch);
            });
        }
    });
    return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("q8_matmul", &q8_matmul, "x @ W.T with W in 8-bit blocks of 32 (fp32, CPU)");
}
