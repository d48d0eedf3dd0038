#include "worker/worker_daemon.h"

#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cerrno>
#include <cstring>

#include <ATen/Parallel.h>
#ifdef SHARDLINE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/file_util.h"
#include "common/base/json_object.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/checkpoint_manifest.h"
#include "common/job/device_spec.h"
#include "common/job/job_wire.h"
#include "common/rpc/grpc_status.h"
#include "common/spec/job_spec.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/engine/engine.h"
#include "worker/remote_store.h"
#include "worker/run/job_runner.h"
#include "worker/worker_metrics.h"

namespace shardline {
namespace {

std::string Hostname() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// What the worker's device can hold, as WorkerInfo.memory_bytes (the
// planner's budget for strategy = "auto"): a GPU's own memory, read without
// allocating on it; the host's RAM for a CPU rank, or where the GPU cannot be
// read (the job then fails on its own, naming the device).
int64_t DeviceMemoryBytes(const std::string& device) {
#ifdef SHARDLINE_WITH_CUDA
  if (absl::StatusOr<DeviceSpec> d = ParseDeviceSpec(device); d.ok() && d->kind == DeviceKind::kCuda) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, d->index) == cudaSuccess) return static_cast<int64_t>(prop.totalGlobalMem);
  }
#endif
  const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  return static_cast<int64_t>(pages) * size;
}

// Rank 0's per-step record beside the job's checkpoints,
// <checkpoint root>/history.jsonl, one JSON object a line, appended as
// trainers' CSV monitors do (an attempt after a restart appends the steps it
// computes again). A monitor: a file that cannot be written is said once on
// stderr and the job goes on.
class HistoryFile {
 public:
  explicit HistoryFile(std::string path) : path_(std::move(path)) {}
  void Append(const StepResult& r, int world) {
    if (failed_) return;
    if (out_.get() < 0) {
      absl::Status made = MakeDirs(path_.substr(0, path_.rfind('/')));
      if (!made.ok()) return Fail(std::string(made.message()));
      // O_NOFOLLOW: a symlink planted under this name is never written through.
      out_ = UniqueFd(::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0640));
      if (out_.get() < 0) return Fail(absl::StrCat("cannot open it: ", std::strerror(errno)));
    }
    const std::string line = nlohmann::ordered_json{{"step", r.step + 1},
                                                    {"loss", FiniteOrNull(r.loss)},
                                                    {"lr", FiniteOrNull(r.lr)},
                                                    {"grad_norm", FiniteOrNull(r.grad_norm)},
                                                    {"tokens_per_second", FiniteOrNull(r.tokens / r.seconds)},
                                                    {"val_loss", FiniteOrNull(r.val_loss)},
                                                    {"world_size", world},
                                                    {"unix_ms", absl::ToUnixMillis(absl::Now())}}
                                 .dump() +
                             "\n";
    // One write(2) of a whole line to an O_APPEND file: a reader never sees half of one.
    absl::Status wrote = WriteFully(out_.get(), line.data(), line.size(), path_);
    if (!wrote.ok()) Fail(std::string(wrote.message()));
  }

 private:
  void Fail(const std::string& why) {
    failed_ = true;
    std::cerr << "shardline-worker: " << path_ << ": " << why << "; the job goes on without it" << std::endl;
  }
  const std::string path_;
  UniqueFd out_;
  bool failed_ = false;
};

}  // namespace

WorkerDaemon::WorkerDaemon(WorkerOptions options) : options_(std::move(options)) {
  // Keepalive pings: a session whose link to the coordinator is cut (a
  // partition, not a closed connection) ends within ~10 s instead of at
  // TCP's retransmission timeout, and the worker reconnects once it heals.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  channel_ = grpc::CreateCustomChannel(
      options_.coordinator, options_.credentials ? options_.credentials : grpc::InsecureChannelCredentials(), args);
  stub_ = v1::Coordinator::NewStub(channel_);
}

WorkerDaemon::~WorkerDaemon() {
  Stop();
  std::thread job;
  {
    absl::MutexLock lock(&job_mu_);  // the job thread takes job_mu_ as it ends
    job = std::move(job_thread_);
  }
  if (job.joinable()) job.join();
}

bool WorkerDaemon::WaitForJob(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    {
      absl::MutexLock lock(&job_mu_);
      if (job_id_.empty()) break;
    }
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::thread job;
  {
    absl::MutexLock lock(&job_mu_);
    job = std::move(job_thread_);
  }
  if (job.joinable()) job.join();
  return true;
}

void WorkerDaemon::AddAuth(grpc::ClientContext* ctx) const {
  if (!options_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.token);
}

