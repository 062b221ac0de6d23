// planner::Strategy's text form, and solve() dispatching to each solver.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "remat/planner.h"

namespace remat::planner {
namespace {

TEST(Strategy, ParsesEveryForm) {
  EXPECT_EQ(Strategy::parse("optimal").kind, Strategy::Kind::kOptimal);
  EXPECT_EQ(Strategy::parse("chen").kind, Strategy::Kind::kChen);
  EXPECT_EQ(Strategy::parse("sqrt").kind, Strategy::Kind::kSqrt);
  EXPECT_EQ(Strategy::parse("none").kind, Strategy::Kind::kNone);
  const Strategy uniform = Strategy::parse("uniform:4");
  EXPECT_EQ(uniform.kind, Strategy::Kind::kUniform);
  EXPECT_EQ(uniform.segments, 4);
  for (const char* text : {"optimal", "chen", "sqrt", "none", "uniform:12"}) {
    EXPECT_EQ(Strategy::parse(text).to_string(), text);
  }
}

TEST(Strategy, RefusesBadTextNamingIt) {
  for (const std::string text :
       {"nope",
        "uniform",
        "uniform:",
        "uniform:0",
        "uniform:x",
        "uniform4",
        "Optimal",
        "uniform:-2",
        "uniform:9999999999",
        ""}) {
    try {
      Strategy::parse(text);
      ADD_FAILURE() << "accepted '" << text << "'";
    } catch (const std::invalid_argument& error) {
      EXPECT_NE(
          std::string(error.what()).find("got '" + text + "'"),
          std::string::npos)
          << error.what();
    }
  }
}

TEST(Solve, CallsTheNamedSolver) {
  const Chain chain(
      {{1, 1, 10, 20, 0, 0},
       {1, 1, 10, 20, 0, 0},
       {1, 1, 10, 20, 0, 0},
       {1, 1, 10, 20, 0, 0}},
      10);
  const int64_t store_all = simulate(chain, solve_store_all(chain)).peak_bytes;
  const int64_t minimum = min_feasible_budget_bytes(chain);
  EXPECT_EQ(
      solve(chain, Strategy::parse("optimal"), minimum),
      solve_optimal(chain, minimum));
  EXPECT_EQ(
      solve(chain, Strategy::parse("chen"), store_all),
      solve_chen_greedy(chain, store_all));
  EXPECT_EQ(*solve(chain, Strategy::parse("sqrt"), 1), solve_sqrt(chain));
  EXPECT_EQ(
      *solve(chain, Strategy::parse("uniform:2"), 1), solve_uniform(chain, 2));
  EXPECT_EQ(*solve(chain, Strategy::parse("none"), 1), solve_store_all(chain));
  EXPECT_FALSE(solve(chain, Strategy::parse("optimal"), minimum - 1));
}

}  // namespace
}  // namespace remat::planner
