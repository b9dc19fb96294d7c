// Causal attention over a prompt on a CPU (kernels/__init__.py's `prompt_attention`), in fp32 or, where the processor
// has AVX512-BF16, with bf16 products (`Bf16`): flash attention's forward pass. Each work unit takes a block of query tokens of one KV head, the rows of every query head that reads
// that KV head together, and walks the visible keys a block at a time with a running maximum and sum, so the scores
// never leave the cache. Where torch's SDPA computes a 9-head, 3-KV-head, 64-wide attention over 800 tokens at about
// 55 GMAC/s on the 2-core Zen 5 EPYC, the blocks here share each key and value load among 4 query rows.
//
// Where the processor has AMX tiles, the bf16 products may also run on them (`AmxUnit`, `causal(..., amx=True)`): on
// the 2-core Intel Xeon with AMX, one layer at 763 tokens, 1.6 ms against SDPA's 2.8 (its bf16 products through
// oneDNN).
//
// A prompt's attention is not row-consistent (a decode step's is: attention.cpp): rows are summed in blocks.
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

// Four vectors from p, and acc[j] += x * v[j] for them: the step both fp32 products below repeat for each of R rows.
inline void load4(const float* p, V* v) {
    for (int j = 0; j < 4; ++j) v[j] = Lanes::load(p + j * W);
}
inline void fmadd4(float x, const V* v, V* acc) {
    const V b = Lanes::set1(x);
    for (int j = 0; j < 4; ++j) acc[j] = Lanes::fmadd(b, v[j], acc[j]);
}

// The products in fp32. Key tiles: each block of KEYS keys transposed, tile[i * KEYS + k] dimension i of key k.
// Values: the cache's own rows.
struct Fp32 {
    using T = float;

    static void query_row(const float* from, float scale, int64_t d, float* to) {
        for (int64_t i = 0; i < d; ++i) to[i] = from[i] * scale;
    }

    static float lane_sum(V total) {  // lane by lane, in order
        alignas(64) float lane[W];
        Lanes::store(lane, total);
        float added = 0.f;
        for (int i = 0; i < W; ++i) added += lane[i];
        return added;
    }

    static void key_tile(const float* keys, int64_t stride, int64_t count, int64_t d, float* tile) {
        for (int64_t k = 0; k < KEYS; ++k)
            for (int64_t i = 0; i < d; ++i) tile[i * KEYS + k] = k < count ? keys[k * stride + i] : 0.f;
    }

