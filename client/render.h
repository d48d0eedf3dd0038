// How shardctl shows things: tables for people, JSON for programs, and the
// live progress line of `watch`.
#pragma once

#include <string>
#include <vector>

#include "shardline/v1/shardline.pb.h"

namespace shardline::ctl {

std::string JsonString(const std::string& s);
std::string JobJson(const v1::Job& j);
std::string WorkerJson(const v1::WorkerInfo& w);

std::string JobsTable(const std::vector<v1::Job>& jobs);
std::string JobDetails(const v1::Job& j);
std::string WorkersTable(const std::vector<v1::WorkerInfo>& workers);
// unit, numel, padded, and each rank's [offset, offset + shard) of the unit.
std::string ShardsTable(const v1::Ownership& o);
std::string ShardsJson(const v1::Ownership& o);

// One line: a bar, step/steps, loss, tokens/s, ETA (from the observed step
// rate; "?" until two steps were seen) and the state.
std::string ProgressLine(const v1::Job& j, double eta_seconds);

}  // namespace shardline::ctl