void WorkerDaemon::Stop() {
  stopping_ = true;
  {
    absl::MutexLock lock(&job_mu_);
    cancel_ = true;
    if (runner_) runner_->Cancel();
  }
  absl::MutexLock lock(&write_mu_);
  if (session_ctx_) session_ctx_->TryCancel();
}

absl::Status WorkerDaemon::Run() {
  absl::Duration backoff = absl::Milliseconds(200);
  while (!stopping_) {
    const absl::Time started = absl::Now();
    absl::Status s = RunSession();
    if (stopping_) break;
    // A session that lasted a while resets the backoff.
    if (absl::Now() - started > absl::Seconds(10)) backoff = absl::Milliseconds(200);
    std::cerr << "shardline-worker: session ended (" << s.message() << "); reconnecting in "
              << absl::FormatDuration(backoff) << std::endl;
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
  return absl::OkStatus();
}

absl::Status WorkerDaemon::RunSession() {
  grpc::ClientContext ctx;
  AddAuth(&ctx);
  auto stream = stub_->WorkerSession(&ctx);
  {
    absl::MutexLock lock(&write_mu_);
    stream_ = stream.get();
    session_ctx_ = &ctx;
  }
  v1::WorkerMessage reg;
  v1::WorkerInfo* info = reg.mutable_register_();
  info->set_host(options_.host.empty() ? Hostname() : options_.host);
  info->set_device(options_.device);
  info->set_collective_address(options_.collective_address);
  info->set_memory_bytes(DeviceMemoryBytes(options_.device));
  info->set_pid(getpid());
  info->set_metrics_port(options_.metrics->port());
  info->add_capabilities("gloo");
  if (options_.device != "cpu") info->add_capabilities("nccl");
  {
    absl::MutexLock lock(&job_mu_);
    info->set_job_id(job_id_);
    if (!job_id_.empty()) {
      info->set_rank(job_rank_);
      info->set_claim_credential(job_credential_);
    }
  }
  std::thread heartbeats;
  if (Write(reg)) {
    heartbeats = std::thread([this] { HeartbeatLoop(); });
    v1::CoordinatorMessage m;
    while (stream->Read(&m)) HandleCommand(m);
  }
  {
    absl::MutexLock lock(&write_mu_);
    stream_ = nullptr;
    session_ctx_ = nullptr;
  }
  if (heartbeats.joinable()) heartbeats.join();
  return FromGrpcStatus(stream->Finish());
}

void WorkerDaemon::Log(const v1::Assignment& a, const std::string& text) {
  std::cerr << "shardline-worker: " << a.job_id() << " rank " << a.rank() << ": " << text << std::endl;
  v1::WorkerMessage m;
  v1::LogLine* l = m.mutable_log();
  l->set_job_id(a.job_id());
  l->set_rank(a.rank());
  l->set_unix_ms(absl::ToUnixMillis(absl::Now()));
  l->set_text(text);
  Write(m);
}

bool WorkerDaemon::Write(const v1::WorkerMessage& m) {
  absl::MutexLock lock(&write_mu_);
  return stream_ && stream_->Write(m);
}

void WorkerDaemon::HeartbeatLoop() {
  for (;;) {
    absl::Duration every;
    {
      absl::MutexLock lock(&write_mu_);
      if (!stream_ || stopping_) return;
      every = heartbeat_;
    }
    v1::WorkerMessage m;
    m.mutable_heartbeat()->set_step(step_);
    m.mutable_heartbeat()->set_last_collective_seq(options_.metrics->last_collective_seq());
    if (!Write(m)) return;
    // Sleep in small slices so a closed session ends this loop promptly.
    const absl::Time until = absl::Now() + every;
    while (absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(50));
      absl::MutexLock lock(&write_mu_);
      if (!stream_) return;
    }
  }
}

void WorkerDaemon::HandleCommand(const v1::CoordinatorMessage& m) {
  if (m.has_registered()) {
    absl::MutexLock lock(&write_mu_);
    heartbeat_ = absl::Milliseconds(std::max(50, m.registered().heartbeat_interval_ms()));
    std::cerr << "shardline-worker: registered as " << m.registered().worker_id() << std::endl;
  } else if (m.has_cancel()) {
    absl::MutexLock lock(&job_mu_);
    if (m.cancel().job_id() == job_id_) {
      std::cerr << "shardline-worker: stopping " << job_id_ << ": " << m.cancel().reason() << std::endl;
      cancel_ = true;
      if (runner_) runner_->Cancel();
    }
  } else if (m.has_checkpoint()) {
    absl::MutexLock lock(&job_mu_);
    if (m.checkpoint().job_id() == job_id_) {
      if (runner_) runner_->RequestSave();
      else save_requested_ = true;
    }
  } else if (m.has_start()) {
    absl::MutexLock lock(&job_mu_);
    if (!job_id_.empty()) {
      v1::WorkerMessage f;
      f.mutable_finished()->set_job_id(m.start().job_id());
      f.mutable_finished()->set_rank(m.start().rank());
      f.mutable_finished()->set_message(absl::StrCat("worker is still running ", job_id_));
      Write(f);
      return;
    }
    if (job_thread_.joinable()) job_thread_.join();
    job_id_ = m.start().job_id();
    job_rank_ = m.start().rank();
    job_credential_ = m.start().credential();
    cancel_ = false;
    save_requested_ = false;
    step_ = 0;
    job_thread_ = std::thread([this, a = m.start()] { RunJob(a); });
  }
}

