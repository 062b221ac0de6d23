// solve_optimal and min_feasible_budget_bytes against exhaustive search over
// all op sequences (test_chains.h), on seeded random heterogeneous chains of
// at most 6 stages, with slots fine enough (one byte each) to be exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "test_chains.h"

namespace remat::planner {
namespace {

using testing::brute_force_fastest;
using testing::brute_force_min_peak;
using testing::random_chain;

constexpr int kChains = 500;
constexpr uint64_t kBaseSeed = 20240601;

TEST(SolveOptimal, MatchesExhaustiveSearchOnSmallChains) {
  int64_t checked_budgets = 0;
  for (int c = 0; c < kChains; ++c) {
    const uint64_t seed = kBaseSeed + c;
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const Chain chain = random_chain(rng, 6, 12);
    SCOPED_TRACE("chain " + to_json(chain));
    const int64_t min_peak = brute_force_min_peak(chain);
    ASSERT_EQ(min_feasible_budget_bytes(chain), min_peak);
    const int64_t store_all_peak =
        simulate(chain, solve_store_all(chain)).peak_bytes;
    ASSERT_FALSE(solve_optimal(chain, min_peak - 1, {min_peak}).has_value());

    std::uniform_int_distribution<int64_t> pick(min_peak, store_all_peak);
    std::vector<int64_t> budgets = {min_peak, store_all_peak, pick(rng)};
    budgets.push_back(pick(rng));
    for (int64_t budget : budgets) {
      SCOPED_TRACE("budget " + std::to_string(budget));
      std::optional<Plan> expected = brute_force_fastest(chain, budget);
      ASSERT_TRUE(expected.has_value());
      const Simulation best = simulate(chain, *expected);
      ASSERT_TRUE(best.valid) << best.error;

      std::optional<Plan> plan = solve_optimal(chain, budget, {budget});
      ASSERT_TRUE(plan.has_value());
      const Simulation sim = simulate(chain, *plan);
      ASSERT_TRUE(sim.valid) << sim.error << " in " << plan->to_string();
      EXPECT_LE(sim.peak_bytes, budget) << plan->to_string();
      EXPECT_NEAR(sim.time_ms, best.time_ms, 1e-9 * (1 + best.time_ms))
          << "optimal " << plan->to_string() << " vs brute force "
          << expected->to_string();
      ++checked_budgets;
    }
  }
  EXPECT_EQ(checked_budgets, kChains * 4);
}

}  // namespace
}  // namespace remat::planner
