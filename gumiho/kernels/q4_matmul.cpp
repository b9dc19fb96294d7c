// Products of activations rounded to 8 bits with a matrix in 4-bit blocks (gumiho/kernels/__init__.py): the
// linears of the "int4/int8" path, the arithmetic llama.cpp runs a Q4_1 GGUF with.
//
// Weights: GGUF Q4_1 blocks of 32 along a row (weight = d * q + m, q in 0..15, d and m fp16), regrouped by
// `pack` (int4.py) into records of 8 output rows x one block, 160 bytes: the 8 d's and the 8 m's (fp16), then
// four chunks of 32 bytes in which byte 4v + t of chunk c holds row v's weight 4c + t in its low nibble and its
// weight 16 + 4c + t in its high nibble. One vector of 32 nibbles then holds 8 rows x 4 consecutive inputs.
//
// Activations: each input row is rounded per block of 32 to int8 (dx = max |x| / 127, xq = round(x / dx)), with
// sx = dx * sum(xq); then row v of W gives sum over blocks of d_v * dx * (q_v . xq) + m_v * sx.
//
// Why: a block's 32 products are two integer instructions (one with VNNI) instead of four fp32 multiply-adds, and
// a weight record is unpacked once for up to eight input rows, so a decode step is bound by reading the weights
// and a few more rows cost little: a tree verification pays little more than one token.
//
// Each output is computed by the same operations whatever the number of rows and the instruction set: the
// integer dot products are exact; then, per block in order, one fp32 multiply and two fused multiply-adds. So a
// tree's rows equal one-row products bit for bit, on every machine.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "simd.h"

namespace {

constexpr int64_t BLOCK = 32;
constexpr int64_t OUTS = 8;  // output rows per record
constexpr int64_t RECORD = 160;
constexpr int MAX_ROWS = 8;  // input rows that share one unpacking of a record

inline float half_to_float(uint16_t h) {
    const uint32_t sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ffu;
    uint32_t bits;
    if (exponent == 0x1f) {
        bits = sign | 0x7f800000u | (mantissa << 13);
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
        bits = sign;
    } else {  // subnormal: normalise
        int shift = 0;
        uint32_t m = mantissa;
        while ((m & 0x400u) == 0) {
            m <<= 1;
            ++shift;
        }
        bits = sign | ((113 - shift) << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// The vectors the products work in: one record's 8 output rows in 256 bits (Lanes8), or two records' 16 in 512
// (Lanes16, built where AVX-512 has VNNI). Group g of input row r (4 bytes) goes to every lane, broadcast straight
// from memory: a load, where a broadcast from a general register takes a vector unit (2-core Zen 4 EPYC, a
// forward's products: 4 rows 3.5 -> 3.1 ms).
struct Lanes8 {
    using I = __m256i;
    using F = __m256;
    static I zero() { return _mm256_setzero_si256(); }
    static I add(I a, I b) { return _mm256_add_epi32(a, b); }
    static I group(const int8_t* p) { return _mm256_broadcastd_epi32(_mm_loadu_si32(p)); }
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    static I dot(I acc, I w, I x) { return _mm256_dpbusd_epi32(acc, w, x); }
#endif
    // A record's 8 fp16 numbers at `at`, as fp32; its 32 bytes at `at` (`next`, the second record's distance, is
    // for Lanes16).
    static F halves(const uint8_t* at, int64_t) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at)));
    }
    static I bytes(const uint8_t* at, int64_t) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)); }
    static I low_nibbles(I x) { return _mm256_and_si256(x, _mm256_set1_epi8(0x0f)); }
    static I high_nibbles(I x) { return low_nibbles(_mm256_srli_epi16(x, 4)); }
    static F fzero() { return _mm256_setzero_ps(); }
    static F convert(I x) { return _mm256_cvtepi32_ps(x); }
    static F set1(float x) { return _mm256_set1_ps(x); }
    static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
    static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
    static void store(float* to, F x) { _mm256_storeu_ps(to, x); }
};

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define GUMIHO_Q4_PAIRS 1
struct Lanes16 {
    using I = __m512i;
    using F = __m512;
    static I zero() { return _mm512_setzero_si512(); }
    static I add(I a, I b) { return _mm512_add_epi32(a, b); }
    static I group(const int8_t* p) {
        int32_t bytes;
        std::memcpy(&bytes, p, 4);
        return _mm512_set1_epi32(bytes);
    }
    static I dot(I acc, I w, I x) { return _mm512_dpbusd_epi32(acc, w, x); }
    // Two records side by side, the one at `at` in the low half and the one `next` bytes on in the high half.
    static F halves(const uint8_t* at, int64_t next) {
        return _mm512_cvtph_ps(_mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at))),
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(at + next)), 1));
    }
    static I bytes(const uint8_t* at, int64_t next) {
        return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at))),
                                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + next)), 1);
    }
    static I low_nibbles(I x) { return _mm512_and_si512(x, _mm512_set1_epi8(0x0f)); }
    static I high_nibbles(I x) { return low_nibbles(_mm512_srli_epi16(x, 4)); }
    static F fzero() { return _mm512_setzero_ps(); }
    static F convert(I x) { return _mm512_cvtepi32_ps(x); }
    static F set1(float x) { return _mm512_set1_ps(x); }
    static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
    static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
    static void store(float* to, F x) { _mm512_storeu_ps(to, x); }
};
#endif

