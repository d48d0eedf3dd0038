#include "worker/worker_daemon.h"

#include <unistd.h>

#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "common/checkpoint_manifest.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/engine/engine.h"
#include "worker/remote_store.h"
#include "worker/worker_metrics.h"

namespace shardline {
namespace {

std::string Hostname() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

int64_t MemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  return static_cast<int64_t>(pages) * size;
}

}  // namespace

WorkerDaemon::WorkerDaemon(WorkerOptions options) : options_(std::move(options)) {
  channel_ = grpc::CreateChannel(options_.coordinator,
                                 options_.credentials ? options_.credentials : grpc::InsecureChannelCredentials());
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
  (void)WaitForSave();
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
  cancel_ = true;
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
  info->set_memory_bytes(MemoryBytes());
  info->set_pid(getpid());
  info->set_metrics_port(options_.metrics->port());
  info->add_capabilities("gloo");
  if (options_.device != "cpu") info->add_capabilities("nccl");
  {
    absl::MutexLock lock(&job_mu_);
    info->set_job_id(job_id_);
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
    }
  } else if (m.has_checkpoint()) {
    absl::MutexLock lock(&job_mu_);
    if (m.checkpoint().job_id() == job_id_) save_requested_ = true;
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
    cancel_ = false;
    save_requested_ = false;
    step_ = 0;
    job_thread_ = std::thread([this, a = m.start()] { RunJob(a); });
  }
}

void WorkerDaemon::RunJob(v1::Assignment a) {
  std::cerr << "shardline-worker: running " << a.job_id() << " as rank " << a.rank() << " of " << a.world_size()
            << std::endl;
  absl::Status s;
  try {
    s = TrainJob(a);
  } catch (const std::exception& e) {  // LibTorch reports errors as exceptions
    std::string what = e.what();
    s = absl::InternalError(what.substr(0, what.find('\n')));
  }
  const absl::Status saved = WaitForSave();  // no save outlives its job
  if (s.ok()) s = saved;
  v1::WorkerMessage m;
  v1::RankFinished* f = m.mutable_finished();
  f->set_job_id(a.job_id());
  f->set_rank(a.rank());
  f->set_ok(s.ok());
  f->set_cancelled(absl::IsCancelled(s));
  f->set_code(static_cast<int>(s.code()));
  f->set_message(std::string(s.message()));
  if (!s.ok()) std::cerr << "shardline-worker: " << a.job_id() << ": " << s.message() << std::endl;
  {
    absl::MutexLock lock(&job_mu_);
    job_id_.clear();
  }
  Write(m);
}

