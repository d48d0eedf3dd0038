#include "client/coordinator_client.h"

#include <chrono>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/base/quoted.h"
#include "common/base/status_macros.h"
#include "common/rpc/grpc_status.h"

namespace shardline::ctl {

absl::StatusOr<Client> Client::Connect(const Options& o) {
  Client c;
  c.json_ = o.json;
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!o.tls_ca.empty()) {
    grpc::SslCredentialsOptions ssl;
    SL_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadFileToString(o.tls_ca, "CA certificate"));
    creds = grpc::SslCredentials(ssl);
  }
  if (!o.token_file.empty()) {
    SL_ASSIGN_OR_RETURN(c.token_, ReadTokenFile(o.token_file));
  }
  c.token_file_ = o.token_file;
  c.stub_ = v1::Coordinator::NewStub(grpc::CreateChannel(o.coordinator, creds));
  c.address_ = o.coordinator;
  return c;
}

void Client::Prepare(grpc::ClientContext* ctx, absl::Duration deadline) const {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(absl::ToInt64Milliseconds(deadline)));
  if (!token_.empty()) ctx->AddMetadata("authorization", "Bearer " + token_);
}

absl::Status Client::Check(const grpc::Status& s) const {
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return absl::UnavailableError(absl::StrCat("coordinator ", address_, " unavailable: ", s.error_message()));
  }
  // Say where a token comes from, or which one was refused.
  if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    return absl::UnauthenticatedError(absl::StrCat(
        "coordinator ", address_, ": ", s.error_message(),
        token_.empty() ? "; shardctl sent none: pass --token-file FILE or set SHARDLINE_TOKEN_FILE"
                       : absl::StrCat("; sent the token of ", Printable(token_file_))));
  }
  return FromGrpcStatus(s);
}

absl::StatusOr<v1::Job> FetchJob(const Client& c, const std::string& id, bool history) {
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  v1::GetJobRequest r;
  r.set_job_id(id);
  r.set_history(history);
  v1::Job j;
  SL_RETURN_IF_ERROR(c.Check(c.stub()->GetJob(&ctx, r, &j)));
  return j;
}

void PrependLineage(const Client& c, v1::Job& j, std::string* note) {
  constexpr int kMaxLineage = 64;  // jobs back: bounds the calls and the records held
  std::vector<v1::StepRecord> before;
  std::set<std::string> seen = {j.id()};
  std::string parent = j.resumed_from_job();
  int64_t upto = j.resumed_from_step();
  for (int hops = 0; !parent.empty() && hops < kMaxLineage && seen.insert(parent).second; ++hops) {
    absl::StatusOr<v1::Job> p = FetchJob(c, parent, /*history=*/true);
    if (!p.ok()) {
      *note = absl::StrCat("history before step ", upto, " not shown: ", parent, ": ", p.status().message());
      break;
    }
    std::vector<v1::StepRecord> part;
    for (const v1::StepRecord& s : p->history()) {
      if (s.step() <= upto) part.push_back(s);
    }
    before.insert(before.begin(), part.begin(), part.end());
    parent = p->resumed_from_job();
    upto = p->resumed_from_step();
  }
  if (before.empty()) return;
  google::protobuf::RepeatedPtrField<v1::StepRecord> all(before.begin(), before.end());
  for (const v1::StepRecord& s : j.history()) *all.Add() = s;
  j.mutable_history()->Swap(&all);
}

}  // namespace shardline::ctl