    // s[r][k] = q[r] . key k of the tile, for R query rows of d values (already scaled).
    template <int R>
    static void scores(const float* q, int64_t d, const float* kt, float* s) {
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
    static void values(const float* p, int64_t keys, const float* v, int64_t vs, int64_t d, float* o,
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
};

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define GUMIHO_PROMPT_BF16 1
// 16 of a prompt's queries, keys or values as floats, exactly: fp32 as they are, fp16 and bf16 widened. The bf16
// products read a bf16 query or an fp16 cache as it lies, where an fp32 copy of each cost a prefill's attention a
// fifth of its time (2-core Intel Xeon with AMX, CNN/DM's 763-token prompts).
inline __m512 floats16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 floats16(const at::Half* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 floats16(const at::BFloat16* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

// The products in bf16 with fp32 sums (AVX512-BF16's vdpbf16ps: 32 products a vector where an fp32 FMA does 16):
// queries, keys, values and the softmax's weights rounded to bf16 (vcvtne2ps2bf16: to nearest even), the running maximum, the sums
// and the outputs kept in fp32. A pair of neighbours along the summed dimension shares each 32-bit lane, so key tiles
// hold dimension pairs, tile[(i / 2 * KEYS + k) * 2 + i % 2], and values key pairs, [(k / 2 * d + c) * 2 + k % 2].
struct Bf16 {
    using T = uint16_t;  // a bf16's bits

    static __m512bh pairs(int32_t two) { return (__m512bh)_mm512_set1_epi32(two); }  // one pair in every lane
    static __m512i round32(__m512 low, __m512 high) {  // 32 floats rounded to nearest even, in order
        return (__m512i)_mm512_cvtne2ps_pbh(high, low);
    }

    static float lane_sum(__m512 total) { return _mm512_reduce_add_ps(total); }  // in a tree

    template <typename S>
    static void query_row(const S* from, float scale, int64_t d, uint16_t* to) {
        const __m512 f = _mm512_set1_ps(scale);
        for (int64_t i = 0; i < d; i += 32)
            _mm512_storeu_si512(to + i, round32(_mm512_mul_ps(floats16(from + i), f),
                                                _mm512_mul_ps(floats16(from + i + 16), f)));
    }

    // A key's dimension pair is one 32-bit word: key k's row rounded, then its words KEYS apart.
    template <typename S>
    static void key_tile(const S* keys, int64_t stride, int64_t count, int64_t d, uint16_t* tile) {
        alignas(64) uint32_t words[16];
        for (int64_t k = 0; k < KEYS; ++k)
            for (int64_t i = 0; i < d; i += 32) {
                const __m512i row = k < count ? round32(floats16(keys + k * stride + i),
                                                        floats16(keys + k * stride + i + 16))
                                              : _mm512_setzero_si512();
                _mm512_store_si512(words, row);
                for (int w = 0; w < 16; ++w) std::memcpy(tile + ((i / 2 + w) * KEYS + k) * 2, words + w, 4);
            }
    }

    // A tile of value pairs for keys [0, count) of KEYS (0 past them): rows `stride` apart, d values. Two keys' 16
    // columns rounded into one vector, then interleaved column by column.
    template <typename S>
    static void value_tile(const S* values, int64_t stride, int64_t count, int64_t d, uint16_t* tile) {
        const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                                    23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
        const __m512 zero = _mm512_setzero_ps();
        for (int64_t k = 0; k < KEYS; k += 2)
            for (int64_t c = 0; c < d; c += 16) {
                const __m512 first = k < count ? floats16(values + k * stride + c) : zero;
                const __m512 second = k + 1 < count ? floats16(values + (k + 1) * stride + c) : zero;
                _mm512_storeu_si512(tile + (k / 2 * d + c) * 2,
                                    _mm512_permutexvar_epi16(interleave, round32(first, second)));
            }
    }

    template <int R>
    static void scores(const uint16_t* q, int64_t d, const uint16_t* kt, float* s) {
        __m512 acc[R][4];
        for (int r = 0; r < R; ++r)
            for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
        for (int64_t i = 0; i < d / 2; ++i) {
            __m512bh k[4];
            for (int j = 0; j < 4; ++j) k[j] = (__m512bh)_mm512_loadu_si512(kt + (i * KEYS + j * W) * 2);
            for (int r = 0; r < R; ++r) {
                int32_t two;
                std::memcpy(&two, q + r * d + 2 * i, sizeof two);
                const __m512bh b = pairs(two);
                for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], b, k[j]);
            }
        }
        for (int r = 0; r < R; ++r)
            for (int j = 0; j < 4; ++j) _mm512_storeu_ps(s + r * KEYS + j * W, acc[r][j]);
    }

    // As Fp32::values, from a tile of value pairs (`vs` unused): the weights p rounded to bf16 first.
    template <int R>
    static void values(const float* p, int64_t keys, const uint16_t* v, int64_t, int64_t d, float* o,
                       const float* rescale) {
        alignas(64) uint16_t weights[R][KEYS];
        for (int r = 0; r < R; ++r)
            for (int k = 0; k < KEYS; k += 32)
                _mm512_store_si512(weights[r] + k,
                                   round32(_mm512_loadu_ps(p + r * KEYS + k), _mm512_loadu_ps(p + r * KEYS + k + 16)));
        for (int64_t c = 0; c < d; c += 4 * W) {
            __m512 acc[R][4];
            for (int r = 0; r < R; ++r) {
                const __m512 f = _mm512_set1_ps(rescale[r]);
                for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_mul_ps(_mm512_loadu_ps(o + r * d + c + j * W), f);
            }
            for (int64_t k = 0; k < keys; k += 2) {  // an odd count's last pair: the weight past it is 0
                __m512bh row[4];
                for (int j = 0; j < 4; ++j) row[j] = (__m512bh)_mm512_loadu_si512(v + (k / 2 * d + c + j * W) * 2);
                for (int r = 0; r < R; ++r) {
                    int32_t two;
                    std::memcpy(&two, weights[r] + k, sizeof two);
                    const __m512bh b = pairs(two);
                    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], b, row[j]);
                }
            }
            for (int r = 0; r < R; ++r)
                for (int j = 0; j < 4; ++j) _mm512_storeu_ps(o + r * d + c + j * W, acc[r][j]);
        }
    }
};
#endif

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

