// shardline-train: runs one rank of a job from its TOML file, bootstrapping
// Gloo through a TCP store that rank 0 hosts. This is how tests and
// benchmarks run the engine as separate processes besides the coordinator;
// it and the worker daemon run jobs through the same JobRunner.
//
//   shardline-train --config job.toml --rank R --world N --store-port P [--out DIR]
//                   [--device cpu|cuda:N] [--backend auto|gloo|nccl]
//
// Prints one JSON object per step on stdout. With --out, rank r writes
// DIR/rank-<r>.json (per-step results, memory by kind, bytes and seconds per
// collective) and rank 0 writes DIR/params.safetensors (the final fp32
// parameters, nanoGPT names). --dump-grads FILE (world 1) instead computes
// the gradients of step 0 and writes weights, batch, loss, gradients and the
// engine's logits of the batch (Engine::Logits: its own forward schedule).
// --trace (with --out) also writes DIR/trace-rank-<r>.json, the rank's
// timeline in Chrome's trace event format (worker/comm/timeline.h), also
// when the run fails. --profile FILE writes LibTorch's Kineto profile of
// steps --profile-steps FIRST:LAST (default 2:5) to FILE, a Chrome trace with
// the device's kernels on CUDA (worker/device/kernel_profile.h).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <sstream>
#include <iostream>
#include <optional>

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/build_info.h"
#include "common/base/file_util.h"
#include "common/base/json_object.h"
#include "common/base/process_memory.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/checkpoint_manifest.h"
#include "common/job/device_spec.h"
#include "common/model/model_shapes.h"
#include "common/model/weight_source.h"
#include "common/spec/job_spec.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/checkpoint/tensor_file.h"
#include "worker/comm/groups.h"
#include "worker/comm/timeline.h"
#include "worker/device/kernel_profile.h"
#include "worker/engine/engine.h"
#include "worker/run/collective_address.h"
#include "worker/run/job_runner.h"

