// Tests of remat/plan_choice.h: choose_plan's rules for budgets and
// strategies, and plan_within as its optimal case, on chains and graphs.
// Torch-free models with fixed costs: nothing is measured.
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

// plan_within one byte below the minimum feasible budget throws a c10::Error
// naming the minimum.
template <typename Model>
void expect_plan_within_refuses_below_the_minimum(const Model& model) {
  const int64_t minimum = remat::planner::min_feasible_budget_bytes(model);
  try {
    remat::plan_within(model, Budget::bytes(minimum - 1));
    ADD_FAILURE() << "no error below the minimum";
  } catch (const c10::Error& error) {
    EXPECT_NE(
        std::string(error.what()).find(std::to_string(minimum) + " bytes"),
        std::string::npos)
        << error.what();
  }
}

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

// chen's greedy segmentation may not reach the optimal minimum: a default
// budget is then raised to the least budget chen fits (one byte less does
// not fit it), never left infeasible; a given budget still is.
TEST(ChoosePlan, ADefaultBudgetIsRaisedToTheLeastItsStrategyFits) {
  const remat::planner::Chain chain = sample_chain();
  const auto chen = Strategy::parse("chen");
  const int64_t minimum = remat::planner::min_feasible_budget_bytes(chain);
  ASSERT_FALSE(remat::planner::solve(chain, chen, minimum).has_value())
      << "the sample chain no longer tests this: chen reaches the minimum";
  const auto tiny = Budget::fraction(1e-6);
  const auto choice =
      remat::choose_plan(chain, chen, tiny, BudgetOrigin::kDefault);
  ASSERT_TRUE(choice.budget_bytes.has_value());
  EXPECT_GT(*choice.budget_bytes, minimum);
  EXPECT_LE(choice.simulation.peak_bytes, *choice.budget_bytes);
  EXPECT_FALSE(
      remat::planner::solve(chain, chen, *choice.budget_bytes - 1).has_value());
  EXPECT_NE(
      choice.budget_text.find("the least budget chen fits"), std::string::npos)
      << choice.budget_text;
  EXPECT_THROW(
      remat::choose_plan(chain, chen, tiny, BudgetOrigin::kGiven),
      remat::InfeasibleBudgetError);
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
  expect_plan_within_refuses_below_the_minimum(chain);
}

// A two-level skip graph (the shape of a small U-Net) with fixed costs.
remat::planner::Graph skip_graph() {
  using remat::planner::kGraphInput;
  std::vector<remat::planner::StageCost> stages;
  for (int64_t i = 0; i < 6; ++i) {
    remat::planner::StageCost cost;
    cost.forward_ms = 1.0 + static_cast<double>(i % 3);
    cost.backward_ms = 2.0 * cost.forward_ms;
    cost.output_bytes = 1000 * (i % 2 + 1);
    cost.saved_bytes = 4000 + 1000 * i;
    stages.push_back(cost);
  }
  return remat::planner::Graph(
      stages, {{kGraphInput}, {0}, {1}, {2, 1}, {3, 0}, {4}}, 2000);
}

// On a graph the same rules hold: the optimal choice is solve_optimal's,
// fixed stage modes are schedule_graph's and a given budget binds them, a
// default one below the minimum is raised, and plan_within refuses below the
// minimum with a c10::Error.
TEST(ChoosePlan, TheRulesHoldOnAGraph) {
  using remat::planner::StageMode;
  const remat::planner::Graph graph = skip_graph();
  const int64_t minimum = remat::planner::min_feasible_budget_bytes(graph);
  const Budget roomy = Budget::parse("80%");
  const auto optimal = remat::choose_plan(graph, roomy, BudgetOrigin::kGiven);
  EXPECT_EQ(optimal.strategy.to_string(), "optimal");
  EXPECT_EQ(optimal.min_feasible_bytes, minimum);
  EXPECT_EQ(optimal.budget_bytes, roomy.resolve_bytes(graph));
  EXPECT_EQ(
      optimal.plan,
      *remat::planner::solve_optimal(graph, roomy.resolve_bytes(graph)));
  EXPECT_EQ(remat::plan_within(graph, roomy), optimal.plan);
  EXPECT_LE(optimal.simulation.peak_bytes, *optimal.budget_bytes);

  const std::vector<StageMode> per_block(6, StageMode::kCheckpoint);
  const auto fixed = remat::choose_plan(
      graph, per_block, Budget::none(), BudgetOrigin::kGiven);
  EXPECT_EQ(fixed.strategy.to_string(), "none");
  EXPECT_EQ(fixed.plan, remat::planner::schedule_graph(graph, per_block));
  EXPECT_FALSE(fixed.budget_bytes.has_value());
  const Budget below_fixed = Budget::bytes(fixed.simulation.peak_bytes - 1);
  EXPECT_THROW(
      remat::choose_plan(graph, per_block, below_fixed, BudgetOrigin::kGiven),
      remat::InfeasibleBudgetError);
  EXPECT_EQ(
      remat::choose_plan(graph, per_block, below_fixed, BudgetOrigin::kSweep)
          .plan,
      fixed.plan);
  EXPECT_THROW(
      remat::choose_plan(
          graph, std::vector<StageMode>(2), roomy, BudgetOrigin::kGiven),
      std::invalid_argument);

  const Budget tiny = Budget::bytes(minimum - 1);
  const auto raised = remat::choose_plan(graph, tiny, BudgetOrigin::kDefault);
  EXPECT_EQ(raised.budget_bytes, minimum);
  EXPECT_LE(raised.simulation.peak_bytes, minimum);
  try {
    remat::choose_plan(graph, tiny, BudgetOrigin::kGiven);
    ADD_FAILURE() << "no error below the minimum";
  } catch (const remat::InfeasibleBudgetError& error) {
    EXPECT_EQ(error.min_feasible_bytes(), minimum);
  }
  expect_plan_within_refuses_below_the_minimum(graph);
}

// Budget::none() gives the store-all plan, also on a chain of no bytes (a
// valid chain: its store-all peak is 0, which is no budget a solver takes).
TEST(PlanWithin, NoneGivesTheStoreAllPlanOnAChainOfNoBytes) {
  const remat::planner::Chain chain(
      {remat::planner::StageCost{1, 2, 0, 0}}, /*input_bytes=*/0);
  EXPECT_EQ(
      remat::plan_within(chain, Budget::none()),
      remat::planner::solve_store_all(chain));
  EXPECT_EQ(
      remat::choose_plan(
          chain,
          Strategy::parse("optimal"),
          Budget::none(),
          BudgetOrigin::kGiven)
          .plan,
      remat::planner::solve_store_all(chain));
  const remat::planner::Graph graph = remat::planner::graph_of(chain);
  EXPECT_EQ(
      remat::plan_within(graph, Budget::none()),
      remat::planner::solve_store_all(graph));
}

}  // namespace
