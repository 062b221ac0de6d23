// explain(): the report's numbers are simulate()'s, op by op; format_bytes.
#include <gtest/gtest.h>

#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "remat/planner.h"
#include "test_chains.h"

namespace remat::planner {
namespace {

/// The exact byte counts of the op table's "live after" and "peak in op"
/// columns, read back from the report ("<#> <op> <kind> <live> (<unit>)
/// <peak> (<unit>)").
struct OpRow {
  int64_t live_after = 0;
  int64_t peak = 0;
};

std::vector<OpRow> op_rows(const std::string& report) {
  std::vector<OpRow> rows;
  std::istringstream lines(report);
  std::string line;
  while (std::getline(lines, line) &&
         line.find("peak in op") == std::string::npos) {
  }
  while (std::getline(lines, line) && !line.empty()) {
    std::istringstream cells(line);
    std::string index, op, kind, live, live_unit_a, live_unit_b, peak;
    cells >> index >> op >> kind >> live >> live_unit_a >> live_unit_b >> peak;
    rows.push_back({std::stoll(live), std::stoll(peak)});
  }
  return rows;
}

TEST(Explain, EveryOpPeakIsSimulatesStepByStep) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    const Chain chain = testing::random_chain(rng, 7, 1000);
    for (const Plan& plan : {solve_sqrt(chain), solve_store_all(chain)}) {
      const Simulation simulation = simulate(chain, plan);
      ASSERT_TRUE(simulation.valid) << simulation.error;
      ASSERT_EQ(simulation.op_peak_bytes.size(), plan.ops.size());
      const std::vector<OpRow> rows = op_rows(explain(chain, plan));
      ASSERT_EQ(rows.size(), plan.ops.size()) << explain(chain, plan);

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
        EXPECT_EQ(rows[k].peak, simulation.op_peak_bytes[k]) << "op " << k;
        EXPECT_EQ(rows[k].live_after, simulation.live_after_bytes[k]);
        largest = std::max(largest, simulation.op_peak_bytes[k]);
      }
      EXPECT_EQ(largest, simulation.peak_bytes);
    }
  }
}

TEST(Explain, InvalidPlanIsReportedNotThrown) {
  const Chain chain({{1, 1, 8, 8, 0, 0}, {1, 1, 8, 8, 0, 0}}, 8);
  const Plan backward_first{{{OpKind::kBackward, 1}}};
  const std::string report = explain(chain, backward_first);
  EXPECT_EQ(report.rfind("invalid plan: op 0 (B1)", 0), 0u) << report;
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
}

}  // namespace
}  // namespace remat::planner
