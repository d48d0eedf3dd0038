// FlatParam's unshard life cycle and Device / backend selection on CPU:
// transitions and their no-ops, the errors for a wait with no gather and a
// reshard under an in-flight gather, what memory each state holds, the order
// in which gradient reduction issues collectives, and the refusals of device
// specs and backends that cannot run here.
#include "worker/engine/flat_param.h"

#include <algorithm>

#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "worker/comm/groups.h"
#include "worker/device/device.h"
#include "worker/engine/grad_reduction.h"

namespace shardline {
namespace {

// A Work that completes only when told: lets a test hold a gather in flight.
class HeldWork : public comm::Work {
 public:
  absl::Status Wait(absl::Duration) override {
    done_ = true;
    return absl::OkStatus();
  }
  absl::Status WaitOnDevice(absl::Duration t) override { return Wait(t); }
  bool Done() const override { return done_; }

 private:
  bool done_ = false;
};

// A group of one whose all-gather copies at once but reports through a
// HeldWork, and counts calls.
class CountingGroup : public comm::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void Abort(const absl::Status&) override {}
  std::shared_ptr<comm::Work> AllGather(at::Tensor out, at::Tensor in) override {
    ++gathers;
    out.copy_(in);
    return std::make_shared<HeldWork>();
  }
  std::shared_ptr<comm::Work> ReduceScatter(at::Tensor, at::Tensor) override { return nullptr; }
  std::shared_ptr<comm::Work> AllReduce(at::Tensor) override { return nullptr; }
  std::shared_ptr<comm::Work> Broadcast(at::Tensor, int) override { return nullptr; }
  std::shared_ptr<comm::Work> Barrier() override { return nullptr; }
  comm::CommStats Stats() const override { return {}; }
  absl::Status status() const override { return absl::OkStatus(); }
  int gathers = 0;
};

// A group of two that records, in one log shared with other groups, which
// collective each call issued (an AllReduceAfter with the log index of the
// op it follows); its ops finish only when waited on, as a device op whose
// end the watchdog has not yet seen.
class RecordingGroup : public comm::Communicator {
 public:
  RecordingGroup(std::string name, bool ordered_on_device, std::vector<std::string>* log)
      : name_(std::move(name)), ordered_(ordered_on_device), log_(log) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  bool ordered_on_device() const override { return ordered_; }
  void Abort(const absl::Status&) override {}
  std::shared_ptr<comm::Work> AllGather(at::Tensor, at::Tensor) override { return Issue("AG"); }
  std::shared_ptr<comm::Work> ReduceScatter(at::Tensor, at::Tensor) override { return Issue("RS"); }
  std::shared_ptr<comm::Work> AllReduce(at::Tensor) override { return Issue("AR"); }
  std::shared_ptr<comm::Work> AllReduceAfter(at::Tensor t, std::shared_ptr<comm::Work> after) override {
    if (ordered_ || !after) return AllReduce(t);  // (the contract: a null `after` is the plain op)
    const auto it = std::find(issued_.begin(), issued_.end(), after.get());
    return Issue(absl::StrCat("AR after #", it - issued_.begin()));
  }
  std::shared_ptr<comm::Work> Broadcast(at::Tensor, int) override { return Issue("BC"); }
  std::shared_ptr<comm::Work> Barrier() override { return Issue("B"); }
  comm::CommStats Stats() const override { return {}; }
  absl::Status status() const override { return absl::OkStatus(); }

  // Every group's works, by their log index (shared like the log).
  static inline std::vector<const comm::Work*> issued_;

 private:
  std::shared_ptr<comm::Work> Issue(const std::string& op) {
    log_->push_back(name_ + " " + op);
    auto work = std::make_shared<HeldWork>();
    issued_.resize(log_->size());
    issued_.back() = work.get();
    return work;
  }
  const std::string name_;
  const bool ordered_;
  std::vector<std::string>* const log_;
};

struct Fixture {
  std::shared_ptr<const Device> device = *Device::Open("cpu");
  MemoryLedger ledger;
  at::Tensor init;
  std::unique_ptr<FlatParam> param;

