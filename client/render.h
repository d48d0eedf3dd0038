// How shardctl shows things: tables for people, JSON for programs, and the
// live progress line of `watch`.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardline/v1/shardline.pb.h"

namespace shardline::ctl {

// JSON for programs, written by nlohmann (ordered: keys as listed).
using Json = nlohmann::ordered_json;
std::string Dump(const Json& j);  // one line, ASCII only (\uXXXX)
Json JobObject(const v1::Job& j);
Json WorkerObject(const v1::WorkerInfo& w);
Json ShardsObject(const v1::Ownership& o);

// A step of the job's running attempt was measured: a resumed job starts at
// its checkpoint's step with no loss or rate yet, shown as "-".
bool HasReportedStep(const v1::Job& j);
std::string JobsTable(const std::vector<v1::Job>& jobs);
std::string JobDetails(const v1::Job& j);
std::string WorkersTable(const std::vector<v1::WorkerInfo>& workers);
// unit, numel, padded, and each rank's [offset, offset + shard) of the unit.
std::string ShardsTable(const v1::Ownership& o);

// One line: a bar, step/steps, loss, tokens/s, ETA (from the observed step
// rate; "?" until two steps were seen) and the state.
std::string ProgressLine(const v1::Job& j, double eta_seconds);

}  // namespace shardline::ctl
