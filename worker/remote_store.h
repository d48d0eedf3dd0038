// RemoteStore: c10d's Store interface over the coordinator's rendezvous RPCs,
// so the engine's communicators bootstrap through the coordinator (Gloo's
// store, NCCL's unique id) with no file store and no extra port. Every call
// carries a deadline; a wait that outlives its timeout throws, as c10d stores
// do (c10d's contract is exceptions; callers turn them into Status).
#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "shardline/v1/shardline.grpc.pb.h"

namespace shardline {

class RemoteStore : public c10d::Store {
 public:
  // `credential` is the rank's Assignment.credential; every key is put
  // under `prefix` (the job's namespace, "<job id>/").
  RemoteStore(std::shared_ptr<grpc::Channel> channel, std::string token, std::string credential, std::string prefix,
              std::chrono::milliseconds timeout);

  c10::intrusive_ptr<c10d::Store> clone() override;
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  void Prepare(grpc::ClientContext* ctx, std::chrono::milliseconds wait = std::chrono::milliseconds(0)) const;
  void Check(const grpc::Status& s, const char* op, const std::string& key) const;

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  const std::string token_, credential_, prefix_;
};

}  // namespace shardline