namespace shardline {
namespace {

struct Flags {
  std::string config, out, dump_grads, store_host = "127.0.0.1", ckpt_dir, resume, device = "cpu", backend = "auto";
  std::string listen_address, interface;  // worker/run/collective_address.h
  std::string profile, profile_steps = "2:5";  // worker/device/kernel_profile.h
  int rank = 0, world = 1, store_port = 0, threads = 1, steps = 0, save_at = 0, stop_after = 0;
  double timeout_s = 60;
  bool trace = false;
};

using Json = nlohmann::ordered_json;


Json StatsObject(const comm::CommStats& s) {
  Json out = Json::object();
  for (int i = 0; i < comm::kNumOps; ++i) {
    const comm::OpStats& o = s.ops[i];
    out[comm::OpName(static_cast<comm::Op>(i))] = {{"calls", o.calls}, {"bytes", o.bytes_sent}, {"seconds", o.seconds}};
  }
  return out;
}

// The full trainable parameters by name (nanoGPT's, transformers', or the
// adapters' under LoRA), gathered one unit at a time.
absl::StatusOr<NamedTensors> GatherParams(Engine& e) {
  NamedTensors out;
  for (int u = 0; u < static_cast<int>(e.trainable_layouts().size()); ++u) {
    SL_ASSIGN_OR_RETURN(at::Tensor flat, e.GatherUnitMaster(u));
    for (const ParamSlot& p : e.trainable_layouts()[u].params) {
      out.emplace_back(p.spec.name, flat.narrow(0, p.offset, p.spec.numel()).view(p.spec.shape).clone());
    }
  }
  return out;
}

absl::Status DumpGradients(Engine& e, const JobConfig& c, const std::string& path) {
  if (c.lora.enabled) return absl::InvalidArgumentError("--dump-grads: not for [lora] jobs (it dumps the whole model)");
  SL_ASSIGN_OR_RETURN(const double loss, e.ComputeGradients(0));
  NamedTensors t;
  SL_ASSIGN_OR_RETURN(NamedTensors params, GatherParams(e));
  for (auto& p : params) t.push_back(p);
  for (int u = 0; u < static_cast<int>(e.trainable_layouts().size()); ++u) {
    const at::Tensor g = e.GradShard(u).to(at::kFloat);
    for (const ParamSlot& p : e.trainable_layouts()[u].params) {
      t.emplace_back("grad." + p.spec.name, g.narrow(0, p.offset, p.spec.numel()).view(p.spec.shape).clone());
    }
  }
  // The batch of step 0 and its logits.
  auto data = TokenDataset::Open(c.data.format, c.data.train, c.model.vocab_size, c.model.block_size, c.train.seed);
  if (!data.ok()) return data.status();
  at::Tensor x, y, positions;
  (*data)->Batch(0, c.train.batch_size, 0, c.train.batch_size, &x, &y, &positions);
  // The engine's logits of the whole batch, through its own unit schedule.
  SL_ASSIGN_OR_RETURN(const at::Tensor logits, e.Logits(x, positions));
  t.emplace_back("logits", logits.to(at::kFloat));
  t.emplace_back("batch.inputs", x);
  t.emplace_back("batch.targets", y);
  if (positions.defined()) t.emplace_back("batch.positions", positions);  // packed documents
  for (int s = 1; s < c.train.steps; ++s) {  // later steps' batches, for a reference run
    at::Tensor xs, ys;
    (*data)->Batch(s, c.train.batch_size, 0, c.train.batch_size, &xs, &ys);
    t.emplace_back(absl::StrCat("batch.", s, ".inputs"), xs);
    t.emplace_back(absl::StrCat("batch.", s, ".targets"), ys);
  }
  t.emplace_back("loss", at::full({1}, loss, at::kDouble));
  return WriteSafetensors(path, t);
}

// Without a coordinator rank 0 commits: every rank writes its file and
// reports it through the store; rank 0 writes the manifest last.
class StoreSink : public CheckpointSink {
 public:
  StoreSink(const JobConfig& c, const Flags& f, c10d::Store* store) : c_(c), f_(f), store_(store) {}
  absl::StatusOr<int64_t> Save(const ShardSnapshot& snap, int64_t step) override {
    const std::string dir = absl::StrCat(f_.ckpt_dir, "/", c_.name, "/", StepDirName(step));
    SL_ASSIGN_OR_RETURN(ManifestRankFile mine, WriteRankShards(snap, dir, step));
    SL_ASSIGN_OR_RETURN(CheckpointManifest m, NewManifest(c_.name, c_, f_.world, step));
    const auto key = [&](int r) { return absl::StrCat("ckpt/", step, "/", r); };
    auto encode = [](const ManifestRankFile& x) { return absl::StrCat(x.size, " ", x.sha256, " ", x.file); };
    try {
      if (store_) {
        const std::string v = encode(mine);
        store_->set(key(f_.rank), std::vector<uint8_t>(v.begin(), v.end()));
      }
      if (f_.rank != 0) return mine.size;
      for (int r = 0; r < f_.world; ++r) {
        ManifestRankFile x = mine;
        if (r != 0) {
          const std::vector<uint8_t> raw = store_->get(key(r));  // waits, with the store's timeout
          std::istringstream in(std::string(raw.begin(), raw.end()));
          in >> x.size >> x.sha256 >> x.file;
          x.rank = r;
        }
        m.ranks.push_back(x);
      }
    } catch (const std::exception& ex) {
      return absl::DeadlineExceededError(absl::StrCat("[rank ", f_.rank, "] checkpoint ", dir,
                                                      ": a rank did not report its file: ", ex.what()));
    }
    // The coordinator's commit path: only into this job's own step directory.
    SL_RETURN_IF_ERROR(WriteManifestConfined(absl::StrCat(f_.ckpt_dir, "/", c_.name), m));
    return mine.size;
  }

