// A prompt's bf16 products on AMX tiles (kernels/__init__.py's `tile_matmul`): y = x W^T, x [M, K] bf16 rows, W
// packed once at load into the tiles' own layout, y rounded to bf16. Optionally the SiLU-gated product of a stacked
// gate and up projection in the same pass (`gated`): silu(x G^T) * (x U^T) from the fp32 sums, without writing the
// [M, 2I] product and reading it back.
//
// On the 2-core Intel Xeon with AMX, oneDNN's bf16 matmul (its brgemm on AMX, W reordered at every call) runs a
// 763-token prompt's products of SmolLM2-135M at 2.3 TFLOPS where N is 3,072 and 1.1 where N is 576 or K 1,536; the
// tiles' products alone reach 4.8 there, but a loop that loads its tiles is bound by the loads (below), near 1 TFLOPS
// a core. Packed once, the small shapes here run at 1.8-2.1, and the gated product saves the SiLU pass.
//
// Each step of the inner loop multiplies 32 rows of x by 32 columns of W (2 x 2 tiles of 16 x 16 sums) over 32 of K:
// two A tiles and two B tiles loaded, four products. Work units are blocks of UNIT_ROWS rows by UNIT_COLUMNS
// columns, their x rows and W columns kept in L2 while the pairs of B tiles take turns in L1.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "amx.h"
#include "simd.h"

namespace {

constexpr int64_t TILE = 16;         // rows of an A tile and of a sum tile; columns of a sum tile
constexpr int64_t DEPTH = 32;        // K a tile product covers (16 pairs of bf16)
// A work unit: UNIT_ROWS rows of x (442 KB at K = 576, in L2) against UNIT_COLUMNS columns of W, a pair of column
// blocks at a time (36 KB at K = 576, in L1) across all of the unit's rows. On the 2-core Intel Xeon with AMX, the
// four products of a 763-token prompt's layer: 2.7-2.9 ms at 384 x 64, 2.9-3.1 at 256 x 512, 3.0-3.2 at 128 x 256
// with the rows outer, against oneDNN's 3.5 and a SiLU pass.
constexpr int64_t UNIT_ROWS = 384;
constexpr int64_t UNIT_COLUMNS = 64;

// The first W row of packed block `block` of W's N rows: in order, or gate block j / up block j in turn (`gated`).
inline int64_t first_row(int64_t block, int64_t N, bool gated) {
    return gated ? (block % 2) * (N / 2) + (block / 2) * TILE : block * TILE;
}

bool available() {
#ifdef GUMIHO_AMX_TILES
    return amx::usable();
#else
    return false;
#endif
}

// W [N, K] bf16 as B tiles: for each block of 16 columns (rows of W) and 32 of K, 16 rows of 32 bf16, row p holding
// W[n][32 kb + 2p + e] at 2n + e. `gated`: N = 2I rows, gate then up; the blocks of 16 are laid out gate block j,
// up block j, in turn, so a pair of B tiles gives 16 gated outputs.
torch::Tensor pack(torch::Tensor weight, bool gated) {
    TORCH_CHECK(weight.scalar_type() == torch::kBFloat16 && weight.dim() == 2, "tile_matmul.pack: bf16 [N, K]");
    const int64_t N = weight.size(0), K = weight.size(1);
    TORCH_CHECK(K % DEPTH == 0 && N % (2 * TILE) == 0, "tile_matmul.pack: N and K multiples of 32");
    weight = weight.contiguous();
    const int64_t blocks = N / TILE, depths = K / DEPTH;
    auto packed = torch::empty({blocks, depths, TILE, 2 * TILE}, weight.options());
    const uint16_t* w = reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>());
    uint16_t* p = reinterpret_cast<uint16_t*>(packed.data_ptr<at::BFloat16>());
    for (int64_t block = 0; block < blocks; ++block) {
        const int64_t first = first_row(block, N, gated);
        for (int64_t kb = 0; kb < depths; ++kb)
            for (int64_t pair = 0; pair < TILE; ++pair)
                for (int64_t n = 0; n < TILE; ++n)
                    for (int64_t e = 0; e < 2; ++e)
                        p[((block * depths + kb) * TILE + pair) * 2 * TILE + 2 * n + e] =
                            w[(first + n) * K + kb * DEPTH + 2 * pair + e];
    }
    return packed;
}

