// Test helpers: seeded random chains and a brute-force search over plans.
//
// The brute force knows nothing of the solvers: it explores op sequences with
// Replay (simulate's own state machine), keyed by the replay state, and finds
// the fastest plan under a budget (Dijkstra on time) or the least peak over all
// plans (Dijkstra on the running peak). Every op sequence simulate accepts is
// reachable, so its answers are the true optima over all valid plans.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <queue>
#include <random>
#include <utility>
#include <vector>

#include "remat/planner.h"

namespace remat::planner::testing {

/// How many times fewer random cases the exhaustive and table tests draw in
/// a sanitizer build (REMAT_SANITIZE: about 12 times slower here): the
/// Release build checks the full counts, the sanitizer build looks for
/// memory and undefined-behaviour errors on the same code paths.
#ifdef REMAT_TEST_SANITIZED
inline constexpr int kCaseDivisor = 10;
#else
inline constexpr int kCaseDivisor = 1;
#endif

/// A chain of 1..max_stages stages with byte sizes in [0, max_bytes] (saved
/// bytes usually >= output bytes), times in (0, 4]. With with_tmp, some
/// stages get transients: forward, recorded forward (record_tmp_bytes), and
/// backward, which is sometimes negative (down to -|x_i|). With
/// with_selective, most stages also get a selective way to run: saved bytes
/// usually between the output and the full record (sometimes more), its own
/// transients, a recomputation time up to the forward's (sometimes 0). With
/// with_parameters, most stages also gather parameters (gathered_bytes) and
/// the chain holds resident bytes, as under sharded training.
inline Chain random_chain(
    std::mt19937_64& rng,
    int64_t max_stages,
    int64_t max_bytes,
    bool with_tmp = true,
    bool with_selective = false,
    bool with_parameters = false) {
  std::uniform_int_distribution<int64_t> count(1, max_stages);
  std::uniform_int_distribution<int64_t> bytes(1, max_bytes);
  std::uniform_int_distribution<int64_t> small(0, max_bytes / 2);
  std::uniform_real_distribution<double> ms(0.05, 4.0);
  std::uniform_real_distribution<double> fraction(0.0, 1.0);
  std::bernoulli_distribution sometimes(0.3);
  const int64_t input = bytes(rng);
  std::vector<StageCost> stages(count(rng));
  int64_t stage_input = input;  // |x_i|
  for (StageCost& s : stages) {
    s.forward_ms = ms(rng);
    s.backward_ms = ms(rng);
    s.output_bytes = bytes(rng);
    s.saved_bytes = s.output_bytes + (sometimes(rng) ? 0 : small(rng));
    if (with_tmp) {
      s.forward_tmp_bytes = sometimes(rng) ? small(rng) : 0;
      s.backward_tmp_bytes = sometimes(rng) ? small(rng) : 0;
      if (sometimes(rng)) {
        s.record_tmp_bytes = small(rng);
      }
      if (sometimes(rng)) {
        s.backward_tmp_bytes = -static_cast<int64_t>(
            fraction(rng) * static_cast<double>(stage_input));
      }
    }
    if (with_selective && !sometimes(rng)) {
      SelectiveCost c;
      std::uniform_int_distribution<int64_t> kept(
          s.output_bytes, std::max(s.output_bytes, s.saved_bytes));
      c.saved_bytes = sometimes(rng) ? bytes(rng) : kept(rng);
      c.forward_tmp_bytes = sometimes(rng) ? small(rng) : 0;
      c.backward_tmp_bytes = sometimes(rng) ? small(rng) : 0;
      if (sometimes(rng)) {
        c.backward_tmp_bytes = -static_cast<int64_t>(
            fraction(rng) * static_cast<double>(stage_input));
      }
      c.recompute_ms = sometimes(rng) ? 0.0 : fraction(rng) * s.forward_ms;
      s.selective = c;
    }
    if (with_parameters && !sometimes(rng)) {
      s.gathered_bytes = small(rng);
    }
    stage_input = s.output_bytes;
  }
  const int64_t resident = with_parameters ? small(rng) : 0;
  return Chain(std::move(stages), input, resident);
}

/// A homogeneous chain: every stage the same.
inline Chain uniform_chain(
    int64_t stages, const StageCost& cost, int64_t input) {
  return Chain(std::vector<StageCost>(stages, cost), input);
}

/// Number of forward ops in `plan`.
inline int64_t forward_count(const Plan& plan) {
  int64_t count = 0;
  for (const Op& op : plan.ops) {
    count += op.kind != OpKind::kBackward ? 1 : 0;
  }
  return count;
}

namespace detail {

inline std::vector<uint8_t> state_key(const Chain& chain, const Replay& r) {
  std::vector<uint8_t> key;
  for (int64_t v = 0; v <= chain.size(); ++v) {
    key.push_back(static_cast<uint8_t>(r.holding(v)));
  }
  for (int64_t i = 0; i < chain.size(); ++i) {
    key.push_back(
        r.recorded_selectively(i) ? 2 : static_cast<uint8_t>(r.recorded(i)));
  }
  key.push_back(static_cast<uint8_t>(r.next_backward_stage() + 1));
  return key;
}

inline std::vector<Op> all_ops(const Chain& chain) {
  std::vector<Op> ops;
  for (int64_t i = 0; i < chain.size(); ++i) {
    for (OpKind kind :
         {OpKind::kForwardNoSave,
          OpKind::kForwardCheckpoint,
          OpKind::kForwardRecord,
          OpKind::kForwardSelective,
          OpKind::kBackward}) {
      ops.push_back({kind, i});
    }
  }
  return ops;
}

// Dijkstra over replay states. `cost` maps a replay to the quantity minimized
// (it must never decrease along a path); states whose peak exceeds
// budget_bytes are pruned. Returns the best finished plan.
template <typename Cost>
std::optional<Plan> search(
    const Chain& chain, int64_t budget_bytes, Cost cost) {
  struct Node {
    Replay replay;
    Plan plan;
  };
  using Entry = std::pair<double, int64_t>;  // cost, node index
  std::vector<Node> nodes;
  std::map<std::vector<uint8_t>, double> settled;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue;
  nodes.push_back({Replay(chain), Plan{}});
  queue.push({cost(nodes[0].replay), 0});
  const std::vector<Op> ops = all_ops(chain);
  while (!queue.empty()) {
    const auto [value, index] = queue.top();
    queue.pop();
    const std::vector<uint8_t> key = state_key(chain, nodes[index].replay);
    if (settled.count(key) != 0) {
      continue;
    }
    settled[key] = value;
    if (nodes[index].replay.finished()) {
      return nodes[index].plan;
    }
    for (const Op& op : ops) {
      Replay next = nodes[index].replay;
      if (!next.apply(op).empty() || next.peak_bytes() > budget_bytes) {
        continue;
      }
      if (settled.count(state_key(chain, next)) != 0) {
        continue;
      }
      Plan plan = nodes[index].plan;
      plan.ops.push_back(op);
      const double next_cost = cost(next);
      nodes.push_back({std::move(next), std::move(plan)});
      queue.push({next_cost, static_cast<int64_t>(nodes.size()) - 1});
    }
  }
  return std::nullopt;
}

}  // namespace detail

/// The fastest valid plan whose peak is <= budget_bytes, by exhaustive search.
inline std::optional<Plan> brute_force_fastest(
    const Chain& chain, int64_t budget_bytes) {
  return detail::search(
      chain, budget_bytes, [](const Replay& r) { return r.time_ms(); });
}

/// The least peak over all valid plans, by exhaustive search.
inline int64_t brute_force_min_peak(const Chain& chain) {
  std::optional<Plan> plan =
      detail::search(chain, INT64_MAX, [](const Replay& r) {
        return static_cast<double>(r.peak_bytes());
      });
  return simulate(chain, *plan).peak_bytes;
}

}  // namespace remat::planner::testing
