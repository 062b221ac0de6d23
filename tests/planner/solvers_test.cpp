// Solvers: exact schedules of the simple ones, homogeneous chains against an
// independent recursion, and properties over seeded random chains.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <tuple>

#include "test_chains.h"

namespace remat::planner {
namespace {

using testing::brute_force_fastest;
using testing::forward_count;
using testing::random_chain;

Chain unit_chain(int64_t stages) {
  return testing::uniform_chain(stages, StageCost{1, 0, 1, 1}, 1);
}

TEST(SolveUniform, FollowsCheckpointSequential) {
  const Chain chain = unit_chain(5);
  // 5 / 2 = 2 per segment; the last segment takes stages 2..4 and is recorded.
  EXPECT_EQ(
      solve_uniform(chain, 2).to_string(),
      "C0 N1 R2 R3 R4 B4 B3 B2 R0 R1 B1 B0");
  EXPECT_EQ(solve_uniform(chain, 1), solve_store_all(chain));
  EXPECT_EQ(solve_uniform(chain, 9), solve_uniform(chain, 5));
  EXPECT_EQ(solve_sqrt(unit_chain(9)), solve_uniform(unit_chain(9), 3));
  EXPECT_THROW(solve_uniform(chain, 0), std::invalid_argument);
}

TEST(Solvers, RejectBudgetsThatAreNotPositive) {
  const Chain chain = unit_chain(3);
  for (int64_t budget : {0, -5}) {
    try {
      solve_optimal(chain, budget);
      FAIL();
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("budget_bytes"), std::string::npos);
      EXPECT_NE(
          std::string(e.what()).find(std::to_string(budget)),
          std::string::npos);
    }
    EXPECT_THROW(solve_chen_greedy(chain, budget), std::invalid_argument);
  }
  EXPECT_THROW(solve_optimal(chain, 100, {0}), std::invalid_argument);
}

// Least number of forwards for n unit stages (output = saved = input = 1
// byte, no transients) with m bytes free beyond x_0; `last`: no gradient is
// pending during the forwards (the segment ends at the chain output). Written
// from the memory model directly, independent of the library's DP.
int64_t least_forwards(
    int64_t n,
    int64_t m,
    bool last,
    std::map<std::tuple<int64_t, int64_t, bool>, int64_t>& memo) {
  constexpr int64_t kNever = 1 << 30;
  const int64_t pending = last ? 0 : 1;
  if (m < 0) {
    return kNever;
  }
  auto key = std::make_tuple(n, m, last);
  if (auto it = memo.find(key); it != memo.end()) {
    return it->second;
  }
  int64_t best = kNever;
  // Record the first stage: its record (1) with the pending gradient, then
  // its backward with record, incoming and outgoing gradient (3).
  if (m >= std::max<int64_t>(pending + 1, 3)) {
    best = n == 1 ? 1 : 1 + least_forwards(n - 1, m - 1, last, memo);
  }
  // Run k stages without keeping anything but x_k (the loose value being
  // read plus the one produced: 2 once past the first stage), keep x_k for
  // the rest, then redo the first k stages with x_k's gradient pending.
  for (int64_t k = 1; k < n; ++k) {
    if (m < pending + (k >= 2 ? 2 : 1)) {
      continue;
    }
    const int64_t rest = least_forwards(n - k, m - 1, last, memo);
    const int64_t head = least_forwards(k, m, false, memo);
    best = std::min(best, k + rest + head);
  }
  memo[key] = std::min(best, kNever);
  return memo[key];
}

TEST(SolveOptimal, CountsTheLeastForwardsOnHomogeneousChains) {
  std::map<std::tuple<int64_t, int64_t, bool>, int64_t> memo;
  for (int64_t n = 1; n <= 24; ++n) {
    const Chain chain = unit_chain(n);
    const int64_t low = min_feasible_budget_bytes(chain);
    const int64_t high = simulate(chain, solve_store_all(chain)).peak_bytes;
    for (int64_t budget = low; budget <= high; ++budget) {
      SCOPED_TRACE(
          "stages " + std::to_string(n) + ", budget " + std::to_string(budget));
      std::optional<Plan> plan = solve_optimal(chain, budget, {budget});
      ASSERT_TRUE(plan.has_value());
      ASSERT_TRUE(simulate(chain, *plan).valid);
      const int64_t expected = least_forwards(n, budget - 1, true, memo);
      EXPECT_EQ(forward_count(*plan), expected) << plan->to_string();
      if (n <= 5) {
        EXPECT_EQ(forward_count(*brute_force_fastest(chain, budget)), expected);
      }
    }
    EXPECT_FALSE(solve_optimal(chain, low - 1, {low}).has_value());
  }
}

void expect_valid_within(
    const Chain& chain, const Plan& plan, int64_t budget_bytes) {
  const Simulation sim = simulate(chain, plan);
  ASSERT_TRUE(sim.valid) << sim.error << " in " << plan.to_string();
  EXPECT_LE(sim.peak_bytes, budget_bytes) << plan.to_string();
}

TEST(Solvers, HoldTheirPropertiesOnRandomChains) {
  constexpr uint64_t kBaseSeed = 77001;
  for (int c = 0; c < 40; ++c) {
    const uint64_t seed = kBaseSeed + c;
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const Chain chain = random_chain(rng, 14, 20);
    const int64_t n = chain.size();
    const Simulation store_all = simulate(chain, solve_store_all(chain));
    ASSERT_TRUE(store_all.valid);
    const int64_t low = min_feasible_budget_bytes(chain);
    ASSERT_LE(low, store_all.peak_bytes);

    // Exact slots (one byte each): time non-increasing in the budget,
    // nothing recomputed from the store-all peak on.
    double previous_ms = std::numeric_limits<double>::infinity();
    for (int64_t budget = low; budget <= store_all.peak_bytes + 2;
         budget += std::max<int64_t>(1, (store_all.peak_bytes - low) / 12)) {
      std::optional<Plan> plan = solve_optimal(chain, budget, {budget});
      ASSERT_TRUE(plan.has_value()) << budget;
      expect_valid_within(chain, *plan, budget);
      const double ms = simulate(chain, *plan).time_ms;
      EXPECT_LE(ms, previous_ms + 1e-9) << "budget " << budget;
      previous_ms = ms;
      if (budget >= store_all.peak_bytes) {
        EXPECT_EQ(forward_count(*plan), n) << plan->to_string();
      }
      std::optional<Plan> coarse = solve_optimal(chain, budget, {7});
      ASSERT_TRUE(coarse.has_value());
      expect_valid_within(chain, *coarse, budget);
    }

    // Never slower than the baselines at a budget they fit in.
    std::vector<Plan> baselines = {solve_sqrt(chain)};
    for (int64_t k = 1; k <= n; ++k) {
      baselines.push_back(solve_uniform(chain, k));
    }
    for (int64_t budget : {low, (low + store_all.peak_bytes) / 2}) {
      if (std::optional<Plan> chen = solve_chen_greedy(chain, budget)) {
        expect_valid_within(chain, *chen, budget);
        baselines.push_back(*chen);
      }
    }
    for (const Plan& baseline : baselines) {
      const Simulation sim = simulate(chain, baseline);
      ASSERT_TRUE(sim.valid) << sim.error << " in " << baseline.to_string();
      std::optional<Plan> plan =
          solve_optimal(chain, sim.peak_bytes, {sim.peak_bytes});
      ASSERT_TRUE(plan.has_value());
      EXPECT_LE(simulate(chain, *plan).time_ms, sim.time_ms + 1e-9)
          << plan->to_string() << " vs " << baseline.to_string();
    }
    expect_valid_within(chain, solve_min_memory(chain), low);
  }
}

// `chain` with every byte size multiplied by `factor`.
Chain scaled(const Chain& chain, int64_t factor) {
  std::vector<StageCost> stages = chain.stages();
  for (StageCost& s : stages) {
    s.output_bytes *= factor;
    s.saved_bytes *= factor;
    s.forward_tmp_bytes *= factor;
    s.backward_tmp_bytes *= factor;
    if (s.record_tmp_bytes) {
      *s.record_tmp_bytes *= factor;
    }
  }
  return Chain(std::move(stages), chain.input_bytes() * factor);
}

// Real tensor sizes share large factors (2 MiB activations): with the default
// 500 slots the DP then counts in that factor and stays exact, where an even
// split of the budget would round every size up and lose memory.
TEST(SolveOptimal, IsExactWithDefaultSlotsWhenSizesShareAFactor) {
  constexpr int64_t kFactor = 3 << 20;
  std::mt19937_64 rng(9100);
  for (int c = 0; c < 30; ++c) {
    SCOPED_TRACE("chain " + std::to_string(c));
    const Chain chain = random_chain(rng, 12, 20);
    const Chain big = scaled(chain, kFactor);
    const int64_t low = min_feasible_budget_bytes(chain);
    ASSERT_EQ(min_feasible_budget_bytes(big), low * kFactor);
    const int64_t high = simulate(chain, solve_store_all(chain)).peak_bytes;
    for (int64_t budget = low; budget < high; ++budget) {
      const std::optional<Plan> exact = solve_optimal(chain, budget, {budget});
      // Half a factor more: the slack cannot hold another value.
      const int64_t big_budget = budget * kFactor + kFactor / 2;
      const std::optional<Plan> plan = solve_optimal(big, big_budget);
      ASSERT_TRUE(exact.has_value() && plan.has_value());
      expect_valid_within(big, *plan, big_budget);
      const double exact_ms = simulate(chain, *exact).time_ms;
      EXPECT_NEAR(simulate(big, *plan).time_ms, exact_ms, 1e-6 * exact_ms)
          << "budget " << budget << ": " << plan->to_string() << " vs "
          << exact->to_string();
    }
  }
}

TEST(SolveOptimal, StaysWithinTheBudgetWithDefaultSlotsOnLongChains) {
  std::mt19937_64 rng(4242);
  for (int c = 0; c < 4; ++c) {
    const Chain chain = random_chain(rng, 120, 1 << 20);
    const int64_t low = min_feasible_budget_bytes(chain);
    const int64_t high = simulate(chain, solve_store_all(chain)).peak_bytes;
    for (double fraction : {0.0, 0.1, 0.5}) {
      const int64_t budget =
          low +
          static_cast<int64_t>(fraction * static_cast<double>(high - low));
      std::optional<Plan> plan = solve_optimal(chain, budget);
      ASSERT_TRUE(plan.has_value());
      expect_valid_within(chain, *plan, budget);
    }
  }
}

// Four stages of 10-byte outputs and 30-byte records, times of 1e38 ms (the
// chain's total is finite in double, beyond float's range). At 130 bytes the
// fastest plan recomputes stage 1 only (8.5e38 ms); a table of infinities
// ties every option and takes the first feasible (R0 R1 C2 ..., 9.25e38 ms).
TEST(SolveOptimal, IsFastestWhenTimesPassFloatRange) {
  std::vector<StageCost> stages(4);
  for (int i = 0; i < 4; ++i) {
    stages[i].forward_ms = 1e38 * (1 + i % 2);
    stages[i].backward_ms = 1e38;
    stages[i].output_bytes = 10;
    stages[i].saved_bytes = 30;
  }
  stages[1].forward_ms = 0.25e38;
  const Chain chain(stages, 10);
  const std::optional<Plan> plan = solve_optimal(chain, 130, {130});
  ASSERT_TRUE(plan.has_value());
  const Simulation sim = simulate(chain, *plan);
  ASSERT_TRUE(sim.valid) << sim.error;
  EXPECT_LE(sim.peak_bytes, 130);
  EXPECT_DOUBLE_EQ(sim.time_ms, 8.5e38) << plan->to_string();
  // The same chain with every time divided by 1e38 has the same best plan.
  for (StageCost& s : stages) {
    s.forward_ms /= 1e38;
    s.backward_ms /= 1e38;
  }
  const Chain small(stages, 10);
  const std::optional<Plan> small_plan = solve_optimal(small, 130, {130});
  ASSERT_TRUE(small_plan.has_value());
  EXPECT_DOUBLE_EQ(simulate(small, *small_plan).time_ms, 8.5);
}

// More slots than bytes to divide are one byte each, as many as the bytes:
// INT64_MAX slots (asking for the exact answer) must neither overflow nor
// be refused as a table of INT64_MAX columns.
TEST(SolveOptimal, TakesMoreSlotsThanTheBudgetHasBytes) {
  const Chain chain(std::vector<StageCost>(3, StageCost{1, 1, 10, 20}), 10);
  const int64_t store_all = simulate(chain, solve_store_all(chain)).peak_bytes;
  const std::optional<Plan> exact =
      solve_optimal(chain, store_all - 1, {store_all});
  ASSERT_TRUE(exact.has_value());
  for (int64_t slots :
       {int64_t{1} << 40,
        std::numeric_limits<int64_t>::max() - 1,
        std::numeric_limits<int64_t>::max()}) {
    SCOPED_TRACE("slots " + std::to_string(slots));
    std::optional<Plan> plan;
    ASSERT_NO_THROW(plan = solve_optimal(chain, store_all - 1, {slots}));
    ASSERT_TRUE(plan.has_value());
    EXPECT_EQ(*plan, *exact);
  }
}

}  // namespace
}  // namespace remat::planner
