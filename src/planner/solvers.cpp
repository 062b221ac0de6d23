// The simple solvers: store-all, uniform segments (checkpoint_sequential),
// sqrt(L) segments and Chen et al.'s greedy segmentation with budget search.
//
// All of them build "segment plans": the chain is cut into consecutive
// segments; every segment but the last keeps only its input (kForwardCheckpoint
// on its first stage, kForwardNoSave on the rest) during the first forward;
// the last segment is recorded right away. Backward walks the segments from the
// last: a segment that was not recorded is re-run with kForwardRecord, then
// its backwards run. This is exactly torch's checkpoint_sequential schedule.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "remat/planner/simulate.h"
#include "remat/planner/solvers.h"

namespace remat::planner {
namespace {

// REQUIRES: starts[0] == 0, strictly increasing, all < chain.size().
Plan segment_plan(const Chain& chain, const std::vector<int64_t>& starts) {
  const int64_t n = chain.size();
  REMAT_PLANNER_CHECK(
      !starts.empty() && starts.front() == 0 && starts.back() < n &&
          std::adjacent_find(
              starts.begin(), starts.end(), std::greater_equal<>()) ==
              starts.end(),
      "segment starts must rise from 0 within the chain");
  const int64_t segments = static_cast<int64_t>(starts.size());
  auto segment_end = [&](int64_t k) {
    return k + 1 < segments ? starts[k + 1] : n;
  };
  Plan plan;
  for (int64_t k = 0; k + 1 < segments; ++k) {
    plan.ops.push_back({OpKind::kForwardCheckpoint, starts[k]});
    for (int64_t i = starts[k] + 1; i < segment_end(k); ++i) {
      plan.ops.push_back({OpKind::kForwardNoSave, i});
    }
  }
  for (int64_t k = segments - 1; k >= 0; --k) {
    for (int64_t i = starts[k]; i < segment_end(k); ++i) {
      plan.ops.push_back({OpKind::kForwardRecord, i});
    }
    for (int64_t i = segment_end(k) - 1; i >= starts[k]; --i) {
      plan.ops.push_back({OpKind::kBackward, i});
    }
  }
  return plan;
}

void check_budget(const char* function, int64_t budget_bytes) {
  if (budget_bytes <= 0) {
    throw std::invalid_argument(
        std::string("remat::planner::") + function +
        ": budget_bytes: expected > 0, got " + std::to_string(budget_bytes));
  }
}

}  // namespace

Plan solve_store_all(const Chain& chain) {
  return segment_plan(chain, {0});
}

Plan solve_uniform(const Chain& chain, int64_t segments) {
  if (segments < 1) {
    throw std::invalid_argument(
        "remat::planner::solve_uniform: segments: expected >= 1, got " +
        std::to_string(segments));
  }
  const int64_t n = chain.size();
  segments = std::min(segments, n);
  const int64_t segment_size = n / segments;
  std::vector<int64_t> starts;
  for (int64_t k = 0; k < segments; ++k) {
    starts.push_back(k * segment_size);
  }
  return segment_plan(chain, starts);
}

Plan solve_sqrt(const Chain& chain) {
  const double root = std::sqrt(static_cast<double>(chain.size()));
  return solve_uniform(
      chain, std::max<int64_t>(1, static_cast<int64_t>(std::llround(root))));
}

std::optional<Plan> solve_chen_greedy(
    const Chain& chain, int64_t budget_bytes) {
  check_budget("solve_chen_greedy", budget_bytes);
  const int64_t n = chain.size();
  int64_t total_saved = 0;
  int64_t max_saved = 0;
  for (const StageCost& s : chain.stages()) {
    total_saved += s.saved_bytes;
    max_saved = std::max(max_saved, s.saved_bytes);
  }
  // Candidate thresholds: a geometric and a linear grid from the largest
  // single stage to the whole chain (Chen et al. search the threshold too).
  std::vector<int64_t> thresholds = {total_saved};
  constexpr int kGridPoints = 128;
  const double low = std::max<double>(1.0, static_cast<double>(max_saved));
  const double high = std::max<double>(low, static_cast<double>(total_saved));
  for (int k = 0; k <= kGridPoints; ++k) {
    const double t = static_cast<double>(k) / kGridPoints;
    thresholds.push_back(static_cast<int64_t>(low * std::pow(high / low, t)));
    thresholds.push_back(static_cast<int64_t>(low + (high - low) * t));
  }
  std::sort(thresholds.begin(), thresholds.end());
  thresholds.erase(
      std::unique(thresholds.begin(), thresholds.end()), thresholds.end());

  std::optional<Plan> best;
  Simulation best_sim;
  std::vector<int64_t> last_starts;
  for (int64_t threshold : thresholds) {
    std::vector<int64_t> starts = {0};
    int64_t segment_bytes = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t saved = chain.stage(i).saved_bytes;
      if (i > starts.back() && segment_bytes + saved > threshold) {
        starts.push_back(i);
        segment_bytes = 0;
      }
      segment_bytes += saved;
    }
    if (starts == last_starts) {
      continue;
    }
    last_starts = starts;
    Plan plan = segment_plan(chain, starts);
    Simulation sim = simulate(chain, plan);
    if (!sim.valid || sim.peak_bytes > budget_bytes) {
      continue;
    }
    if (!best || sim.time_ms < best_sim.time_ms ||
        (sim.time_ms == best_sim.time_ms &&
         sim.peak_bytes < best_sim.peak_bytes)) {
      best = std::move(plan);
      best_sim = sim;
    }
  }
  return best;
}

}  // namespace remat::planner
