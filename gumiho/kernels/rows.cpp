// The per-row operations of a decoder layer for the few rows of a decode step, a tree or a draft step on a CPU
// (gumiho/kernels/__init__.py): RMS norm, the residual sum with its norm, the SiLU-gated product. Each is one call
// where torch takes four to six small operations, whose dispatch costs more than their arithmetic at these sizes
// (an RMS norm in torch: a cast, a square, a mean, an add, a reciprocal square root and two products).
//
// A row's result never depends on the other rows of the call: the same operations in the same order for every row
// (sums eight lanes wide, then a fixed horizontal sum), so a tree's rows equal one-token steps bit for bit. A
// prompt's many rows are shared out among torch's threads (`each_row`), which leaves every row's result as it is.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>

#include "simd.h"

namespace {

float sum_of_squares(const float* x, int64_t n) {
#if defined(__AVX2__) && defined(__FMA__)
    __m256 s = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        s = _mm256_fmadd_ps(v, v, s);
    }
    float total = hsum8(s);
    for (; i < n; ++i) total += x[i] * x[i];
    return total;
#else
    float total = 0.f;
    for (int64_t i = 0; i < n; ++i) total += x[i] * x[i];
    return total;
#endif
}

// out = weight * x / sqrt(mean(x^2) + eps), one row of n.
void norm_row(const float* x, const float* weight, int64_t n, float eps, float* out) {
    const float inverse = 1.f / std::sqrt(sum_of_squares(x, n) / static_cast<float>(n) + eps);
    for (int64_t i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * inverse);
}

// Calls f(r) for rows [0, rows): on the calling thread for a decode step's or a tree's few rows, whose thread
// hand-offs would cost more than they share; split across torch's threads from PARALLEL_ROWS rows (a prompt).
constexpr int64_t PARALLEL_ROWS = 64;

template <typename F>
void each_row(int64_t rows, const F& f) {
    at::parallel_for(0, rows, PARALLEL_ROWS, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) f(r);
    });
}

void check(const torch::Tensor& x, const torch::Tensor& weight) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat && weight.scalar_type() == torch::kFloat, "rows: fp32 only");
    TORCH_CHECK(weight.dim() == 1 && x.size(-1) == weight.size(0), "rows: the weight must match the last dimension");
}

bool fp32_or_bf16(const torch::Tensor& x) {
    return x.scalar_type() == torch::kFloat || x.scalar_type() == torch::kBFloat16;
}

// Row r of x [rows, n], fp32 or bf16, as fp32: x's own memory, or the row widened into the thread's buffer.
const float* row_as_float(const torch::Tensor& x, int64_t r, int64_t n) {
    if (x.scalar_type() == torch::kFloat) return x.data_ptr<float>() + r * n;
    float* widened = kept_buffer<float>(n);
    from_bf16_row(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()) + r * n, n, widened);
    return widened;
}

// Where a result row goes: straight into out [rows, n] if fp32; else computed into the thread's buffer, then `done`
// rounds it into out's bf16 row, as torch's conversion would.
struct RowOut {
    torch::Tensor out;
    float* at(int64_t r, int64_t n) const {
        return out.scalar_type() == torch::kFloat ? out.data_ptr<float>() + r * n : kept_buffer<float, 1>(n);
    }
    void done(int64_t r, int64_t n, const float* row) const {
        if (out.scalar_type() == torch::kBFloat16)
            to_bf16_row(row, n, reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()) + r * n);
    }
};

torch::Tensor empty_as(const torch::Tensor& x, bool bf16) {
    return torch::empty_like(x, x.options().dtype(bf16 ? torch::kBFloat16 : torch::kFloat));
}

}  // namespace

// A prompt whose products run in bf16 (the int4 path's bf16 prefill) hands its rows over in bf16: `bf16` returns the
// normed rows rounded to bf16, `add_rms_norm` and `silu_mul` also read bf16 products. Every value is the one the
// fp32 call gives, rounded as torch's conversion rounds it; the products' inputs and outputs are then the same
// numbers as when torch's casts sat around each product, without a cast's extra pass over each tensor.

// x [..., n] fp32, weight [n]: RMS norm of every row (in bf16 where `bf16`).
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps, bool bf16) {
    check(x, weight);
    x = x.contiguous();
    weight = weight.contiguous();
    const RowOut out{empty_as(x, bf16)};
    const int64_t n = x.size(-1), rows = x.numel() / n;
    each_row(rows, [&](int64_t r) {
        float* row = out.at(r, n);
        norm_row(x.data_ptr<float>() + r * n, weight.data_ptr<float>(), n, static_cast<float>(eps), row);
        out.done(r, n, row);
    });
    return out.out;
}