// For R input rows, sum over inputs of q_v * xq for the output rows v of the vectors' records: the 8 vectors of
// nibbles times 4-byte groups of x, the rows' sums interleaved so that their chains overlap (integer sums: exact in
// any order, so every width gives the same sums).
template <typename L, int R>
inline void dots(const typename L::I w[8], const int8_t* xq, int64_t K, typename L::I out[R]) {
    const auto group = [&](int r, int g) { return L::group(xq + r * K + 4 * g); };
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    if constexpr (R > 4) {  // enough independent chains already (and registers for no more)
        for (int r = 0; r < R; ++r) out[r] = L::dot(L::zero(), w[0], group(r, 0));
        for (int g = 1; g < 8; ++g)
            for (int r = 0; r < R; ++r) out[r] = L::dot(out[r], w[g], group(r, g));
        return;
    }
    typename L::I even[R], odd[R];
    for (int r = 0; r < R; ++r) {
        even[r] = L::dot(L::zero(), w[0], group(r, 0));
        odd[r] = L::dot(L::zero(), w[1], group(r, 1));
    }
    for (int g = 2; g < 8; g += 2) {
        for (int r = 0; r < R; ++r) {
            even[r] = L::dot(even[r], w[g], group(r, g));
            odd[r] = L::dot(odd[r], w[g + 1], group(r, g + 1));
        }
    }
    for (int r = 0; r < R; ++r) out[r] = L::add(even[r], odd[r]);
#else
    // Pairs of products in 16 bits: |15 * 127 * 2| * 8 groups = 30480 fits, so the sums are exact (Lanes8 only).
    __m256i pairs[R];
    for (int r = 0; r < R; ++r) pairs[r] = _mm256_maddubs_epi16(w[0], group(r, 0));
    for (int g = 1; g < 8; ++g)
        for (int r = 0; r < R; ++r)
            pairs[r] = _mm256_add_epi16(pairs[r], _mm256_maddubs_epi16(w[g], group(r, g)));
    for (int r = 0; r < R; ++r) out[r] = _mm256_madd_epi16(pairs[r], _mm256_set1_epi16(1));
#endif
}