#ifdef GUMIHO_AMX_TILES
inline __m512 silu_times(__m512 gate, __m512 up) {
    const __m512 one = _mm512_set1_ps(1.f);
    const __m512 sigmoid = _mm512_div_ps(one, _mm512_add_ps(one, exp_lanes<Floats16>(_mm512_sub_ps(
        _mm512_setzero_ps(), gate))));
    return _mm512_mul_ps(_mm512_mul_ps(gate, sigmoid), up);
}

// 32 rows of x (at `a`, `stride` bf16 apart) times the column pair at `w` of the packed W, over all of K, into
// `sums` [32][32] fp32 (columns 0-15 the pair's first block, 16-31 its second). Each load is placed just before the
// first product that reads it: tiles are not renamed, so a load waits for the products still reading its tile.
inline void block_product(const uint16_t* a, int64_t stride, const uint16_t* w, int64_t depths, float* sums) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const uint16_t* second = w + depths * TILE * 2 * TILE;
    for (int64_t kb = 0; kb < depths; ++kb) {
        _tile_loadd(4, a + kb * DEPTH, stride * 2);
        _tile_loadd(6, w + kb * TILE * 2 * TILE, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, second + kb * TILE * 2 * TILE, 64);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, a + TILE * stride + kb * DEPTH, stride * 2);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, sums, 2 * TILE * 4);
    _tile_stored(1, sums + TILE, 2 * TILE * 4);
    _tile_stored(2, sums + TILE * 2 * TILE, 2 * TILE * 4);
    _tile_stored(3, sums + TILE * 2 * TILE + TILE, 2 * TILE * 4);
}
#endif

// x [M, K] bf16 (rows contiguous), packed from `pack` for N columns, bias fp32 [N] or empty: [M, N] bf16, or
// [M, N / 2] for a gated pair (silu(gate + bias) * (up + bias), the bias in W's row order).
torch::Tensor matmul(torch::Tensor x, torch::Tensor packed, torch::Tensor bias, bool gated) {
    TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && x.dim() == 2, "tile_matmul: bf16 x [M, K]");
    TORCH_CHECK(packed.scalar_type() == torch::kBFloat16 && packed.dim() == 4 && packed.size(2) == TILE &&
                    packed.size(3) == 2 * TILE && packed.size(0) % 2 == 0 && packed.is_contiguous(),
                "tile_matmul: a weight packed by pack()");
    x = x.contiguous();
    const int64_t M = x.size(0), K = x.size(1), depths = packed.size(1), N = packed.size(0) * TILE;
    TORCH_CHECK(K == depths * DEPTH, "tile_matmul: x has ", K, " columns, the weight ", depths * DEPTH);
    TORCH_CHECK(bias.numel() == 0 || bias.scalar_type() == torch::kFloat && bias.numel() == N,
                "tile_matmul: bias fp32 [N]");
    const int64_t width = gated ? N / 2 : N;
    auto out = torch::empty({M, width}, x.options());
