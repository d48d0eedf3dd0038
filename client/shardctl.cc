// shardctl [--coordinator ADDR] [--token-file F] [--tls-ca F] [--json] COMMAND
//
//   submit JOB.toml [--workers N] [--follow]   jobs   status JOB   watch JOB
//   cancel JOB   delete JOB [--checkpoints]   workers   shards JOB
//   resume JOB   ckpt save|list|export|import   plan   completion bash|zsh
//
// The global flags may also follow the command (`shardctl status JOB --json`).
// Errors are one line on stderr and a nonzero exit (2 for usage: a mistyped
// command names the nearest real one). `watch` (and
// `submit --follow`) exit 0 only when the job SUCCEEDED. The job file is
// validated here before it is sent, and again by the coordinator.
#include <cctype>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/command_line.h"
#include "client/coordinator_client.h"
#include "client/export_command.h"
#include "client/import_command.h"
#include "client/plan_command.h"
#include "client/render.h"
#include "client/tensorboard_events.h"
#include "common/base/build_info.h"
#include "common/base/file_util.h"
#include "common/base/plural.h"
#include "common/base/quoted.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/checkpoint_export.h"
#include "common/job/job_config.h"
#include "common/job/job_file.h"
#include "common/rpc/grpc_status.h"
#include "common/spec/job_spec.h"
#include "common/state/job_state.h"
#include "shardline/v1/shardline.grpc.pb.h"
#define TOML_EXCEPTIONS 1
#include <toml++/toml.h>

namespace shardline::ctl {
namespace {

// The checks the coordinator will make, done before anything is sent.
// With `local_check` false the file goes to the coordinator as it is (to
// exercise the coordinator's own validation).
// `resume_from`, where given, is a committed step directory (of any job, or
// one `ckpt import` wrote) that the new job starts from.
absl::StatusOr<v1::SubmitJobRequest> PrepareSubmit(const std::string& path, int workers, bool local_check,
                                                   const std::string& resume_from) {
  SL_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, "job file", kMaxJobFileBytes));
  std::error_code ec;
  const std::string base = std::filesystem::absolute(std::filesystem::path(path), ec).parent_path().string();
  v1::SubmitJobRequest req;
  req.set_spec_toml(text);
  req.set_workers(workers);
  req.set_source(path);
  req.set_base_dir(base);
  if (!resume_from.empty()) {
    // The coordinator (and the workers) resolve it from their own working
    // directories: it travels absolute.
    req.set_resume_from(std::filesystem::absolute(std::filesystem::path(resume_from), ec).lexically_normal().string());
  }
  if (!local_check) return req;
  SL_ASSIGN_OR_RETURN(JobConfig cfg, ResolveJobSpec(text, path, base));
  const int w = workers > 0 ? workers : cfg.workers;
  SL_RETURN_IF_ERROR(ValidateJobConfig(cfg, w, path));
  SL_RETURN_IF_ERROR(CheckJobFiles(cfg, path));
  if (!resume_from.empty()) {
    SL_ASSIGN_OR_RETURN(CheckpointManifest m, ReadManifest(req.resume_from()));
    SL_RETURN_IF_ERROR(CheckSameTraining(m, cfg, req.resume_from()));
  }
  req.set_workers(w);
  return req;
}


// The spec of `old` for a resume: another strategy, validated for `workers`.
absl::StatusOr<v1::SubmitJobRequest> PrepareResume(const Client& c, const std::string& id, const std::string& from,
                                                   int workers, const std::string& strategy) {
  SL_ASSIGN_OR_RETURN(const v1::Job old, FetchJob(c, id));
  std::string step_dir = from;
  if (step_dir.empty()) {
    if (old.checkpoints_size() == 0) return absl::NotFoundError(absl::StrCat("job ", id, " has no committed checkpoint"));
    step_dir = old.checkpoints(old.checkpoints_size() - 1).path();
  }
  std::string spec = old.spec_toml();
  if (!strategy.empty()) {
    SL_RETURN_IF_ERROR(ParseStrategy(strategy).status());
    try {
      toml::table t = toml::parse(spec, id);
      if (!t.contains("parallelism")) t.insert("parallelism", toml::table{});
      t["parallelism"].as_table()->insert_or_assign("strategy", strategy);
      std::ostringstream out;
      out << t;
      spec = out.str();
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("job ", id, ": its spec does not parse: ", e.what()));
    }
  }
  SL_ASSIGN_OR_RETURN(JobConfig cfg, ResolveJobSpec(spec, id, old.base_dir()));
  const int w = workers > 0 ? workers : old.workers();
  SL_RETURN_IF_ERROR(ValidateJobConfig(cfg, w, absl::StrCat("resume of ", id)));
  v1::SubmitJobRequest req;
  req.set_spec_toml(spec);
  req.set_workers(w);
  req.set_source(absl::StrCat("resume of ", id));
  req.set_base_dir(old.base_dir());
  req.set_resume_from(step_dir);
  return req;
}