// The outputs of a record's 8 rows (Lanes8) or of two records' 16 (Lanes16, the second record `next` bytes after
// the first) for R input rows: per block in order, one fp32 multiply and two fused multiply-adds per output, the
// same operations whatever the width, so both widths give the same numbers bit for bit.
template <typename L, int R>
void record_rows(const uint8_t* records, int64_t next, int64_t blocks, const int8_t* xq, const float* dx,
                 const float* sx, int64_t K, float* out, int64_t N, Fetch fetch) {
    typename L::F acc[R];
    for (int r = 0; r < R; ++r) acc[r] = L::fzero();
    for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* rec = records + b * RECORD;
        if (fetch) {
            for (int64_t line = 0; line < RECORD; line += 64) {
                fetch(rec + line);
                if (next) fetch(rec + next + line);
            }
        }
        const typename L::F d = L::halves(rec, next), m = L::halves(rec + 16, next);
        typename L::I w[8];
        for (int c = 0; c < 4; ++c) {
            const typename L::I chunk = L::bytes(rec + 32 + 32 * c, next);
            w[c] = L::low_nibbles(chunk);
            w[c + 4] = L::high_nibbles(chunk);
        }
        typename L::I sums[R];
        dots<L, R>(w, xq + b * BLOCK, K, sums);
        for (int r = 0; r < R; ++r) {
            const int64_t at = r * (K / BLOCK) + b;
            acc[r] = L::fmadd(L::convert(sums[r]), L::mul(d, L::set1(dx[at])), acc[r]);
            acc[r] = L::fmadd(m, L::set1(sx[at]), acc[r]);
        }
    }
    for (int r = 0; r < R; ++r) L::store(out + r * N, acc[r]);
}
#else
struct Lanes8 {};  // plain C++: one record at a time

template <typename L, int R>
void record_rows(const uint8_t* records, int64_t, int64_t blocks, const int8_t* xq, const float* dx, const float* sx,
                 int64_t K, float* out, int64_t N, Fetch) {
    for (int r = 0; r < R; ++r) {
        float acc[OUTS] = {0.f};
        for (int64_t b = 0; b < blocks; ++b) {
            const uint8_t* rec = records + b * RECORD;
            const int8_t* xb = xq + r * K + b * BLOCK;
            const int64_t at = r * (K / BLOCK) + b;
            for (int v = 0; v < OUTS; ++v) {
                uint16_t dh, mh;
                std::memcpy(&dh, rec + 2 * v, 2);
                std::memcpy(&mh, rec + 16 + 2 * v, 2);
                int32_t dot = 0;
                for (int c = 0; c < 4; ++c) {
                    for (int t = 0; t < 4; ++t) {
                        const uint8_t byte = rec[32 + 32 * c + 4 * v + t];
                        dot += (byte & 0x0f) * xb[4 * c + t] + (byte >> 4) * xb[16 + 4 * c + t];
                    }
                }
                const float scale = half_to_float(dh) * dx[at];
                acc[v] = std::fma(static_cast<float>(dot), scale, acc[v]);
                acc[v] = std::fma(half_to_float(mh), sx[at], acc[v]);
            }
        }
        for (int v = 0; v < OUTS; ++v) out[r * N + v] = acc[v];
    }
}
#endif

}  // namespace

// x [M, K] fp32 and records uint8 [N / 8, K / 32 * 160] (int4.py `q4_records`): returns x @ W.T, [M, N] fp32.
// Batched: x [B, M, K] and records [B, N / 8, K / 32 * 160], matrix b for rows b (a stack of heads in one call).
// `ahead`: bytes ahead of its reads at which the records are asked for (0: never); `keep`: into every cache level,
// else non-temporally (simd.h's Fetch).
torch::Tensor q4_matmul(torch::Tensor x, torch::Tensor records, int64_t ahead, bool keep) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat && records.scalar_type() == torch::kByte,
                "q4_matmul: x fp32, records uint8");
    TORCH_CHECK(x.dim() == records.dim() && (x.dim() == 2 || x.dim() == 3),
                "q4_matmul: x [(B,) M, K] with records [(B,) N / 8, bytes]");
    const bool batched = x.dim() == 3;
    x = x.contiguous();
    records = records.contiguous();
    const int64_t B = batched ? x.size(0) : 1, M = x.size(-2), K = x.size(-1), groups = records.size(-2);
    const int64_t N = groups * OUTS, blocks = K / BLOCK;
    TORCH_CHECK(K % BLOCK == 0 && records.size(-1) == blocks * RECORD && (!batched || records.size(0) == B),
                "q4_matmul: inconsistent shapes");
    // The rounded rows in buffers kept by the calling thread: three tensors allocated per call cost a decode
    // step's 120 products about 0.1 ms.
    int8_t* const qp = kept_buffer<int8_t>(B * M * K);
    float* const dp = kept_buffer<float, 0>(B * M * blocks);
    float* const sp = kept_buffer<float, 1>(B * M * blocks);
    at::parallel_for(0, B * M, 16, [&](int64_t begin, int64_t end) {  // rows alone: a prompt's, on every thread
        for (int64_t r = begin; r < end; ++r)
            quantize_row(x.data_ptr<float>() + r * K, K, qp + r * K, dp + r * blocks, sp + r * blocks);
    });
    auto out = batched ? torch::empty({B, M, N}, x.options()) : torch::empty({M, N}, x.options());
    const uint8_t* rp = records.data_ptr<uint8_t>();
    float* op = out.data_ptr<float>();
    // Work units: a record's group of 8 output rows, or two consecutive groups where 512-bit products are built.