  explicit Fixture(bool persistent_params) {
    auto layout = MakeShardLayout("unit", {{"w", {2, 3}, true}, {"b", {3}, false}}, 1);
    EXPECT_TRUE(layout.ok());
    init = at::arange(9, at::kFloat);
    FlatParamOptions o;
    o.param_dtype = at::kBFloat16;
    o.persistent_params = persistent_params;
    o.persistent_grads = persistent_params;
    param = *FlatParam::Create(*layout, 0, o, *device, &ledger, FlatParam::ValuesOf(init));
  }
};

TEST(FlatParamLifeCycle, TransitionsRepeatAsNoOpsAndRefuseUnsafeOnes) {
  Fixture f(/*persistent_params=*/false);
  FlatParam& p = *f.param;
  CountingGroup group;
  CommWaiter waiter(absl::Seconds(1));
  EXPECT_EQ(p.state(), UnshardState::kSharded);
  EXPECT_FALSE(p.unsharded_allocated());
  const int64_t sharded_params = f.ledger.current(MemKind::kParams);  // the bf16 param shard
  EXPECT_EQ(sharded_params, 9 * 2);

  EXPECT_TRUE(p.Reshard().ok());  // sharded: no-op
  const absl::Status no_gather = p.WaitForUnshard(waiter);
  EXPECT_EQ(no_gather.code(), absl::StatusCode::kFailedPrecondition) << no_gather;
  EXPECT_NE(no_gather.message().find("unit"), std::string::npos);

  p.Unshard(group);
  EXPECT_EQ(p.state(), UnshardState::kGathering);
  EXPECT_TRUE(p.unsharded_allocated());
  EXPECT_EQ(f.ledger.current(MemKind::kParams), sharded_params + 9 * 2);
  p.Unshard(group);  // gathering: no second gather
  EXPECT_EQ(group.gathers, 1);
  const absl::Status early = p.Reshard();
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition) << early;
  EXPECT_EQ(p.state(), UnshardState::kGathering);  // the refused reshard changed nothing

  ASSERT_TRUE(p.WaitForUnshard(waiter).ok());
  EXPECT_EQ(p.state(), UnshardState::kUnsharded);
  EXPECT_TRUE(p.weights()[1].to(at::kFloat).equal(at::arange(6, 9, at::kFloat)));
  EXPECT_TRUE(p.WaitForUnshard(waiter).ok());  // unsharded: no-op
  p.Unshard(group);                            // unsharded: no-op
  EXPECT_EQ(group.gathers, 1);

  ASSERT_TRUE(p.Reshard().ok());
  EXPECT_EQ(p.state(), UnshardState::kSharded);
  EXPECT_FALSE(p.unsharded_allocated());
  EXPECT_EQ(f.ledger.current(MemKind::kParams), sharded_params);
  EXPECT_TRUE(p.Reshard().ok());

  // A second cycle gathers again into the same leaves.
  p.Unshard(group);
  ASSERT_TRUE(p.WaitForUnshard(waiter).ok());
  EXPECT_EQ(group.gathers, 2);
  EXPECT_TRUE(p.weights()[0].to(at::kFloat).equal(at::arange(6, at::kFloat).view({2, 3})));
}

TEST(FlatParamLifeCycle, PersistentParamsStayUnsharded) {
  Fixture f(/*persistent_params=*/true);
  CountingGroup group;
  CommWaiter waiter(absl::Seconds(1));
  EXPECT_EQ(f.param->state(), UnshardState::kUnsharded);
  f.param->Unshard(group);
  EXPECT_TRUE(f.param->WaitForUnshard(waiter).ok());
  EXPECT_TRUE(f.param->Reshard().ok());
  EXPECT_EQ(f.param->state(), UnshardState::kUnsharded);
  EXPECT_TRUE(f.param->unsharded_allocated());
  EXPECT_EQ(group.gathers, 0);
}

