// The token table's paths without its gather: the sparse lookup
// (SparseEmbedding) and, tied, the vocabulary-parallel head
// (VocabParallelHead). The rest of the step is engine.cc.
#include "worker/engine/engine.h"

#include <utility>

#include "common/base/status_macros.h"

namespace shardline {

absl::StatusOr<at::Tensor> Engine::EmbedSparse(const at::Tensor& ids, const ForwardPass& pass) {
  at::Tensor positions;  // (as GptFamily::Embed's)
  if (sparse_embedding_->by_position()) {
    positions = pass.packing.packed() ? pass.packing.positions : at::arange(ids.size(1), ids.options());
  }
  SL_ASSIGN_OR_RETURN(SparseEmbedding::Rows rows, sparse_embedding_->Lookup(*comms_.shard, waiter_, ids, positions,
                                                                            units_[0].base().param_shard()));
  if (pass.train()) {
    Unit::Activation a;
    a.input = ids;
    a.all_ids = rows.all_ids;
    a.output = rows.hidden;
    TrackActivation(a.output, true);
    units_[0].Keep(std::move(a));
  }
  return rows.hidden;
}

absl::Status Engine::BackwardSparseEmbed(int micro, bool final_micro, const at::Tensor& grad) {
  const Unit::Activation a = units_[0].Take();
  TrackActivation(a.output, false);
  FlatParam* f = units_[0].trainable();
  // Every replica's rows (world_rows_) where nothing all-reduces the shard
  // after them: untied, always; tied, once the head's part was all-reduced,
  // in the last micro-batch (ReduceTiedTable).
  const bool world = world_rows_ && (!tied_sparse_ || final_micro);
  // On a host backend the replicas' all-reduces start as reduce-scatters
  // finish; every one started must be issued before the rows' gathers, so
  // that every rank queues them in one order.
  if (world) SL_RETURN_IF_ERROR(reduction_->Pump(/*wait_all=*/false, /*max_in_flight=*/0));
  SL_ASSIGN_OR_RETURN(const at::Tensor part,
                      sparse_embedding_->Gradient(*comms_.shard, world ? comms_.replicate.get() : nullptr, waiter_,
                                                  a.all_ids, grad, f->grad_shard().scalar_type()));
  // Reduced in every micro-batch whatever the accumulation (its bytes are
  // the tokens', not the table's); across replicate groups in the last,
  // unless the rows were every replica's. A tied table's shard already
  // holds the head's part where that was reduced in this micro-batch;
  // otherwise the first micro-batch's rows replace what the shard held.
  // (The vocabulary-parallel head's part is a shard, added in every
  // micro-batch.)
  const bool head_reduced = tied_sparse_ && (head_vocab_parallel_ || final_micro || reduce_every_micro_);
  return reduction_->AddShard(f, part, /*replace=*/micro == 0 && !head_reduced, /*last=*/final_micro && !world);
}

absl::Status Engine::ReduceTiedTable(int micro, bool final_micro) {
  FlatParam* table = units_[0].trainable();
  if (!table) return absl::OkStatus();  // (frozen under LoRA)
  if (head_vocab_parallel_) {
    // The shard the head computed replaces the first micro-batch's; all-
    // reduced across replicas as below.
    return reduction_->AddShard(table, std::exchange(head_grad_table_, at::Tensor()), /*replace=*/micro == 0,
                                /*last=*/final_micro && world_rows_);
  }
  // The head's part of the gradient is all of it but the lookup's rows,
  // which BackwardSparseEmbed adds at the end. Past the first micro-batch
  // the shard holds earlier parts (this one's under sharded accumulation,
  // the lookups' under unsharded), so the reduce-scatter adds to it. The
  // all-reduce across replicas follows it here where the last rows are
  // every replica's (world_rows_), else those rows.
  return reduction_->Start(table, /*accumulate=*/micro > 0, /*last=*/final_micro && world_rows_);
}

absl::StatusOr<at::Tensor> Engine::HeadVocabParallel(const at::Tensor& x, const ForwardPass& pass,
                                                     const std::function<void()>& issue) {
  Unit& unit = units_[model::HeadUnit(config_.model)];
  Unit::Activation a;
  a.input = x;
  if (pass.train()) a.leaf = x.detach().requires_grad_(true);
  const at::Tensor hidden = family_->HeadHidden(a.leaf.defined() ? a.leaf : x, unit.weights());
  FlatParam* table = units_[0].trainable();
  VocabParallelHead::Want want;
  want.grad_hidden = pass.train();
  want.grad_table = pass.train() && table;
  want.reduce_dtype = units_[0].base().options().reduce_dtype;
  SL_ASSIGN_OR_RETURN(VocabParallelHead::Result r,
                      vocab_head_->Run(*comms_.shard, waiter_, hidden.detach().reshape({-1, hidden.size(-1)}),
                                       pass.targets, units_[0].base().param_shard(), pass.loss_scale, want, issue));
  if (pass.train()) {
    head_grad_hidden_ = r.grad_hidden.view(hidden.sizes());
    head_grad_table_ = std::move(r.grad_table);
    a.output = hidden;
    TrackActivation(a.output, true);
    unit.Keep(std::move(a));
  }
  return r.loss;
}

}  // namespace shardline
