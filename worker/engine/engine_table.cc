// The token table's paths without its gather: the sparse lookup
// (SparseEmbedding) and the vocabulary-parallel head (VocabParallelHead),
// over a tied table or the untied head's own, whose prefix (the norm) is
// exchanged instead. The unit schedule is engine.cc; the step's end,
// engine_step.cc.
#include "worker/engine/engine.h"

#include <utility>

#include "common/base/status_macros.h"

namespace shardline {

namespace {
// Calls fn(flat_offset, shard_offset, numel) for each piece of the head
// unit's prefix (its parameters before the table) that f's shard holds.
template <typename Fn>
void ForEachPrefixPiece(const FlatParam& f, int64_t prefix_numel, Fn fn) {
  const ShardLayout& layout = f.layout();
  for (const ShardPiece& p : layout.PiecesOf(f.shard_rank())) {
    const int64_t offset = layout.params[p.param_index].offset;
    if (offset >= prefix_numel) break;
    fn(offset + p.param_begin, p.shard_begin, p.param_end - p.param_begin);
  }
}
}  // namespace

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

bool Engine::RowsOverWorld(bool final_micro) const {
  // Every replica's rows (world_rows_) where nothing all-reduces the shard
  // after them: untied, always; tied, once the head's part was all-reduced,
  // in the last micro-batch (StartTiedTableReduction, AddHeadTableShard),
  // or always where the head's part is the world's (over the world).
  const bool over_world = vocab_head_ && vocab_head_->over_world();
  return world_rows_ && (!tied_sparse_ || final_micro || over_world);
}

absl::Status Engine::BackwardSparseEmbed(int micro, bool final_micro, const at::Tensor& grad,
                                         const std::function<absl::Status()>& start_block) {
  const Unit::Activation a = units_[0].Take();
  TrackActivation(a.output, false);
  FlatParam* f = units_[0].trainable();
  const bool over_world = vocab_head_ && vocab_head_->over_world();
  const bool world = RowsOverWorld(final_micro);
  // On a host backend the replicas' all-reduces start as reduce-scatters
  // finish; every one started must be issued before the rows' gathers, so
  // that every rank queues them in one order.
  if (world) SL_RETURN_IF_ERROR(reduction_->Pump(/*wait_all=*/false, /*max_in_flight=*/0));
  absl::Status started;
  auto issue = [&] { started = start_block ? start_block() : absl::OkStatus(); };
  absl::StatusOr<at::Tensor> part_or =
      sparse_embedding_->Gradient(*comms_.shard, world ? comms_.replicate.get() : nullptr, waiter_, a.all_ids, grad,
                                  f->grad_shard().scalar_type(), issue);
  SL_RETURN_IF_ERROR(started);
  SL_ASSIGN_OR_RETURN(const at::Tensor part, std::move(part_or));
  // Reduced in every micro-batch whatever the accumulation (its bytes are
  // the tokens', not the table's); across replicate groups in the last,
  // unless the rows were every replica's. A tied table's shard already
  // holds the head's part where that was reduced in this micro-batch;
  // otherwise the first micro-batch's rows replace what the shard held.
  // (The vocabulary-parallel head's part is a shard, added in every
  // micro-batch.)
  // (Over the world the head's part is added last: FinishHeadTableParts.)
  const bool head_reduced =
      tied_sparse_ && !over_world && (head_vocab_parallel_ || final_micro || reduce_every_micro_);
  SL_RETURN_IF_ERROR(
      reduction_->AddShard(f, part, /*replace=*/micro == 0 && !head_reduced, /*last=*/final_micro && !world));
  return head_parts_work_ ? FinishHeadTableParts() : absl::OkStatus();  // (issued in the last micro-batch)
}

absl::Status Engine::StartTiedTableReduction(int micro, bool final_micro) {
  FlatParam* table = units_[0].trainable();
  if (!table) return absl::OkStatus();  // (frozen under LoRA)
  // The head's part of the gradient is all of it but the lookup's rows,
  // which BackwardSparseEmbed adds at the end. Past the first micro-batch
  // the shard holds earlier parts (this one's under sharded accumulation,
  // the lookups' under unsharded), so the reduce-scatter adds to it. The
  // all-reduce across replicas follows it here where the last rows are
  // every replica's (world_rows_), else those rows.
  return reduction_->Start(table, /*accumulate=*/micro > 0, /*last=*/final_micro && world_rows_);
}

absl::Status Engine::AddHeadTableShard(int micro, bool final_micro) {
  FlatParam* table = units_[0].trainable();
  if (!table) return absl::OkStatus();  // (frozen under LoRA)
  if (vocab_head_->over_world()) return AddHeadTablePart(micro, final_micro);
  // The shard the head computed replaces the first micro-batch's; all-
  // reduced across replicas as StartTiedTableReduction's.
  return reduction_->AddShard(table, std::exchange(head_grad_table_, at::Tensor()), /*replace=*/micro == 0,
                              /*last=*/final_micro && world_rows_);
}

absl::StatusOr<at::Tensor> Engine::HeadVocabParallel(const at::Tensor& x, const ForwardPass& pass,
                                                     const std::function<void(int)>& issue) {
  const int head = model::HeadUnit(config_.model);
  Unit& unit = units_[head];
  const Unit& holder = TableHolder();
  Unit::Activation a;
  a.input = x;
  if (pass.train()) a.leaf = x.detach().requires_grad_(true);
  Weights weights = unit.weights();
  if (head_holds_table_) {
    // The exchanged prefix's parameters (the norm), the graph's leaves
    // where the head trains.
    // (Kept until the shard changes: ForgetHeadPrefix.)
    at::Tensor prefix = head_prefix_;
    if (pass.train() && unit.trainable()) prefix = head_prefix_leaf_ = prefix.detach().requires_grad_(true);
    weights.clear();
    for (const ParamSlot& slot : unit.base().layout().params) {
      if (slot.offset >= head_prefix_numel_) break;
      weights.push_back(prefix.narrow(0, slot.offset, slot.spec.numel()).view(slot.spec.shape));
    }
  }
  const at::Tensor hidden = family_->HeadHidden(a.leaf.defined() ? a.leaf : x, weights);
  VocabParallelHead::Want want;
  want.grad_hidden = pass.train();
  want.grad_table = pass.train() && holder.trainable();
  want.reduce_dtype = holder.base().options().reduce_dtype;
  const at::Tensor part = holder.base().param_shard().narrow(0, vocab_head_->part_begin(), vocab_head_->part_numel());
  SL_ASSIGN_OR_RETURN(VocabParallelHead::Result r,
                      vocab_head_->Run(*comms_.shard, comms_.replicate.get(), waiter_,
                                       hidden.detach().reshape({-1, hidden.size(-1)}), pass.targets, part,
                                       pass.loss_scale, want, issue));
  if (pass.train()) {
    head_grad_hidden_ = r.grad_hidden.view(hidden.sizes());
    head_grad_table_ = std::move(r.grad_table);
    a.output = hidden;
    TrackActivation(a.output, true);
    unit.Keep(std::move(a));
  }
  return r.loss;
}

absl::Status Engine::AddHeadTablePart(int micro, bool final_micro) {
  // The world's gradient of this rank's part, summed over the micro-batches
  // (padded to the largest part: the all-gather's blocks are equal).
  const at::Tensor part = std::exchange(head_grad_table_, at::Tensor());
  const int replicas = comms_.replicate->size();
  const int64_t shard = TableHolder().base().layout().shard_numel;
  const int64_t largest = (shard + replicas - 1) / replicas;
  if (micro == 0) head_part_grad_ = at::zeros({largest}, part.options());
  head_part_grad_.narrow(0, 0, part.numel()).add_(part);
  if (!final_micro) return absl::OkStatus();
  // Issued right after the head's backward, before any block's all-reduce,
  // on every rank: it overlaps the blocks' backward.
  head_parts_ = at::empty({replicas * largest}, part.options());
  head_parts_work_ = comms_.replicate->AllGather(head_parts_, head_part_grad_);
  return absl::OkStatus();
}

absl::Status Engine::FinishHeadTableParts() {
  FlatParam* f = TableHolder().trainable();
  const std::shared_ptr<comm::Work> work = std::exchange(head_parts_work_, nullptr);
  SL_RETURN_IF_ERROR(waiter_.OnDevice(*work, comm::Op::kAllGather));
  // Every replica's part in order: the shard's gradient, the head's part.
  const at::Tensor parts = std::exchange(head_parts_, at::Tensor());
  head_part_grad_ = at::Tensor();  // (the gather's input, kept until it finished)
  const at::Tensor shard = parts.narrow(0, 0, f->layout().shard_numel);  // (a view of a buffer this owns)
  if (!head_holds_table_) return reduction_->AddShard(f, shard, /*replace=*/false, /*last=*/false);
  // Untied, the head unit's shard is the parts (zero outside the table)
  // and its pieces of the norm's gradient, summed across the replicas (every
  // rank sums all of it: C elements, the same bytes everywhere).
  const at::Tensor prefix = std::exchange(head_prefix_grad_sum_, at::Tensor());
  SL_RETURN_IF_ERROR(waiter_.OnDevice(*comms_.replicate->AllReduce(prefix), comm::Op::kAllReduce));
  ForEachPrefixPiece(*f, head_prefix_numel_, [&](int64_t flat, int64_t shard_offset, int64_t n) {
    shard.narrow(0, shard_offset, n).add_(prefix.narrow(0, flat, n));
  });
  return reduction_->AddShard(f, shard, /*replace=*/true, /*last=*/false);
}

bool Engine::HeadExchanged(int u) const {
  return head_holds_table_ && head_vocab_parallel_ && u == model::HeadUnit(config_.model);
}

void Engine::IssueHeadPrefix() {
  // Issued, or summed already: the prefix changes only with the shard.
  if (head_prefix_work_ || head_prefix_.defined()) return;
  const FlatParam& f = units_[model::HeadUnit(config_.model)].base();
  head_prefix_ = at::zeros({head_prefix_numel_}, f.param_shard().options());
  ForEachPrefixPiece(f, head_prefix_numel_, [&](int64_t flat, int64_t shard, int64_t n) {
    head_prefix_.narrow(0, flat, n).copy_(f.param_shard().narrow(0, shard, n));
  });
  head_prefix_work_ = comms_.shard->AllReduce(head_prefix_);
}

void Engine::ForgetHeadPrefix() {
  // (None is in flight between passes: each forward waits for the one it
  // issued, and no backward prefetches the head.)
  head_prefix_ = at::Tensor();
}

absl::Status Engine::WaitHeadPrefix() {
  if (!head_prefix_work_) return absl::OkStatus();
  const std::shared_ptr<comm::Work> work = std::exchange(head_prefix_work_, nullptr);
  return waiter_.OnDevice(*work, comm::Op::kAllReduce);
}

absl::Status Engine::IssueHeadPrefixGrad(int micro, bool final_micro) {
  const Unit& unit = units_[model::HeadUnit(config_.model)];
  const at::Tensor leaf = std::exchange(head_prefix_leaf_, at::Tensor());
  if (!unit.trainable() || !leaf.defined()) return absl::OkStatus();  // (frozen under LoRA)
  head_prefix_grad_ = leaf.grad().to(unit.base().options().reduce_dtype).contiguous();
  head_prefix_grad_work_ = comms_.shard->AllReduce(head_prefix_grad_);
  // Over the world the table's part goes across the replicas from here,
  // before any block's all-reduce.
  return vocab_head_->over_world() ? AddHeadTablePart(micro, final_micro) : absl::OkStatus();
}

absl::Status Engine::FinishHeadShard(int micro, bool final_micro) {
  FlatParam* f = units_[model::HeadUnit(config_.model)].trainable();
  const std::shared_ptr<comm::Work> work = std::exchange(head_prefix_grad_work_, nullptr);
  SL_RETURN_IF_ERROR(waiter_.OnDevice(*work, comm::Op::kAllReduce));
  if (vocab_head_->over_world()) {  // (the shard is written at the end: FinishHeadTableParts)
    const at::Tensor prefix = std::exchange(head_prefix_grad_, at::Tensor());
    if (micro == 0) {
      head_prefix_grad_sum_ = prefix;
    } else {
      head_prefix_grad_sum_.add_(prefix);
    }
    return absl::OkStatus();
  }
  // The table's rows' gradient (zero elsewhere in the shard), and the part
  // of the prefix's that this shard holds.
  at::Tensor shard = std::exchange(head_grad_table_, at::Tensor());
  const at::Tensor prefix = std::exchange(head_prefix_grad_, at::Tensor());
  ForEachPrefixPiece(*f, head_prefix_numel_, [&](int64_t flat, int64_t shard_offset, int64_t n) {
    shard.narrow(0, shard_offset, n).add_(prefix.narrow(0, flat, n));
  });
  // Across replicas in the last micro-batch, as the unit's reduction would.
  return reduction_->AddShard(f, shard, /*replace=*/micro == 0, /*last=*/final_micro);
}

}  // namespace shardline