absl::Status Watch(const Client& c, const std::string& id) {
  grpc::ClientContext ctx;
  c.Prepare(&ctx, absl::Hours(24 * 30));
  v1::WatchJobRequest req;
  req.set_job_id(id);
  auto reader = c.stub()->WatchJob(&ctx, req);
  const bool tty = isatty(STDOUT_FILENO) && !c.json();
  v1::Job j, first;
  absl::Time t0;
  int64_t last_step = -1;
  bool have_first = false;
  while (reader->Read(&j)) {
    // A new attempt (a restart) starts the step rate afresh.
    if (have_first && j.attempts_size() != first.attempts_size()) have_first = false;
    if (!have_first && j.step() > 0) {
      first = j;
      t0 = absl::Now();
      have_first = true;
    }
    double eta = -1;
    if (have_first && j.step() > first.step()) {
      const double rate = (j.step() - first.step()) / absl::ToDoubleSeconds(absl::Now() - t0);
      eta = (j.steps() - j.step()) / rate;
    }
    if (c.json()) {
      std::cout << Dump(JobObject(j)) << std::endl;
    } else if (tty) {
      std::cout << "\r" << ProgressLine(j, eta) << "\033[K" << std::flush;
    } else if (j.step() != last_step || IsFinalJobState(j.state())) {
      std::cout << ProgressLine(j, eta) << std::endl;
    }
    last_step = j.step();
  }
  SL_RETURN_IF_ERROR(c.Check(reader->Finish()));
  if (tty) std::cout << std::endl;
  if (!c.json()) std::cout << Printable(j.id()) << " " << JobStateName(j.state()) << ": " << Printable(j.message()) << std::endl;
  if (j.state() != v1::JOB_STATE_SUCCEEDED) {
    return absl::AbortedError(absl::StrCat(j.id(), " ended ", JobStateName(j.state()), ": ", j.message()));
  }
  return absl::OkStatus();
}

// Prints a job's log lines (of one rank, or all for -1); with `follow`, asks
// again every second for newer ones until the job has ended.
absl::Status Logs(const Client& c, const std::string& id, int rank, bool follow) {
  int64_t after = 0;
  for (;;) {
    grpc::ClientContext ctx;
    c.Prepare(&ctx);
    v1::GetLogsRequest r;
    r.set_job_id(id);
    r.set_rank(rank);
    r.set_after_seq(after);
    v1::GetLogsResponse resp;
    SL_RETURN_IF_ERROR(c.Check(c.stub()->GetLogs(&ctx, r, &resp)));
    for (const v1::LogLine& l : resp.lines()) {
      after = std::max(after, l.seq());
      if (c.json()) {
        std::cout << Dump({{"seq", l.seq()}, {"rank", l.rank()}, {"unix_ms", l.unix_ms()}, {"text", l.text()}})
                  << "\n";
      } else {
        std::cout << absl::FormatTime("%Y-%m-%d %H:%M:%E3S", absl::FromUnixMillis(l.unix_ms()), absl::LocalTimeZone())
                  << " [rank " << l.rank() << "] " << Printable(l.text()) << "\n";
      }
    }
    std::cout << std::flush;
    if (!follow || resp.ended()) return absl::OkStatus();
    absl::SleepFor(absl::Seconds(1));
  }
}

int64_t NewestCheckpointStep(const v1::Job& j) {
  return j.checkpoints_size() ? j.checkpoints(j.checkpoints_size() - 1).step() : -1;
}

