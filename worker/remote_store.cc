#include "worker/remote_store.h"

#include <stdexcept>

#include "absl/strings/str_cat.h"

namespace shardline {

RemoteStore::RemoteStore(std::shared_ptr<grpc::Channel> channel, std::string token, std::string credential,
                         std::string prefix, std::chrono::milliseconds timeout)
    : c10d::Store(timeout),
      channel_(std::move(channel)),
      stub_(v1::Coordinator::NewStub(channel_)),
      token_(std::move(token)),
      credential_(std::move(credential)),
      prefix_(std::move(prefix)) {}

c10::intrusive_ptr<c10d::Store> RemoteStore::clone() {
  return c10::make_intrusive<RemoteStore>(channel_, token_, credential_, prefix_, timeout_);
}

void RemoteStore::Prepare(grpc::ClientContext* ctx, std::chrono::milliseconds wait) const {
  // Every RPC has a deadline: the wait it carries plus a margin for the trip.
  ctx->set_deadline(std::chrono::system_clock::now() + wait + std::chrono::seconds(10));
  if (!token_.empty()) ctx->AddMetadata("authorization", "Bearer " + token_);
  ctx->AddMetadata("x-shardline-credential", credential_);
}

void RemoteStore::Check(const grpc::Status& s, const char* op, const std::string& key) const {
  if (s.ok()) return;
  throw std::runtime_error(absl::StrCat("coordinator store ", op, " ", prefix_, key, ": ", s.error_message()));
}

void RemoteStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::StoreSetRequest req;
  req.set_key(prefix_ + key);
  req.set_value(std::string(value.begin(), value.end()));
  v1::StoreSetResponse resp;
  Check(stub_->StoreSet(&ctx, req, &resp), "set", key);
}

std::vector<uint8_t> RemoteStore::compareSet(const std::string& key, const std::vector<uint8_t>&,
                                             const std::vector<uint8_t>&) {
  throw std::runtime_error(absl::StrCat("coordinator store: compareSet of ", key, " is not supported"));
}

std::vector<uint8_t> RemoteStore::get(const std::string& key) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout_);
  v1::StoreGetRequest req;
  req.set_key(prefix_ + key);
  req.set_timeout_ms(timeout_.count());
  v1::StoreGetResponse resp;
  Check(stub_->StoreGet(&ctx, req, &resp), "get", key);
  return std::vector<uint8_t>(resp.value().begin(), resp.value().end());
}

int64_t RemoteStore::add(const std::string& key, int64_t value) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::StoreAddRequest req;
  req.set_key(prefix_ + key);
  req.set_delta(value);
  v1::StoreAddResponse resp;
  Check(stub_->StoreAdd(&ctx, req, &resp), "add", key);
  return resp.value();
}

bool RemoteStore::deleteKey(const std::string& key) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::StoreDeleteRequest req;
  req.set_key(prefix_ + key);
  v1::StoreDeleteResponse resp;
  Check(stub_->StoreDelete(&ctx, req, &resp), "delete", key);
  return resp.deleted();
}

bool RemoteStore::check(const std::vector<std::string>& keys) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  v1::StoreCheckRequest req;
  for (const auto& k : keys) req.add_keys(prefix_ + k);
  v1::StoreCheckResponse resp;
  Check(stub_->StoreCheck(&ctx, req, &resp), "check", keys.empty() ? "" : keys[0]);
  return resp.ready();
}

int64_t RemoteStore::getNumKeys() {
  throw std::runtime_error("coordinator store: getNumKeys is not supported");
}

void RemoteStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void RemoteStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout);
  v1::StoreWaitRequest req;
  for (const auto& k : keys) req.add_keys(prefix_ + k);
  req.set_timeout_ms(timeout.count());
  v1::StoreWaitResponse resp;
  Check(stub_->StoreWait(&ctx, req, &resp), "wait", keys.empty() ? "" : keys[0]);
}

}  // namespace shardline
