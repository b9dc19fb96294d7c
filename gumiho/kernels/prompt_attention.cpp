// Causal attention over a prompt on a CPU (kernels/__init__.py's `prompt_attention`), in fp32: flash attention's
// forward pass. Each work unit takes a block of query tokens of one KV head, the rows of every query head that reads
// that KV head together, and walks the visible keys a block at a time with a running maximum and sum, so the scores
// never leave the cache. Where torch's SDPA computes a 9-head, 3-KV-head, 64-wide attention over 800 tokens at about
// 55 GMAC/s on the 2-core Zen 5 EPYC, the blocks here share each key and value load among 4 query rows.
//
// A prompt's attention is not row-consistent (a decode step's is: attention.cpp): rows are summed in blocks.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "simd.h"

namespace {

#if defined(__AVX2__) && defined(__FMA__)
#define GUMIHO_PROMPT_ATTENTION 1
#if defined(__AVX512F__)
using Lanes = Floats16;
constexpr int ROWS = 4;  // query rows sharing each key and value load (4 x 4 accumulators of 32 registers)
#else
using Lanes = Floats8;
constexpr int ROWS = 2;  // 2 x 4 accumulators of 16 registers
#endif
using V = Lanes::V;
constexpr int W = Lanes::lanes;
constexpr int KEYS = 4 * W;        // keys per block: four vectors of scores per row
constexpr int64_t TOKENS = 32;     // query tokens per work unit (rows: TOKENS times the query heads per KV head)
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// Four vectors from p, and acc[j] += x * v[j] for them: the step both products below repeat for each of R rows.
inline void load4(const float* p, V* v) {
    for (int j = 0; j < 4; ++j) v[j] = Lanes::load(p + j * W);
}
inline void fmadd4(float x, const V* v, V* acc) {
    const V b = Lanes::set1(x);
    for (int j = 0; j < 4; ++j) acc[j] = Lanes::fmadd(b, v[j], acc[j]);
}

// s[r][k] = q[r] . kt[., k] for R query rows of d values (already scaled) and a block of KEYS keys stored
// transposed (kt[i * KEYS + k] is dimension i of key k).
template <int R>
inline void block_scores(const float* q, int64_t d, const float* kt, float* s) {
    V acc[R][4], k[4];
    for (int r = 0; r < R; ++r)
        for (int j = 0; j < 4; ++j) acc[r][j] = Lanes::set1(0.f);
    for (int64_t i = 0; i < d; ++i) {
        load4(kt + i * KEYS, k);
        for (int r = 0; r < R; ++r) fmadd4(q[r * d + i], k, acc[r]);
    }
    for (int r = 0; r < R; ++r)
        for (int j = 0; j < 4; ++j) Lanes::store(s + r * KEYS + j * W, acc[r][j]);
}

// o[r] = o[r] * rescale[r] + sum_k p[r][k] v[k] for R rows, over `keys` value rows (`vs` apart) of d values,
// 4 vectors of outputs at a time.
template <int R>
inline void block_values(const float* p, int64_t keys, const float* v, int64_t vs, int64_t d, float* o,
                         const float* rescale) {
    for (int64_t c = 0; c < d; c += 4 * W) {
        V acc[R][4], row[4];
        for (int r = 0; r < R; ++r) {
            const V f = Lanes::set1(rescale[r]);
            for (int j = 0; j < 4; ++j) acc[r][j] = Lanes::mul(Lanes::load(o + r * d + c + j * W), f);
        }
        for (int64_t k = 0; k < keys; ++k) {
            load4(v + k * vs + c, row);
            for (int r = 0; r < R; ++r) fmadd4(p[r * KEYS + k], row, acc[r]);
        }
        for (int r = 0; r < R; ++r)
            for (int j = 0; j < 4; ++j) Lanes::store(o + r * d + c + j * W, acc[r][j]);
    }
}

// fn(std::integral_constant<int, R>{}) for R = min(rows, ROWS) (1 to 4): the blocks' rows, the last group shorter.
template <typename F>
inline void with_group(int64_t rows, const F& fn) {
    switch (std::min<int64_t>(rows, ROWS)) {
        case 1: fn(std::integral_constant<int, 1>{}); break;
        case 2: fn(std::integral_constant<int, 2>{}); break;
#if defined(__AVX512F__)
        case 3: fn(std::integral_constant<int, 3>{}); break;
        default: fn(std::integral_constant<int, 4>{}); break;
#else
        default: fn(std::integral_constant<int, 2>{}); break;
#endif
    }
}

inline float largest(const float* x) {
    V m = Lanes::load(x);
    for (int j = 1; j < 4; ++j) m = Lanes::max(m, Lanes::load(x + j * W));
    alignas(64) float lane[W];
    Lanes::store(lane, m);
    return *std::max_element(lane, lane + W);
}

// The keys [0, total) of one KV head (rows `stride` apart, d values) as tiles of KEYS keys, each transposed:
// tile[i * KEYS + k] is dimension i of key k of the block (0 past the last key). Transposed once per call for every
// query block, where each block once transposed its own copies (30 layers at 800 / 1,200 tokens on the 2-core Zen 5
// EPYC: 91.2 -> 84.3 ms, 202.6 -> 184.8). A query block's keys past its last token enter as themselves rather than
// as zeros: their scores are replaced by -inf all the same, so every output is what it was.
inline void key_tiles(const float* keys, int64_t stride, int64_t total, int64_t d, float* tiles) {
    for (int64_t k0 = 0; k0 < total; k0 += KEYS) {
        float* tile = tiles + k0 * d;
        const int64_t count = std::min<int64_t>(KEYS, total - k0);
        for (int64_t k = 0; k < KEYS; ++k) {
            const float* key = keys + (k0 + k) * stride;
            for (int64_t i = 0; i < d; ++i) tile[i * KEYS + k] = k < count ? key[i] : 0.f;
        }
    }
}

// One work unit: query tokens [t0, t1) of KV head `kv` in batch row `b`, every query head of the group.
struct Unit {
    const float *q, *values;
    const float* tiles;  // every block of KEYS keys transposed once, [B * KV][key_blocks][d][KEYS] (key_tiles)
    float* out;
    int64_t n, past, d, groups, heads, kv_heads, key_blocks, qs[3], vs[3];
    float scale;