void WorkerDaemon::RunJob(v1::Assignment a) {
  absl::Status s;
  try {
    s = TrainJob(a);
  } catch (const std::exception& e) {  // LibTorch reports errors as exceptions
    std::string what = e.what();
    s = absl::InternalError(what.substr(0, what.find('\n')));
  }
  v1::WorkerMessage m;
  v1::RankFinished* f = m.mutable_finished();
  f->set_job_id(a.job_id());
  f->set_rank(a.rank());
  f->set_ok(s.ok());
  f->set_cancelled(absl::IsCancelled(s));
  f->set_code(static_cast<int>(s.code()));
  f->set_message(std::string(s.message()));
  if (std::optional<comm::LinkFault> link = comm::LinkFaultOf(s)) {
    f->mutable_link()->set_from_rank(link->from);
    f->mutable_link()->set_to_rank(link->to);
    f->mutable_link()->set_seq(link->seq);
    f->mutable_link()->set_step(link->step);
  }
  Log(a, s.ok() ? absl::StrCat("finished at step ", step_.load())
               : absl::StrCat(absl::IsCancelled(s) ? "stopped: " : "failed: ", s.message()));
  {
    absl::MutexLock lock(&job_mu_);
    job_id_.clear();
    job_credential_.clear();
  }
  Write(m);
}

namespace {

// The daemon's commit path: this rank's file goes under the job's
// checkpoint root and is reported, with the attempt's credential, to the
// coordinator, which writes the manifest once every rank reported.
class CoordinatorSink : public CheckpointSink {
 public:
  CoordinatorSink(v1::Coordinator::Stub* stub, std::string token, const v1::Assignment& a)
      : stub_(stub), token_(std::move(token)), a_(a) {}
  absl::StatusOr<int64_t> Save(const ShardSnapshot& snap, int64_t step) override {
    const std::string dir = a_.checkpoint_root() + "/" + StepDirName(step);
    SL_ASSIGN_OR_RETURN(ManifestRankFile f, WriteRankShards(snap, dir, step, a_.attempt()));
    v1::CheckpointReport rep;
    rep.set_job_id(a_.job_id());
    rep.set_rank(a_.rank());
    rep.set_step(step);
    rep.set_path(dir + "/" + f.file);
    rep.set_size_bytes(f.size);
    rep.set_checksum(f.sha256);
    grpc::ClientContext ctx;
    if (!token_.empty()) ctx.AddMetadata("authorization", "Bearer " + token_);
    ctx.AddMetadata("x-shardline-credential", a_.credential());
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::CheckpointReportResponse resp;
    SL_RETURN_IF_ERROR(FromGrpcStatus(stub_->ReportCheckpoint(&ctx, rep, &resp)));
    return f.size;
  }

 private:
  v1::Coordinator::Stub* const stub_;
  const std::string token_;
  const v1::Assignment a_;
};

}  // namespace