 private:
  const JobConfig& c_;
  const Flags& f_;
  c10d::Store* const store_;
};


Json StepObject(const StepResult& r) {
  return {{"step", r.step},
          {"loss", FiniteOrNull(r.loss)},
          {"grad_norm", FiniteOrNull(r.grad_norm)},
          {"lr", FiniteOrNull(r.lr)},
          {"epoch", FiniteOrNull(r.epoch)},
          {"seconds", r.seconds},
          {"exposed_comm_seconds", r.exposed_comm_seconds},
          {"exposed_all_gather_seconds", r.exposed_all_gather_seconds},
          {"exposed_reduce_scatter_seconds", r.exposed_reduce_scatter_seconds},
          {"optimizer_seconds", r.optimizer_seconds},
          {"cpu_seconds", r.cpu_seconds},
          {"step_thread_cpu_seconds", r.step_thread_cpu_seconds},
          {"tokens_per_s", FiniteOrNull(r.tokens / r.seconds)},
          {"val_loss", FiniteOrNull(r.val_loss)},
          {"skipped", r.skipped}};
}

// DIR/rank-<r>.json: per-step results, memory by kind, units and bytes and
// seconds per collective.
absl::Status WriteRankReport(const Engine& engine, const Flags& f, const Json& steps) {
  const MemoryReport m = engine.Memory();
  Json mem = Json::object();
  for (int k = 0; k < kNumMemKinds; ++k) mem[MemKindName(static_cast<MemKind>(k))] = m.bytes[k];
  for (int k = 0; k < kNumMemKinds; ++k) {
    mem[absl::StrCat("peak_", MemKindName(static_cast<MemKind>(k)))] = m.peak_by_kind[k];
  }
  mem["state"] = m.state_bytes;
  mem["peak"] = m.peak_bytes;
  mem["activation_peak"] = m.activation_peak_bytes;
  mem["init_peak"] = m.init_peak_bytes;
  mem["tensor_peak"] = m.tensor_peak_bytes;
  mem["reserved_peak"] = m.reserved_peak_bytes;
  mem["peak_rss"] = ProcessPeakRssBytes();  // VmHWM: ru_maxrss would carry a parent's peak
  Json units = Json::array();
  for (const ShardLayout& l : engine.trainable_layouts()) {
    units.push_back({{"unit", l.unit}, {"numel", l.numel}, {"padded", l.padded_numel}, {"shard", l.shard_numel}});
  }
  const Json report = {{"rank", f.rank},
                       {"world", f.world},
                       {"device", engine.device().name()},
                       {"shard_group_size", engine.shard_group_size()},
                       {"steps", steps},
                       {"memory", mem},
                       {"units", units},
                       {"comm", {{"shard", StatsObject(engine.ShardCommStats())},
                                 {"replicate", StatsObject(engine.ReplicateCommStats())}}}};
  return WriteFileAtomically(absl::StrCat(f.out, "/rank-", f.rank, ".json"), report.dump() + "\n");
}

// --out is written after the last step: a folder that cannot take files
// is refused before the first, naming it (issue 27), not after hours.
absl::Status CheckOutputFolder(const std::string& out) {
  absl::Status made = MakeDirs(out);
  if (!made.ok()) return absl::Status(made.code(), absl::StrCat("--out: ", made.message()));
  const std::string probe = absl::StrCat(out, "/.shardline-write-test-", ::getpid());
  absl::Status wrote = WriteFileAtomically(probe, "");
  if (!wrote.ok()) return absl::Status(wrote.code(), absl::StrCat("--out ", out, ": not writable: ", wrote.message()));
  ::unlink(probe.c_str());
  return absl::OkStatus();
}

// `timeline`: where --trace records (null: not tracing).
absl::Status RunRank(const Flags& f, Timeline* timeline) {
  // A bad window is refused before the store, the rendezvous and the model.
  std::optional<KernelProfile> profile;
  if (!f.profile.empty()) {
    SL_ASSIGN_OR_RETURN(const DeviceSpec spec, ParseDeviceSpec(f.device));
    SL_ASSIGN_OR_RETURN(profile, KernelProfile::Parse(f.profile, f.profile_steps, spec.kind == DeviceKind::kCuda));
  }
  SL_ASSIGN_OR_RETURN(std::string text, ReadFileToString(f.config, "job file"));
  // Paths in the job file are taken as given (relative to the working directory).
  SL_ASSIGN_OR_RETURN(JobConfig config, ResolveJobSpec(text, f.config, ""));
  if (f.steps > 0) config.train.steps = f.steps;
  SL_RETURN_IF_ERROR(ValidateJobConfig(config, f.world, f.config));
  if (config.lora.enabled) {  // recorded in its checkpoints: what the adapters are trained on
    SL_ASSIGN_OR_RETURN(config.lora.base_digest, BaseWeightsDigest(config.model));
  }
  at::set_num_threads(f.threads);
  const absl::Duration timeout = absl::Seconds(f.timeout_s);
  c10::intrusive_ptr<c10d::Store> store;
  if (f.world > 1) {
    try {
      c10d::TCPStoreOptions o;
      o.port = static_cast<uint16_t>(f.store_port);
      o.isServer = f.rank == 0;
      o.numWorkers = f.world;
      o.waitWorkers = false;
      o.timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
      store = c10::make_intrusive<c10d::TCPStore>(f.store_host, o);
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("[rank ", f.rank, "] store ", f.store_host, ":", f.store_port,
                                                 ": ", std::string(e.what()).substr(0, 200)));
    }
  }
  SL_ASSIGN_OR_RETURN(std::shared_ptr<const Device> device, Device::Open(f.device));
  SL_ASSIGN_OR_RETURN(const Backend backend, ParseBackend(f.backend));
  // --save-at saves where the job file would not; without it, only [checkpoint] interval steps save.
  if (f.ckpt_dir.empty()) {
    config.checkpoint.interval = 0, config.checkpoint.interval_seconds = 0, config.checkpoint.at_end = false;
  }
  StoreSink sink(config, f, store.get());
  Json steps = Json::array();
  JobHooks hooks;
  if (timeline) {
    hooks.opened = [&](Communicators& comms) {
      comms.shard->set_observer(timeline->Observer(Timeline::Lane::kShard));
      comms.replicate->set_observer(timeline->Observer(Timeline::Lane::kReplicate));
    };
  }
  hooks.stepped = [&](const StepResult& r, const Engine&) {
    steps.push_back(StepObject(r));
    // When the step ended, in Unix seconds: benchmarks take a run's start-up
    // (launch to first step) from it.
    steps.back()["ended_unix"] = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
    if (f.rank == 0) std::cout << steps.back().dump() << std::endl;
    return profile ? profile->AfterStep(r.step) : absl::OkStatus();
  };
  SL_ASSIGN_OR_RETURN(const CollectiveAddress address,
                      ChooseCollectiveAddress(f.listen_address, f.interface,
                                              absl::StrCat(f.store_host, ":", std::max(f.store_port, 1))));
  JobRun run{config, f.rank, f.world, f.resume, timeout};
  run.collective_address = address.address;
  run.stop_after = f.stop_after;
  run.save_at = f.save_at;
  JobRunner runner(std::move(run), &sink, std::move(hooks));
  SL_RETURN_IF_ERROR(runner.Start(store, device, backend));
  if (!f.dump_grads.empty()) return DumpGradients(runner.engine(), config, f.dump_grads);
  if (timeline) runner.engine().set_timeline(timeline);
  SL_RETURN_IF_ERROR(runner.Run());
  if (profile) SL_RETURN_IF_ERROR(profile->Finish());
  if (f.out.empty()) return absl::OkStatus();
  SL_ASSIGN_OR_RETURN(NamedTensors params, GatherParams(runner.engine()));
  if (f.rank == 0) SL_RETURN_IF_ERROR(WriteSafetensors(f.out + "/params.safetensors", params));
  return WriteRankReport(runner.engine(), f, steps);
}

absl::Status Run(const Flags& f) {
  if (!f.out.empty()) SL_RETURN_IF_ERROR(CheckOutputFolder(f.out));
  if (!f.trace) return RunRank(f, nullptr);
  // Written whatever the run's outcome: a failed run's timeline shows where.
  Timeline timeline(f.rank);
  const absl::Status ran = RunRank(f, &timeline);
  const std::string path = absl::StrCat(f.out, "/trace-rank-", f.rank, ".json");
  if (absl::Status w = timeline.Write(path); !w.ok()) {
    std::cerr << "shardline-train: --trace " << path << ": " << w.message() << std::endl;
  }
  return ran;
}

}  // namespace
}  // namespace shardline

