// explain(): the report's numbers are simulate()'s, op by op; format_bytes.
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "remat/planner.h"
#include "test_chains.h"

namespace remat::planner {
namespace {

TEST(Explain, EveryOpPeakIsSimulatesStepByStep) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    const Chain chain = testing::random_chain(rng, 7, 1000);
    for (const Plan& plan : {solve_sqrt(chain), solve_store_all(chain)}) {
      const Simulation simulation = simulate(chain, plan);
      ASSERT_TRUE(simulation.valid) << simulation.error;
      ASSERT_EQ(simulation.op_peak_bytes.size(), plan.ops.size());
      const ExplainReport report = explain_report(chain, plan);
      ASSERT_TRUE(report.valid) << report.error;
      ASSERT_EQ(report.ops.size(), plan.ops.size());
      EXPECT_EQ(report.peak_bytes, simulation.peak_bytes);
      EXPECT_EQ(report.step_ms, simulation.step_ms);
      EXPECT_EQ(report.start_bytes, chain.base_bytes());

      // Independently of the report: an op whose step raises Replay's
      // running peak has that peak inside it; the largest op peak (or the
      // input) is simulate()'s peak.
      Replay replay(chain);
      int64_t largest = chain.input_bytes();
      for (size_t k = 0; k < plan.ops.size(); ++k) {
        const int64_t before = replay.peak_bytes();
        ASSERT_EQ(replay.apply(plan.ops[k]), "");
        if (replay.peak_bytes() > before) {
          EXPECT_EQ(simulation.op_peak_bytes[k], replay.peak_bytes());
        }
        EXPECT_EQ(simulation.live_after_bytes[k], replay.current_bytes());
        EXPECT_EQ(report.ops[k].op, plan.ops[k]);
        EXPECT_EQ(report.ops[k].op_peak_bytes, simulation.op_peak_bytes[k])
            << "op " << k;
        EXPECT_EQ(
            report.ops[k].live_after_bytes, simulation.live_after_bytes[k]);
        largest = std::max(largest, simulation.op_peak_bytes[k]);
        EXPECT_EQ(
            report.ops[k].running_peak_bytes,
            std::max(chain.base_bytes(), largest));
      }
      EXPECT_EQ(largest, simulation.peak_bytes);
    }
  }
}

// The stage rows count what the plan runs; the text renders the same data.
TEST(Explain, StageRowsCountThePlansForwardsAndTheTextShowsThem) {
  std::mt19937_64 rng(12);
  for (int trial = 0; trial < 20; ++trial) {
    const Chain chain = testing::random_chain(rng, 6, 1000);
    const Plan plan = solve_sqrt(chain);
    const ExplainReport report = explain_report(chain, plan);
    ASSERT_TRUE(report.valid) << report.error;
    ASSERT_EQ(static_cast<int64_t>(report.stages.size()), chain.size());
    int64_t recomputed = 0;
    for (const ExplainStage& row : report.stages) {
      int64_t forwards = 0;
      std::optional<OpKind> first;
      for (const Op& op : plan.ops) {
        if (op.stage == row.stage && op.kind != OpKind::kBackward) {
          first = first ? first : std::optional<OpKind>(op.kind);
          ++forwards;
        }
      }
      EXPECT_EQ(row.forwards, forwards) << "stage " << row.stage;
      EXPECT_EQ(row.first_forward, first) << "stage " << row.stage;
      EXPECT_LE(row.records + row.checkpoints + row.selectives, forwards);
      EXPECT_EQ(row.cost.forward_ms, chain.stage(row.stage).forward_ms);
      EXPECT_FALSE(row.keeps.empty());
      recomputed += forwards - 1;
    }
    EXPECT_EQ(report.recomputed_forwards, recomputed);
    EXPECT_FALSE(report.counts_parameters);
    const std::string text = to_text(report);
    EXPECT_EQ(text, explain(chain, plan));
    for (const ExplainStage& row : report.stages) {
      EXPECT_NE(text.find(row.keeps), std::string::npos) << row.keeps;
    }
    EXPECT_NE(
        text.find(std::to_string(report.peak_bytes) + " bytes"),
        std::string::npos);
  }
}

TEST(Explain, InvalidPlanIsReportedNotThrown) {
  const Chain chain({{1, 1, 8, 8, 0, 0}, {1, 1, 8, 8, 0, 0}}, 8);
  const Plan backward_first{{{OpKind::kBackward, 1}}};
  const std::string report = explain(chain, backward_first);
  EXPECT_EQ(report.rfind("invalid plan: op 0 (B1)", 0), 0u) << report;
  const ExplainReport data = explain_report(chain, backward_first);
  EXPECT_FALSE(data.valid);
  EXPECT_EQ(data.error.rfind("op 0 (B1)", 0), 0u) << data.error;
  EXPECT_TRUE(data.ops.empty());
}

TEST(Explain, WritesToAStream) {
  const Chain chain({{1, 1, 8, 8, 0, 0}, {1, 1, 8, 8, 0, 0}}, 8);
  const Plan plan = solve_store_all(chain);
  std::ostringstream out;
  explain(out, chain, plan);
  EXPECT_EQ(out.str(), explain(chain, plan));
  EXPECT_NE(out.str().find("predicted peak"), std::string::npos);
}

TEST(Replay, RefusesATemporaryChain) {
  static_assert(std::is_constructible_v<Replay, const Chain&>);
  static_assert(!std::is_constructible_v<Replay, Chain&&>);
  static_assert(!std::is_constructible_v<Replay, Chain>);
}

TEST(FormatBytes, ThreeSignificantDigitsInBinaryUnits) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(int64_t{37} * 1024 * 1024 + 200 * 1024), "37.2 MiB");
  EXPECT_EQ(format_bytes(int64_t{2} << 30), "2.00 GiB");
  EXPECT_EQ(format_bytes(-2048), "-2.00 KiB");
  // The digits are counted on the rounded value: where rounding reaches the
  // next decade or 1024, one decimal fewer or the next unit.
  EXPECT_EQ(format_bytes(10239), "10.0 KiB");
  EXPECT_EQ(format_bytes(102399), "100 KiB");
  EXPECT_EQ(format_bytes(1048575), "1.00 MiB");
  EXPECT_EQ(format_bytes(-1048575), "-1.00 MiB");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(INT64_MAX), "8.00 EiB");
}

}  // namespace
}  // namespace remat::planner
