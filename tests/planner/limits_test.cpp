// limits_test.cpp: the planner on chains too long for its exact solvers.
// The exact solvers refuse them up front, naming the length and the limit;
// the segment solvers and simulate() take any length (their work is linear
// in the plan's length).
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "remat/planner.h"
#include "test_chains.h"

namespace remat::planner {
namespace {

Chain uniform_chain(int64_t stages) {
  StageCost stage;
  stage.forward_ms = 1;
  stage.backward_ms = 2;
  stage.output_bytes = 4096;
  stage.saved_bytes = 16384;
  return Chain(
      std::vector<StageCost>(static_cast<size_t>(stages), stage), 4096);
}

/// Runs `call` and expects std::invalid_argument whose message has every
/// one of `parts`.
template <typename Call>
void expect_refused(Call call, const std::vector<std::string>& parts) {
  try {
    call();
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& error) {
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(error.what()).find(part), std::string::npos)
          << "'" << part << "' not in: " << error.what();
    }
  }
}

TEST(Limits, TheExactSolversRefuseChainsLongerThanTheLimit) {
  const Chain chain = uniform_chain(kMaxExactStages + 1);
  const std::string length = std::to_string(kMaxExactStages + 1) + " stages";
  const std::string limit = "at most " + std::to_string(kMaxExactStages);
  expect_refused([&] { min_feasible_budget_bytes(chain); }, {length, limit});
  expect_refused([&] { solve_min_memory(chain); }, {length, limit});
  const int64_t half = simulate(chain, solve_store_all(chain)).peak_bytes / 2;
  expect_refused([&] { solve_optimal(chain, half); }, {length, limit, "sqrt"});
  // At or above the store-all peak there is nothing to solve.
  const int64_t all = simulate(chain, solve_store_all(chain)).peak_bytes;
  ASSERT_TRUE(solve_optimal(chain, all).has_value());
}

TEST(Limits, SolveOptimalRefusesATableLargerThanTheLimit) {
  const Chain chain = uniform_chain(200);
  const int64_t half = simulate(chain, solve_store_all(chain)).peak_bytes / 2;
  SolverOptions options;
  options.memory_slots = kMaxOptimalTableCells;  // far too many slots
  expect_refused(
      [&] { solve_optimal(chain, half, options); },
      {"200 stages",
       std::to_string(kMaxOptimalTableCells),
       "fewer memory slots"});
}

TEST(Limits, SegmentSolversPlanVeryLongChains) {
  const Chain chain = uniform_chain(100000 / testing::kCaseDivisor);
  for (const Plan& plan :
       {solve_sqrt(chain), solve_uniform(chain, 300), solve_store_all(chain)}) {
    const Simulation simulation = simulate(chain, plan);
    EXPECT_TRUE(simulation.valid) << simulation.error;
  }
  const int64_t sqrt_peak = simulate(chain, solve_sqrt(chain)).peak_bytes;
  const std::optional<Plan> chen = solve_chen_greedy(chain, sqrt_peak);
  ASSERT_TRUE(chen.has_value());
  EXPECT_LE(simulate(chain, *chen).peak_bytes, sqrt_peak);
}

}  // namespace
}  // namespace remat::planner