inline float largest(const float* x) {  // exact in any order
    V m = Lanes::load(x);
    for (int j = 1; j < 4; ++j) m = Lanes::max(m, Lanes::load(x + j * W));
#if defined(__AVX512F__)
    return _mm512_reduce_max_ps(m);
#else
    alignas(64) float lane[W];
    Lanes::store(lane, m);
    return *std::max_element(lane, lane + W);
#endif
}

// The keys [0, total) of one KV head (rows `stride` apart, d values) as tiles of KEYS keys (M::key_tile), and where
// M has them, its values too. Laid out once per call for every query block, where each block once transposed its own
// copies (fp32, 30 layers at 800 / 1,200 tokens on the 2-core Zen 5 EPYC: 91.2 -> 84.3 ms, 202.6 -> 184.8). A query
// block's keys past its last token enter as themselves rather than as zeros: their scores are replaced by -inf all
// the same, so every output is what it was.
template <typename M, typename S>
void tiles_of(const S* rows, int64_t stride, int64_t total, int64_t d, bool values, typename M::T* tiles) {
    for (int64_t k0 = 0; k0 < total; k0 += KEYS) {
        const int64_t count = std::min<int64_t>(KEYS, total - k0);
        if (!values)
            M::key_tile(rows + k0 * stride, stride, count, d, tiles + k0 * d);
#ifdef GUMIHO_PROMPT_BF16
        else if constexpr (std::is_same_v<M, Bf16>)
            M::value_tile(rows + k0 * stride, stride, count, d, tiles + k0 * d);
#endif
    }
}

// A row's outputs o * inverse into `to`: fp32, or rounded to bf16 as torch rounds (simd.h's to_bf16_row) for a bf16
// prefill's output projection, which would otherwise take a rounded copy.
inline void write_row(const float* o, float inverse, int64_t d, float* to) {
    for (int64_t i = 0; i < d; ++i) to[i] = o[i] * inverse;
}
inline void write_row(const float* o, float inverse, int64_t d, at::BFloat16* to) {
    alignas(64) float chunk[64];
    for (int64_t c = 0; c < d; c += 64) {
        const int64_t count = std::min<int64_t>(64, d - c);
        write_row(o + c, inverse, count, chunk);
        to_bf16_row(chunk, count, reinterpret_cast<uint16_t*>(to + c));
    }
}

// One work unit: query tokens [t0, t1) of KV head `kv` in batch row `b`, every query head of the group; queries of
// type Q (fp32, or bf16 for Bf16's products), outputs of type O (fp32, or bf16 for Bf16's).
template <typename M, typename Q, typename O>
struct Unit {
    using T = typename M::T;
    const Q* q;
    const T* tiles;    // every block of KEYS keys laid out once, [B * KV][key_blocks * KEYS * d] (tiles_of)
    const T* values;   // the values' rows (Fp32: the cache's own, `vs` apart; Bf16: value tiles as the keys')
    O* out;
    int64_t n, past, d, groups, heads, kv_heads, key_blocks, qs[3], vs[3];
    float scale;

    const T* values_of(int64_t b, int64_t kv) const {
        if constexpr (std::is_same_v<M, Fp32>) return values + b * vs[0] + kv * vs[1];
        return values + (b * kv_heads + kv) * key_blocks * KEYS * d;
    }

