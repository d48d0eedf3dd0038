// TensorBoard event files from a job's history: `shardctl status JOB
// --history --tensorboard DIR` writes one file TensorBoard reads (no network,
// unlike W&B and MLflow), its scalars under shardline/: loss, val_loss, lr,
// grad_norm, tokens_per_second and epoch, one point per recorded step.
//
// Format: TensorFlow's record file (per record: uint64 length, its masked
// CRC-32C, the bytes, their masked CRC-32C; all little-endian) of Event
// protos (tensorflow/core/util/event.proto): a first event with
// file_version "brain.Event:2", then one Event{wall_time, step,
// summary{value{tag, simple_value}}} per scalar. The few fields are encoded
// here by hand rather than by compiling TensorFlow's protos into the build.
// No C++ CRC-32C is packaged in Debian 12 (absl's arrives in 20230125), so
// the table-driven one is here too.
//
// The file is written whole to a temporary name and renamed into DIR (which
// is created); errors name the file.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "shardline/v1/shardline.pb.h"

namespace shardline::ctl {

// CRC-32C (Castagnoli, reflected 0x82F63B78) of `data`.
uint32_t Crc32c(absl::string_view data);

// The events file's path on success.
absl::StatusOr<std::string> WriteTensorBoardEvents(const std::string& dir, const v1::Job& job);

}  // namespace shardline::ctl
