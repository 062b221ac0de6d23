// Plan's text form: grammar, round-trip and parse errors.
#include <gtest/gtest.h>

#include <random>
#include <stdexcept>

#include "remat/planner.h"

namespace remat::planner {
namespace {

TEST(PlanText, WritesOneLetterAndTheStagePerOp) {
  Plan plan{
      {{OpKind::kForwardCheckpoint, 0},
       {OpKind::kForwardNoSave, 1},
       {OpKind::kForwardRecord, 12},
       {OpKind::kForwardSelective, 13},
       {OpKind::kBackward, 13},
       {OpKind::kBackward, 12}}};
  EXPECT_EQ(plan.to_string(), "C0 N1 R12 S13 B13 B12");
  EXPECT_EQ(Plan{}.to_string(), "");
}

TEST(PlanText, ParsesWhatItWrites) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 200; ++round) {
    Plan plan;
    std::uniform_int_distribution<int> kind(
        0, static_cast<int>(OpKind::kBackward));
    std::uniform_int_distribution<int64_t> stage(0, 1000);
    for (int k = 0; k < round % 17; ++k) {
      plan.ops.push_back({static_cast<OpKind>(kind(rng)), stage(rng)});
    }
    EXPECT_EQ(plan_from_string(plan.to_string()), plan) << plan.to_string();
  }
}

TEST(PlanText, RejectsTextOutsideTheGrammar) {
  for (const char* bad :
       {" R0",
        "R0 ",
        "R0  B0",
        "X0",
        "R",
        "R-1",
        "R01",
        "R0,B0",
        "r0",
        "R99999999999999999999"}) {
    EXPECT_THROW(plan_from_string(bad), std::invalid_argument) << bad;
  }
  try {
    plan_from_string("R0 Q1");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("offset 3"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace remat::planner
