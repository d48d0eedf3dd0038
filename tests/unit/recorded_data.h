// The recordings in tests/unit/data (each file's make_*.py writes it): a
// safetensors file read as the tests compare it, and the AdamW
// hyperparameters the optimizer recordings use.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include <ATen/ATen.h>

#include "common/model/safetensors.h"
#include "worker/engine/optimizer.h"

namespace shardline {

class RecordedFile {
 public:
  // `name` in SHARDLINE_TEST_DATA; a file that does not open fails the test.
  explicit RecordedFile(const std::string& name) {
    auto file = SafetensorsReader::Open(std::string(SHARDLINE_TEST_DATA) + "/" + name);
    EXPECT_TRUE(file.ok()) << file.status();
    if (file.ok()) file_ = std::move(*file);
  }
  // Tensor `name` (F32, BF16 or F16), flattened, as fp32: its values exactly.
  at::Tensor Floats(const std::string& name) const {
    const int64_t n = file_->entries().at(name).numel();
    at::Tensor t = at::empty({n}, at::kFloat);
    EXPECT_TRUE(file_->ReadFloats(name, 0, n, t.data_ptr<float>()).ok()) << name;
    return t;
  }
  // Tensor `name` (U8), flattened.
  at::Tensor Bytes(const std::string& name) const {
    std::string raw;
    EXPECT_TRUE(file_->ReadRaw(name, "U8", &raw).ok()) << name;
    at::Tensor t = at::empty({static_cast<int64_t>(raw.size())}, at::kByte);
    std::memcpy(t.data_ptr(), raw.data(), raw.size());
    return t;
  }

 private:
  std::unique_ptr<SafetensorsReader> file_;
};

// make_adamw_bf16.py's and make_adamw_8bit.py's hyperparameters at `step`.
inline AdamWStep RecordedAdamWStep(int64_t step) {
  AdamWStep s;
  s.lr = 3e-3;
  s.beta1 = 0.9;
  s.beta2 = 0.95;
  s.eps = 1e-8;
  s.weight_decay = 0.1;
  s.step = step;
  return s;
}

}  // namespace shardline