    void operator()(int64_t b, int64_t kv, int64_t t0, std::vector<float>& scratch, std::vector<T>& qrows) const {
        const int64_t t1 = std::min(n, t0 + TOKENS), span = t1 - t0, rows = groups * span;
        scratch.resize(rows * d + rows * KEYS + 3 * rows);
        qrows.resize(rows * d);                    // [rows][d], scaled; row r: member r / span, token t0 + r % span
        float* o = scratch.data();                 // [rows][d], running weighted sums of values
        float* s = o + rows * d;                   // [rows][KEYS], scores, then their exps
        float* top = s + rows * KEYS;              // [rows], running maximum
        float* sum = top + rows;                   // [rows], running sum of exps
        float* rescale = sum + rows;               // [rows], exp(old maximum - new)
        for (int64_t r = 0; r < rows; ++r)
            M::query_row(q + b * qs[0] + (kv * groups + r / span) * qs[1] + (t0 + r % span) * qs[2], scale, d,
                         qrows.data() + r * d);
        std::fill(o, o + rows * d, 0.f);
        std::fill(top, top + rows, NEG_INF);
        std::fill(sum, sum + rows, 0.f);
        const T* kblocks = tiles + (b * kv_heads + kv) * key_blocks * KEYS * d;
        const T* vbase = values_of(b, kv);
        const int64_t vkey = std::is_same_v<M, Fp32> ? vs[2] : d;  // elements from one key's values to the next
        const int64_t last = past + t1 - 1;  // the last key any of these rows sees
        for (int64_t k0 = 0; k0 <= last; k0 += KEYS) {
            const int64_t count = std::min<int64_t>(KEYS, last + 1 - k0);
            const T* kt = kblocks + k0 * d;  // this block's tile: k0 / KEYS tiles of KEYS * d before it
            for (int64_t r0 = 0; r0 < rows; r0 += ROWS)
                with_group(rows - r0, [&](auto group) {
                    M::template scores<decltype(group)::value>(qrows.data() + r0 * d, d, kt, s + r0 * KEYS);
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
                sum[r] = sum[r] * rescale[r] + M::lane_sum(total);
                top[r] = best;
            }
            for (int64_t r0 = 0; r0 < rows; r0 += ROWS)
                with_group(rows - r0, [&](auto group) {
                    M::template values<decltype(group)::value>(s + r0 * KEYS, count, vbase + k0 * vkey, vkey, d,
                                                               o + r0 * d, rescale + r0);
                });
        }
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t head = kv * groups + r / span, t = t0 + r % span;
            write_row(o + r * d, 1.f / sum[r], d, out + (b * n + t) * heads * d + head * d);
        }
    }
};

// Every (batch row, KV head)'s keys [0, past + n) laid out as M's key tiles (tiles_of), and after all of them, where M
// has value tiles, its values'; each KV head's take `tile` numbers. Keys and values of type S.
template <typename M, typename S>
std::vector<typename M::T> key_and_value_tiles(const torch::Tensor& keys, const torch::Tensor& values, int64_t total,
                                               int64_t tile) {
    const int64_t B = keys.size(0), KV = keys.size(1), d = keys.size(3);
    constexpr bool value_tiles = !std::is_same_v<M, Fp32>;
    std::vector<typename M::T> tiles((value_tiles ? 2 : 1) * B * KV * tile);
    at::parallel_for(0, (value_tiles ? 2 : 1) * B * KV, 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            const int64_t bkv = i % (B * KV);
            const bool of_values = i >= B * KV;
            const torch::Tensor& from = of_values ? values : keys;
            tiles_of<M>(from.data_ptr<S>() + bkv / KV * from.stride(0) + bkv % KV * from.stride(1),
                        from.stride(2), total, d, of_values, tiles.data() + i * tile);
        }
    });
    return tiles;
}

// Units [0, units) dealt to the threads in turn, unit u to thread u % threads, each thread calling
// work(u, its scratch) in order: with the costliest units first (the latest tokens, which see the most keys), each
// thread gets about the same share of a causal attention's work.
template <typename Scratch, typename F>
void deal(int64_t units, const F& work) {
    const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), units));
    at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
        Scratch scratch;
        for (int64_t thread = begin; thread < end; ++thread)
            for (int64_t u = thread; u < units; u += threads) work(u, scratch);
    });
}

