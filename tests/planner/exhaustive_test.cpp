// solve_optimal and min_feasible_budget_bytes against exhaustive search over
// all op sequences (test_chains.h), on seeded random heterogeneous chains of
// at most 6 stages, with slots fine enough (one byte each) to be exact; with
// and without selective stages.
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

constexpr int kChains = 500 / testing::kCaseDivisor;
constexpr uint64_t kBaseSeed = 20240601;

// Checks solve_optimal and min_feasible_budget_bytes on kChains random
// chains (random_chain with `with_selective`) at four budgets each.
void check_against_exhaustive_search(
    bool with_selective, uint64_t base_seed, bool with_parameters = false) {
  int64_t checked_budgets = 0;
  int64_t selective_optima = 0;  // budgets whose best plan has an S op
  for (int c = 0; c < kChains; ++c) {
    const uint64_t seed = base_seed + c;
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const Chain chain =
        random_chain(rng, 6, 12, true, with_selective, with_parameters);
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
      selective_optima += expected->to_string().find('S') != std::string::npos;

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
  if (with_selective) {  // the search must have had S ops to match
    EXPECT_GT(selective_optima, checked_budgets / 10);
  } else {
    EXPECT_EQ(selective_optima, 0);
  }
}

TEST(SolveOptimal, MatchesExhaustiveSearchOnSmallChains) {
  check_against_exhaustive_search(false, kBaseSeed);
}

// With a third way to run most stages (kForwardSelective), the search also
// tries S ops: the recurrence's selective option must cover them.
TEST(SolveOptimal, MatchesExhaustiveSearchWithSelectiveStages) {
  check_against_exhaustive_search(true, kBaseSeed + 7919);
}

// Under sharded training every op of a stage also holds its gathered
// parameters (twice that in its backward) and every peak the resident shards:
// the recurrence must count both as simulate() does.
TEST(SolveOptimal, MatchesExhaustiveSearchWithGatheredParameters) {
  check_against_exhaustive_search(true, kBaseSeed + 104729, true);
}

// A selective way that saves memory and costs little must be used where the
// budget is between what it needs and what recording needs, and the plan
// must beat the best plan of the same chain without it.
TEST(SolveOptimal, UsesSelectiveStagesWhenTheyAreFasterUnderTheBudget) {
  std::vector<StageCost> stages(4);
  for (StageCost& s : stages) {
    s.forward_ms = 1.0;
    s.backward_ms = 2.0;
    s.output_bytes = 10;
    s.saved_bytes = 100;
    s.selective = SelectiveCost{40, 0, 0, 0.1};
  }
  const Chain with(stages, 10);
  for (StageCost& s : stages) {
    s.selective.reset();
  }
  const Chain without(stages, 10);
  const int64_t store_all = simulate(with, solve_store_all(with)).peak_bytes;
  const int64_t budget = store_all / 2;
  const std::optional<Plan> plan = solve_optimal(with, budget, {budget});
  const std::optional<Plan> plain = solve_optimal(without, budget, {budget});
  ASSERT_TRUE(plan.has_value());
  ASSERT_TRUE(plain.has_value());
  EXPECT_NE(plan->to_string().find('S'), std::string::npos)
      << plan->to_string();
  const Simulation sim = simulate(with, *plan);
  ASSERT_TRUE(sim.valid) << sim.error;
  EXPECT_LE(sim.peak_bytes, budget);
  EXPECT_LT(sim.time_ms, simulate(without, *plain).time_ms)
      << plan->to_string() << " vs " << plain->to_string();
  EXPECT_LT(
      min_feasible_budget_bytes(with), min_feasible_budget_bytes(without));
}

}  // namespace
}  // namespace remat::planner
