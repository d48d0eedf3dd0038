// Storage views: the tensors a FlatParam or an Nf4Base hands to the model
// are views over one flat buffer whose memory comes and goes (FSDP's
// resize-to-zero). Freeing releases the storage's memory but keeps the
// StorageImpl every view shares, so the views, and any autograd graph that
// saved them, see the data again once the memory is given back and refilled.
// Pure functions of their arguments; the caller owns the tensors.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

namespace shardline {

// A view of `shape` at `offset` elements into `flat`'s storage, as a fresh
// TensorImpl: its own version counter, so refilling `flat` does not look
// like an in-place edit of the view to autograd.
inline at::Tensor StorageView(const at::Tensor& flat, int64_t offset, const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * shape[i + 1];
  at::Tensor v = at::empty({0}, flat.options());
  v.set_(flat.storage(), flat.storage_offset() + offset, shape, strides);
  return v;
}

// Releases a storage's memory but keeps the StorageImpl every view shares.
inline void ReleaseStorage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

// Gives a released storage fresh memory of `nbytes` (its allocator
// allocates on the current stream).
inline void ReacquireStorage(const at::Tensor& t, int64_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

}  // namespace shardline