// The attention of `causal` in M's products, into out (of type O), from queries of type Q and keys and values of
// type S.
template <typename M, typename Q = float, typename S = float, typename O = float>
void attend(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& values, int64_t past,
            double scale, torch::Tensor& out) {
    using T = typename M::T;
    const int64_t B = q.size(0), H = q.size(1), n = q.size(2), d = q.size(3), KV = keys.size(1);
    TORCH_CHECK(d % (4 * W) == 0, "causal: the head size must be a multiple of ", 4 * W);
    const int64_t total = past + n, key_blocks = (total + KEYS - 1) / KEYS, tile = key_blocks * KEYS * d;
    const std::vector<T> tiles = key_and_value_tiles<M, S>(keys, values, total, tile);
    const T* value_rows = tiles.data() + B * KV * tile;
    if constexpr (std::is_same_v<M, Fp32>) value_rows = values.data_ptr<float>();
    const Unit<M, Q, O> unit{q.data_ptr<Q>(), tiles.data(), value_rows, out.data_ptr<O>(), n, past, d, H / KV, H,
                       KV, key_blocks, {q.stride(0), q.stride(1), q.stride(2)},
                       {values.stride(0), values.stride(1), values.stride(2)}, static_cast<float>(scale)};
    const int64_t blocks = (n + TOKENS - 1) / TOKENS;
    struct Scratch {
        std::vector<float> rows;
        std::vector<T> queries;
    };
    deal<Scratch>(B * KV * blocks, [&](int64_t u, Scratch& scratch) {
        const int64_t block = blocks - 1 - u / (B * KV), bkv = u % (B * KV);
        unit(bkv / KV, bkv % KV, block * TOKENS, scratch.rows, scratch.queries);
    });
}

#if defined(GUMIHO_PROMPT_BF16) && defined(GUMIHO_AMX_TILES)
#define GUMIHO_PROMPT_AMX 1
// Bf16's products on AMX tiles (Intel's Advanced Matrix Extensions), for heads of 64 dimensions. A work unit takes 16
// query tokens of one query head: their scores against every key the last of them sees (S = Q K^T, a tile product
// per 16 keys and half of the dimensions), each row's softmax taken whole (its maximum first, so no running rescale),
// and P V summed over blocks of 32 keys into four tiles of 16 outputs. The numbers rounded to bf16 are Bf16's: the
// scaled queries, the keys, the values and the numerators; every sum is in fp32, the numerators' before rounding, as
// Bf16's. The key and value tiles are Bf16's own layout (tiles_of), which the tiles load as it lies: B tiles of 16
// keys' dimension pairs, and of 32 keys' value pairs, each row of 64 bytes 256 apart.
constexpr int64_t AMX_TOKENS = 16;  // a tile's rows
constexpr int64_t AMX_D = 64;

struct AmxScratch {
    std::vector<float> scores;       // [AMX_TOKENS][width]
    std::vector<uint16_t> numerators;  // [AMX_TOKENS][width], bf16
    bool configured = false;
    ~AmxScratch() {
        if (configured) _tile_release();
    }
};

// e^x for x <= 0 (a score less its row's maximum) as 2^f 2^i, f in [0, 1) by a polynomial of degree 4: within
// 3e-6 of e^x relative, where a numerator rounded to bf16 moves by up to 2e-3 (exp_lanes' degree 7, which the other
// products take, cost a quarter of the tiles' whole attention).
inline __m512 exp_nonpositive(__m512 x) {
    const __m512 t = _mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(-100.f)), _mm512_set1_ps(1.44269504f));
    const __m512 i = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, i);
    __m512 p = _mm512_set1_ps(0.0135206031f);
    for (const float c : {0.0520374291f, 0.241427496f, 0.693006635f, 1.00000250f})
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
    return _mm512_scalef_ps(p, i);
}

// Row r of a unit's scores: its first `seen` keys' numerators exp(s - max) rounded to bf16 into `to` (zeros up to
// `width`, a multiple of 32), and their sum (before rounding, as Bf16's).
inline float numerators(const float* row, int64_t seen, int64_t width, uint16_t* to) {
    const auto mask = [seen](int64_t j) -> __mmask16 {
        const int64_t m = std::clamp<int64_t>(seen - j, 0, 16);
        return static_cast<__mmask16>((1u << m) - 1);
    };
    __m512 top = _mm512_set1_ps(NEG_INF);
    for (int64_t j = 0; j < seen; j += 16)
        top = _mm512_max_ps(top, _mm512_mask_loadu_ps(_mm512_set1_ps(NEG_INF), mask(j), row + j));
    const __m512 best = _mm512_set1_ps(_mm512_reduce_max_ps(top));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < width; j += 32) {
        __m512 half[2];
        for (int e = 0; e < 2; ++e) {
            const __mmask16 m = mask(j + 16 * e);
            half[e] = m ? _mm512_maskz_mov_ps(m, exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(row + j + 16 * e),
                                                                                best)))
                        : _mm512_setzero_ps();
        }
        _mm512_storeu_si512(to + j, Bf16::round32(half[0], half[1]));
        sum = _mm512_add_ps(sum, _mm512_add_ps(half[0], half[1]));
    }
    return _mm512_reduce_add_ps(sum);
}