#ifdef GUMIHO_Q4_PAIRS
    constexpr int64_t SPAN = 2;
#else
    constexpr int64_t SPAN = 1;
#endif
    const int64_t spans = (groups + SPAN - 1) / SPAN;
    const Fetch first{ahead, keep};
    at::parallel_for(0, B * spans, 8 / SPAN, [&](int64_t begin, int64_t end) {
        for (int64_t unit = begin; unit < end; ++unit) {
            const int64_t b = unit / spans, g = unit % spans * SPAN, width = std::min(SPAN, groups - g);
            const uint8_t* rec = rp + (b * groups + g) * blocks * RECORD;
            for (int64_t r = 0; r < M; r += MAX_ROWS) {
                // The first rows' pass asks for the records; they stay in the cache for the next rows' passes,
                // and asking again (non-temporally) slowed an 800-row product by 7% (2-core Zen 5 EPYC).
                const Fetch fetch = r == 0 ? first : Fetch{};
                const int64_t row = b * M + r, at = row * blocks;
                const int8_t* xr = qp + row * K;
                float* o = op + row * N + g * OUTS;
                const int64_t rows = std::min<int64_t>(MAX_ROWS, M - r);
#ifdef GUMIHO_Q4_PAIRS
                if (width == 2) {
                    with_rows(rows, [&](auto R) {  // the next group's records follow this group's
                        record_rows<Lanes16, decltype(R)::value>(rec, blocks * RECORD, blocks, xr, dp + at, sp + at,
                                                                 K, o, N, fetch);
                    });
                    continue;
                }
#endif
                with_rows(rows, [&](auto R) {
                    record_rows<Lanes8, decltype(R)::value>(rec, 0, blocks, xr, dp + at, sp + at, K, o, N, fetch);
                });
            }
        }
    });
    return out;
}

// x [M, K] fp32 rounded as the products round it: (xq int8 [M, K], dx [M, K / 32], sx [M, K / 32]) (for the tests).
std::vector<torch::Tensor> quantize(torch::Tensor x) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat && x.dim() == 2 && x.size(1) % BLOCK == 0, "quantize: x [M, 32 k] fp32");
    x = x.contiguous();
    const int64_t M = x.size(0), K = x.size(1);
    auto xq = torch::empty({M, K}, x.options().dtype(torch::kChar));
    auto dx = torch::empty({M, K / BLOCK}, x.options()), sx = torch::empty({M, K / BLOCK}, x.options());
    for (int64_t r = 0; r < M; ++r)
        quantize_row(x.data_ptr<float>() + r * K, K, xq.data_ptr<int8_t>() + r * K, dx.data_ptr<float>() + r * (K / BLOCK),
                     sx.data_ptr<float>() + r * (K / BLOCK));
    return {xq, dx, sx};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("q4_matmul", &q4_matmul, "x @ W.T, x rounded to 8 bits per block of 32, W in 4-bit blocks (CPU)");
    m.def("quantize", &quantize, "x rounded to 8 bits per block of 32 as the products round it: xq, dx, sx");
}
