// SeededUnitValues: a unit's initial values when a job reads no weights, a
// function of (seed, parameter name) alone, never of world size, rank or the
// order of init, produced range by range so that a rank loading a unit never
// holds it whole in fp32 (the tied vocabulary table of a 4B model is 1.5 GB
// in fp32).
//
// Each parameter draws from its own CPU generator seeded by (seed, name), as
// one call of normal_ / uniform_ over the whole parameter would: the values
// are produced in pieces of whole 16-element blocks (ATen's CPU normal_
// fills 16 at a time from uniforms drawn in order, and redraws the last 16
// of a length not divisible by 16; a piece never ends inside the last 16),
// bitwise equal to the whole call (seeded_init_test holds it).
// Not thread-safe: one loader thread.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/ATen.h>

#include "common/model/shard_layout.h"

namespace shardline {

// How one parameter starts.
struct ParamInit {
  enum class Kind { kZero, kOnes, kNormal, kUniform };
  Kind kind = Kind::kZero;
  double scale = 0;  // kNormal: N(0, scale); kUniform: U(-scale, scale)
};
using ParamInitOf = std::function<ParamInit(const ParamSpec&)>;

// PEFT's initialisation of adapters (model::AdapterParams): lora_A
// Kaiming-uniform with a = sqrt(5), that is U(-1/sqrt(in), 1/sqrt(in)) as
// nn.Linear's default; lora_B zero.
ParamInit AdapterInitOf(const ParamSpec& p);

class SeededUnitValues {
 public:
  // Elements of a piece of a parameter's generated values: a multiple of 16.
  static constexpr int64_t kPiece = int64_t{4} << 20;

  SeededUnitValues(ShardLayout layout, uint64_t seed, ParamInitOf init_of);

  // Writes the unit's flat [begin, begin + out.numel()) (layout order, the
  // padding zero) into `out` (fp32, contiguous, host). Each parameter's
  // generator runs forward: ranges in increasing order cost one pass over
  // the parameters they reach; a range before one already produced starts
  // that parameter's generator again.
  void Fill(int64_t begin, at::Tensor out);

 private:
  // One parameter's generator and the piece of its values it produced last.
  struct Stream {
    at::Generator generator;
    at::Tensor piece;          // fp32, the values [piece_begin, piece_begin + piece.numel())
    int64_t piece_begin = 0;
    int64_t next = 0;          // where the generator's next piece begins
  };
  void Restart(size_t i);
  // Advances parameter i's stream to the piece that holds element `at`.
  const Stream& PieceHolding(size_t i, int64_t at);

  const ShardLayout layout_;
  const uint64_t seed_;
  std::vector<ParamInit> inits_;
  std::vector<Stream> streams_;
};

}  // namespace shardline