    void operator()(int64_t b, int64_t kv, int64_t t0, std::vector<float>& scratch) const {
        const int64_t t1 = std::min(n, t0 + TOKENS), span = t1 - t0, rows = groups * span;
        scratch.resize(rows * d * 2 + rows * KEYS + 3 * rows);
        float* qrows = scratch.data();             // [rows][d], scaled; row r: member r / span, token t0 + r % span
        float* o = qrows + rows * d;               // [rows][d], running weighted sums of values
        float* s = o + rows * d;                   // [rows][KEYS], scores, then their exps
        float* top = s + rows * KEYS;              // [rows], running maximum
        float* sum = top + rows;                   // [rows], running sum of exps
        float* rescale = sum + rows;               // [rows], exp(old maximum - new)
        for (int64_t r = 0; r < rows; ++r) {
            const float* from = q + b * qs[0] + (kv * groups + r / span) * qs[1] + (t0 + r % span) * qs[2];
            for (int64_t i = 0; i < d; ++i) qrows[r * d + i] = from[i] * scale;
        }
        std::fill(o, o + rows * d, 0.f);
        std::fill(top, top + rows, NEG_INF);
        std::fill(sum, sum + rows, 0.f);
        const float* kblocks = tiles + (b * kv_heads + kv) * key_blocks * KEYS * d;
        const float* vbase = values + b * vs[0] + kv * vs[1];
        const int64_t last = past + t1 - 1;  // the last key any of these rows sees
        for (int64_t k0 = 0; k0 <= last; k0 += KEYS) {
            const int64_t count = std::min<int64_t>(KEYS, last + 1 - k0);
            const float* kt = kblocks + k0 * d;  // this block's tile: k0 / KEYS tiles of KEYS * d before it
            for (int64_t r0 = 0; r0 < rows; r0 += ROWS)
                with_group(rows - r0, [&](auto group) {
                    block_scores<decltype(group)::value>(qrows + r0 * d, d, kt, s + r0 * KEYS);
                });
            for (int64_t r = 0; r < rows; ++r) {
                float* row = s + r * KEYS;
                const int64_t seen = std::min<int64_t>(count, past + t0 + r % span - k0 + 1);  // visible keys
                if (seen <= 0) {  // the whole block lies after this row's token
                    std::fill(row, row + KEYS, 0.f);
                    rescale[r] = 1.f;
                    continue;
                }
                std::fill(row + seen, row + KEYS, NEG_INF);
                const float best = std::max(top[r], largest(row));
                rescale[r] = top[r] == NEG_INF ? 0.f : std::exp(top[r] - best);
                const V vbest = Lanes::set1(best);
                for (int j = 0; j < 4; ++j)
                    Lanes::store(row + j * W, exp_lanes<Lanes>(Lanes::sub(Lanes::load(row + j * W), vbest)));
                std::fill(row + seen, row + KEYS, 0.f);  // exp_lanes clamps -inf to a tiny number, not zero
                V total = Lanes::load(row);
                for (int j = 1; j < 4; ++j) total = Lanes::add(total, Lanes::load(row + j * W));
                alignas(64) float lane[W];
                Lanes::store(lane, total);
                float added = 0.f;
                for (int i = 0; i < W; ++i) added += lane[i];
                sum[r] = sum[r] * rescale[r] + added;
                top[r] = best;
            }
            for (int64_t r0 = 0; r0 < rows; r0 += ROWS)
                with_group(rows - r0, [&](auto group) {
                    block_values<decltype(group)::value>(s + r0 * KEYS, count, vbase + k0 * vs[2], vs[2], d,
                                                         o + r0 * d, rescale + r0);
                });
        }
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t head = kv * groups + r / span, t = t0 + r % span;
            float* to = out + (b * n + t) * heads * d + head * d;
            const float inverse = 1.f / sum[r];
            for (int64_t i = 0; i < d; ++i) to[i] = o[r * d + i] * inverse;
        }
    }
};
#endif

}  // namespace