// Asks a running job to save and waits until it commits a checkpoint newer
// than its newest one, ends (the save's failure is the job's message), or
// `timeout` passes.
absl::StatusOr<v1::CheckpointInfo> SaveNow(const Client& c, const std::string& job, absl::Duration timeout) {
  SL_ASSIGN_OR_RETURN(const v1::Job asked, FetchJob(c, job));
  const int64_t before = NewestCheckpointStep(asked);
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  v1::CheckpointNowRequest r;
  r.set_job_id(job);
  v1::CheckpointNowResponse resp;
  SL_RETURN_IF_ERROR(c.Check(c.stub()->CheckpointNow(&ctx, r, &resp)));
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    SL_ASSIGN_OR_RETURN(const v1::Job j, FetchJob(c, job));
    if (NewestCheckpointStep(j) > before) return j.checkpoints(j.checkpoints_size() - 1);
    if (IsFinalJobState(j.state())) {
      return absl::AbortedError(absl::StrCat("job ", job, " ended ", JobStateName(j.state()), " before it committed the checkpoint: ",
                                             j.message()));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("job ", job, " committed no checkpoint within ",
                                                      absl::FormatDuration(timeout), "; it may still: shardctl ckpt list ",
                                                      job));
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

// Every flag of every command, as the parse fills them.
struct Args {
  Options o;
  std::string file, job, from, strategy, shell, tensorboard_dir;
  int workers = 0, page_size = 100, log_rank = -1;
  bool follow = false, skip_local_check = false, history = false, delete_checkpoints = false, follow_logs = false;
  double save_timeout_s = 600;
  ExportFlags export_flags;
  ImportFlags import_flags;
  PlanFlags plan;
};

// The flags every command takes, before or after its name.
void AddGlobalFlags(CLI::App& app, Args& a) {
  app.require_subcommand(1);
  app.set_version_flag("--version", absl::StrCat("shardctl ", kVersion, " (", kRevision, ")"));
  // Taken after the subcommand too: every subcommand (added after this)
  // hands what it does not know to its parent.
  app.fallthrough();
  // Each flag's default comes from the environment, so that a shell (or a
  // recipe) sets them once.
  auto from_env = [](const char* name, const char* otherwise) {
    const char* v = std::getenv(name);
    return std::string(v ? v : otherwise);
  };
  a.o.coordinator = from_env("SHARDLINE_COORDINATOR", "127.0.0.1:50051");
  a.o.token_file = from_env("SHARDLINE_TOKEN_FILE", "");
  a.o.tls_ca = from_env("SHARDLINE_TLS_CA", "");
  app.add_option("--coordinator", a.o.coordinator, "coordinator address (env SHARDLINE_COORDINATOR)");
  app.add_option("--token-file", a.o.token_file, "file holding the coordinator's token (env SHARDLINE_TOKEN_FILE)");
  app.add_option("--tls-ca", a.o.tls_ca, "PEM root certificate: connect with TLS (env SHARDLINE_TLS_CA)");
  app.add_flag("--json", a.o.json, "machine-readable output");
}

void AddJobCommands(CLI::App& app, Args& a) {
  auto* submit = app.add_subcommand("submit", "submit a job file");
  submit->add_option("JOB.toml", a.file)->required();
  // Bounded as [job] workers is: 0 (the default) means "the job's", so a
  // given value outside [1, 2^20] is refused rather than silently dropped.
  submit->add_option("--workers", a.workers, "number of workers (default: [job] workers)")
      ->check(CLI::Range(1, 1 << 20));
  submit->add_option("--resume-from", a.from, "start from this committed step directory (another job's, or one "
                                              "`ckpt import` wrote), at any world size");
  submit->add_flag("--follow", a.follow, "watch the job until it ends");
  submit->add_flag("--skip-local-check", a.skip_local_check,
                   "send without validating here (tests the coordinator's checks)");
  app.add_subcommand("jobs", "list jobs")
      ->add_option("--page-size", a.page_size, "jobs fetched per call (1..1000, default 100)")
      ->check(CLI::Range(1, 1000));  // the coordinator's bound, refused before any call
  auto* status = app.add_subcommand("status", "show one job");
  status->add_flag("--history", a.history,
                   "also its per-step history (loss, lr, grad norm, tokens/s, val loss), across the jobs it resumed from");
  status->add_option("--tensorboard", a.tensorboard_dir,
                     "write that history as a TensorBoard events file into DIR (implies --history)");
  auto* watch = app.add_subcommand("watch", "follow a job with a progress bar until it ends");
  auto* cancel = app.add_subcommand("cancel", "cancel a job");
  auto* del = app.add_subcommand("delete", "forget a job that has ended");
  del->add_flag("--checkpoints", a.delete_checkpoints, "also remove its checkpoints");
  auto* shards = app.add_subcommand("shards", "the job's ownership map");
  for (auto* s : {status, watch, cancel, del, shards}) s->add_option("JOB", a.job)->required();
  app.add_subcommand("workers", "list workers");
  auto* logs = app.add_subcommand("logs", "a job's log lines as its ranks sent them (a tail per rank)");
  logs->add_option("JOB", a.job)->required();
  logs->add_option("--rank", a.log_rank, "only this rank's lines")->check(CLI::Range(0, 1 << 20));
  logs->add_flag("--follow", a.follow_logs, "keep printing new lines until the job ends");
  auto* resume = app.add_subcommand("resume", "start a new job from a job's latest (or a given) checkpoint");
  resume->add_option("JOB", a.job)->required();
  resume->add_option("--from", a.from, "a committed step directory (default: the job's latest)");
  resume->add_option("--workers", a.workers, "number of workers (default: the job's)")->check(CLI::Range(1, 1 << 20));
  resume->add_option("--strategy", a.strategy, "another strategy for the new job");
  resume->add_flag("--follow", a.follow, "watch the new job until it ends");
}

// `ckpt save|list|export`; returns `ckpt`, whose one subcommand names what runs.
CLI::App* AddCheckpointCommands(CLI::App& app, Args& a) {
  auto* ckpt = app.add_subcommand("ckpt", "checkpoints");
  ckpt->require_subcommand(1);
  auto* save = ckpt->add_subcommand("save", "save a running job's state after its current step and wait "
                                            "until the checkpoint is committed");
  save->add_option("--timeout", a.save_timeout_s, "seconds to wait for the commit (default 600)")
      ->check(CLI::Range(1.0, 86400.0));
  auto* list = ckpt->add_subcommand("list", "a job's committed checkpoints");
  for (auto* sc : {save, list}) sc->add_option("JOB", a.job)->required();
  AddExportOptions(ckpt->add_subcommand("export", "write a checkpoint's model for other tools (no coordinator "
                                                   "needed)"),
                   &a.export_flags);
  AddImportOptions(ckpt->add_subcommand("import", "turn a PyTorch DCP checkpoint (FSDP2, torchtitan) into a "
                                                   "checkpoint a job resumes from (no coordinator needed)"),
                   &a.import_flags);
  return ckpt;
}

// A new job: its id (as JSON with --json), then, with --follow, its progress.
absl::Status Start(const Client& c, const Args& a, const v1::SubmitJobRequest& r) {
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  v1::SubmitJobResponse resp;
  SL_RETURN_IF_ERROR(c.Check(c.stub()->SubmitJob(&ctx, r, &resp)));
  // The id alone on stdout (scripts take it); the steps it resolved (from
  // [train] steps, or epochs over its data) on stderr.
  std::cout << (a.o.json ? Dump({{"job_id", resp.job_id()}, {"steps", resp.steps()}}) : resp.job_id()) << std::endl;
  if (!a.o.json) std::cerr << resp.job_id() << ": " << resp.steps() << " steps" << std::endl;
  return a.follow ? Watch(c, resp.job_id()) : absl::OkStatus();
}

// `jobs`: every page, each its own call with its own deadline.
absl::Status ListJobs(const Client& c, const Args& a) {
  std::vector<v1::Job> jobs;
  v1::ListJobsRequest page;
  page.set_page_size(a.page_size);
  for (;;) {
    grpc::ClientContext ctx;
    c.Prepare(&ctx);
    v1::ListJobsResponse resp;
    SL_RETURN_IF_ERROR(c.Check(c.stub()->ListJobs(&ctx, page, &resp)));
    jobs.insert(jobs.end(), resp.jobs().begin(), resp.jobs().end());
    if (resp.next_page_token().empty() || jobs.size() > 1000000) break;
    page.set_page_token(resp.next_page_token());
  }
  if (a.o.json) {
    Json js = Json::array();
    for (const auto& j : jobs) js.push_back(JobObject(j));
    std::cout << Dump({{"jobs", js}}) << std::endl;
  } else {
    std::cout << JobsTable(jobs);
  }
  return absl::OkStatus();
}

absl::Status Delete(const Client& c, const Args& a) {
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  v1::DeleteJobRequest r;
  r.set_job_id(a.job);
  r.set_checkpoints(a.delete_checkpoints);
  v1::DeleteJobResponse resp;
  SL_RETURN_IF_ERROR(c.Check(c.stub()->DeleteJob(&ctx, r, &resp)));
  if (a.o.json) {
    std::cout << Dump({{"deleted", a.job}, {"removed_checkpoints", resp.removed_checkpoints()}}) << std::endl;
  } else {
    std::cout << "deleted " << a.job
              << (a.delete_checkpoints ? absl::StrCat(" and ", resp.removed_checkpoints(), " checkpoints") : "")
              << std::endl;
  }
  return absl::OkStatus();
}

// `status` and `cancel` print the job they got back.
absl::Status StatusOrCancel(const Client& c, const Args& a, bool cancel) {
  v1::Job j;
  std::string note;
  if (!cancel) {
    const bool history = a.history || !a.tensorboard_dir.empty();
    SL_ASSIGN_OR_RETURN(j, FetchJob(c, a.job, history));
    if (history) PrependLineage(c, j, &note);
    if (!a.tensorboard_dir.empty()) {
      // What was written, not the status and its history again.
      SL_ASSIGN_OR_RETURN(const std::string events, WriteTensorBoardEvents(a.tensorboard_dir, j));
      std::cout << (a.o.json ? Dump({{"tensorboard", events}, {"steps", j.history_size()}})
                             : absl::StrCat("wrote ", Plural(j.history_size(), "step"), " to ", events))
                << std::endl;
      if (!note.empty()) std::cerr << "shardctl: " << note << std::endl;
      return absl::OkStatus();
    }
  } else {
    grpc::ClientContext ctx;
    c.Prepare(&ctx);
    v1::CancelJobRequest r;
    r.set_job_id(a.job);
    SL_RETURN_IF_ERROR(c.Check(c.stub()->CancelJob(&ctx, r, &j)));
  }
  std::cout << (a.o.json ? Dump(JobObject(j)) + "\n" : JobDetails(j));
  if (!note.empty()) std::cerr << "shardctl: " << note << std::endl;
  return absl::OkStatus();
}

absl::Status SaveCheckpoint(const Client& c, const Args& a) {
  SL_ASSIGN_OR_RETURN(v1::CheckpointInfo saved, SaveNow(c, a.job, absl::Seconds(a.save_timeout_s)));
  if (a.o.json) {
    std::cout << Dump({{"step", saved.step()}, {"path", saved.path()}}) << std::endl;
  } else {
    std::cout << absl::StrFormat("committed step %d: %s\n", saved.step(), Printable(saved.path()));
  }
  return absl::OkStatus();
}

absl::Status ListCheckpoints(const Client& c, const Args& a) {
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  v1::ListCheckpointsRequest r;
  r.set_job_id(a.job);
  v1::ListCheckpointsResponse resp;
  SL_RETURN_IF_ERROR(c.Check(c.stub()->ListCheckpoints(&ctx, r, &resp)));
  Json js = Json::array();
  for (const auto& k : resp.checkpoints()) {
    js.push_back({{"step", k.step()}, {"path", k.path()}});
    if (!a.o.json) std::cout << absl::StrFormat("step %8d  %s\n", k.step(), Printable(k.path()));
  }
  if (a.o.json) std::cout << Dump({{"checkpoints", js}}) << std::endl;
  return absl::OkStatus();
}

absl::Status ListWorkers(const Client& c, const Args& a) {
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  v1::ListWorkersResponse resp;
  SL_RETURN_IF_ERROR(c.Check(c.stub()->ListWorkers(&ctx, v1::ListWorkersRequest(), &resp)));
  std::vector<v1::WorkerInfo> ws(resp.workers().begin(), resp.workers().end());
  if (a.o.json) {
    Json js = Json::array();
    for (const auto& w : ws) js.push_back(WorkerObject(w));
    std::cout << Dump({{"workers", js}}) << std::endl;
  } else {
    std::cout << WorkersTable(ws);
  }
  return absl::OkStatus();
}

absl::Status Shards(const Client& c, const Args& a) {
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  v1::GetOwnershipRequest r;
  r.set_job_id(a.job);
  v1::Ownership own;
  SL_RETURN_IF_ERROR(c.Check(c.stub()->GetOwnership(&ctx, r, &own)));
  std::cout << (a.o.json ? Dump(ShardsObject(own)) + "\n" : ShardsTable(own));
  return absl::OkStatus();
}

// The commands that talk to the coordinator. A job file is validated before
// connecting.
absl::Status RunRemote(const std::string& cmd, const Args& a) {
  std::optional<v1::SubmitJobRequest> req;
  if (cmd == "submit") {
    SL_ASSIGN_OR_RETURN(req, PrepareSubmit(a.file, a.workers, !a.skip_local_check, a.from));
  }
  SL_ASSIGN_OR_RETURN(Client c, Client::Connect(a.o));
  if (cmd == "submit") return Start(c, a, *req);
  if (cmd == "resume") {
    SL_ASSIGN_OR_RETURN(v1::SubmitJobRequest r, PrepareResume(c, a.job, a.from, a.workers, a.strategy));
    return Start(c, a, r);
  }
  if (cmd == "jobs") return ListJobs(c, a);
  if (cmd == "status" || cmd == "cancel") return StatusOrCancel(c, a, cmd == "cancel");
  if (cmd == "watch") return Watch(c, a.job);
  if (cmd == "delete") return Delete(c, a);
  if (cmd == "ckpt save") return SaveCheckpoint(c, a);
  if (cmd == "ckpt list") return ListCheckpoints(c, a);
  if (cmd == "logs") return Logs(c, a.job, a.log_rank, a.follow_logs);
  if (cmd == "workers") return ListWorkers(c, a);
  return Shards(c, a);
}

// Parses argv into `a`; a usage error or help exits with what CLI11 says
// (usage errors 2), reported through *exit_code.
bool Parse(CLI::App& app, int argc, char** argv, int* exit_code) {
  try {
    app.parse(argc, argv);
    return true;
  } catch (const CLI::CallForHelp& e) {
    *exit_code = app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    *exit_code = app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    *exit_code = app.exit(e);
  } catch (const CLI::ParseError& e) {
    // A word where a command belongs is named with the nearest real one
    // rather than as an unexpected argument.
    if (auto typo = MistypedSubcommand(app, std::vector<std::string>(argv + 1, argv + argc))) {
      std::cerr << "shardctl: " << *typo << std::endl;
    } else {
      app.exit(e);
    }
    *exit_code = 2;
  }
  return false;
}

}  // namespace
}  // namespace shardline::ctl