absl::Status WorkerDaemon::TrainJob(const v1::Assignment& a) {
  // The coordinator resolved the spec: decode and validate, read nothing else.
  SL_ASSIGN_OR_RETURN(JobConfig config, DecodeJobConfig(a.spec(), a.job_id()));
  SL_RETURN_IF_ERROR(ValidateJobConfig(config, a.world_size(), a.job_id()));
  at::set_num_threads(options_.threads);
  const auto timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.collective_timeout));
  c10::intrusive_ptr<c10d::Store> store =
      c10::make_intrusive<RemoteStore>(channel_, options_.token, a.credential(), a.job_id() + "/", timeout);
  WorkerMetrics& metrics = *options_.metrics;
  metrics.BeginJob(a.job_id(), a.rank(), a.world_size(), config.model, config.lora,
                   options_.peak_flops > 0 ? options_.peak_flops : DefaultPeakFlops(options_.device, options_.threads));
  // Per job, so that a GPU that is gone or busy fails this job, naming the
  // rank and the device, and the worker takes the next one.
  absl::StatusOr<std::shared_ptr<const Device>> device = Device::Open(options_.device);
  if (!device.ok()) return absl::Status(device.status().code(), absl::StrCat("[rank ", a.rank(), "] ", device.status().message()));

  if (a.resume_from_is_real_path()) {
    // The step directory the submit named, resolved and checked then: a link
    // swapped into its path since would lead this rank to other files.
    if (absl::Status real = CheckIsRealPath(a.resume_from(), "resume_from"); !real.ok()) {
      return absl::Status(real.code(), absl::StrCat("[rank ", a.rank(), "] ", real.message()));
    }
  }
  JobRun run{config, a.rank(), a.world_size(), a.resume_from(), options_.collective_timeout};
  run.collective_address = options_.collective_address;
  JobHooks hooks;
  hooks.connected = [&](Communicators& comms, const AutoFigures& figures, const std::vector<double>& send_seconds) {
    comms.shard->set_observer(metrics.ObserverFor(/*shard_group=*/true));
    comms.replicate->set_observer(metrics.ObserverFor(/*shard_group=*/false));
    v1::WorkerMessage connected;
    connected.mutable_connected()->set_job_id(a.job_id());
    connected.mutable_connected()->set_rank(a.rank());
    connected.mutable_connected()->set_bus_bandwidth(figures.bus_bandwidth);
    connected.mutable_connected()->set_compute_flops(figures.compute_flops);
    connected.mutable_connected()->set_comm_cpu_s_per_byte(figures.comm_cpu_s_per_byte);
    for (double s : send_seconds) connected.mutable_connected()->add_send_seconds(s);
    Write(connected);
  };
  HistoryFile history(a.checkpoint_root() + "/history.jsonl");
  hooks.stepped = [&](const StepResult& r, const Engine& engine) {
    step_ = r.step + 1;
    if (a.rank() == 0) history.Append(r, a.world_size());
    const int every = config.train.log_interval;
    if (every > 0 && ((r.step + 1) % every == 0 || r.step + 1 == config.train.steps)) {
      Log(a, absl::StrFormat("step %d/%d: loss %.4f, lr %.3g, grad norm %.4f, %.0f tokens/s%s%s", r.step + 1,
                             config.train.steps, r.loss, r.lr, r.grad_norm, r.tokens / r.seconds,
                             std::isnan(r.val_loss) ? "" : absl::StrFormat(", val loss %.4f", r.val_loss),
                             std::isnan(r.epoch) ? "" : absl::StrFormat(", epoch %.2f", r.epoch)));
    }
    metrics.OnStep(r, engine.Memory());
    v1::WorkerMessage m;
    v1::Progress* p = m.mutable_progress();
    p->set_job_id(a.job_id());
    p->set_rank(a.rank());
    p->set_step(r.step + 1);
    p->set_loss(r.loss);
    p->set_tokens_per_second(r.tokens / r.seconds);
    p->set_lr(r.lr);
    p->set_grad_norm(r.grad_norm);
    p->set_step_seconds(r.seconds);
    if (!std::isnan(r.val_loss)) p->set_val_loss(r.val_loss);
    Write(m);
    if (r.skipped) std::cerr << "shardline-worker: step " << r.step + 1 << ": gradient norm not finite; no update" << std::endl;
    return absl::OkStatus();
  };
  hooks.saved = [&](double seconds, int64_t bytes, bool ok) {
    metrics.OnCheckpoint(seconds, bytes, ok);
    if (ok) Log(a, absl::StrFormat("saved its shard (%.1f MB) in %.2f s", bytes / 1e6, seconds));
  };
  Log(a, absl::StrFormat("running as rank %d of %d, %s, %s", a.rank(), a.world_size(),
                         StrategyName(config.parallelism.strategy),
                         a.resume_from().empty() ? "from the start" : absl::StrCat("resuming from ", a.resume_from())));
  CoordinatorSink sink(stub_.get(), options_.token, a);
  JobRunner runner(std::move(run), &sink, std::move(hooks));
  {
    // From now on a cancel or a save request reaches the runner; one that
    // came during setup is passed on.
    absl::MutexLock lock(&job_mu_);
    runner_ = &runner;
    if (cancel_) runner.Cancel();
    if (save_requested_.exchange(false)) runner.RequestSave();
  }
  absl::Status s = runner.Start(store, *device);
  if (s.ok()) s = runner.Run();
  absl::MutexLock lock(&job_mu_);
  runner_ = nullptr;
  return s;
}

}  // namespace shardline