// The residual stream after a sublayer and the next sublayer's input: (x + delta, rms_norm(x + delta)). x fp32,
// delta fp32 or bf16 (its values widened), the sum fp32, the norm in bf16 where `bf16`.
std::tuple<torch::Tensor, torch::Tensor> add_rms_norm(torch::Tensor x, torch::Tensor delta, torch::Tensor weight,
                                                      double eps, bool bf16) {
    check(x, weight);
    TORCH_CHECK(delta.sizes() == x.sizes() && fp32_or_bf16(delta), "rows: x and delta differ");
    x = x.contiguous();
    delta = delta.contiguous();
    weight = weight.contiguous();
    auto sum = torch::empty_like(x);
    const RowOut normed{empty_as(x, bf16)};
    const int64_t n = x.size(-1), rows = x.numel() / n;
    const float* xp = x.data_ptr<float>();
    float* sp = sum.data_ptr<float>();
    each_row(rows, [&](int64_t r) {
        const float* d = row_as_float(delta, r, n);
        for (int64_t i = 0; i < n; ++i) sp[r * n + i] = xp[r * n + i] + d[i];
        float* row = normed.at(r, n);
        norm_row(sp + r * n, weight.data_ptr<float>(), n, static_cast<float>(eps), row);
        normed.done(r, n, row);
    });
    return {sum, normed.out};
}

// gate_up [..., 2m] (the gate's m columns, then the up projection's), fp32 or bf16: silu(gate) * up, [..., m] in
// gate_up's dtype.
torch::Tensor silu_mul(torch::Tensor gate_up) {
    TORCH_CHECK(fp32_or_bf16(gate_up) && gate_up.size(-1) % 2 == 0, "silu_mul: fp32 or bf16 [..., 2m]");
    gate_up = gate_up.contiguous();
    const int64_t m = gate_up.size(-1) / 2, rows = gate_up.numel() / (2 * m);
    auto sizes = gate_up.sizes().vec();
    sizes.back() = m;
    const RowOut out{torch::empty(sizes, gate_up.options())};
    each_row(rows, [&](int64_t r) {
        const float* gate = row_as_float(gate_up, r, 2 * m);
        const float* up = gate + m;
        float* o = out.at(r, m);
#if defined(__AVX2__) && defined(__FMA__)
        // Eight at a time, a tail through a padded vector: an element's result never depends on where it sits.
        const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
        for (int64_t i = 0; i < m; i += 8) {
            alignas(32) float g[8] = {0.f}, u[8] = {0.f}, out[8];
            const bool tail = i + 8 > m;
            if (tail)
                for (int64_t j = 0; i + j < m; ++j) g[j] = gate[i + j], u[j] = up[i + j];
            const __m256 x = _mm256_loadu_ps(tail ? g : gate + i);
            const __m256 silu = _mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, x))));
            const __m256 y = _mm256_mul_ps(silu, _mm256_loadu_ps(tail ? u : up + i));
            _mm256_storeu_ps(tail ? out : o + i, y);
            if (tail)
                for (int64_t j = 0; i + j < m; ++j) o[i + j] = out[j];
        }
#else
        for (int64_t i = 0; i < m; ++i) o[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
#endif
        out.done(r, m, o);
    });
    return out.out;
}