// Two units' gradients reduced under a hybrid strategy while neither
// reduce-scatter reports Done (the watchdog has not polled yet): the order in
// which a rank issues collectives must not depend on that timing.
std::vector<std::string> ReductionOrder(bool ordered_on_device, int micro_batches = 1,
                                        bool first_accumulates = false) {
  std::vector<std::string> log;
  RecordingGroup::issued_.clear();
  RecordingGroup shard("shard", ordered_on_device, &log), replicate("replicate", ordered_on_device, &log);
  auto device = *Device::Open("cpu");
  MemoryLedger ledger;
  CommWaiter waiter(absl::Seconds(1));
  auto layout = MakeShardLayout("unit", {{"w", {4}, true}}, 2);
  EXPECT_TRUE(layout.ok());
  FlatParamOptions o;
  o.persistent_grads = false;
  std::vector<std::unique_ptr<FlatParam>> units;
  for (int i = 0; i < 2; ++i) {
    units.push_back(*FlatParam::Create(*layout, 0, o, *device, &ledger, FlatParam::ValuesOf(at::zeros({4}))));
    units.back()->EnsureGrad();
  }
  GradReduction reduction(&shard, &replicate, &waiter, &ledger);
  // Two micro-batches under sharded accumulation: the first only
  // reduce-scatters, the last adds and all-reduces.
  for (int micro = 0; micro < micro_batches; ++micro) {
    const bool last = micro == micro_batches - 1;
    for (auto& u : units) u->EnsureGrad();
    EXPECT_TRUE(reduction.Start(units[0].get(), micro > 0 || first_accumulates, last).ok());
    EXPECT_TRUE(reduction.Pump(/*wait_all=*/false).ok());
    EXPECT_TRUE(reduction.Start(units[1].get(), micro > 0, last).ok());
    EXPECT_TRUE(reduction.Pump(/*wait_all=*/true).ok());
  }
  return log;
}

TEST(GradReduction, OnTheDeviceEachAllReduceFollowsItsReduceScatterAtOnce) {
  // NCCL: both communicators share the reduce-scatter stream, so the order
  // of issue is the order of execution; RS1 RS2 AR1 on one rank against
  // RS1 AR1 RS2 on another is a wait cycle once four ranks form two groups.
  EXPECT_EQ(ReductionOrder(true), (std::vector<std::string>{"shard RS", "replicate AR", "shard RS", "replicate AR"}));
}

TEST(GradReduction, ShardedAccumulationAllReducesOnlyAfterTheLastMicroBatch) {
  // Earlier micro-batches only reduce-scatter (their shards are summed);
  // the replicate groups all-reduce the sum once, in the same fixed order.
  const std::vector<std::string> want = {"shard RS", "shard RS", "shard RS", "replicate AR", "shard RS", "replicate AR"};
  EXPECT_EQ(ReductionOrder(true, 2), want);
  EXPECT_EQ(ReductionOrder(false, 2),
            (std::vector<std::string>{"shard RS", "shard RS", "shard RS", "shard RS", "replicate AR", "replicate AR"}));
}

TEST(GradReduction, OnTheHostEachAllReduceIsQueuedToStartAfterItsReduceScatter) {
  // Gloo: the all-reduce reads the shard, so it may start only once the
  // reduce-scatter has written it. It is queued at once, to start then on
  // the replicate group's thread (its link would idle until the step thread
  // next pumped); the replicate group's own order holds.
  EXPECT_EQ(ReductionOrder(false), (std::vector<std::string>{"shard RS", "replicate AR after #0", "shard RS",
                                                             "replicate AR after #2"}));
}

TEST(GradReduction, OnTheHostNoAllReduceOvertakesOneStillToBeIssued) {
  // The first unit accumulates (its shard is complete only once the host
  // added its scratch: the all-reduce is issued at Finish), so the second's
  // may not be queued ahead of it: a rank whose first reduce-scatter ended
  // later would run the two all-reduces in the other order.
  EXPECT_EQ(ReductionOrder(false, 1, /*first_accumulates=*/true),
            (std::vector<std::string>{"shard RS", "shard RS", "replicate AR", "replicate AR"}));
}

