// Fuzzes the reader of one tensor as torch.save wrote it at a byte range of a
// .distcp file (ReadTorchSavedTensor: a stored zip and its data.pkl, read by
// PickleReader with persistent ids). Invariants: an error is one line naming
// the file; a tensor that reads lies wholly inside the range, and every one
// of its elements can then be read (as floats, or as its one int).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/checkpoint/torch_saved_tensor.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardline;
  const std::string path = "ckpt/__0_0.distcp";
  const int fd = memfd_create("chunk", 0);
  FUZZ_CHECK(fd >= 0, "memfd_create");
  FUZZ_CHECK(write(fd, data, size) == static_cast<ssize_t>(size), "write");
  absl::StatusOr<TorchSavedTensor> t = ReadTorchSavedTensor(fd, path, 0, static_cast<int64_t>(size));
  if (!t.ok()) {
    FUZZ_CHECK(fuzz::NamesFileInOneLine(t.status().message(), path), "error \"%s\"",
               std::string(t.status().message()).c_str());
  } else {
    FUZZ_CHECK(t->numel >= 0 && t->data_offset >= 0 &&
                   t->data_offset + t->numel * t->element_bytes <= static_cast<int64_t>(size),
               "tensor of %lld elements at %lld outside %zu bytes", static_cast<long long>(t->numel),
               static_cast<long long>(t->data_offset), size);
    std::vector<float> values(static_cast<size_t>(t->numel));
    const bool ints = t->dtype == "int32" || t->dtype == "int64";
    const absl::Status s = ReadTorchSavedFloats(fd, path, *t, 0, t->numel, values.data());
    FUZZ_CHECK(s.ok() != ints, "elements of a %s tensor that read: %s", t->dtype.c_str(),
               std::string(s.message()).c_str());
  }
  const absl::StatusOr<int64_t> i = ReadTorchSavedInt(fd, path, 0, static_cast<int64_t>(size));
  if (!i.ok()) {
    FUZZ_CHECK(fuzz::NamesFileInOneLine(i.status().message(), path), "int error \"%s\"",
               std::string(i.status().message()).c_str());
  }
  close(fd);
  return 0;
}