// Tile C = the scores of tile 0's and 1's queries (dimensions 0-31, 32-63) against the 16 keys whose dimension pairs
// lie at `pairs` (Bf16::key_tile's rows, 256 bytes apart: pairs 0-15, then 16-31 KEYS * 32 numbers on). A macro: the
// tile intrinsics take their tile numbers as literals.
#define GUMIHO_SCORE_TILE(C, pairs)                     \
    do {                                                \
        _tile_zero(C);                                  \
        _tile_loadd(6, (pairs), KEYS * 4);              \
        _tile_dpbf16ps(C, 0, 6);                        \
        _tile_loadd(7, (pairs) + KEYS * 32, KEYS * 4);  \
        _tile_dpbf16ps(C, 1, 7);                        \
    } while (0)

template <typename Q, typename O>
struct AmxUnit {
    const Q* q;
    const uint16_t* keys;    // Bf16 key tiles, [B * KV][key_blocks * KEYS * d]
    const uint16_t* values;  // Bf16 value tiles, the same
    O* out;
    int64_t n, past, groups, heads, kv_heads, key_blocks, qs[3];
    float scale;

    void operator()(int64_t b, int64_t h, int64_t t0, AmxScratch& scratch) const {
        constexpr int64_t d = AMX_D;
        const int64_t t1 = std::min(n, t0 + AMX_TOKENS), span = t1 - t0;
        const int64_t width = (past + t1 + 31) / 32 * 32;  // the last row's keys, in whole blocks of 32
        // Rows a cache line longer than that: rows a multiple of 1 KB apart would share a few of L1's sets (763
        // keys, 3 KB rows: 1.36-1.60 -> 1.27-1.45 ms a layer on the 2-core Intel Xeon with AMX, three runs each).
        const int64_t ld = width + 32;
        if (static_cast<int64_t>(scratch.scores.size()) < AMX_TOKENS * ld) {
            scratch.scores.resize(AMX_TOKENS * ld);
            scratch.numerators.resize(AMX_TOKENS * ld);
        }
        if (!scratch.configured) {
            amx::configure();
            scratch.configured = true;
        }
        float* scores = scratch.scores.data();
        uint16_t* p = scratch.numerators.data();
        alignas(64) uint16_t qa[AMX_TOKENS * d];
        alignas(64) float acc[AMX_TOKENS * d];
        float sums[AMX_TOKENS];
        for (int64_t r = 0; r < AMX_TOKENS; ++r) {
            if (r < span)
                Bf16::query_row(q + b * qs[0] + h * qs[1] + (t0 + r) * qs[2], scale, d, qa + r * d);
            else
                std::memset(qa + r * d, 0, d * sizeof(uint16_t));
        }
        const int64_t at = (b * kv_heads + h / groups) * key_blocks * KEYS * d;
        const uint16_t *kt = keys + at, *vt = values + at;
        _tile_loadd(0, qa, d * 2);
        _tile_loadd(1, qa + 32, d * 2);
        // Scores 64 keys at a time (a block of Bf16's tiles), in four tiles whose products run side by side: keys
        // 16j .. 16j + 15 in tile 2 + j (the last block of a width 32 short of 64: two tiles).
        for (int64_t k0 = 0; k0 < width; k0 += KEYS) {
            const uint16_t* block = kt + k0 * d;
            const bool whole = width - k0 >= 64;
            GUMIHO_SCORE_TILE(2, block);
            GUMIHO_SCORE_TILE(3, block + 32);
            if (whole) {
                GUMIHO_SCORE_TILE(4, block + 64);
                GUMIHO_SCORE_TILE(5, block + 96);
            }
            _tile_stored(2, scores + k0, ld * 4);
            _tile_stored(3, scores + k0 + 16, ld * 4);
            if (whole) {
                _tile_stored(4, scores + k0 + 32, ld * 4);
                _tile_stored(5, scores + k0 + 48, ld * 4);
            }
        }
        for (int64_t r = 0; r < AMX_TOKENS; ++r) {
            if (r < span)
                sums[r] = numerators(scores + r * ld, past + t0 + r + 1, width, p + r * ld);
            else
                std::memset(p + r * ld, 0, width * sizeof(uint16_t));
        }
        _tile_zero(4);
        _tile_zero(5);
        _tile_zero(6);
        _tile_zero(7);
        for (int64_t k0 = 0; k0 < width; k0 += 32) {  // value tiles of dimensions 0-15, 16-31, 32-47, 48-63
            const uint16_t* tile = vt + k0 / KEYS * KEYS * d + k0 % KEYS * d;
            _tile_loadd(0, p + k0, ld * 2);
            _tile_loadd(1, tile, d * 4);
            _tile_dpbf16ps(4, 0, 1);
            _tile_loadd(2, tile + 32, d * 4);
            _tile_dpbf16ps(5, 0, 2);
            _tile_loadd(3, tile + 64, d * 4);
            _tile_dpbf16ps(6, 0, 3);
            _tile_loadd(1, tile + 96, d * 4);
            _tile_dpbf16ps(7, 0, 1);
        }
        _tile_stored(4, acc, d * 4);
        _tile_stored(5, acc + 16, d * 4);
        _tile_stored(6, acc + 32, d * 4);
        _tile_stored(7, acc + 48, d * 4);
        for (int64_t r = 0; r < span; ++r)
            write_row(acc + r * d, 1.f / sums[r], d, out + (b * n + t0 + r) * heads * d + h * d);
    }
};

