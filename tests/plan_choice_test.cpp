// Tests of remat/plan_choice.h: choose_plan's rules for budgets and
// strategies, and plan_within as its optimal case. Torch-free chains with
// fixed costs: nothing is measured.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <c10/util/Exception.h>

#include "remat/plan_choice.h"
#include "remat/planner.h"
#include "test_util.h"

namespace {

using remat::Budget;
using remat::BudgetOrigin;
using remat::planner::Strategy;

using remat::testing::sample_chain;

TEST(ChoosePlan, OptimalFitsTheBudgetOrReportsTheMinimum) {
  const remat::planner::Chain chain = sample_chain();
  const auto choice = remat::choose_plan(
      chain,
      Strategy::parse("optimal"),
      Budget::parse("60%"),
      BudgetOrigin::kGiven);
  ASSERT_TRUE(choice.budget_bytes.has_value());
  EXPECT_TRUE(choice.simulation.valid) << choice.simulation.error;
  EXPECT_LE(choice.simulation.peak_bytes, *choice.budget_bytes);
  ASSERT_TRUE(choice.min_feasible_bytes.has_value());
  EXPECT_EQ(
      *choice.min_feasible_bytes,
      remat::planner::min_feasible_budget_bytes(chain));

  const int64_t too_small = *choice.min_feasible_bytes - 1;
  try {
    remat::choose_plan(
        chain,
        Strategy::parse("optimal"),
        Budget::parse(std::to_string(too_small)),
        BudgetOrigin::kGiven);
    ADD_FAILURE() << "no error below the minimum";
  } catch (const remat::InfeasibleBudgetError& error) {
    EXPECT_EQ(error.min_feasible_bytes(), choice.min_feasible_bytes);
    EXPECT_NE(
        std::string(error.what())
            .find(std::to_string(*choice.min_feasible_bytes) + " bytes"),
        std::string::npos)
        << error.what();
  }
}

TEST(ChoosePlan, AGivenBudgetBindsFixedStrategiesADefaultOneDoesNot) {
  const remat::planner::Chain chain = sample_chain();
  const auto none = Strategy::parse("none");
  const auto small = Budget::parse("50%");
  EXPECT_THROW(
      remat::choose_plan(chain, none, small, BudgetOrigin::kGiven),
      remat::InfeasibleBudgetError);
  for (const BudgetOrigin origin :
       {BudgetOrigin::kDefault, BudgetOrigin::kSweep}) {
    const auto choice = remat::choose_plan(chain, none, small, origin);
    EXPECT_FALSE(choice.budget_bytes.has_value());
    EXPECT_EQ(choice.budget_text, "none");
    EXPECT_EQ(choice.plan, remat::planner::solve_store_all(chain));
  }
}

// A default budget below the minimum feasible one is raised to it (and says
// so); a given budget or one of bench's is refused with the minimum.
TEST(ChoosePlan, ADefaultBudgetBelowTheMinimumIsRaisedToIt) {
  const remat::planner::Chain chain = sample_chain();
  const auto optimal = Strategy::parse("optimal");
  const int64_t minimum = remat::planner::min_feasible_budget_bytes(chain);
  const auto tiny = Budget::fraction(1e-6);
  ASSERT_LT(tiny.resolve_bytes(chain), minimum);
  const auto choice =
      remat::choose_plan(chain, optimal, tiny, BudgetOrigin::kDefault);
  ASSERT_TRUE(choice.budget_bytes.has_value());
  EXPECT_EQ(*choice.budget_bytes, minimum);
  EXPECT_LE(choice.simulation.peak_bytes, minimum);
  EXPECT_NE(
      choice.budget_text.find("the minimum feasible budget"), std::string::npos)
      << choice.budget_text;
  EXPECT_NE(choice.budget_text.find(tiny.to_string()), std::string::npos)
      << choice.budget_text;
  for (const BudgetOrigin origin :
       {BudgetOrigin::kGiven, BudgetOrigin::kSweep}) {
    EXPECT_THROW(
        remat::choose_plan(chain, optimal, tiny, origin),
        remat::InfeasibleBudgetError);
  }
  // Above the minimum the default is what it says.
  const auto roomy = Budget::parse("90%");
  const auto kept =
      remat::choose_plan(chain, optimal, roomy, BudgetOrigin::kDefault);
  EXPECT_EQ(kept.budget_bytes, roomy.resolve_bytes(chain));
  EXPECT_EQ(kept.budget_text, roomy.to_string());
}

TEST(PlanWithin, IsTheOptimalChoiceAndRefusesBelowTheMinimumWithC10Error) {
  const remat::planner::Chain chain = sample_chain();
  for (const std::string text : {"60%", "100%", "none", "30000"}) {
    SCOPED_TRACE(text);
    const Budget budget = Budget::parse(text);
    EXPECT_EQ(
        remat::plan_within(chain, budget),
        remat::choose_plan(
            chain, Strategy::parse("optimal"), budget, BudgetOrigin::kGiven)
            .plan);
  }
  const int64_t minimum = remat::planner::min_feasible_budget_bytes(chain);
  try {
    remat::plan_within(chain, Budget::bytes(minimum - 1));
    ADD_FAILURE() << "no error below the minimum";
  } catch (const c10::Error& error) {
    EXPECT_NE(
        std::string(error.what()).find(std::to_string(minimum) + " bytes"),
        std::string::npos)
        << error.what();
  }
}

}  // namespace