TEST(GradReduction, AUnitIsReducedOnlyOnceItsAllReduceAcrossReplicasEnded) {
  // The step's sums read each unit's shard as soon as Reduced says so:
  // read any earlier, a shard still being reduce-scattered or all-reduced
  // enters the clipping norm half done.
  std::vector<std::string> log;
  RecordingGroup::issued_.clear();
  RecordingGroup shard("shard", false, &log), replicate("replicate", false, &log);
  auto device = *Device::Open("cpu");
  MemoryLedger ledger;
  CommWaiter waiter(absl::Seconds(1));
  auto layout = MakeShardLayout("unit", {{"w", {4}, true}}, 2);
  ASSERT_TRUE(layout.ok());
  auto unit_owner = *FlatParam::Create(*layout, 0, FlatParamOptions{}, *device, &ledger, FlatParam::ValuesOf(at::zeros({4})));
  auto other_owner = *FlatParam::Create(*layout, 0, FlatParamOptions{}, *device, &ledger, FlatParam::ValuesOf(at::zeros({4})));
  FlatParam& unit = *unit_owner;
  FlatParam& other = *other_owner;
  unit.EnsureGrad();
  GradReduction reduction(&shard, &replicate, &waiter, &ledger);
  EXPECT_TRUE(reduction.Reduced(&unit)) << "nothing started";
  ASSERT_TRUE(reduction.Start(&unit, /*accumulate=*/false, /*last=*/true).ok());
  EXPECT_FALSE(reduction.Reduced(&unit)) << "reduce-scatter in flight";
  EXPECT_TRUE(reduction.Reduced(&other)) << "another unit's reduction is not this one's";
  ASSERT_TRUE(reduction.Pump(/*wait_all=*/false, /*max_in_flight=*/0).ok());  // the reduce-scatter waited for
  EXPECT_FALSE(reduction.Reduced(&unit)) << "all-reduce across replicas in flight";
  ASSERT_TRUE(reduction.Pump(/*wait_all=*/true).ok());
  EXPECT_TRUE(reduction.Reduced(&unit));
  EXPECT_EQ(log, (std::vector<std::string>{"shard RS", "replicate AR after #0"}));
}

TEST(GradReduction, AOneRankGroupCastsAsItCopiesWithNoCastBuffer) {
  // bf16 gradients reduced in fp32 by a group of one: the reduce-scatter's
  // copy casts, so no fp32 copy of the whole gradient is made first (a pass
  // and a unit-sized buffer), and the shard holds the gradient, widened.
  auto device = *Device::Open("cpu");
  MemoryLedger ledger;
  CommWaiter waiter(absl::Seconds(1));
  auto layout = MakeShardLayout("unit", {{"w", {6}, true}}, 1);
  ASSERT_TRUE(layout.ok());
  FlatParamOptions o;
  o.param_dtype = at::kBFloat16;
  o.reduce_dtype = at::kFloat;
  o.persistent_grads = false;
  auto unit_owner = *FlatParam::Create(*layout, 0, o, *device, &ledger, FlatParam::ValuesOf(at::zeros({6})));
  FlatParam& unit = *unit_owner;
  unit.EnsureGrad();
  unit.grad_full().copy_(at::arange(6, at::kFloat).mul_(0.5));
  const int64_t before = ledger.current(MemKind::kGrads);
  auto self = comm::CreateSelfCommunicator();
  auto replicate = comm::CreateSelfCommunicator();
  GradReduction reduction(self.get(), replicate.get(), &waiter, &ledger);
  ASSERT_TRUE(reduction.Start(&unit, /*accumulate=*/false, /*last=*/true).ok());
  EXPECT_EQ(ledger.peak(MemKind::kGrads), before) << "no reduce-dtype copy of the gradient";
  ASSERT_TRUE(reduction.Pump(/*wait_all=*/true).ok());
  EXPECT_EQ(unit.grad_shard().scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(unit.grad_shard(), at::arange(6, at::kFloat).mul_(0.5)));
}

