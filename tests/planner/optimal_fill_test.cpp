// solve_optimal's DP fill (pruned by bounds, vectorized in AVX2/baseline
// clones, src/planner/fill_kernels.cpp, rows in groups, filled by 1-3
// threads) against the plain definition of the DP: on seeded random chains,
// budgets and slot counts, both fills give bit-identical tables, and
// solve_optimal gives the plan of the plain DP (ties included). Also the
// private pieces the fill stands on: its tables' accessors and
// REMAT_PLANNER_CHECK, which must throw in every build (this file is compiled
// as Release too).
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "check.h"
#include "optimal_table.h"
#include "segment_table.h"
#include "test_chains.h"

namespace remat::planner {
namespace {

using detail::FillKind;
using detail::optimal_plan;
using detail::optimal_time_table;
using testing::random_chain;

constexpr int kChains = 300 / testing::kCaseDivisor;
constexpr uint64_t kBaseSeed = 20261129;

TEST(OptimalFill, MatchesReferenceFillOnRandomChains) {
  int64_t compared_tables = 0;
  for (int c = 0; c < kChains; ++c) {
    const uint64_t seed = kBaseSeed + c;
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    // Odd chains have selective stages (a third option per segment).
    const Chain chain = random_chain(rng, 40, 1 << 12, true, c % 2 == 1);
    const int64_t low = min_feasible_budget_bytes(chain);
    const int64_t high = simulate(chain, solve_store_all(chain)).peak_bytes;
    std::uniform_real_distribution<double> where(0.0, 1.0);
    std::uniform_int_distribution<int64_t> slots(1, 700);
    for (int k = 0; k < 3; ++k) {
      const int64_t budget =
          low +
          static_cast<int64_t>(where(rng) * static_cast<double>(high - low));
      const int64_t memory_slots = slots(rng);
      SCOPED_TRACE(
          "budget " + std::to_string(budget) + " slots " +
          std::to_string(memory_slots));
      // Threads 1..3: blocks of 16 stages are filled side by side, so chains
      // longer than 16 stages exercise the hand-over between threads.
      const int64_t threads = 1 + k;
      const std::vector<double> filtered = optimal_time_table(
          chain, budget, memory_slots, FillKind::kFiltered, threads);
      const std::vector<double> reference =
          optimal_time_table(chain, budget, memory_slots, FillKind::kReference);
      ASSERT_EQ(filtered.size(), reference.size());
      size_t mismatches = 0;
      double max_difference = 0;
      for (size_t i = 0; i < filtered.size(); ++i) {
        if (filtered[i] != reference[i]) {
          ++mismatches;
          max_difference =
              std::max(max_difference, std::abs(filtered[i] - reference[i]));
        }
      }
      EXPECT_EQ(mismatches, 0u) << "max difference " << max_difference;
      compared_tables += filtered.empty() ? 0 : 1;
    }
  }
  EXPECT_GT(compared_tables, kChains);  // most draws fill a table
}

// The chain with every time rounded to a multiple of 0.5 ms: many plans tie.
Chain with_coarse_times(const Chain& chain) {
  std::vector<StageCost> stages = chain.stages();
  for (StageCost& s : stages) {
    s.forward_ms = 0.5 * std::ceil(2 * s.forward_ms);
    s.backward_ms = 0.5 * std::ceil(2 * s.backward_ms);
    if (s.selective) {
      s.selective->recompute_ms =
          0.5 * std::round(2 * s.selective->recompute_ms);
    }
  }
  return Chain(std::move(stages), chain.input_bytes(), chain.resident_bytes());
}

TEST(SolveOptimal, GivesThePlanOfTheReferenceFill) {
  constexpr int kCases = 120 / testing::kCaseDivisor;
  int64_t compared_plans = 0;
  int64_t tables = 0;
  for (int c = 0; c < kCases; ++c) {
    const uint64_t seed = kBaseSeed + 1000 + c;
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    // One stage, short chains, and chains of several blocks of 16 stages
    // (whose rows below a block are filled in groups); every third chain has
    // selective stages, every fifth gathered parameters; a quarter have
    // coarse times (ties), and some are uniform (ties everywhere).
    const int64_t max_stages = c % 10 == 0 ? 1 : (c % 2 == 0 ? 12 : 70);
    Chain chain =
        random_chain(rng, max_stages, 1 << 12, true, c % 3 == 1, c % 5 == 4);
    if (c % 4 == 2) {
      chain = with_coarse_times(chain);
    }
    if (c % 7 == 3) {
      chain = testing::uniform_chain(
          1 + c % 60, StageCost{1.0, 2.0, 1000, 2500}, 1000);
    }
    const int64_t low = min_feasible_budget_bytes(chain);
    const int64_t high = simulate(chain, solve_store_all(chain)).peak_bytes;
    std::uniform_int_distribution<int64_t> between(low, high);
    std::uniform_int_distribution<int64_t> slots(1, 700);
    for (const int64_t budget :
         {low - 1, low, low + 1, between(rng), between(rng), high - 1, high}) {
      if (budget <= 0) {
        continue;
      }
      for (const int64_t memory_slots : {int64_t{500}, slots(rng)}) {
        const int64_t threads = 1 + (budget + memory_slots) % 3;
        SCOPED_TRACE(
            "budget " + std::to_string(budget) + " (least " +
            std::to_string(low) + ", store-all " + std::to_string(high) +
            ") slots " + std::to_string(memory_slots) + " threads " +
            std::to_string(threads));
        const SolverOptions options{memory_slots, threads};
        const std::optional<Plan> plan = solve_optimal(chain, budget, options);
        const std::optional<Plan> reference =
            optimal_plan(chain, budget, options, FillKind::kReference);
        ASSERT_EQ(plan.has_value(), reference.has_value());
        EXPECT_EQ(plan.has_value(), budget >= low);
        if (!plan) {
          continue;
        }
        EXPECT_EQ(plan->to_string(), reference->to_string());
        const Simulation sim = simulate(chain, *plan);
        EXPECT_TRUE(sim.valid) << sim.error;
        EXPECT_LE(sim.peak_bytes, budget);
        ++compared_plans;
        tables += budget < high &&
                          !optimal_time_table(
                               chain, budget, memory_slots, FillKind::kFiltered)
                               .empty()
                      ? 1
                      : 0;
      }
    }
  }
  EXPECT_GT(compared_plans, 5 * kCases);
  EXPECT_GT(tables, 2 * kCases);  // most budgets below store-all fill a table
}

TEST(PlannerCheck, ThrowsLogicErrorNamingConditionPlaceAndMessage) {
  const int two = 2;
  try {
    REMAT_PLANNER_CHECK(two + two == 5, "arithmetic broke");
    FAIL() << "REMAT_PLANNER_CHECK did not throw";
  } catch (const std::logic_error& error) {
    const std::string what = error.what();
    EXPECT_NE(what.find("two + two == 5"), std::string::npos) << what;
    EXPECT_NE(what.find("optimal_fill_test.cpp:"), std::string::npos) << what;
    EXPECT_NE(what.find("arithmetic broke"), std::string::npos) << what;
  }
  EXPECT_NO_THROW(REMAT_PLANNER_CHECK(two + two == 4, "arithmetic holds"));
}

TEST(SegmentTable, AccessorsThrowOutsideTheirBounds) {
  detail::SegmentArray<detail::SegmentCell> cells(3);
  EXPECT_NO_THROW(cells.at(0, 2));
  EXPECT_THROW(cells.at(2, 1), std::logic_error);   // a > b
  EXPECT_THROW(cells.at(-1, 1), std::logic_error);  // a < 0
  EXPECT_THROW(cells.at(1, 3), std::logic_error);   // b past the chain
  for (int64_t b = 0; b < 3; ++b) {
    for (int64_t a = 0; a <= b; ++a) {
      detail::SegmentCell& cell = cells.at(a, b);
      cell.lo = 2 + a;
      cell.hi = 4;
      cell.all_ms = 1.5;
    }
  }
  const detail::SegmentCostTable table(std::move(cells), /*max_slots=*/5);
  const detail::SegmentCell& row = table.row(0, 2);  // m in [2, 5]
  EXPECT_EQ(row.at(1), detail::kInfeasible);         // below lo
  EXPECT_EQ(row.at(2), detail::kInfeasible);         // [lo, hi): to compute
  EXPECT_EQ(row.at(5), 1.5f);                        // store-all from hi
  EXPECT_THROW(row.at(6), std::logic_error);         // above max_slots
  EXPECT_THROW(row.at_address(1), std::logic_error);
  EXPECT_THROW(row.at_address(6), std::logic_error);
  EXPECT_EQ(table.computed_top(row), 3);
}

}  // namespace
}  // namespace remat::planner
