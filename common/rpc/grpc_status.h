// The one mapping between absl::Status (used everywhere inside Shardline) and
// grpc::Status (on the wire). Codes map one to one; messages pass unchanged.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace shardline {

grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

}  // namespace shardline
