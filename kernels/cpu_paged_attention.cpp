// Attention over SGLang's paged KV cache on CPU, reading each key and value row where it
// lies in the cache (no gather into a contiguous copy first).
//
// Python side: kernels/cpu_paged_attention.py; reference: the gathers and
// scaled_dot_product_attention of sglang_domino/sglang/cpu/attention.py `attend`,
// held equal by tests/sglang/cpu/test_attention.py.
//
// Rows: request r owns rows [r * q_len, (r + 1) * q_len) of q and out; row i of request r
// sits at position lens[r] - q_len + i. It attends to the request's keys 0..lens[r]-1
// (all of them; causal: up to its own position; a window w >= 0: none before
// position - w), whose cache slots are table[rows_of_table[r], j]. Scores and sums in
// float32 whatever the storage dtype.
//
// Work is split over (request, KV head) pairs with at::parallel_for; the grain keeps a small
// step (one decode row) on the calling thread, where waking the other intra-op threads
// costs more than the arithmetic.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

// a . b over n floats, in 8 partial sums (so the compiler vectorizes it without
// reassociating a single running sum)
inline float dot(const float* a, const float* b, int64_t n) {
  float lanes[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) {
    for (int l = 0; l < 8; ++l) lanes[l] += a[d + l] * b[d + l];
  }
  float s = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; d < n; ++d) s += a[d] * b[d];
  return s;
}

template <typename T>
inline const float* as_float(const T* src, float* buf, int64_t n) {
  for (int64_t d = 0; d < n; ++d) buf[d] = static_cast<float>(src[d]);
  return buf;
}

template <>
inline const float* as_float<float>(const float* src, float*, int64_t) { return src; }

// One task: request r, kv head kh, with its q_len x group query rows (the heads that
// share kh): each key and value row is read once for all of them.
template <typename q_t, typename kv_t>
void attend_rows(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                 const at::Tensor& table, const at::Tensor& table_rows, const at::Tensor& lens,
                 int64_t q_len, double scale, bool causal, int64_t window, at::Tensor& out) {
  const int64_t requests = lens.size(0), heads = q.size(1), dim = q.size(2), vdim = v_cache.size(2);
  const int64_t kv_heads = k_cache.size(1), group = heads / kv_heads, G = q_len * group;
  const q_t* qp = q.data_ptr<q_t>();
  const kv_t* kp = k_cache.data_ptr<kv_t>();
  const kv_t* vp = v_cache.data_ptr<kv_t>();
  const int32_t* tp = table.data_ptr<int32_t>();
  const int64_t* trp = table_rows.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  q_t* op = out.data_ptr<q_t>();
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1), os0 = out.stride(0), os1 = out.stride(1);
  const int64_t ks0 = k_cache.stride(0), ks1 = k_cache.stride(1), vs0 = v_cache.stride(0), vs1 = v_cache.stride(1);
  const int64_t ts0 = table.stride(0);
  const float fscale = static_cast<float>(scale);

  int64_t longest = 1;
  for (int64_t r = 0; r < requests; ++r) {
    longest = std::max(longest, lp[r]);
    // a request's row of the table and its length, checked once: every slot read below
    // is checked against the cache too (upstream's gathers raise on a bad index)
    TORCH_CHECK(trp[r] >= 0 && trp[r] < table.size(0) && lp[r] >= 0 && lp[r] <= table.size(1),
                "paged_attention: request ", r, " has table row ", trp[r], " and length ", lp[r], " outside the table");
  }
  const int64_t cache_slots = std::min(k_cache.size(0), v_cache.size(0));
  // about 64k multiply-adds per task before a second thread is woken
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, G * longest * (dim + vdim)));

  at::parallel_for(0, requests * kv_heads, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> qbuf(G * dim), acc(G * vdim), kbuf(dim), vbuf(vdim), scores;
    std::vector<int64_t> first(G), stop(G);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r = task / kv_heads, kh = task % kv_heads;
      const int64_t n = lp[r];
      const int32_t* slots = tp + trp[r] * ts0;
      int64_t lo = n, hi = 0;   // the keys any row sees
      for (int64_t i = 0; i < q_len; ++i) {
        const int64_t pos = n - q_len + i;
        const int64_t e = causal ? std::min(n, pos + 1) : n;
        const int64_t b = window >= 0 ? std::max<int64_t>(0, pos - window) : 0;
        for (int64_t g = 0; g < group; ++g) {
          const int64_t row = i * group + g;
          first[row] = b;
          stop[row] = e;
          const q_t* qr = qp + (r * q_len + i) * qs0 + (kh * group + g) * qs1;
          for (int64_t d = 0; d < dim; ++d) qbuf[row * dim + d] = static_cast<float>(qr[d]) * fscale;
        }
        lo = std::min(lo, b);
        hi = std::max(hi, e);
      }
      scores.assign(G * std::max<int64_t>(n, 1), 0.f);
      for (int64_t j = lo; j < hi; ++j) {
        TORCH_CHECK(slots[j] >= 0 && slots[j] < cache_slots, "paged_attention: slot ", slots[j], " of request ", r,
                    " outside the cache's ", cache_slots);
        const float* kr = as_float(kp + static_cast<int64_t>(slots[j]) * ks0 + kh * ks1, kbuf.data(), dim);
        for (int64_t row = 0; row < G; ++row) {
          if (j >= first[row] && j < stop[row]) scores[row * n + j] = dot(qbuf.data() + row * dim, kr, dim);
        }
      }
      std::vector<float> top(G, -std::numeric_limits<float>::infinity()), total(G, 0.f);
      for (int64_t row = 0; row < G; ++row) {
        float* sr = scores.data() + row * n;
        for (int64_t j = first[row]; j < stop[row]; ++j) top[row] = std::max(top[row], sr[j]);
        for (int64_t j = first[row]; j < stop[row]; ++j) {
          sr[j] = std::exp(sr[j] - top[row]);
          total[row] += sr[j];
        }
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = lo; j < hi; ++j) {
        const float* vr = as_float(vp + static_cast<int64_t>(slots[j]) * vs0 + kh * vs1, vbuf.data(), vdim);
        for (int64_t row = 0; row < G; ++row) {
          if (j < first[row] || j >= stop[row]) continue;
          const float p = scores[row * n + j];
          float* a = acc.data() + row * vdim;
          for (int64_t d = 0; d < vdim; ++d) a[d] += p * vr[d];
        }
      }
      for (int64_t i = 0; i < q_len; ++i) {
        for (int64_t g = 0; g < group; ++g) {
          const int64_t row = i * group + g;
          // a row that sees no key (SDPA over an all-masked row): zeros
          const float inv = stop[row] > first[row] ? 1.f / total[row] : 0.f;
          q_t* orow = op + (r * q_len + i) * os0 + (kh * group + g) * os1;
          const float* a = acc.data() + row * vdim;
          for (int64_t d = 0; d < vdim; ++d) orow[d] = static_cast<q_t>(a[d] * inv);
        }
      }
    }
  });
}

void paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& table, const at::Tensor& table_rows, const at::Tensor& lens, int64_t q_len,
                     double scale, bool causal, int64_t window, at::Tensor out) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && v_cache.dim() == 3 && out.dim() == 3,
              "paged_attention: q, k_cache, v_cache and out are [rows or slots, heads, dim]");
  TORCH_CHECK(q.stride(2) == 1 && k_cache.stride(2) == 1 && v_cache.stride(2) == 1 && out.stride(2) == 1,
              "paged_attention: the last dimension must be contiguous");
  TORCH_CHECK(table.scalar_type() == at::kInt && table.stride(1) == 1, "paged_attention: table is int32, rows contiguous");
  TORCH_CHECK(table_rows.scalar_type() == at::kLong && lens.scalar_type() == at::kLong &&
              table_rows.is_contiguous() && lens.is_contiguous(), "paged_attention: table_rows and lens are int64");
  TORCH_CHECK(q_len > 0 && q.size(0) == lens.size(0) * q_len && table_rows.size(0) == lens.size(0),
              "paged_attention: q has q_len rows per request");
  TORCH_CHECK(q.size(1) % k_cache.size(1) == 0 && k_cache.size(1) == v_cache.size(1),
              "paged_attention: heads must be a multiple of the cache's kv heads");
  TORCH_CHECK(q.size(2) == k_cache.size(2) && out.size(2) == v_cache.size(2) && out.size(0) == q.size(0) &&
              out.size(1) == q.size(1), "paged_attention: head dims differ");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type() && out.scalar_type() == q.scalar_type(),
              "paged_attention: k and v caches share a dtype, out is q's");
  const auto qt = q.scalar_type(), kt = k_cache.scalar_type();
  TORCH_CHECK(qt == kt, "paged_attention: the cache's dtype must be q's");
  if (qt == at::kFloat) {
    attend_rows<float, float>(q, k_cache, v_cache, table, table_rows, lens, q_len, scale, causal, window, out);
  } else if (qt == at::kBFloat16) {
    attend_rows<at::BFloat16, at::BFloat16>(q, k_cache, v_cache, table, table_rows, lens, q_len, scale, causal,
                                             window, out);
  } else if (qt == at::kHalf) {
    attend_rows<at::Half, at::Half>(q, k_cache, v_cache, table, table_rows, lens, q_len, scale, causal, window, out);
  } else {
    TORCH_CHECK(false, "paged_attention: float32, bfloat16 or float16, not ", qt);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(sglang_domino_cpu, m) {
  m.def("paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor table, Tensor table_rows, Tensor lens, "
        "int q_len, float scale, bool causal, int window, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(sglang_domino_cpu, CPU, m) {
  m.impl("paged_attention", &paged_attention);
}