#ifdef GUMIHO_AMX_TILES
    TORCH_CHECK(amx::usable(), "tile_matmul: the OS does not grant the AMX tiles");
    const uint16_t* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
    const uint16_t* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
    uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
    // the bias in the packed column order: per pair of blocks, the first block's 16 then the second's
    std::vector<float> b(bias.numel() ? N : 0);
    if (bias.numel()) {
        const float* raw = bias.contiguous().data_ptr<float>();
        for (int64_t block = 0; block < N / TILE; ++block) {
            const int64_t first = first_row(block, N, gated);
            std::copy(raw + first, raw + first + TILE, b.begin() + block * TILE);
        }
    }
    // Row units of equal size (a multiple of 32 rows): 769 rows as 288 + 288 + 193, not 384 + 384 + 1, whose last
    // unit would cost a whole block per column pair for one row. Units run column by column, so the threads' shares
    // are whole columns of units (each thread reads half of W) and differ by at most one unit.
    const int64_t row_units = (M + UNIT_ROWS - 1) / UNIT_ROWS, column_units = (N + UNIT_COLUMNS - 1) / UNIT_COLUMNS;
    const int64_t unit_rows = ((M + row_units - 1) / row_units + 2 * TILE - 1) / (2 * TILE) * (2 * TILE);
    const int64_t pair_size = 2 * depths * TILE * 2 * TILE;  // bf16 of a pair of column blocks
    at::parallel_for(0, row_units * column_units, 1, [&](int64_t begin, int64_t end) {
        amx::configure();
        std::vector<uint16_t> padded(2 * TILE * K, 0);  // a last block of fewer than 32 rows, zeros after them
        alignas(64) float sums[2 * TILE * 2 * TILE];
        for (int64_t unit = begin; unit < end; ++unit) {
            const int64_t r0 = unit % row_units * unit_rows, c0 = unit / row_units * UNIT_COLUMNS;
            const int64_t r1 = std::min(M, r0 + unit_rows), c1 = std::min(N, c0 + UNIT_COLUMNS);
            for (int64_t c = c0; c < c1; c += 2 * TILE) {  // a pair of column blocks stays in L1 across the rows
                const uint16_t* w = wp + c / (2 * TILE) * pair_size;
                for (int64_t r = r0; r < r1; r += 2 * TILE) {
                    const int64_t rows = std::min<int64_t>(2 * TILE, r1 - r);
                    const uint16_t* a = xp + r * K;
                    if (rows < 2 * TILE) {
                        std::memcpy(padded.data(), a, rows * K * 2);
                        std::memset(padded.data() + rows * K, 0, (2 * TILE - rows) * K * 2);
                        a = padded.data();
                    }
                    block_product(a, K, w, depths, sums);
                    const __m512 bias_lo = b.empty() ? _mm512_setzero_ps() : _mm512_loadu_ps(b.data() + c);
                    const __m512 bias_hi = b.empty() ? _mm512_setzero_ps() : _mm512_loadu_ps(b.data() + c + TILE);
                    for (int64_t i = 0; i < rows; ++i) {
                        const __m512 lo = _mm512_add_ps(_mm512_load_ps(sums + i * 2 * TILE), bias_lo);
                        const __m512 hi = _mm512_add_ps(_mm512_load_ps(sums + i * 2 * TILE + TILE), bias_hi);
                        if (gated) {
                            _mm256_storeu_si256(reinterpret_cast<__m256i*>(op + (r + i) * width + c / 2),
                                                (__m256i)_mm512_cvtneps_pbh(silu_times(lo, hi)));
                        } else {
                            _mm512_storeu_si512(op + (r + i) * width + c, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
                        }
                    }
                }
            }
        }
        _tile_release();
    });
#else
    TORCH_CHECK(false, "tile_matmul: built without AMX tiles");
#endif
    return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("available", &available, "Whether the products run on AMX tiles here (build and OS)");
    m.def("pack", &pack, "A bf16 weight [N, K] in the tiles' layout (gated: a stacked gate and up projection)",
          pybind11::arg("weight"), pybind11::arg("gated") = false);
    m.def("matmul", &matmul, "x [M, K] bf16 times a packed weight, rounded to bf16 (gated: the SiLU-gated product)",
          pybind11::arg("x"), pybind11::arg("packed"), pybind11::arg("bias"), pybind11::arg("gated") = false);
}