int main(int argc, char** argv) {
  CLI::App app{"shardline-train: run one rank of a job"};
  app.set_version_flag("--version",
                       std::string("shardline-train ") + shardline::kVersion + " (" + shardline::kRevision + ")");
  shardline::Flags f;
  app.add_option("--config", f.config, "job file (TOML)")->required();
  app.add_option("--rank", f.rank, "this process's rank");
  app.add_option("--world", f.world, "number of ranks");
  app.add_option("--store-host", f.store_host, "host of the TCP store (rank 0 serves it)");
  app.add_option("--store-port", f.store_port, "port of the TCP store");
  auto* listen_flag = app.add_option("--listen-address", f.listen_address,
                                     "IP address to bind collectives to (default: the route to the store's host)");
  app.add_option("--interface", f.interface, "bind collectives to this interface's address")->excludes(listen_flag);
  app.add_option("--threads", f.threads, "intra-op threads");
  app.add_option("--device", f.device, "cpu, cuda or cuda:N");
  app.add_option("--backend", f.backend, "auto (NCCL on CUDA, Gloo on CPU), gloo (CUDA staged through host) or nccl");
  app.add_option("--steps", f.steps, "override [train] steps");
  app.add_option("--timeout", f.timeout_s, "deadline of rendezvous and of every collective, seconds");
  app.add_option("--out", f.out, "directory for rank-N.json and params.safetensors");
  app.add_flag("--trace", f.trace, "also write DIR/trace-rank-N.json: the steps' timeline (needs --out)")
      ->needs("--out");
  app.add_option("--profile", f.profile, "write LibTorch's profile (Chrome trace; CUDA kernels on a GPU) here");
  app.add_option("--profile-steps", f.profile_steps, "the steps profiled, FIRST:LAST (FIRST..LAST-1), FIRST >= 1")
      ->needs("--profile");
  app.add_option("--dump-grads", f.dump_grads, "write step-0 weights and gradients here and exit");
  app.add_option("--ckpt-dir", f.ckpt_dir, "checkpoint root: saves go to DIR/<job>/step-<8 digits>/");
  app.add_option("--save-at", f.save_at, "save a checkpoint after this many steps");
  app.add_option("--stop-after", f.stop_after, "stop after this many steps (the schedule keeps [train] steps)");
  app.add_option("--resume", f.resume, "a committed step directory to resume from");
  CLI11_PARSE(app, argc, argv);
  // First, before any other ATen call (device.h says why).
  if (absl::Status d = shardline::PrepareDevice(f.device); !d.ok()) {
    std::cerr << "shardline-train: --device: " << d.message() << std::endl;
    return 2;
  }
  const absl::Status s = shardline::Run(f);
  if (!s.ok()) {
    std::cerr << "shardline-train: " << s.message() << std::endl;
    return 1;
  }
  return 0;
}
