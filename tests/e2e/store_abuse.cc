// store_abuse ADDRESS WORKER_TOKEN_FILE USER_TOKEN_FILE: a hostile client
// built from the proto, for tests/e2e/abuse.py. It holds a real rank of a
// real job (so a valid worker token and a valid rank credential) and does,
// one command at a time, what a hostile client could.
//
// It registers a worker session (heartbeating in the background), prints
// "registered", waits up to 30 s for an assignment and prints
// "assigned JOB RANK". Then it reads commands from stdin, one per line, and
// answers each with one line on stdout:
//   fill                    sets 1 MiB values under its own job's keys until
//                           the store refuses one: "filled set S refused CODE"
//   empty                   deletes them: "emptied S"
//   waits                   1000 store waits on keys that never come, each
//                           given up after 100 ms (the client's deadline, as
//                           a killed client would): "waits 1000 refused R"
//                           (R refused as too many pending)
//   report JOB RANK STEP PATH CRED
//                           ReportCheckpoint of that rank's file PATH of STEP
//   store get|set KEY CRED TOKEN
//                           StoreGet (100 ms) or StoreSet of KEY
//   progress JOB RANK STEP  Progress of that rank, sent on a second worker
//   finished JOB RANK       session (registered as host "hostile-2" at its
//                           first use): "sent" (the coordinator answers no
//                           session message)
//   claim JOB RANK          registers a session (host "hostile-claim") that
//                           says it still runs that rank of JOB, with a
//                           made-up credential: "sent"
//   job JOB                 GetJob with the user token: "job STATE OWNER ROOT"
//                           (the state as a number; OWNER "-" if none)
//   register escape|huge    a session registering with a host name holding
//                           terminal escapes, or of 3 MiB: "status CODE MSG"
//   list TOKEN              ListJobs of 1000 a page from page_token TOKEN
//                           ("-": the first page): "list N NEXT" (NEXT "-"
//                           if none)
//   quit
// CRED is "own" (its rank's credential) or "-" (none); TOKEN is "worker",
// "user" or "-" (no bearer token). Calls answer "status CODE MESSAGE" (the
// gRPC code as a number). Every call has a deadline; stdin's end quits.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "shardline/v1/shardline.grpc.pb.h"

namespace v1 = shardline::v1;