absl::Status WorkerDaemon::TrainJob(const v1::Assignment& a) {
  SL_ASSIGN_OR_RETURN(JobConfig config, ParseJobSpec(a.spec_toml(), a.job_id(), a.base_dir()));
  ResolveDataPaths(config.data, a.base_dir());
  config.model.init_from = ResolveJobPath(a.base_dir(), config.model.init_from);
  SL_RETURN_IF_ERROR(ValidateJobConfig(config, a.world_size(), a.job_id()));
  at::set_num_threads(options_.threads);
  const auto timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.collective_timeout));
  c10::intrusive_ptr<c10d::Store> store =
      c10::make_intrusive<RemoteStore>(channel_, options_.token, a.credential(), a.job_id() + "/", timeout);
  const GroupPlan plan = PlanGroups(config, a.rank(), a.world_size());
  WorkerMetrics& metrics = *options_.metrics;
  metrics.BeginJob(a.job_id(), a.rank(), a.world_size(), config.model, config.lora,
                   options_.peak_flops > 0 ? options_.peak_flops : DefaultPeakFlops(options_.device, options_.threads));
  // Per job, so that a GPU that is gone or busy fails this job, naming the
  // rank and the device, and the worker takes the next one.
  absl::StatusOr<std::shared_ptr<const Device>> device = Device::Open(options_.device);
  if (!device.ok()) return absl::Status(device.status().code(), absl::StrCat("[rank ", a.rank(), "] ", device.status().message()));
  SL_ASSIGN_OR_RETURN(Communicators comms,
                      ConnectGroups(store, plan, **device, Backend::kAuto, options_.collective_timeout));
  comms.shard->set_observer(metrics.ObserverFor(/*shard_group=*/true));
  comms.replicate->set_observer(metrics.ObserverFor(/*shard_group=*/false));
  {
    v1::WorkerMessage connected;
    connected.mutable_connected()->set_job_id(a.job_id());
    connected.mutable_connected()->set_rank(a.rank());
    Write(connected);
  }
  SL_ASSIGN_OR_RETURN(auto engine,
                      Engine::Create(config, a.rank(), a.world_size(), *device, std::move(comms),
                                     options_.collective_timeout));
  int64_t start = 0;
  if (!a.resume_from().empty()) {
    SL_ASSIGN_OR_RETURN(CheckpointManifest m, LoadCheckpoint(*engine, config, a.resume_from()));
    start = m.step;
  }
  NonFiniteSteps nonfinite(config.train.max_nonfinite_skips);
  for (int64_t s = start; s < config.train.steps; ++s) {
    if (cancel_) return absl::CancelledError(absl::StrCat("stopped before step ", s));
    SL_ASSIGN_OR_RETURN(StepResult r, engine->Step(s));
    step_ = s + 1;
    metrics.OnStep(r, engine->Memory());
    v1::WorkerMessage m;
    v1::Progress* p = m.mutable_progress();
    p->set_job_id(a.job_id());
    p->set_rank(a.rank());
    p->set_step(s + 1);
    p->set_loss(r.loss);
    p->set_tokens_per_second(r.tokens / r.seconds);
    p->set_lr(r.lr);
    p->set_grad_norm(r.grad_norm);
    p->set_step_seconds(r.seconds);
    if (!std::isnan(r.val_loss)) p->set_val_loss(r.val_loss);
    Write(m);
    SL_RETURN_IF_ERROR(nonfinite.Check(r));
    if (r.skipped) std::cerr << "shardline-worker: step " << s + 1 << ": gradient norm not finite; no update" << std::endl;
    // A save that failed in the background fails the job now, naming why,
    // not at the next save or at the end of the run.
    if (save_done_ && save_thread_.joinable()) SL_RETURN_IF_ERROR(WaitForSave());
    const int interval = config.checkpoint.interval;
    if ((interval > 0 && (s + 1) % interval == 0) || save_requested_.exchange(false)) {
      absl::Status saved = SaveAndReport(*engine, a, s + 1, config.checkpoint.async);
      if (!saved.ok()) {
        (void)WaitForSave();
        return saved;
      }
    }
  }
  return WaitForSave();  // the last checkpoint is committed before the rank reports done
}

absl::Status WorkerDaemon::WaitForSave() {
  if (!save_thread_.joinable()) return absl::OkStatus();
  save_thread_.join();
  return save_status_;
}

absl::Status WorkerDaemon::SaveAndReport(const Engine& engine, const v1::Assignment& a, int64_t step, bool async) {
  SL_RETURN_IF_ERROR(WaitForSave());  // one save in flight at most
  auto write = [this, a, step](ShardSnapshot snap) -> absl::Status {
    const absl::Time t0 = absl::Now();
    absl::StatusOr<int64_t> bytes = WriteAndReport(snap, a, step);
    options_.metrics->OnCheckpoint(absl::ToDoubleSeconds(absl::Now() - t0), bytes.ok() ? *bytes : 0, bytes.ok());
    return bytes.status();
  };
  if (!async) return write(SnapshotShards(engine, /*copy=*/false));
  // The step loop pays only for this copy; the write runs beside training.
  save_done_ = false;
  save_thread_ = std::thread([this, write, snap = SnapshotShards(engine, /*copy=*/true)]() mutable {
    save_status_ = write(std::move(snap));
    save_done_ = true;
  });
  return absl::OkStatus();
}

absl::StatusOr<int64_t> WorkerDaemon::WriteAndReport(const ShardSnapshot& snap, const v1::Assignment& a,
                                                     int64_t step) {
  const std::string dir = a.checkpoint_root() + "/" + StepDirName(step);
  SL_ASSIGN_OR_RETURN(ManifestRankFile f, WriteRankShards(snap, dir, step));
  v1::CheckpointReport rep;
  rep.set_job_id(a.job_id());
  rep.set_rank(a.rank());
  rep.set_step(step);
  rep.set_path(dir + "/" + f.file);
  rep.set_size_bytes(f.size);
  rep.set_checksum(f.sha256);
  grpc::ClientContext ctx;
  AddAuth(&ctx);
  ctx.AddMetadata("x-shardline-credential", a.credential());
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::CheckpointReportResponse resp;
  SL_RETURN_IF_ERROR(FromGrpcStatus(stub_->ReportCheckpoint(&ctx, rep, &resp)));
  return f.size;
}

}  // namespace shardline
