// The compiled CPU step's linear layers: y = x W^T (+ b), W row-major [out, in] as the
// model stores it, with an optional copy of W packed once for oneDNN.
//
// Python side: kernels/cpu_linear.py; reference: torch.nn.functional.linear, held equal by
// tests/sglang/cpu/test_cpu_linear.py.
//
// Why. With a handful of rows a projection is one pass over its weight: its time is the
// weight's bytes over the memory bandwidth, and MKL's sgemm (what F.linear runs in
// float32) and oneDNN's packed product both take two to three times that at one to
// sixteen rows on the 2-core EPYCs the test bed is served on (docs/cpu-profile.md). Here,
// up to SMALL_ROWS rows of float32, the output features are split over torch's intra-op
// threads (the grain keeps a small matrix on the calling thread) and each task walks its
// weight rows once for all the input rows: tiles of up to 4 input rows by 3 to 8 weight
// rows, sums in 8-lane registers along the shared inner dimension. Above that (a verify
// of many requests) oneDNN's product over the packed copy is faster and is called here,
// so that a graph makes one C++ call per projection whatever its rows.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <mutex>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace {

// the most rows this file's product serves; oneDNN's packed one above (where packed)
constexpr int64_t SMALL_ROWS = 16;

#if defined(__AVX2__) && defined(__FMA__)
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// y[i, j] = x[i, :] . w[j, :] for MR input rows and NR weight rows
template <int MR, int NR>
inline void tile(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy, int64_t k) {
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 8 <= k; d += 8) {
    __m256 wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = _mm256_loadu_ps(w + j * ldw + d);
    for (int i = 0; i < MR; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * ldx + d);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      float s = hsum(acc[i][j]);
      for (int64_t e = d; e < k; ++e) s += x[i * ldx + e] * w[j * ldw + e];
      y[i * ldy + j] = s;
    }
}
#else
// the same contract without AVX2: 8 partial sums the compiler may vectorize
template <int MR, int NR>
inline void tile(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy, int64_t k) {
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      float lanes[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      int64_t d = 0;
      for (; d + 8 <= k; d += 8)
        for (int l = 0; l < 8; ++l) lanes[l] += x[i * ldx + d + l] * w[j * ldw + d + l];
      float s = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
      for (; d < k; ++d) s += x[i * ldx + d] * w[j * ldw + d];
      y[i * ldy + j] = s;
    }
}
#endif

// weight rows [n0, n1) for every input row: blocks of 24 weight rows outer (they stay in
// cache while every input row passes), input rows inner in fours, then one at a time
void features(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t m, int64_t n, int64_t k,
              int64_t n0, int64_t n1) {
  constexpr int64_t BLOCK = 24;   // a multiple of 3 and of 8
  for (int64_t b = n0; b < n1; b += BLOCK) {
    const int64_t stop = std::min(b + BLOCK, n1);
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) {
      int64_t j = b;
      for (; j + 3 <= stop; j += 3) tile<4, 3>(x + i * ldx, ldx, w + j * ldw, ldw, y + i * n + j, n, k);
      for (; j < stop; ++j) tile<4, 1>(x + i * ldx, ldx, w + j * ldw, ldw, y + i * n + j, n, k);
    }
    for (; i < m; ++i) {
      int64_t j = b;
      for (; j + 8 <= stop; j += 8) tile<1, 8>(x + i * ldx, ldx, w + j * ldw, ldw, y + i * n + j, n, k);
      for (; j < stop; ++j) tile<1, 1>(x + i * ldx, ldx, w + j * ldw, ldw, y + i * n + j, n, k);
    }
  }
}

at::Tensor small_product(const at::Tensor& input, const at::Tensor& weight) {
  const at::Tensor x = input.stride(1) == 1 ? input : input.contiguous();
  const at::Tensor w = weight.stride(1) == 1 ? weight : weight.contiguous();
  const int64_t m = x.size(0), n = w.size(0), k = x.size(1);
  at::Tensor y = at::empty({m, n}, x.options());
  if (m > 0 && n > 0) {
    const float* xp = x.data_ptr<float>();
    const float* wp = w.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const int64_t ldx = x.stride(0), ldw = w.stride(0);
    // at least 64K weight floats (256 KB) a task: below that, waking a thread costs more
    const int64_t grain = std::max<int64_t>(24, 65536 / std::max<int64_t>(k, 1));
    at::parallel_for(0, n, grain, [&](int64_t n0, int64_t n1) { features(xp, ldx, wp, ldw, yp, m, n, k, n0, n1); });
  }
  return y;
}

// weights packed for oneDNN (`pack_linear`), by index; appended at load, read while serving
std::vector<at::Tensor>& packed_weights() {
  static std::vector<at::Tensor> weights;
  return weights;
}
std::mutex packing;

int64_t pack_linear(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2, "sglang_domino_cpu::pack_linear: weight [out, in] expected, got ", weight.sizes());
  static auto reorder = c10::Dispatcher::singleton()
                            .findSchemaOrThrow("mkldnn::_reorder_linear_weight", "")
                            .typed<at::Tensor(const at::Tensor&, std::optional<int64_t>)>();
  at::Tensor packed = reorder.call(weight.detach().contiguous(), std::nullopt);
  std::lock_guard<std::mutex> lock(packing);
  packed_weights().push_back(packed);
  return static_cast<int64_t>(packed_weights().size()) - 1;
}

at::Tensor linear(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                  int64_t packed) {
  TORCH_CHECK(input.dim() == 2 && weight.dim() == 2 && input.size(1) == weight.size(1),
              "sglang_domino_cpu::linear: input [rows, in] and weight [out, in] expected, got ", input.sizes(),
              " and ", weight.sizes());
  TORCH_CHECK(packed < static_cast<int64_t>(packed_weights().size()), "sglang_domino_cpu::linear: no packed weight ",
              packed);
  const bool small = input.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat;
  if (packed >= 0 && !(small && input.size(0) <= SMALL_ROWS)) {
    static auto product =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
            .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                              c10::string_view, c10::List<std::optional<at::Scalar>>,
                              std::optional<c10::string_view>)>();
    return product.call(input.contiguous(), packed_weights()[packed], bias, "none",
                        c10::List<std::optional<at::Scalar>>(), std::nullopt);
  }
  if (!small) return at::linear(input, weight, bias);
  at::Tensor y = small_product(input, weight);
  if (bias.has_value() && bias->defined()) y.add_(*bias);
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(sglang_domino_cpu, m) {
  m.def("linear(Tensor input, Tensor weight, Tensor? bias, int packed) -> Tensor");
  m.def("pack_linear(Tensor weight) -> int");
  m.def("small_rows() -> int", []() { return SMALL_ROWS; });
}

TORCH_LIBRARY_IMPL(sglang_domino_cpu, CPU, m) {
  m.impl("linear", &linear);
  m.impl("pack_linear", &pack_linear);
}
