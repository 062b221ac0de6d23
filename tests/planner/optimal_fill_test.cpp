// solve_optimal's DP fill (pruned by bounds, vectorized in AVX2/baseline
// clones, src/planner/fill_kernels.cpp, filled by 1-3 threads) against the
// plain definition of the DP: on seeded random chains, budgets and slot
// counts, both fills give bit-identical tables.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "optimal_table.h"
#include "test_chains.h"

namespace remat::planner {
namespace {

using detail::FillKind;
using detail::optimal_time_table;
using testing::random_chain;

constexpr int kChains = 300;
constexpr uint64_t kBaseSeed = 20261129;

TEST(OptimalFill, MatchesReferenceFillOnRandomChains) {
  int64_t compared_tables = 0;
  for (int c = 0; c < kChains; ++c) {
    const uint64_t seed = kBaseSeed + c;
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const Chain chain = random_chain(rng, 40, 1 << 12);
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

}  // namespace
}  // namespace remat::planner