template <typename Q, typename S, typename O>
void attend_amx(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& values, int64_t past,
                double scale, torch::Tensor& out) {
    const int64_t B = q.size(0), H = q.size(1), n = q.size(2), d = q.size(3), KV = keys.size(1);
    const int64_t total = past + n, key_blocks = (total + KEYS - 1) / KEYS, tile = key_blocks * KEYS * d;
    const std::vector<uint16_t> tiles = key_and_value_tiles<Bf16, S>(keys, values, total, tile);
    const AmxUnit<Q, O> unit{q.data_ptr<Q>(), tiles.data(), tiles.data() + B * KV * tile, out.data_ptr<O>(), n,
                       past, H / KV, H, KV, key_blocks, {q.stride(0), q.stride(1), q.stride(2)},
                       static_cast<float>(scale)};
    const int64_t blocks = (n + AMX_TOKENS - 1) / AMX_TOKENS;
    deal<AmxScratch>(B * H * blocks, [&](int64_t u, AmxScratch& scratch) {
        const int64_t bh = u % (B * H);  // a block's heads in turn: a KV head's tiles stay in the cache for its group
        unit(bh / H, bh % H, (blocks - 1 - u / (B * H)) * AMX_TOKENS, scratch);
    });
}
#endif
#endif

#ifdef GUMIHO_PROMPT_BF16
// fn(a Q, an S, an O) for the queries', the keys' and the output's element types (the keys' and values' are checked
// equal).
template <typename F>
void with_types(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& out, const F& fn) {
    const auto with_out = [&](auto query, auto key) {
        if (out.scalar_type() == torch::kBFloat16)
            fn(query, key, at::BFloat16{});
        else
            fn(query, key, float{});
    };
    const auto with_keys = [&](auto query) {
        switch (keys.scalar_type()) {
            case torch::kHalf: with_out(query, at::Half{}); break;
            case torch::kBFloat16: with_out(query, at::BFloat16{}); break;
            default: with_out(query, float{}); break;
        }
    };
    if (q.scalar_type() == torch::kBFloat16)
        with_keys(at::BFloat16{});
    else
        with_keys(float{});
}
#endif

}  // namespace

bool available() {
#ifdef GUMIHO_PROMPT_ATTENTION
    return true;
#else
    return false;
#endif
}

bool bf16_available() {
#ifdef GUMIHO_PROMPT_BF16
    return true;
#else
    return false;
#endif
}

// Whether `causal(..., amx=True)` runs here: built with the tiles, and Linux grants them to this process.
bool amx_available() {
#ifdef GUMIHO_PROMPT_AMX
    return amx::usable();
#else
    return false;
#endif
}

