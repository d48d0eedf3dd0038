// store_abuse ADDRESS TOKEN_FILE ROUNDS: a worker that holds a real rank of a
// real job and uses its credential to press the coordinator's rendezvous
// store as hard as a hostile client could. For tests/e2e/abuse.py, which
// submits the job and samples the coordinator's memory between rounds.
//
// It registers a worker session (heartbeating in the background), waits up
// to 30 s for an assignment, then runs ROUNDS rounds. Each round sets 1 MiB
// values until the store refuses one, deletes them, then starts 1000 store
// waits on keys that never come and gives each up after 100 ms (the
// client's deadline, as a killed client would). After each round it prints
// one line, "round R set S refused_set R1 waits W refused_waits R2", and
// sleeps 0.5 s so that the coordinator frees what it should.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
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

void Authorize(grpc::ClientContext* ctx, const std::string& token, const std::string& credential, int deadline_ms) {
  ctx->AddMetadata("authorization", "Bearer " + token);
  ctx->AddMetadata("x-shardline-credential", credential);
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
}

// Sets 1 MiB values until one is refused; deletes them. Returns (set, refused code).
std::pair<int, int> FillAndEmpty(v1::Coordinator::Stub* stub, const v1::Assignment& a, const std::string& token) {
  const std::string value((1 << 20) - 64, 'x');
  int set = 0, refused = 0;
  for (; set < 1000; ++set) {
    grpc::ClientContext ctx;
    Authorize(&ctx, token, a.credential(), 10000);
    v1::StoreSetRequest req;
    req.set_key(a.job_id() + "/abuse/" + std::to_string(set));
    req.set_value(value);
    v1::StoreSetResponse resp;
    grpc::Status s = stub->StoreSet(&ctx, req, &resp);
    if (!s.ok()) {
      refused = s.error_code();
      break;
    }
  }
  for (int i = 0; i < set; ++i) {
    grpc::ClientContext ctx;
    Authorize(&ctx, token, a.credential(), 10000);
    v1::StoreDeleteRequest req;
    req.set_key(a.job_id() + "/abuse/" + std::to_string(i));
    v1::StoreDeleteResponse resp;
    (void)stub->StoreDelete(&ctx, req, &resp);
  }
  return {set, refused};
}

// 1000 waits given up after 100 ms; returns how many the store refused.
int AbandonedWaits(v1::Coordinator::Stub* stub, const v1::Assignment& a, const std::string& token) {
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
    Authorize(&c->ctx, token, a.credential(), 100);
    v1::StoreWaitRequest req;
    req.add_keys(a.job_id() + "/never/" + std::to_string(i));
    req.set_timeout_ms(3600 * 1000);
    c->reader = stub->AsyncStoreWait(&c->ctx, req, &cq);
    c->reader->Finish(&c->resp, &c->status, c.get());
    calls.push_back(std::move(c));
  }
  int refused = 0;
  for (int i = 0; i < kWaits; ++i) {
    void* tag = nullptr;
    bool ok = false;
    if (!cq.Next(&tag, &ok)) break;
    refused += static_cast<Call*>(tag)->status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
  }
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  return refused;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: store_abuse ADDRESS TOKEN_FILE ROUNDS" << std::endl;
    return 2;
  }
  const std::string token = FirstLine(argv[2]);
  const int rounds = std::atoi(argv[3]);
  auto stub = v1::Coordinator::NewStub(grpc::CreateChannel(argv[1], grpc::InsecureChannelCredentials()));
  grpc::ClientContext session;
  session.AddMetadata("authorization", "Bearer " + token);
  auto stream = stub->WorkerSession(&session);
  v1::WorkerMessage reg;
  reg.mutable_register_()->set_host("abuser");
  reg.mutable_register_()->set_device("cpu");
  if (!stream->Write(reg)) {
    std::cerr << "store_abuse: cannot register: " << stream->Finish().error_message() << std::endl;
    return 1;
  }
  std::cout << "registered" << std::endl;
  v1::CoordinatorMessage m;
  v1::Assignment a;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::atomic<bool> done{false};
  std::thread heartbeats([&] {
    while (!done) {
      v1::WorkerMessage hb;
      hb.mutable_heartbeat();
      if (!stream->Write(hb)) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  while (a.job_id().empty() && std::chrono::steady_clock::now() < give_up && stream->Read(&m)) {
    if (m.has_start()) a = m.start();
  }
  if (a.job_id().empty()) {
    std::cerr << "store_abuse: no assignment within 30 s" << std::endl;
    done = true;
    session.TryCancel();
    heartbeats.join();
    return 1;
  }
  for (int r = 1; r <= rounds; ++r) {
    auto [set, refused_set] = FillAndEmpty(stub.get(), a, token);
    const int refused_waits = AbandonedWaits(stub.get(), a, token);
    std::cout << "round " << r << " set " << set << " refused_set " << refused_set << " waits 1000 refused_waits "
              << refused_waits << std::endl;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  done = true;
  session.TryCancel();
  heartbeats.join();
  return 0;
}
