// Client: shardctl's connection to the coordinator: the channel (TLS where a
// CA is given), the bearer token, a deadline on every call, and gRPC errors
// turned into one line that says which coordinator and which token. Plus
// the job reads several commands share. Not thread-safe; one per process.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "shardline/v1/shardline.grpc.pb.h"

namespace shardline::ctl {

// The global flags (and their SHARDLINE_* variables).
struct Options {
  std::string coordinator, token_file, tls_ca;
  bool json = false;
};

class Client {
 public:
  // Reads the token file (an error names it); connects lazily.
  static absl::StatusOr<Client> Connect(const Options& o);
  // Every call has a deadline; `watch` gets a long one (jobs run for days).
  void Prepare(grpc::ClientContext* ctx, absl::Duration deadline = absl::Seconds(15)) const;
  absl::Status Check(const grpc::Status& s) const;

  v1::Coordinator::Stub* stub() const { return stub_.get(); }
  bool json() const { return json_; }

 private:
  std::shared_ptr<v1::Coordinator::Stub> stub_;
  std::string token_, token_file_, address_;
  bool json_ = false;
};

absl::StatusOr<v1::Job> FetchJob(const Client& c, const std::string& id, bool history = false);

// One history across resumes: the steps of the jobs `j` resumed from
// (Job.resumed_from_job), each up to the checkpoint the next one started at,
// put before j's own. At most 64 jobs back; a job that no longer reads
// (forgotten, another user's) ends the chain and `note` says so.
void PrependLineage(const Client& c, v1::Job& j, std::string* note);

}  // namespace shardline::ctl