bool available() {
#ifdef GUMIHO_PROMPT_ATTENTION
    return true;
#else
    return false;
#endif
}

// q [B, H, n, d] fp32, heads ordered (KV head, member): head h reads KV head h / (H / KV); keys, values [B, KV,
// >= past + n, d] fp32, rows contiguous (a view of a cache); query token t sees keys 0 .. past + t. Returns
// [B, n, H * d] fp32, head h's output at columns [h d, (h + 1) d): ready for the output projection.
torch::Tensor causal(torch::Tensor q, torch::Tensor keys, torch::Tensor values, int64_t past, double scale) {
    TORCH_CHECK(q.scalar_type() == torch::kFloat && keys.scalar_type() == torch::kFloat &&
                values.scalar_type() == torch::kFloat, "causal: fp32 queries, keys and values");
    TORCH_CHECK(q.dim() == 4 && keys.dim() == 4 && values.dim() == 4, "causal: 4-d tensors");
    TORCH_CHECK(q.stride(3) == 1 && keys.stride(3) == 1 && values.stride(3) == 1, "causal: rows must be contiguous");
    const int64_t B = q.size(0), H = q.size(1), n = q.size(2), d = q.size(3), KV = keys.size(1);
    TORCH_CHECK(H % KV == 0 && keys.size(0) == B && values.size(0) == B && values.size(1) == KV &&
                keys.size(2) >= past + n && values.size(2) >= past + n && keys.size(3) == d && values.size(3) == d,
                "causal: inconsistent shapes");
    auto out = torch::empty({B, n, H * d}, q.options());
#ifdef GUMIHO_PROMPT_ATTENTION
    TORCH_CHECK(d % (4 * W) == 0, "causal: the head size must be a multiple of ", 4 * W);
    const int64_t total = past + n, key_blocks = (total + KEYS - 1) / KEYS;
    auto tiles = torch::empty({B * KV, key_blocks * KEYS * d}, q.options());
    at::parallel_for(0, B * KV, 1, [&](int64_t begin, int64_t end) {
        for (int64_t bkv = begin; bkv < end; ++bkv)
            key_tiles(keys.data_ptr<float>() + bkv / KV * keys.stride(0) + bkv % KV * keys.stride(1), keys.stride(2),
                      total, d, tiles.data_ptr<float>() + bkv * key_blocks * KEYS * d);
    });
    const Unit unit{q.data_ptr<float>(), values.data_ptr<float>(), tiles.data_ptr<float>(),
                    out.data_ptr<float>(), n, past, d, H / KV, H, KV, key_blocks, {q.stride(0), q.stride(1), q.stride(2)},
                    {values.stride(0), values.stride(1), values.stride(2)}, static_cast<float>(scale)};
    // Units dealt to the threads in turn, the costliest (latest tokens: the most keys) first, so that each thread
    // gets about the same share of a causal attention's work.
    const int64_t blocks = (n + TOKENS - 1) / TOKENS, units = B * KV * blocks;
    const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), units));
    at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> scratch;
        for (int64_t thread = begin; thread < end; ++thread)
            for (int64_t u = thread; u < units; u += threads) {
                const int64_t block = blocks - 1 - u / (B * KV), bkv = u % (B * KV);
                unit(bkv / KV, bkv % KV, block * TOKENS, scratch);
            }
    });
#else
    TORCH_CHECK(false, "causal: built without AVX2");
#endif
    return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("available", &available, "Whether this build has the vector code (AVX2 or AVX-512)");
    m.def("causal", &causal, "Causal attention over a prompt, blocks of queries against blocks of keys (fp32; CPU)");
}
