#include "worker/model/document_attention.h"

#include <map>
#include <utility>

namespace shardline {

DocumentSpans DocumentSpans::FromPositions(const at::Tensor& host_positions) {
  const at::Tensor p = host_positions.to(at::kLong).contiguous();
  const int64_t B = p.size(0), T = p.size(1);
  const int64_t* data = p.data_ptr<int64_t>();
  DocumentSpans d;
  d.spans.resize(B);
  for (int64_t b = 0; b < B; ++b) {
    int64_t start = 0;
    for (int64_t t = 1; t <= T; ++t) {
      if (t == T || data[b * T + t] == 0) {
        d.spans[b].push_back({start, t - start});
        start = t;
      }
    }
  }
  return d;
}

at::Tensor DocumentAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const DocumentSpans& docs,
                             std::optional<double> scale) {
  const int64_t B = q.size(0);
  // Documents by length: each length's documents are one batch of SDPA, with
  // no padding (padding to a few bucket lengths measured slower on the CPU:
  // its copies and the padded rows' backward cost more than the calls saved).
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> by_length;  // length -> (sequence, start)
  for (int64_t b = 0; b < B; ++b) {
    for (const auto& [start, length] : docs.spans[b]) by_length[length].push_back({b, start});
  }
  // out[b][start]: that document's attention, [H, length, D].
  std::vector<std::map<int64_t, at::Tensor>> out(B);
  for (const auto& [length, where] : by_length) {
    std::vector<at::Tensor> qs, ks, vs;
    for (const auto& [b, start] : where) {
      qs.push_back(q[b].narrow(1, start, length));
      ks.push_back(k[b].narrow(1, start, length));
      vs.push_back(v[b].narrow(1, start, length));
    }
    const at::Tensor y = at::scaled_dot_product_attention(at::stack(qs), at::stack(ks), at::stack(vs), std::nullopt,
                                                          /*dropout_p=*/0.0, /*is_causal=*/true, scale);
    const std::vector<at::Tensor> ys = y.unbind(0);
    for (size_t i = 0; i < where.size(); ++i) out[where[i].first][where[i].second] = ys[i];
  }
  std::vector<at::Tensor> sequences;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<at::Tensor> parts;
    for (auto& [start, part] : out[b]) parts.push_back(std::move(part));
    sequences.push_back(parts.size() == 1 ? parts[0] : at::cat(parts, 1));
  }
  return at::stack(sequences);
}

}  // namespace shardline