// logits [R, V] fp32: per row the k largest entries of log_softmax(logits / temperature) and their indices,
// largest first (equal values: the lower index first); a row holding a NaN scores -inf throughout (indices 0..k-1).
// One pass for the maximum and the selection, one for the sum of exponentials: torch takes a division, a
// log-softmax, a NaN filter and a top-k, each a pass of its own over a draft vocabulary (about 0.1 ms a draft step).
std::tuple<torch::Tensor, torch::Tensor> top_logprobs(torch::Tensor logits, int64_t k, double temperature) {
    TORCH_CHECK(logits.scalar_type() == torch::kFloat && logits.dim() == 2, "top_logprobs: fp32 [rows, vocab]");
    TORCH_CHECK(k >= 1 && k <= logits.size(1) && temperature > 0, "top_logprobs: need 1 <= k <= vocab, temperature > 0");
    logits = logits.contiguous();
    const int64_t rows = logits.size(0), V = logits.size(1);
    auto values = torch::empty({rows, k}, logits.options());
    auto indices = torch::empty({rows, k}, logits.options().dtype(torch::kLong));
    const float t = static_cast<float>(temperature);
    for (int64_t r = 0; r < rows; ++r) {
        const float* x = logits.data_ptr<float>() + r * V;
        float* val = values.data_ptr<float>() + r * k;
        int64_t* idx = indices.data_ptr<int64_t>() + r * k;
        int64_t held = 0;  // val/idx hold the best `held` so far, in order
        bool nan = false;
        // Insert x[i] where it ranks; false for a NaN (the row is then scored -inf).
        auto offer = [&](int64_t i) {
            const float v = x[i];
            if (v != v) return false;
            if (held == k && !(v > val[k - 1])) return true;
            int64_t at = held < k ? held++ : k - 1;
            while (at > 0 && v > val[at - 1]) {
                val[at] = val[at - 1];
                idx[at] = idx[at - 1];
                --at;
            }
            val[at] = v;
            idx[at] = i;
            return true;
        };
        int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
        // Eight at a time, in order: a block goes through `offer` only where one of its entries beats the k-th best
        // so far or is a NaN, which after the first blocks is rare; the selection is the scalar one's.
        for (; !nan && i < k; ++i) nan = !offer(i);  // the first k fill val, so val[k - 1] is defined
        for (; !nan && i + 8 <= V; i += 8) {
            const __m256 v = _mm256_loadu_ps(x + i);
            const __m256 beats = _mm256_or_ps(_mm256_cmp_ps(v, _mm256_set1_ps(val[k - 1]), _CMP_GT_OQ),
                                              _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            if (!_mm256_movemask_ps(beats)) continue;
            for (int64_t j = i; j < i + 8; ++j)
                if (!offer(j)) {
                    nan = true;
                    break;
                }
        }
#endif
        for (; !nan && i < V; ++i) nan = !offer(i);
        if (nan) {
            for (int64_t j = 0; j < k; ++j) val[j] = -std::numeric_limits<float>::infinity(), idx[j] = j;
            continue;
        }
        const float top = val[0] / t;  // division by t > 0 keeps the order: the largest of x / t
        float total = 0.f;
#if defined(__AVX2__) && defined(__FMA__)
        const __m256 vt = _mm256_set1_ps(t), vtop = _mm256_set1_ps(top);
        __m256 s = _mm256_setzero_ps();
        int64_t e = 0;
        for (; e + 8 <= V; e += 8)
            s = _mm256_add_ps(s, exp8(_mm256_sub_ps(_mm256_div_ps(_mm256_loadu_ps(x + e), vt), vtop)));
        total = hsum8(s);
        for (; e < V; ++e) total += std::exp(x[e] / t - top);
#else
        for (int64_t e = 0; e < V; ++e) total += std::exp(x[e] / t - top);
#endif
        const float log_total = std::log(total);
        for (int64_t j = 0; j < k; ++j) {  // an infinite logit makes NaNs here, as in torch: -inf, as for a NaN
            const float v = (val[j] / t - top) - log_total;
            val[j] = v == v ? v : -std::numeric_limits<float>::infinity();
        }
    }
    return {values, indices};
}

// logits [V] fp32: the index of the first largest entry, or of the first NaN where there is one (torch.argmax's
// answer). torch's own takes about 28 us for a 49,152-token row on a Zen 5 core, where its max takes 5: a decode
// step's greedy token, paid once a step. Two passes: the largest value (NaNs noted), then where it first occurs.
int64_t argmax(torch::Tensor logits) {
    TORCH_CHECK(logits.scalar_type() == torch::kFloat && logits.dim() == 1 && logits.size(0) > 0,
                "argmax: fp32 [vocab]");
    logits = logits.contiguous();
    const float* x = logits.data_ptr<float>();
    const int64_t V = logits.size(0);
    float best = x[0];
    bool nan = false;
    int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 top = _mm256_set1_ps(x[0]), unordered = _mm256_setzero_ps();
    for (; i + 8 <= V; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        top = _mm256_max_ps(top, v);
    }
    nan = _mm256_movemask_ps(unordered) != 0;
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, top);
    for (float lane : lanes) best = lane > best ? lane : best;
#endif
    for (; i < V; ++i) {
        nan = nan || x[i] != x[i];
        best = x[i] > best ? x[i] : best;
    }
    for (int64_t j = 0; j < V; ++j)
        if (nan ? x[j] != x[j] : x[j] == best) return j;
    return 0;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("rms_norm", &rms_norm, "RMS norm of every row (fp32, CPU; the result in bf16 where asked)",
          pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("eps"), pybind11::arg("bf16") = false);
    m.def("add_rms_norm", &add_rms_norm, "(x + delta, rms_norm(x + delta)) (fp32, a bf16 delta; CPU; the norm in "
          "bf16 where asked)", pybind11::arg("x"), pybind11::arg("delta"), pybind11::arg("weight"),
          pybind11::arg("eps"), pybind11::arg("bf16") = false);
    m.def("silu_mul", &silu_mul, "silu(gate) * up from a fused gate-up product (fp32 or bf16, CPU)");
    m.def("top_logprobs", &top_logprobs, "Top-k log-softmax entries of every row (fp32, CPU)");
    m.def("argmax", &argmax, "Index of the first largest entry of a row, NaN first (fp32, CPU)");
}