int main(int argc, char** argv) {
  using namespace shardline;
  using namespace shardline::ctl;
  CLI::App app{"shardctl: submit, watch and manage Shardline jobs", "shardctl"};
  Args a;
  AddGlobalFlags(app, a);
  AddJobCommands(app, a);
  CLI::App* ckpt = AddCheckpointCommands(app, a);
  AddPlanOptions(app.add_subcommand("plan", "predict memory, communication and step time of every strategy "
                                            "(no coordinator needed)"),
                 &a.plan);
  app.add_subcommand("completion", "print a completion script: source <(shardctl completion bash)")
      ->add_option("SHELL", a.shell, "bash or zsh")
      ->required()
      ->check(CLI::IsMember({"bash", "zsh"}));
  int exit_code = 0;
  if (!Parse(app, argc, argv, &exit_code)) return exit_code;
  std::string cmd = app.get_subcommands()[0]->get_name();
  if (cmd == "ckpt") cmd += " " + ckpt->get_subcommands()[0]->get_name();
  absl::Status s;
  if (cmd == "completion") {  // generated from `app` itself, so it follows every flag added above
    std::cout << (a.shell == "bash" ? BashCompletion(app) : ZshCompletion(app));
  } else if (cmd == "plan") {
    s = RunPlan(a.plan, a.o.json);  // local arithmetic
  } else if (cmd == "ckpt export") {
    s = RunExport(a.export_flags, a.o.json);
  } else if (cmd == "ckpt import") {
    s = RunImport(a.import_flags, a.o.json);
  } else {
    s = RunRemote(cmd, a);
  }
  if (!s.ok()) {
    std::cerr << "shardctl: " << Printable(s.message()) << std::endl;
    return 1;
  }
  return 0;
}
