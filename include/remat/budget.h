// remat/budget.h: a memory budget for activations, or for the whole step.
//
// A budget is none, a number of bytes, a fraction of the store-all peak, or
// a total. 100% -- the store-all peak -- is what planner::simulate()
// predicts for planner::solve_store_all() on the chain profile_chain()
// measured: the activation peak of a training step without checkpointing,
// the chain input included. Every budget but a total counts those same bytes
// (simulate()'s units); the loss computed from the chain output is outside
// the chain and not counted. A chain's resident bytes
// (Chain::resident_bytes: under sharded training, the parameter shards and
// their gradients) are in every plan's peak, so a fraction scales only the
// rest: resident + fraction * (peak - resident).
//
// A total budget is the memory of the whole step: the chain's model state
// (planner::ModelState: parameters, gradients and optimizer state, which no
// plan changes) plus the activations and input. It resolves to the total
// minus the model state, so a user can give the memory of their device
// minus a margin.
#pragma once

#include <cstdint>
#include <string>

#include "remat/planner/chain.h"
#include "remat/planner/graph.h"

namespace remat {

/// A memory budget for activations (see the top of this header). Values are
/// made only by the validating constructors below; the default is none.
///
/// Example:
// clang-format off
///   auto net = remat::auto_checkpoint(model, sample, Budget::parse("50%"));
///   auto tight = remat::auto_checkpoint(model, sample, Budget::bytes(64 << 20));
// clang-format on
struct Budget {
 public:
  enum class Kind {
    kNone,      ///< no limit: keep everything (no checkpointing)
    kBytes,     ///< an absolute number of bytes
    kFraction,  ///< a fraction of the store-all peak
    kTotal,     ///< bytes of the whole step, model state included
  };

  /// No budget (the default).
  Budget() = default;
  /// No budget: resolves to the store-all peak.
  static Budget none();
  /// An absolute budget. Throws c10::Error unless budget_bytes > 0.
  static Budget bytes(int64_t budget_bytes);
  /// `fraction` of the store-all peak. Throws c10::Error unless
  /// 0 < fraction <= 1.
  static Budget fraction(double fraction);
  /// A total budget: `total_bytes` for the whole step, the chain's model
  /// state included. Throws c10::Error unless total_bytes > 0.
  static Budget total(int64_t total_bytes);
  /// Parses the text form users type (case-insensitive; blanks around the
  /// number and unit are allowed):
  ///   "none"
  ///   a percentage of the store-all peak in (0%, 100%]:   "50%", "12.5%"
  ///   bytes, a whole positive number after scaling, <= 1 EiB: "1000000",
  ///     "300MB" (B, KB, MB, GB, TB: powers of 1000), "512MiB", "1.5GiB"
  ///     (KiB, MiB, GiB, TiB: powers of 1024)
  ///   a total: "total:" and bytes as above: "total:16GiB"
  /// Throws c10::Error naming the text received and what was expected, e.g.
  /// for "10XB": ... got '10XB' (unknown unit 'XB'; ...)
  static Budget parse(const std::string& text);

  Kind kind() const {
    return kind_;
  }
  bool is_none() const {
    return kind_ == Kind::kNone;
  }
  bool is_fraction() const {
    return kind_ == Kind::kFraction;
  }
  bool is_total() const {
    return kind_ == Kind::kTotal;
  }
  /// The bytes of a Kind::kBytes or Kind::kTotal budget; 0 otherwise.
  int64_t budget_bytes() const {
    return bytes_;
  }
  /// The fraction of a Kind::kFraction budget (0.5 for "50%"); 0 otherwise.
  double budget_fraction() const {
    return fraction_;
  }

  /// The budget in bytes for `chain`: the bytes; for a fraction f,
  /// resident + f * (store-all peak - resident) rounded down (at least 1),
  /// resident = chain.resident_bytes() (0 unless sharded); the store-all
  /// peak for none; for a total, the total minus
  /// chain.model_state().total_bytes(). Throws c10::Error, naming both, if
  /// a total is not above the model state.
  int64_t resolve_bytes(const planner::Chain& chain) const;
  /// The same for a graph (remat/planner/graph.h): the store-all peak is
  /// planner::simulate(graph, planner::solve_store_all(graph)); a graph has
  /// no resident bytes.
  int64_t resolve_bytes(const planner::Graph& graph) const;
  /// "none", "50% of the store-all peak", "512 MiB (536870912 bytes)" or
  /// "total 16.0 GiB (17179869184 bytes) with the model state".
  std::string to_string() const;

  bool operator==(const Budget& other) const {
    return kind_ == other.kind_ && bytes_ == other.bytes_ &&
           fraction_ == other.fraction_;
  }
  bool operator!=(const Budget& other) const {
    return !(*this == other);
  }

 private:
  Kind kind_ = Kind::kNone;
  int64_t bytes_ = 0;
  double fraction_ = 0;
};

}  // namespace remat
