// chain_model.h (private): the chains (or graphs) of a model profiled at a
// few sizes, and the modelled chain (graph) at any size, for fit_size and
// fit_batch (step 1 of NOTE: [Fitting a size] in fit.cpp). A chain is held
// as its graph (planner::graph_of): one model for both; the structure (each
// stage's inputs) is the first profile's, and every profile has it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

#include "remat/planner/chain.h"
#include "remat/planner/graph.h"

namespace remat::detail {

/// The graphs profiled at a few sizes, and the graph at any size on the
/// polynomial through them (degree: one less than the number of profiles,
/// 1 to 3 of them at distinct sizes; one profile is a constant, exact at its
/// own size only).
class ChainModel {
 public:
  ChainModel(std::vector<int64_t> sizes, std::vector<planner::Graph> graphs)
      : sizes_(std::move(sizes)), profiles_(std::move(graphs)) {
    TORCH_INTERNAL_ASSERT(
        !sizes_.empty() && sizes_.size() <= 3 &&
        sizes_.size() == profiles_.size());
    for (size_t k = 0; k < sizes_.size(); ++k) {
      for (size_t j = 0; j < k; ++j) {
        TORCH_INTERNAL_ASSERT(sizes_[j] != sizes_[k]);
      }
    }
  }

  /// The model with `graph`, profiled at `size`, in place of the profile
  /// farthest from it (or of the one at that size).
  ChainModel with(int64_t size, const planner::Graph& graph) const {
    size_t farthest = 0;
    for (size_t k = 0; k < sizes_.size(); ++k) {
      if (sizes_[k] == size) {
        farthest = k;
        break;
      }
      if (std::abs(sizes_[k] - size) > std::abs(sizes_[farthest] - size)) {
        farthest = k;
      }
    }
    ChainModel result = *this;
    result.sizes_[farthest] = size;
    result.profiles_[farthest] = graph;
    return result;
  }

  /// The modelled graph at `size`, with the profiles' structure;
  /// std::nullopt where the modelled bytes are too large for a
  /// planner::Graph (a size far beyond any memory: no cap fits it).
  std::optional<planner::Graph> at(int64_t size) const {
    auto time = [&](auto field) { return std::max(0.0, value(field, size)); };
    // Every byte field, twice (the graph's byte total weighs some twice),
    // must stay well below the graph's limit (INT64_MAX / 4), and the cast
    // to int64_t must be defined.
    constexpr double kByteLimit = 0x1p59;
    double byte_total = 0;
    bool too_large = false;
    auto bytes = [&](auto field, int64_t floor) -> int64_t {
      const double modelled = std::ceil(value(field, size));
      if (!(std::abs(modelled) <= kByteLimit)) {  // NaN too
        too_large = true;
        return floor;
      }
      byte_total += 2 * std::abs(modelled);
      return std::max<int64_t>(floor, static_cast<int64_t>(modelled));
    };
    const planner::Graph& structure = profiles_.front();
    const int64_t input_bytes = bytes(
        [](const planner::Graph& c) {
          return static_cast<double>(c.input_bytes());
        },
        0);
    std::vector<planner::StageCost> stages;
    // |x_v| of the modelled values: a backward transient is at least minus
    // the gradients of its stage's distinct inputs (planner::Graph).
    std::vector<int64_t> value_bytes{input_bytes};
    for (int64_t i = 0; i < structure.size(); ++i) {
      auto field = [i](auto member) {
        return [i, member](const planner::Graph& c) {
          return static_cast<double>(member(c.stage(i)));
        };
      };
      int64_t inputs_bytes = 0;
      for (const int64_t value : structure.input_values(i)) {
        inputs_bytes += value_bytes[static_cast<size_t>(value)];
      }
      planner::StageCost cost;
      cost.forward_ms =
          time(field([](const planner::StageCost& s) { return s.forward_ms; }));
      cost.backward_ms = time(
          field([](const planner::StageCost& s) { return s.backward_ms; }));
      cost.output_bytes = bytes(
          field([](const planner::StageCost& s) { return s.output_bytes; }), 0);
      cost.saved_bytes = bytes(
          field([](const planner::StageCost& s) { return s.saved_bytes; }), 0);
      cost.forward_tmp_bytes = bytes(
          field(
              [](const planner::StageCost& s) { return s.forward_tmp_bytes; }),
          0);
      cost.record_tmp_bytes = bytes(
          field(
              [](const planner::StageCost& s) { return s.record_transient(); }),
          0);
      cost.backward_tmp_bytes = bytes(
          field(
              [](const planner::StageCost& s) { return s.backward_tmp_bytes; }),
          -inputs_bytes);
      const bool selective = std::all_of(
          profiles_.begin(), profiles_.end(), [i](const planner::Graph& c) {
            return c.stage(i).selective.has_value();
          });
      if (selective) {
        auto part = [&field](auto member) {
          return field([member](const planner::StageCost& s) {
            return member(*s.selective);
          });
        };
        planner::SelectiveCost costs;
        costs.saved_bytes = bytes(
            part([](const planner::SelectiveCost& s) { return s.saved_bytes; }),
            0);
        costs.forward_tmp_bytes = bytes(
            part([](const planner::SelectiveCost& s) {
              return s.forward_tmp_bytes;
            }),
            0);
        costs.backward_tmp_bytes = bytes(
            part([](const planner::SelectiveCost& s) {
              return s.backward_tmp_bytes;
            }),
            -inputs_bytes);
        costs.recompute_ms = time(part(
            [](const planner::SelectiveCost& s) { return s.recompute_ms; }));
        cost.selective = costs;
      }
      value_bytes.push_back(cost.output_bytes);
      stages.push_back(cost);
    }
    std::vector<std::vector<int64_t>> inputs;
    for (int64_t i = 0; i < structure.size(); ++i) {
      inputs.push_back(structure.inputs(i));
    }
    // A machine's cost, not the size's: the mean of the profiles'.
    double cold_write_ms_per_mib = 0;
    for (const planner::Graph& profile : profiles_) {
      cold_write_ms_per_mib += profile.cold_write_ms_per_mib();
    }
    cold_write_ms_per_mib /= static_cast<double>(profiles_.size());
    if (too_large || byte_total > kByteLimit) {
      return std::nullopt;
    }
    return planner::Graph(std::move(stages), std::move(inputs), input_bytes)
        .with_cold_write_ms_per_mib(cold_write_ms_per_mib);
  }

 private:
  /// `field` of the profiled chains, taken to `size` on the polynomial
  /// through them. Newton's form: f0 [+ (f1 - f0) (n - n0) / (n1 - n0)
  /// [+ (n - n0) (n - n1) f[n0, n1, n2]]].
  template <typename Field>
  double value(const Field& field, int64_t size) const {
    auto at = [&](size_t k) { return field(profiles_[k]); };
    auto n = [&](size_t k) { return static_cast<double>(sizes_[k]); };
    const double x = static_cast<double>(size);
    if (sizes_.size() == 1) {
      return at(0);
    }
    const double f0 = at(0), f1 = at(1);
    double result = f0 + (f1 - f0) * (x - n(0)) / (n(1) - n(0));
    if (sizes_.size() == 3) {
      const double slope01 = (f1 - f0) / (n(1) - n(0));
      const double slope12 = (at(2) - f1) / (n(2) - n(1));
      result += (x - n(0)) * (x - n(1)) * (slope12 - slope01) / (n(2) - n(0));
    }
    return result;
  }

  std::vector<int64_t> sizes_;
  std::vector<planner::Graph> profiles_;  // a chain as its graph
};

}  // namespace remat::detail