namespace {

std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::chrono::system_clock::time_point In(int ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

void Authorize(grpc::ClientContext* ctx, const std::string& token, const std::string& credential, int deadline_ms) {
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  if (!credential.empty()) ctx->AddMetadata("x-shardline-credential", credential);
  ctx->set_deadline(In(deadline_ms));
}

std::string Answer(const grpc::Status& s) {
  std::string msg = s.error_message();
  for (char& c : msg) {
    if (c == '\n') c = ' ';
  }
  return "status " + std::to_string(s.error_code()) + " " + msg;
}

// A registered worker session that heartbeats every 200 ms until destroyed.
class Session {
 public:
  // With `claim_job`: registers saying it still runs rank `claim_rank` of
  // that job, with a credential it made up.
  Session(v1::Coordinator::Stub* stub, const std::string& token, const std::string& host,
          const std::string& claim_job = "", int claim_rank = 0) {
    ctx_.AddMetadata("authorization", "Bearer " + token);
    stream_ = stub->WorkerSession(&ctx_);
    v1::WorkerMessage reg;
    reg.mutable_register_()->set_host(host);
    reg.mutable_register_()->set_device("cpu");
    if (!claim_job.empty()) {
      reg.mutable_register_()->set_job_id(claim_job);
      reg.mutable_register_()->set_rank(claim_rank);
      reg.mutable_register_()->set_claim_credential("made-up");
    }
    ok_ = stream_->Write(reg);
    heartbeats_ = std::thread([this] {
      while (!done_) {
        v1::WorkerMessage hb;
        hb.mutable_heartbeat();
        if (!Send(hb)) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    });
  }
  ~Session() {
    done_ = true;
    ctx_.TryCancel();
    heartbeats_.join();
  }
  bool ok() const { return ok_; }
  bool Send(const v1::WorkerMessage& m) {
    std::lock_guard<std::mutex> lock(write_mu_);
    return stream_->Write(m);
  }
  // The first assignment within `seconds`; an empty one if none came.
  v1::Assignment AwaitAssignment(int seconds) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    v1::CoordinatorMessage m;
    // Read blocks; the session's heartbeats make the coordinator write
    // nothing back, so the deadline is enforced by cancelling the call.
    std::atomic<bool> got{false};
    std::thread watchdog([&] {
      while (!got && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (!got) ctx_.TryCancel();
    });
    v1::Assignment a;
    while (stream_->Read(&m)) {
      if (m.has_start()) {
        a = m.start();
        break;
      }
    }
    got = true;
    watchdog.join();
    return a;
  }
  std::string Finish() { return stream_->Finish().error_message(); }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>> stream_;
  std::mutex write_mu_;
  bool ok_ = false;
  std::atomic<bool> done_{false};
  std::thread heartbeats_;
};

class Abuser {
 public:
  Abuser(std::unique_ptr<v1::Coordinator::Stub> stub, std::string worker_token, std::string user_token,
         v1::Assignment a)
      : stub_(std::move(stub)), worker_token_(std::move(worker_token)), user_token_(std::move(user_token)),
        a_(std::move(a)) {}

  std::string Do(const std::string& line) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "fill") return Fill();
    if (cmd == "empty") return Empty();
    if (cmd == "waits") return Waits();
    if (cmd == "report") return Report(in);
    if (cmd == "job") return GetJob(in);
    if (cmd == "list") return List(in);
    if (cmd == "store") return Store(in);
    if (cmd == "register") return Register(in);
    if (cmd == "claim") return Claim(in);
    if (cmd == "progress" || cmd == "finished") return SendAsSecondSession(cmd, in);
    return "unknown command: " + cmd;
  }

 private:
  // report JOB RANK STEP PATH own|none: a checkpoint report.
  std::string Report(std::istringstream& in) {
    v1::CheckpointReport r;
    int rank = 0;
    int64_t step = 0;
    std::string job, path, cred;
    in >> job >> rank >> step >> path >> cred;
    r.set_job_id(job);
    r.set_rank(rank);
    r.set_step(step);
    r.set_path(path);
    r.set_size_bytes(4096);
    r.set_checksum(std::string(64, 'a'));
    grpc::ClientContext ctx;
    Authorize(&ctx, worker_token_, Credential(cred), 10000);
    v1::CheckpointReportResponse resp;
    return Answer(stub_->ReportCheckpoint(&ctx, r, &resp));
  }

  // job ID: GetJob as the user.
  std::string GetJob(std::istringstream& in) {
    std::string id;
    in >> id;
    grpc::ClientContext ctx;
    Authorize(&ctx, user_token_, "", 10000);
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::Job j;
    grpc::Status s = stub_->GetJob(&ctx, req, &j);
    if (!s.ok()) return Answer(s);
    return "job " + std::to_string(j.state()) + " " + (j.owner().empty() ? "-" : j.owner()) + " " +
           j.checkpoint_root();
  }

  // list TOKEN|-: one ListJobs page as the user.
  std::string List(std::istringstream& in) {
    std::string token;
    in >> token;
    grpc::ClientContext ctx;
    Authorize(&ctx, user_token_, "", 10000);
    v1::ListJobsRequest req;
    req.set_page_size(1000);
    req.set_page_token(token == "-" ? "" : token);
    v1::ListJobsResponse resp;
    grpc::Status s = stub_->ListJobs(&ctx, req, &resp);
    if (!s.ok()) return Answer(s);
    return "list " + std::to_string(resp.jobs_size()) + " " +
           (resp.next_page_token().empty() ? "-" : resp.next_page_token());
  }

  // store get|set KEY own|none worker|user|none: a store call with that credential and token.
  std::string Store(std::istringstream& in) {
    std::string op, key, cred, token;
    in >> op >> key >> cred >> token;
    grpc::ClientContext ctx;
    Authorize(&ctx, token == "worker" ? worker_token_ : token == "user" ? user_token_ : "", Credential(cred), 10000);
    if (op == "get") {
      v1::StoreGetRequest req;
      req.set_key(key);
      req.set_timeout_ms(100);
      v1::StoreGetResponse resp;
      return Answer(stub_->StoreGet(&ctx, req, &resp));
    }
    v1::StoreSetRequest req;
    req.set_key(key);
    req.set_value("planted by a hostile client");
    v1::StoreSetResponse resp;
    return Answer(stub_->StoreSet(&ctx, req, &resp));
  }

  // register escape|huge: a worker session whose host is hostile.
  std::string Register(std::istringstream& in) {
    std::string kind;
    in >> kind;
    grpc::ClientContext ctx;
    Authorize(&ctx, worker_token_, "", 10000);
    auto stream = stub_->WorkerSession(&ctx);
    v1::WorkerMessage reg;
    reg.mutable_register_()->set_host(kind == "huge" ? std::string(3 << 20, 'h') : "h\x1b]0;pwned\x07\x1b[2J");
    reg.mutable_register_()->set_device("cpu");
    stream->Write(reg);
    stream->WritesDone();
    v1::CoordinatorMessage m;
    while (stream->Read(&m)) {
    }
    return Answer(stream->Finish());
  }

  // claim JOB RANK: a session that claims a rank it was not given.
  std::string Claim(std::istringstream& in) {
    std::string job;
    int rank = 0;
    in >> job >> rank;
    claimant_ = std::make_unique<Session>(stub_.get(), worker_token_, "hostile-claim", job, rank);
    return claimant_->ok() ? "sent" : "cannot open the claiming session: " + claimant_->Finish();
  }

  // progress JOB RANK STEP | finished JOB RANK: sent from a second session.
  std::string SendAsSecondSession(const std::string& cmd, std::istringstream& in) {
    if (!second_) {
      second_ = std::make_unique<Session>(stub_.get(), worker_token_, "hostile-2");
      if (!second_->ok()) return "cannot open a second session: " + second_->Finish();
    }
    v1::WorkerMessage m;
    std::string job;
    int rank = 0;
    in >> job >> rank;
    if (cmd == "progress") {
      int64_t step = 0;
      in >> step;
      m.mutable_progress()->set_job_id(job);
      m.mutable_progress()->set_rank(rank);
      m.mutable_progress()->set_step(step);
      m.mutable_progress()->set_loss(0.125);
    } else {
      m.mutable_finished()->set_job_id(job);
      m.mutable_finished()->set_rank(rank);
      m.mutable_finished()->set_ok(true);
    }
    return second_->Send(m) ? "sent" : "the second session is closed";
  }

  std::string Credential(const std::string& which) const { return which == "own" ? a_.credential() : ""; }

  // Sets 1 MiB values until one is refused.
  std::string Fill() {
    const std::string value((1 << 20) - 64, 'x');
    int refused = 0;
    for (filled_ = 0; filled_ < 1000; ++filled_) {
      grpc::ClientContext ctx;
      Authorize(&ctx, worker_token_, a_.credential(), 10000);
      v1::StoreSetRequest req;
      req.set_key(a_.job_id() + "/abuse/" + std::to_string(filled_));
      req.set_value(value);
      v1::StoreSetResponse resp;
      grpc::Status s = stub_->StoreSet(&ctx, req, &resp);
      if (!s.ok()) {
        refused = s.error_code();
        break;
      }
    }
    return "filled set " + std::to_string(filled_) + " refused " + std::to_string(refused);
  }

  std::string Empty() {
    for (int i = 0; i < filled_; ++i) {
      grpc::ClientContext ctx;
      Authorize(&ctx, worker_token_, a_.credential(), 10000);
      v1::StoreDeleteRequest req;
      req.set_key(a_.job_id() + "/abuse/" + std::to_string(i));
      v1::StoreDeleteResponse resp;
      (void)stub_->StoreDelete(&ctx, req, &resp);
    }
    return "emptied " + std::to_string(filled_);
  }

  // 1000 waits given up after 100 ms.
  std::string Waits() {
    constexpr int kWaits = 1000;
    grpc::CompletionQueue cq;
    struct Call {
      grpc::ClientContext ctx;
      v1::StoreWaitResponse resp;
      grpc::Status status;
      std::unique_ptr<grpc::ClientAsyncResponseReader<v1::StoreWaitResponse>> reader;
    };
    std::vector<std::unique_ptr<Call>> calls;
    for (int i = 0; i < kWaits; ++i) {
      auto c = std::make_unique<Call>();
      Authorize(&c->ctx, worker_token_, a_.credential(), 100);
      v1::StoreWaitRequest req;
      req.add_keys(a_.job_id() + "/never/" + std::to_string(i));
      req.set_timeout_ms(3600 * 1000);
      c->reader = stub_->AsyncStoreWait(&c->ctx, req, &cq);
      c->reader->Finish(&c->resp, &c->status, c.get());
      calls.push_back(std::move(c));
    }
    int refused = 0;
    for (int i = 0; i < kWaits; ++i) {
      void* tag = nullptr;
      bool ok = false;
      // Each call ends by its 100 ms deadline; 30 s bounds the whole.
      if (cq.AsyncNext(&tag, &ok, In(30000)) != grpc::CompletionQueue::GOT_EVENT) break;
      refused += static_cast<Call*>(tag)->status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
    }
    cq.Shutdown();
    void* tag;
    bool ok;
    while (cq.Next(&tag, &ok)) {
    }
    return "waits " + std::to_string(kWaits) + " refused " + std::to_string(refused);
  }

  std::unique_ptr<v1::Coordinator::Stub> stub_;
  const std::string worker_token_, user_token_;
  const v1::Assignment a_;
  int filled_ = 0;
  std::unique_ptr<Session> second_;
  std::unique_ptr<Session> claimant_;  // "claim"
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: store_abuse ADDRESS WORKER_TOKEN_FILE USER_TOKEN_FILE" << std::endl;
    return 2;
  }
  const std::string worker_token = FirstLine(argv[2]), user_token = FirstLine(argv[3]);
  auto stub = v1::Coordinator::NewStub(grpc::CreateChannel(argv[1], grpc::InsecureChannelCredentials()));
  auto session = std::make_unique<Session>(stub.get(), worker_token, "abuser");
  if (!session->ok()) {
    std::cerr << "store_abuse: cannot register: " << session->Finish() << std::endl;
    return 1;
  }
  std::cout << "registered" << std::endl;
  const v1::Assignment a = session->AwaitAssignment(30);
  if (a.job_id().empty()) {
    std::cerr << "store_abuse: no assignment within 30 s" << std::endl;
    return 1;
  }
  std::cout << "assigned " << a.job_id() << " " << a.rank() << std::endl;
  Abuser abuser(std::move(stub), worker_token, user_token, a);
  std::string line;
  while (std::getline(std::cin, line) && line != "quit") std::cout << abuser.Do(line) << std::endl;
  return 0;
}
