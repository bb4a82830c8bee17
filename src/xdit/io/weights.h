// Weight binding: a module declares its parameters by their diffusers names and shapes, then
// finish() checks them all against the checkpoint and reports every problem at once, by name.
//
//   WeightBinder root(*weights);                       // covers every tensor of the source
//   WeightBinder blk = root.scoped("transformer_blocks.0.");
//   blk.declare("attn.to_q.weight", {dim, dim}, &to_q.weight);
//   blk.declare("attn.to_q.bias", {dim}, &to_q.bias, DTypeSet::floating(), /*optional=*/true);
//   root.finish();  // throws one Error listing missing, unexpected, wrong-shape and wrong-dtype tensors
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "xdit/core/dtype.h"
#include "xdit/core/tensor.h"
#include "xdit/io/safetensors.h"

namespace xdit {

// The stored dtypes a parameter may have.
class DTypeSet {
 public:
  constexpr DTypeSet() = default;
  constexpr DTypeSet(std::initializer_list<DType> dtypes) {
    for (DType d : dtypes) bits_ |= bit(d);
  }
  static constexpr DTypeSet floating() {
    return {DType::F32, DType::BF16, DType::F16, DType::F8E4M3, DType::F8E5M2};
  }
  static constexpr DTypeSet integer() { return {DType::I32, DType::I64}; }
  constexpr bool contains(DType d) const { return (bits_ & bit(d)) != 0; }
  std::string str() const;  // "f32|bf16|f16"

 private:
  static constexpr uint32_t bit(DType d) { return uint32_t{1} << static_cast<unsigned>(d); }
  uint32_t bits_ = 0;
};

// Expected shapes may hold -1 for "any size" (e.g. a vocabulary size the config does not give).
struct ParamSpec {
  std::string name;  // full name in the checkpoint
  Shape shape;
  DTypeSet allowed;
  bool optional = false;
  Tensor* target = nullptr;
};

struct BindOptions {
  // When set, floating-point tensors stored in another dtype are converted to it (a copy) instead
  // of being bound as zero-copy views; integer tensors are left as stored. Used for f32 runs.
  std::optional<DType> convert_to;
};

class WeightBinder {
 public:
  // Binds tensors of `source` whose names start with `prefix`. Every tensor under `prefix` must be
  // declared (or ignored), or finish() reports it as unexpected.
  explicit WeightBinder(const TensorSource& source, std::string prefix = {}, BindOptions options = {});

  // A binder for a sub-module; declarations go to the same checklist.
  WeightBinder scoped(std::string_view prefix) const;
  const std::string& prefix() const { return prefix_; }
  const TensorSource& source() const;

  // Declares prefix()+name. `target` must stay valid until finish(), which assigns it (a view of the
  // source in its stored dtype, or a converted copy); an absent optional parameter stays undefined.
  void declare(std::string_view name, Shape shape, Tensor* target, DTypeSet allowed = DTypeSet::floating(),
               bool optional = false);
  // Tensors under prefix()+name_prefix are expected but not used (e.g. a text encoder's LM head).
  void ignore(std::string_view name_prefix);
  // Whether the source holds prefix()+name (to pick a variant of a module before declaring).
  bool has(std::string_view name) const;

  // Checks all declarations made through this binder and its scopes. Throws one Error whose first
  // line is "N weight problems in <source>: ..." followed by one line per problem; on success
  // assigns every target. Call once, on any of the binders.
  void finish();

 private:
  struct State;
  WeightBinder(std::shared_ptr<State> state, std::string prefix);

  std::shared_ptr<State> state_;
  std::string prefix_;
};

}  // namespace xdit
