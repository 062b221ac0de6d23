// A chain's model state (parameters, gradients, optimizer state): validated,
// carried through JSON and equality, outside every peak, and the step memory
// report built on it.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "remat/planner.h"

namespace remat::planner {
namespace {

Chain stages(int64_t count, ModelState state = {}) {
  StageCost stage;
  stage.forward_ms = 1;
  stage.backward_ms = 2;
  stage.output_bytes = 100;
  stage.saved_bytes = 150;
  return Chain(
      std::vector<StageCost>(static_cast<size_t>(count), stage),
      /*input_bytes=*/100,
      /*resident_bytes=*/0,
      state);
}

Chain two_stages(ModelState state = {}) {
  return stages(2, state);
}

TEST(ModelState, IsOutsideEveryPeakAndPartOfEquality) {
  const ModelState state{1000, 1000, 2000};
  const Chain plain = two_stages();
  const Chain with_state = two_stages(state);
  EXPECT_EQ(with_state.model_state(), state);
  EXPECT_EQ(with_state.model_state().total_bytes(), 4000);
  EXPECT_NE(plain, with_state);
  EXPECT_EQ(plain.with_model_state(state), with_state);
  // No plan changes the model state, so simulate() leaves it out.
  for (const Plan& plan : {solve_store_all(plain), solve_sqrt(plain)}) {
    EXPECT_EQ(
        simulate(plain, plan).peak_bytes,
        simulate(with_state, plan).peak_bytes);
  }
}

TEST(ModelState, RefusesNegativeAndOverflowingFields) {
  EXPECT_THROW(two_stages({-1, 0, 0}), std::invalid_argument);
  EXPECT_THROW(two_stages({0, 0, -5}), std::invalid_argument);
  try {
    two_stages({0, -7, 0});
    FAIL() << "a negative gradient size was accepted";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(
        std::string(error.what()).find("model_state.gradient_bytes"),
        std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("-7"), std::string::npos);
  }
  const int64_t huge = INT64_MAX / 4;
  EXPECT_THROW(two_stages({huge, huge, 0}), std::invalid_argument);
}

TEST(ModelState, RoundTripsThroughJsonAndIsOptionalThere) {
  const Chain with_state = two_stages({123, 456, 912});
  EXPECT_EQ(chain_from_json(to_json(with_state)), with_state);
  // A chain without one writes no field and reads back as all zeros.
  const std::string plain = to_json(two_stages());
  EXPECT_EQ(plain.find("model_state"), std::string::npos) << plain;
  EXPECT_EQ(chain_from_json(plain).model_state(), ModelState{});
  // Every field is required and checked, with its path.
  std::string missing = to_json(with_state);
  const std::string field = "\"optimizer_bytes\":912";
  ASSERT_NE(missing.find(field), std::string::npos) << missing;
  missing.replace(missing.find(field), field.size(), "\"other\":1");
  try {
    chain_from_json(missing);
    FAIL() << "accepted " << missing;
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("model_state"), std::string::npos)
        << error.what();
  }
}

TEST(StepMemory, AddsTheModelStateToThePeaksAndBoundsTheSaving) {
  const Chain chain = two_stages({1000, 1000, 2000});
  const StepMemory memory = step_memory(chain);
  const int64_t store_all = simulate(chain, solve_store_all(chain)).peak_bytes;
  EXPECT_EQ(memory.store_all_peak_bytes, store_all);
  ASSERT_TRUE(memory.least_peak_bytes.has_value());
  EXPECT_EQ(*memory.least_peak_bytes, min_feasible_budget_bytes(chain));
  EXPECT_EQ(memory.total_store_all_bytes(), 4000 + store_all);
  EXPECT_EQ(memory.max_saving_bytes(), store_all - *memory.least_peak_bytes);
  EXPECT_DOUBLE_EQ(
      memory.max_saving_fraction(),
      static_cast<double>(memory.max_saving_bytes()) / (4000.0 + store_all));
  const std::string text = to_text(memory, "adamw");
  EXPECT_NE(text.find("optimizer state (adamw)"), std::string::npos) << text;
  EXPECT_NE(text.find("checkpointing can save at most"), std::string::npos)
      << text;
}

TEST(StepMemory, SaysWhichDominates) {
  // Activations dominate: no model state, and a chain long enough for
  // checkpointing to save most of its peak.
  const std::string long_chain = to_text(step_memory(stages(16)), "sgd");
  EXPECT_NE(long_chain.find("activations dominate"), std::string::npos)
      << long_chain;
  // The model state dominates: a state far above the activations.
  EXPECT_NE(
      to_text(step_memory(two_stages({1 << 20, 1 << 20, 1 << 21})), "adamw")
          .find("the model state dominates"),
      std::string::npos);
}

}  // namespace
}  // namespace remat::planner