// q [B, H, n, d] fp32 (or bf16, for bf16 products), heads ordered (KV head, member): head h reads KV head h / (H / KV); keys, values [B, KV,
// >= past + n, d] fp32 (or fp16 or bf16, for bf16 products), rows contiguous (a view of a cache); query token t sees keys 0 .. past + t. Returns
// [B, n, H * d] fp32, head h's output at columns [h d, (h + 1) d): ready for the output projection. `bf16`: the
// products in bf16 (Bf16), where the build has them (bf16_available); `amx`: those products on AMX tiles, for heads of
// 64 dimensions, where the build and the OS have them (amx_available). `bf16_out`: the output rounded to bf16 as
// torch rounds, for bf16 products only.
torch::Tensor causal(torch::Tensor q, torch::Tensor keys, torch::Tensor values, int64_t past, double scale,
                     bool bf16, bool amx, bool bf16_out) {
    const auto is = [](const torch::Tensor& x, auto... types) { return ((x.scalar_type() == types) || ...); };
    TORCH_CHECK(is(q, torch::kFloat) && is(keys, torch::kFloat) && is(values, torch::kFloat) ||
                    bf16 && is(q, torch::kFloat, torch::kBFloat16) && keys.scalar_type() == values.scalar_type() &&
                        is(keys, torch::kFloat, torch::kHalf, torch::kBFloat16),
                "causal: fp32 queries, keys and values (bf16 products also read bf16 queries, fp16 or bf16 keys and "
                "values)");
    TORCH_CHECK(q.dim() == 4 && keys.dim() == 4 && values.dim() == 4, "causal: 4-d tensors");
    TORCH_CHECK(q.stride(3) == 1 && keys.stride(3) == 1 && values.stride(3) == 1, "causal: rows must be contiguous");
    const int64_t B = q.size(0), H = q.size(1), n = q.size(2), d = q.size(3), KV = keys.size(1);
    TORCH_CHECK(H % KV == 0 && keys.size(0) == B && values.size(0) == B && values.size(1) == KV &&
                keys.size(2) >= past + n && values.size(2) >= past + n && keys.size(3) == d && values.size(3) == d,
                "causal: inconsistent shapes");
    TORCH_CHECK(bf16 || !bf16_out, "causal: a bf16 output comes with bf16 products");
    auto out = torch::empty({B, n, H * d}, q.options().dtype(bf16_out ? torch::kBFloat16 : torch::kFloat));
    if (amx) {
        TORCH_CHECK(bf16 && d == 64, "causal: AMX tiles take bf16 products of 64-dimension heads");
#ifdef GUMIHO_PROMPT_AMX
        TORCH_CHECK(amx::usable(), "causal: the OS does not grant the AMX tiles");
        with_types(q, keys, out, [&](auto query, auto key, auto to) {
            attend_amx<decltype(query), decltype(key), decltype(to)>(q, keys, values, past, scale, out);
        });
        return out;
#else
        TORCH_CHECK(false, "causal: built without AMX tiles");
#endif
    }
#ifdef GUMIHO_PROMPT_ATTENTION
    if (!bf16) {
        attend<Fp32>(q, keys, values, past, scale, out);
        return out;
    }
#ifdef GUMIHO_PROMPT_BF16
    with_types(q, keys, out, [&](auto query, auto key, auto to) {
        attend<Bf16, decltype(query), decltype(key), decltype(to)>(q, keys, values, past, scale, out);
    });
    return out;
#endif
    TORCH_CHECK(false, "causal: built without AVX512-BF16");
#else
    TORCH_CHECK(false, "causal: built without AVX2");
#endif
    return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("available", &available, "Whether this build has the vector code (AVX2 or AVX-512)");
    m.def("bf16_available", &bf16_available, "Whether this build has the bf16 products (AVX512-BF16)");
    m.def("amx_available", &amx_available, "Whether the bf16 products run on AMX tiles here (build and OS)");
    m.def("causal", &causal, "Causal attention over a prompt, blocks of queries against blocks of keys (CPU)",
          pybind11::arg("q"), pybind11::arg("keys"), pybind11::arg("values"), pybind11::arg("past"),
          pybind11::arg("scale"), pybind11::arg("bf16") = false,
          pybind11::arg("amx") = false, pybind11::arg("bf16_out") = false);
}