TEST(Device, CpuIsTheHostAndBadSpecsAreNamed) {
  auto cpu = Device::Open("cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_FALSE((*cpu)->is_cuda());
  EXPECT_EQ((*cpu)->name(), "cpu");
  at::Tensor t = (*cpu)->Zeros(5, at::kFloat);
  EXPECT_TRUE(t.is_cpu());
  EXPECT_EQ(t.sum().item<float>(), 0.0f);
  EXPECT_TRUE((*cpu)->Synchronize(absl::Seconds(1)).ok());
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:0x"}) {
    auto d = Device::Open(bad);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(d.status().message().find(bad), std::string::npos) << d.status();
  }
  if (CudaDeviceCount() == 0) {
    auto d = Device::Open("cuda:0");
    EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition) << d.status();
    EXPECT_NE(d.status().message().find("cuda:0"), std::string::npos) << d.status();
  }
  auto far = Device::Open("cuda:1000");
  EXPECT_FALSE(far.ok());
}

TEST(Device, PrepareRefusesWhatTheProgramCannotUse) {
  EXPECT_TRUE(PrepareDevice("cpu").ok());
  const absl::Status bad = PrepareDevice("cuda:\x1b]0;x");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_EQ(bad.message().find('\x1b'), std::string::npos) << "echoed raw: " << bad;
  // An index past what this process sees names the device and the count.
  const absl::Status absent = PrepareDevice("cuda:999");
  EXPECT_EQ(absent.code(), absl::StatusCode::kFailedPrecondition) << absent;
#ifdef SHARDLINE_WITH_CUDA
  const int n = CudaDeviceCount();
  EXPECT_NE(absent.message().find(absl::StrCat("device cuda:999: not visible (this process sees ", n, " CUDA device")),
            std::string::npos)
      << absent;
#endif
}

#ifdef SHARDLINE_WITH_CUDA
TEST(Device, LibTorchCudaLoadsOnDemand) {
  // Not linked: CPU processes never load it (see device.cc).
  auto op = c10::Dispatcher::singleton().findSchema({"aten::_fused_adamw_", ""});
  ASSERT_TRUE(op.has_value());
  EXPECT_FALSE(op->hasKernelForDispatchKey(c10::DispatchKey::CUDA));
  ASSERT_TRUE(LoadLibTorchCuda().ok()) << LoadLibTorchCuda();
  EXPECT_TRUE(op->hasKernelForDispatchKey(c10::DispatchKey::CUDA));
  EXPECT_TRUE(LoadLibTorchCuda().ok());  // once
}
#endif

TEST(Groups, BackendFollowsTheDevice) {
  auto cpu = *Device::Open("cpu");
  EXPECT_EQ(*ResolveBackend(Backend::kAuto, *cpu), Backend::kGloo);
  EXPECT_EQ(*ResolveBackend(Backend::kGloo, *cpu), Backend::kGloo);
  auto nccl = ResolveBackend(Backend::kNccl, *cpu);
  EXPECT_EQ(nccl.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(nccl.status().message().find("cpu"), std::string::npos);
  EXPECT_FALSE(ParseBackend("mpi").ok());
  EXPECT_EQ(*ParseBackend("nccl"), Backend::kNccl);
  JobConfig c;
  c.parallelism.strategy = Strategy::kHybridShard;
  c.parallelism.shard_group_size = 2;
  const GroupPlan p = PlanGroups(c, 3, 4);
  EXPECT_EQ(p.shard_size, 2);
  EXPECT_EQ(p.replicate_size, 2);
  EXPECT_EQ(p.shard_rank, 1);
  EXPECT_EQ(p.shard_index, 1);
}

}  // namespace
}  // namespace shardline
