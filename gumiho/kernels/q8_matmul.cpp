// Products with a matrix stored as 8-bit blocks (gumiho/kernels/__init__.py): the int4 path's lm_head.
//
// The matrix W [N, K] is held as q int8 [N, K] and one fp32 scale per block of 32 along a row, d [N, K / 32], so
// that W = d * q; the default model's tied embedding is exactly such blocks (the GGUF's Q8_0). Reading a quarter of
// the fp32 bytes and converting in registers, one row costs about two-thirds of torch's fp16 product on an AVX2
// CPU, and further rows little more, since every weight block converted is used for up to four input rows.
//
// Each output is computed by the same operations whatever the number of rows: per block, eight lane products
// summed over its four strides of 8 and scaled; the blocks accumulated in order; then a fixed horizontal sum. So a
// verified tree's rows can be computed together and still equal one-row products bit for bit.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "simd.h"

namespace {

constexpr int64_t BLOCK = 32;

#if defined(__AVX2__) && defined(__FMA__)
inline __m256 widen8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
#endif

// out[r * N + v] = x[r] . W[v] for v in [v0, v1), ROWS input rows of K floats.
template <int ROWS>
void rows_times_blocks(const float* x, int64_t K, const int8_t* q, const float* d, int64_t v0, int64_t v1,
                       float* out, int64_t N) {
    const int64_t blocks = K / BLOCK;
    for (int64_t v = v0; v < v1; ++v) {
        const int8_t* qv = q + v * K;
        const float* dv = d + v * blocks;
#if defined(__AVX2__) && defined(__FMA__)
        __m256 acc[ROWS];
        for (int r = 0; r < ROWS; ++r) acc[r] = _mm256_setzero_ps();
        for (int64_t b = 0; b < blocks; ++b) {
            const int8_t* qb = qv + b * BLOCK;
            const __m256 w0 = widen8(qb), w1 = widen8(qb + 8), w2 = widen8(qb + 16), w3 = widen8(qb + 24);
            const __m256 scale = _mm256_broadcast_ss(dv + b);
            for (int r = 0; r < ROWS; ++r) {
                const float* xb = x + r * K + b * BLOCK;
                __m256 t = _mm256_mul_ps(w0, _mm256_loadu_ps(xb));
                t = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xb + 8), t);
                t = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xb + 16), t);
                t = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xb + 24), t);
                acc[r] = _mm256_fmadd_ps(scale, t, acc[r]);
            }
        }
        for (int r = 0; r < ROWS; ++r) out[r * N + v] = hsum8(acc[r]);
#else
        for (int r = 0; r < ROWS; ++r) {
            float lane[8] = {0.f};
            for (int64_t b = 0; b < blocks; ++b) {
                float t[8] = {0.f};
                for (int64_t i = 0; i < BLOCK; ++i)
                    t[i % 8] += static_cast<float>(qv[b * BLOCK + i]) * x[r * K + b * BLOCK + i];
                for (int l = 0; l < 8; ++l) lane[l] += dv[b] * t[l];
            }
            out[r * N + v] = ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
        }
#endif
    }
}

}  // namespace

// x [M, K] fp32; q int8 [N, K]; d fp32 [N, K / 32]. Returns x @ (d * q).T, [M, N] fp32.
torch::Tensor q8_matmul(torch::Tensor x, torch::Tensor q, torch::Tensor d) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat && q.scalar_type() == torch::kChar && d.scalar_type() == torch::kFloat,
                "q8_matmul: x fp32, q int8, d fp32");
    TORCH_CHECK(x.dim() == 2 && q.dim() == 2 && d.dim() == 2, "q8_matmul: 2-D tensors only");
    x = x.contiguous();
    q = q.contiguous();
    d = d.contiguous();
    const int64_t M = x.size(0), K = x.size(1), N = q.size(0);
    TORCH_CHECK(K % BLOCK == 0 && q.size(1) == K && d.size(0) == N && d.size(1) == K / BLOCK,
                "q8_matmul: inconsistent shapes");
    auto out = torch::empty({M, N}, x.options());
    const float* xp = x.data_ptr<float>();
    const int8_t* qp = q.data_ptr<int8_t>();
    const float* dp = d.data_ptr<float>();
    float* op = out.data_ptr<float>();
    at::parallel_for(0, N, 512, [&](int64_t v0, int64_t v1) {
        for (int64_t m = 0; m < M; m += 4) {
            const float* xm = xp + m * K;
            float* om = op + m * N;
            switch (std::min<int64_t>(4, M - m)) {
                case 1: rows_times_blocks<1>(xm, K, qp, dp, v0, v1, om, N); break;
                case 2: rows_times_blocks<2>(xm, K, qp, dp, v0, v1, om, N); break;
                case 3: rows_times_blocks<3>(xm, K, qp, dp, v0, v1, om, N); break;
                default: rows_times_blocks<4>(xm, K, qp, dp, v0, v1, om, N); break;
            }
        }
    });
    return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("q8_matmul", &q8_matmul, "x @ W.T with W in 8-bit blocks of 32 (fp32, CPU)");
}
