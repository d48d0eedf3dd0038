// StepSchedule against timelines worked by hand: what hides behind compute
// and what does not, for the engine's prefetch depth, backward regathers,
// one reduce-scatter in flight, replicas, the sparse embedding's waits,
// micro-batches and the CPU that sends take.
#include "common/plan/step_schedule.h"

#include <gtest/gtest.h>

namespace shardline {
namespace {

// Units of equal size: an embedding with no compute, `blocks` blocks and a
// head; 1 byte/s links, so bytes read as seconds. As the planner has it, the
// last block stays gathered from its forward to its backward.
ScheduleInput Uniform(int blocks, double gather, double forward, double backward, double reduce) {
  ScheduleInput in;
  in.shard_bw = in.replica_bw = 1;
  for (int u = 0; u < blocks + 2; ++u) {
    UnitWork w;
    const bool block = u > 0 && u <= blocks;
    w.gather_bytes = gather;
    w.gather_in_backward = block && u < blocks && gather > 0;
    w.forward_s = u == 0 ? 0 : forward;
    w.backward_s = u == 0 ? 0 : backward;
    w.reduce_bytes = reduce;
    in.units.push_back(w);
  }
  return in;
}

TEST(StepScheduleTest, ComputeBoundHidesAllButTheEdges) {
  // Gathers of 1 s behind 10 s of forward each: the embedding's and the
  // first block's are waited on (the lookup has no compute to hide a
  // gather behind). Backward: the head, the embedding and the last block
  // stay gathered, the first block's regather is issued at the head; the
  // reductions of 1 s hide behind 20 s of backward, except the last
  // block's and the embedding's, which has no compute either.
  const ScheduleInput in = Uniform(2, 1, 10, 20, 1);
  const ScheduleTimes t = SimulateStep(in);
  EXPECT_DOUBLE_EQ(t.compute_s, 3 * 10 + 3 * 20);
  EXPECT_DOUBLE_EQ(t.step_s, 2 + 90 + 2);
  EXPECT_DOUBLE_EQ(t.bytes, 4 + 1 + 4);  // 4 gathers, 1 regather, 4 reductions
  EXPECT_DOUBLE_EQ(t.comm_s, 9);
}

TEST(StepScheduleTest, TheFirstBlocksGatherFromTheLastUpdateHidesBehindIt) {
  // As above, but the first block's gather went out 1 s before the step,
  // during the last update: only the embedding's is waited on at the start.
  // Issued half a second before, it still holds up the embedding's by the
  // half left. The bytes are the same.
  ScheduleInput in = Uniform(2, 1, 10, 20, 1);
  in.carried_gather_s = 1;
  ScheduleTimes t = SimulateStep(in);
  EXPECT_DOUBLE_EQ(t.step_s, 1 + 90 + 2);
  EXPECT_DOUBLE_EQ(t.bytes, 9);
  in.carried_gather_s = 0.5;
  t = SimulateStep(in);
  EXPECT_DOUBLE_EQ(t.step_s, 1.5 + 90 + 2);
  EXPECT_DOUBLE_EQ(t.bytes, 9);
}

TEST(StepScheduleTest, LinkBoundStepIsTheLinksTimeWhateverTheCompute) {
  // 10 s gathers behind 1 s computes: the link never idles once the step
  // starts, so the step is the link's busy time plus the compute that no
  // collective runs beside (the head's backward waits for nothing, its
  // reduction then runs alone; the last unit waits its reduction).
  const ScheduleInput in = Uniform(4, 10, 1, 2, 10);
  const ScheduleTimes t = SimulateStep(in);
  EXPECT_DOUBLE_EQ(t.comm_s, 6 * 10 + 3 * 10 + 6 * 10);
  EXPECT_GE(t.step_s, t.comm_s);
  EXPECT_LE(t.step_s, t.comm_s + t.compute_s);
}

TEST(StepScheduleTest, PrefetchDepthBoundsWhatAForwardHides) {
  // A large head (gather 30 s) behind blocks of 10 s forward: with two
  // gathers in flight its gather starts when the block two before it starts,
  // and waits; with more in flight it starts earlier and hides further.
  // (Forward alone: no backward compute, regathers or reductions.)
  ScheduleInput in = Uniform(6, 1, 10, 0, 0);
  for (UnitWork& w : in.units) w.gather_in_backward = false;
  in.units.back().gather_bytes = 30;
  in.max_inflight_gathers = 2;
  const double two = SimulateStep(in).step_s;
  in.max_inflight_gathers = 8;
  const double eight = SimulateStep(in).step_s;
  // Eight in flight: every gather queued at the start, the head's ends at
  // 1 + 6 + 30 = 37, before its turn at 2 + 60 (the first block waits for
  // its gather behind the embedding's): 62 + 10 s of head.
  EXPECT_DOUBLE_EQ(eight, 2 + 60 + 10);
  // Two in flight: the head's gather is issued when block 5 starts (at 42),
  // ends at 72, 10 s after the blocks end at 62.
  EXPECT_DOUBLE_EQ(two, 72 + 10);
}

TEST(StepScheduleTest, TheHeadIssuesBackwardsFirstGathersThenOneAhead) {
  // As the engine does: the head's loss is fused with its backward, so the
  // backward's first regathers are issued at the head, as many as the
  // limit allows; after that each block prefetches the one before it
  // (BackwardPrefetch::kPre). Three blocks whose gathers take 10 s, the
  // last kept from its forward to its backward, a head whose backward
  // takes 30 s, blocks of 1 s; no forward compute (the gathers run 0-30),
  // no reductions.
  ScheduleInput in = Uniform(3, 10, 0, 1, 0);
  in.units.front().gather_bytes = in.units.back().gather_bytes = 0;
  in.units.back().backward_s = 30;
  // Limit 3: blocks 2 and 1 regather at 30-40 and 40-50, beside the
  // head's backward (30-60), then three blocks of 1 s.
  in.max_inflight_gathers = 3;
  EXPECT_DOUBLE_EQ(SimulateStep(in).step_s, 63);
  // Limit 1: block 2's at 30-40; block 1's once block 2 is ready at 61
  // (61-71), waited on.
  in.max_inflight_gathers = 1;
  EXPECT_DOUBLE_EQ(SimulateStep(in).step_s, 72);
}

TEST(StepScheduleTest, OneReductionInFlightMakesBackwardWaitForThePreviousOne) {
  // Reductions of 15 s behind 10 s backwards: sharded accumulation waits for
  // the previous reduction before the next unit, unsharded does not wait.
  ScheduleInput in = Uniform(3, 0, 0, 10, 15);
  in.reduce_every_micro = true;
  const ScheduleTimes sharded = SimulateStep(in);
  in.reduce_every_micro = false;
  const ScheduleTimes unsharded = SimulateStep(in);
  // Either way the link sends 5 x 15 s back to back from the head's end at
  // 10: the step ends with the last reduction at 10 + 75 = 85.
  EXPECT_DOUBLE_EQ(sharded.step_s, 85);
  EXPECT_DOUBLE_EQ(unsharded.step_s, 85);
  // With two micro-batches the second backward starts only after the first
  // one's last wait under sharded accumulation, and unsharded sends nothing
  // in the first micro-batch.
  in.micro_batches = 2;
  in.reduce_every_micro = true;
  const ScheduleTimes sharded2 = SimulateStep(in);
  in.reduce_every_micro = false;
  const ScheduleTimes unsharded2 = SimulateStep(in);
  EXPECT_DOUBLE_EQ(sharded2.bytes, 2 * unsharded2.bytes);
  EXPECT_DOUBLE_EQ(unsharded2.step_s, 40 + 85);  // 40 s of compute, then as one micro-batch
  EXPECT_GT(sharded2.step_s, unsharded2.step_s);
}

TEST(StepScheduleTest, ReplicaAllReduceFollowsEachReductionOnItsOwnLink) {
  ScheduleInput in = Uniform(1, 0, 0, 10, 1);
  for (UnitWork& w : in.units) w.replica_bytes = 4;
  in.replica_bw = 2;  // 2 s each
  const ScheduleTimes t = SimulateStep(in);
  // Backward: head 0-10 (reduced 10-11, all-reduced 11-13), block 10-20
  // (20-21, 21-23), embedding no compute, reduced 21-22, all-reduced 23-25.
  EXPECT_DOUBLE_EQ(t.step_s, 25);
  EXPECT_DOUBLE_EQ(t.bytes, 3 * 1 + 3 * 4);
}

TEST(StepScheduleTest, PiecesGatheredAcrossReplicasHoldUpOnlyTheFirstGathersTheUpdateDidNotHide) {
  // The optimizer sharded across replicas: 2 s of pieces per unit go out
  // on the replicas' link during the update, each unit's first gather
  // after its pieces. With no update to hide behind (a job's first step),
  // the embedding's gather waits 2 s for its pieces and ends at 3, the
  // block's (pieces in at 4) at 5, the head's at 7: forward 5-15 and 15-25
  // (the head's gather is in by then), backward 25-45. Without pieces: 42.
  ScheduleInput in = Uniform(1, 1, 10, 10, 0);
  for (UnitWork& w : in.units) w.replica_gather_bytes = 2;
  ScheduleTimes t = SimulateStep(in);
  EXPECT_DOUBLE_EQ(t.step_s, 5 + 10 + 10 + 20);
  EXPECT_DOUBLE_EQ(t.bytes, 3 * 1 + 3 * 2);
  // With a 4 s update the first block's pieces go out first, at -4 (in by
  // -2, its gather by -1), then the embedding's (by 0) and the head's (by
  // 2): the embedding's gather ends at 1, the head's at 3, inside the
  // block's forward: 1 + 20 + 20, as without pieces.
  in.carried_gather_s = 4;
  t = SimulateStep(in);
  EXPECT_DOUBLE_EQ(t.step_s, 1 + 20 + 20);
  for (UnitWork& w : in.units) w.replica_gather_bytes = 0;
  EXPECT_DOUBLE_EQ(SimulateStep(in).step_s, 41);
}

TEST(StepScheduleTest, SparseEmbeddingExchangesAreWaitedOn) {
  ScheduleInput in = Uniform(1, 0, 10, 10, 0);
  in.units.front().lookup_bytes = 3;
  in.units.front().row_grad_bytes = 5;
  EXPECT_DOUBLE_EQ(SimulateStep(in).step_s, 3 + 20 + 20 + 5);
  // The rows' gradients gathered across replicas after them, waited on too:
  // in every micro-batch (an untied table), or in the last alone (a tied
  // one, whose shard the earlier ones' rows reach through its all-reduce).
  in.units.front().replica_row_grad_bytes = 2;
  EXPECT_DOUBLE_EQ(SimulateStep(in).step_s, 3 + 20 + 20 + 5 + 2);
  in.micro_batches = 2;
  EXPECT_DOUBLE_EQ(SimulateStep(in).step_s, 2 * (3 + 20 + 20 + 5 + 2));
  in.units.front().replica_rows_last_only = true;
  EXPECT_DOUBLE_EQ(SimulateStep(in).step_s, 2 * (3 + 20 + 20 + 5) + 2);
}

TEST(StepScheduleTest, TheHeadsHiddenStatesHideBehindItsOwnTokens) {
  // The head over the vocabulary: every rank's hidden states (4 s) go out
  // as the head starts, while its own tokens' quarter of its 10 s forward
  // computes (2.5 s); the 1.5 s left is waited on, then the statistics' 1 s
  // exchange, then the rest of the forward: 10 + 2.5 + 1.5 + 1 + 7.5, and
  // the two backwards.
  ScheduleInput in = Uniform(1, 0, 10, 10, 0);
  UnitWork& head = in.units.back();
  head.overlapped_lookup_bytes = 4;
  head.overlapped_lookup_s = 2.5;
  head.lookup_bytes = 1;
  ScheduleTimes t = SimulateStep(in);
  EXPECT_DOUBLE_EQ(t.step_s, 10 + 2.5 + 1.5 + 1 + 7.5 + 20);
  EXPECT_DOUBLE_EQ(t.compute_s, 40) << "the overlapped part is the forward's, counted once";
  // A gather shorter than the own tokens' compute is hidden whole.
  head.overlapped_lookup_bytes = 2;
  EXPECT_DOUBLE_EQ(SimulateStep(in).step_s, 10 + 10 + 1 + 20);
}

TEST(StepScheduleTest, TheRowsGoOutBeforeTheFirstBlocksReduction) {
  // As the engine orders them: the rows' exchange, waited on at once, first,
  // and the first block's reduce-scatter behind it, where it hides behind
  // the next micro-batch's forward. Two micro-batches reducing each (the
  // sparse table's shard is computed, not reduce-scattered): head backward
  // 20-30, its reduction 30-34, block backward 30-40, rows 40-45, the
  // block's reduction 45-49 beside the second forward from 45; again from
  // 65: rows 85-90, the block's 90-94, the end.
  ScheduleInput in = Uniform(1, 0, 10, 10, 4);
  in.units.front().reduce_bytes = 0;
  in.units.front().row_grad_bytes = 5;
  in.micro_batches = 2;
  in.reduce_every_micro = true;
  EXPECT_DOUBLE_EQ(SimulateStep(in).step_s, 94);
  // Where the rows cross the replicas too, every reduction goes first: the
  // block's 40-44, the rows 44-49 and 49-50 across; the second micro-batch
  // from 50 ends with the block's 90-94, the rows 94-99 and 99-100.
  in.units.front().replica_row_grad_bytes = 1;
  EXPECT_DOUBLE_EQ(SimulateStep(in).step_s, 100);
}

TEST(StepScheduleTest, ParametersGatheredAfterTheOptimizerAreWaitedOn) {
  ScheduleInput in = Uniform(1, 0, 10, 10, 0);
  in.after_step_gather_bytes = 7;
  EXPECT_DOUBLE_EQ(SimulateStep(in).step_s, 40 + 7);
}

TEST(StepScheduleTest, ManyMicroBatchesCostWhatEachRepeats) {
  // Compute-bound micro-batches repeat exactly, whether simulated one by one
  // (3) or extrapolated (2^20). The first takes the 94 s of one alone; each
  // later one 93 s: its embedding's gather queues behind the previous one's
  // last reduction, but the first block stayed gathered from that one's
  // backward (a byte fewer each).
  ScheduleInput in = Uniform(2, 1, 10, 20, 1);
  for (int m : {3, 4, 1 << 20}) {
    in.micro_batches = m;
    const ScheduleTimes t = SimulateStep(in);
    EXPECT_DOUBLE_EQ(t.compute_s, 90.0 * m) << m;
    EXPECT_NEAR(t.step_s, 94.0 + 93.0 * (m - 1), 1e-6 * m) << m;
    EXPECT_DOUBLE_EQ(t.bytes, 9.0 * m - (m - 1)) << m;
  }
}

TEST(StepScheduleTest, AFrozenBaseStaysGatheredFromTheLastStep) {
  // The first block's gather is 1 byte, of which 0.75 is a frozen base kept
  // from the last step's backward: only 0.25 is waited on after the
  // embedding's.
  ScheduleInput in = Uniform(2, 1, 10, 20, 1);
  in.first_block_frozen_bytes = 0.75;
  const ScheduleTimes t = SimulateStep(in);
  EXPECT_DOUBLE_EQ(t.step_s, 1.25 + 90 + 2);
  EXPECT_DOUBLE_EQ(t.bytes, 9 - 0.75);
}

TEST(StepScheduleTest, SendsStretchComputeByTheirCpu) {
  // 9 bytes per step at 1 s of compute each: 9 s more compute over the
  // 90 s of the units, every unit 10% slower.
  ScheduleInput in = Uniform(2, 1, 10, 20, 1);
  in.cpu_s_per_byte = 1;
  const ScheduleTimes t = SimulateStep(in);
  EXPECT_DOUBLE_EQ(t.compute_s, 99);
  EXPECT_DOUBLE_EQ(t.step_s, 2 + 99 + 2);
}

}  // namespace
}  // namespace shardline
