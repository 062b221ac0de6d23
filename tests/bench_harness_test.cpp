// Tests of remat::measure (the statistics every table reports, paired ratios
// and their intervals, the interleaved runner, its gradient gate and adaptive
// mode), of the report writers (src/report) and of the benchmark driver's
// scenario registry (bench/harness). Tiny models: each test takes milliseconds.
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "harness/scenario.h"
#include "remat/measure/runner.h"
#include "remat/measure/statistics.h"
#include "remat/remat.h"
#include "report/report.h"

namespace remat::bench {
namespace {

TEST(Summarize, ReportsMedianAndSpreadOfOddAndEvenSeries) {
  const Summary odd = summarize({3, 1, 2});
  EXPECT_EQ(odd.count, 3);
  EXPECT_DOUBLE_EQ(odd.median, 2);
  EXPECT_DOUBLE_EQ(odd.spread(), 2);
  const Summary even = summarize({4, 1, 3, 2});
  EXPECT_DOUBLE_EQ(even.median, 2.5);
  EXPECT_DOUBLE_EQ(even.min, 1);
  EXPECT_DOUBLE_EQ(even.max, 4);
}

TEST(Summarize, ThrowsOnAnEmptySeries) {
  EXPECT_THROW(summarize({}), std::invalid_argument);
}

TEST(GeometricMean, IsTheAverageOfRatiosAndRejectsNonPositiveValues) {
  EXPECT_NEAR(geometric_mean({0.5, 2.0}), 1.0, 1e-12);
  EXPECT_NEAR(geometric_mean({2.0, 8.0}), 4.0, 1e-12);
  EXPECT_THROW(geometric_mean({1.0, 0.0}), std::invalid_argument);
  EXPECT_THROW(geometric_mean({}), std::invalid_argument);
}

TEST(Cell, RendersBytesInBinaryUnitsForPeopleAndExactlyForMachines) {
  const Cell cell = Cell::bytes(3 << 19);  // 1.5 MiB
  EXPECT_EQ(cell.markdown(), "1.50 MiB");
  EXPECT_EQ(cell.csv(), "1572864");
  EXPECT_EQ(cell.json(), 1572864);
  EXPECT_EQ(Cell::ratio(1.23456).markdown(), "1.235");
  EXPECT_EQ(Cell::ms(12.34).markdown(), "12.3");
  EXPECT_EQ(Cell::empty().markdown(), "—");
  EXPECT_TRUE(Cell::empty().json().is_null());
}

TEST(Table, RejectsARowWithTheWrongNumberOfCells) {
  Table table;
  table.name = "t";
  table.columns = {"a", "b"};
  table.add_row({Cell::integer(1), Cell::integer(2)});
  EXPECT_THROW(table.add_row({Cell::integer(1)}), std::invalid_argument);
}

TEST(Writers, MarkdownCsvAndJsonCarryTheSameTable) {
  Section section;
  section.scenario = "T";
  section.title = "T — a test";
  section.command = "remat_bench T";
  section.add_text("About the table.");
  Table table;
  table.name = "rows";
  table.columns = {"name", "peak"};
  table.add_row({Cell::text("a, \"quoted\" | piped"), Cell::bytes(2048)});
  section.add_table(table);

  const std::string markdown = to_markdown(section);
  EXPECT_NE(markdown.find("## T — a test"), std::string::npos);
  EXPECT_NE(markdown.find("Command: `remat_bench T`"), std::string::npos);
  EXPECT_NE(markdown.find("| name | peak |"), std::string::npos);
  EXPECT_NE(markdown.find("piped | 2.00 KiB |"), std::string::npos);
  EXPECT_NE(markdown.find("\\|"), std::string::npos);

  EXPECT_EQ(to_csv(table), "name,peak\n\"a, \"\"quoted\"\" | piped\",2048\n");

  const nlohmann::json json = to_json(section);
  EXPECT_EQ(json["scenario"], "T");
  EXPECT_EQ(json["tables"][0]["name"], "rows");
  EXPECT_EQ(json["tables"][0]["rows"][0][1], 2048);
  EXPECT_EQ(json["text"][0], "About the table.");
}

struct TinyChain {
  TinyChain() {
    torch::manual_seed(3);
    model = torch::nn::Sequential(
        torch::nn::Linear(8, 16),
        torch::nn::ReLU(),
        torch::nn::Linear(16, 16),
        torch::nn::ReLU(),
        torch::nn::Linear(16, 4));
    input = torch::randn({5, 8});
  }
  ForwardFn plain() {
    return [model = model](const torch::Tensor& x) mutable {
      return model->forward(x);
    };
  }
  torch::nn::Sequential model;
  torch::Tensor input;
};

TEST(Runner, InterleavesTimedRoundsAndRerunsTheBaseline) {
  TinyChain tiny;
  RunnerOptions options;
  options.warmup = 1;
  options.rounds = 4;
  Runner runner({tiny.model.get(), tiny.input, {}}, options);
  auto model = tiny.model;
  const RunResult result = runner.run(
      {{"none", tiny.plain()},
       {"sequential(2)", [model](const torch::Tensor& x) mutable {
          return remat::checkpoint_sequential(model, 2, x);
        }}});
  ASSERT_EQ(result.configurations.size(), 2u);
  for (const Measurement& measured : result.configurations) {
    EXPECT_EQ(measured.step_ms.size(), 4u);
    EXPECT_EQ(measured.forward_ms.size(), 4u);
    EXPECT_EQ(measured.backward_ms.size(), 4u);
    EXPECT_GT(measured.peak_bytes, 0);
    EXPECT_EQ(measured.max_grad_diff, 0.0);
    for (size_t r = 0; r < measured.step_ms.size(); ++r) {
      EXPECT_DOUBLE_EQ(
          measured.step_ms[r],
          measured.forward_ms[r] + measured.backward_ms[r]);
    }
  }
  EXPECT_EQ(result.baseline_rerun.step_ms.size(), 4u);
  EXPECT_EQ(result.baseline().name, "none");
}

TEST(Runner, GradientGateRejectsAConfigurationThatComputesSomethingElse) {
  TinyChain tiny;
  RunnerOptions options;
  options.warmup = 0;
  options.rounds = 1;
  Runner runner({tiny.model.get(), tiny.input, {}}, options);
  auto model = tiny.model;
  const std::vector<Configuration> configurations{
      {"none", tiny.plain()},
      {"doubled", [model](const torch::Tensor& x) mutable {
         return model->forward(x) * 2;
       }}};
  try {
    runner.run(configurations);
    FAIL() << "the gate let 'doubled' through";
  } catch (const GradientMismatch& error) {
    EXPECT_NE(std::string(error.what()).find("doubled"), std::string::npos)
        << error.what();
  }
}

TEST(Runner, StepTimeCellsShowForwardBackwardStepSpreadAndRatio) {
  Measurement baseline;
  baseline.forward_ms = {1, 2, 3};
  baseline.backward_ms = {2, 4, 6};
  baseline.step_ms = {3, 6, 9};
  baseline.cpu_ms = {3, 6, 9};
  Measurement slower = baseline;
  slower.step_ms = {6, 12, 18};
  slower.cpu_ms = {3, 6, 9};
  const std::vector<Cell> cells = step_time_cells(slower, baseline);
  ASSERT_EQ(cells.size(), step_time_columns().size());
  EXPECT_DOUBLE_EQ(cells[0].value(), 2);   // forward median
  EXPECT_DOUBLE_EQ(cells[1].value(), 4);   // backward median
  EXPECT_DOUBLE_EQ(cells[2].value(), 12);  // step median
  EXPECT_DOUBLE_EQ(cells[3].value(), 12);  // step spread
  EXPECT_DOUBLE_EQ(cells[4].value(), 2);   // ratio to the baseline
  EXPECT_DOUBLE_EQ(cells[5].value(), 1);   // CPU ratio
  // Three rounds are too few for a 95 % interval, and the cell says so.
  EXPECT_NE(cells[4].markdown().find("too few rounds"), std::string::npos)
      << cells[4].markdown();
}

// The order statistics of the interval, checked against binomial sums
// computed here independently (exact integer counts of subsets).
TEST(PairedRatio, BoundsTheMedianByTheOrderStatisticsOfTheBinomial) {
  for (int64_t n = 1; n <= 40; ++n) {
    SCOPED_TRACE(n);
    std::vector<double> baseline(static_cast<size_t>(n), 10.0);
    std::vector<double> compared;
    for (int64_t i = 0; i < n; ++i) {
      compared.push_back(static_cast<double>(n - i));  // n..1: unsorted
    }
    const RatioInterval ratio = paired_ratio(compared, baseline);
    // P(X < k) for X ~ Binomial(n, 1/2), from C(n, j) summed in doubles.
    std::vector<double> below(static_cast<size_t>(n + 2), 0.0);
    double choose = 1;  // C(n, 0)
    for (int64_t j = 0; j <= n; ++j) {
      below[static_cast<size_t>(j + 1)] =
          below[static_cast<size_t>(j)] + choose / std::pow(2.0, n);
      choose = choose * static_cast<double>(n - j) / static_cast<double>(j + 1);
    }
    int64_t k = 0;
    for (int64_t c = 1; 2 * c <= n + 1; ++c) {
      if (1 - 2 * below[static_cast<size_t>(c)] >= 0.95) {
        k = c;
      }
    }
    EXPECT_EQ(ratio.has_interval, k > 0);
    EXPECT_EQ(ratio.rounds, n);
    if (k > 0) {
      // The sorted ratios are 0.1, 0.2, ..., n/10.
      EXPECT_NEAR(ratio.low, 0.1 * static_cast<double>(k), 1e-12);
      EXPECT_NEAR(ratio.high, 0.1 * static_cast<double>(n + 1 - k), 1e-12);
      EXPECT_NEAR(ratio.coverage, 1 - 2 * below[static_cast<size_t>(k)], 1e-12);
      EXPECT_GE(ratio.coverage, 0.95);
    } else {
      EXPECT_NEAR(ratio.low, 0.1, 1e-12);
      EXPECT_NEAR(ratio.high, 0.1 * static_cast<double>(n), 1e-12);
    }
    EXPECT_LE(ratio.low, ratio.median);
    EXPECT_GE(ratio.high, ratio.median);
  }
  EXPECT_FALSE(paired_ratio({1, 1, 1, 1, 1}, {1, 1, 1, 1, 1}).has_interval);
  EXPECT_TRUE(
      paired_ratio({1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1}).has_interval);
}

TEST(PairedRatio, ExcludesOneOnlyWhenTheWholeIntervalLiesOnOneSide) {
  const std::vector<double> base(10, 10.0);
  EXPECT_TRUE(paired_ratio({11, 12, 11, 13, 12, 11, 12, 14, 11, 12}, base)
                  .excludes_one());
  EXPECT_FALSE(paired_ratio({9, 12, 11, 13, 12, 11, 12, 14, 8, 12}, base)
                   .excludes_one());
  EXPECT_TRUE(
      paired_ratio({8, 9, 9, 8, 7, 9, 8, 9, 9, 8}, base).excludes_one());
}

TEST(PairedRatio, RefusesSeriesThatCannotBePaired) {
  EXPECT_THROW(paired_ratio({}, {}), std::invalid_argument);
  EXPECT_THROW(paired_ratio({1, 2}, {1}), std::invalid_argument);
  EXPECT_THROW(paired_ratio({1, 2}, {1, 0}), std::invalid_argument);
  EXPECT_THROW(paired_ratio({-1, 2}, {1, 1}), std::invalid_argument);
  EXPECT_THROW(paired_ratio({1}, {1}, 1.0), std::invalid_argument);
  try {
    paired_ratio({1, 2, 3}, {1, 2});
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("3 and 2"), std::string::npos)
        << error.what();
  }
  // A bad compared time is named as such, not as the (valid) baseline's.
  for (const double bad : {-1.0, std::nan("")}) {
    try {
      paired_ratio({1, bad, 3}, {1, 2, 3});
      ADD_FAILURE() << "no error for " << bad;
    } catch (const std::invalid_argument& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("compared times, got"), std::string::npos)
          << message;
      EXPECT_EQ(message.find("baseline"), std::string::npos) << message;
      EXPECT_NE(message.find("round 1"), std::string::npos) << message;
    }
  }
}

TEST(Runner, AdaptiveModeAddsRoundsUpToItsLimitAndSaysWhetherItConverged) {
  TinyChain tiny;
  RunnerOptions options;
  options.warmup = 0;
  options.rounds = 6;
  options.max_rounds = 9;
  options.target_half_width = 1e-12;  // never met by measured times
  const RunResult strict =
      Runner({tiny.model.get(), tiny.input, {}}, options)
          .run({{"none", tiny.plain()}, {"again", tiny.plain()}});
  EXPECT_FALSE(strict.converged);
  EXPECT_EQ(strict.rounds, 9);
  for (const Measurement& measured : strict.configurations) {
    EXPECT_EQ(measured.step_ms.size(), 9u);
    EXPECT_EQ(measured.cpu_ms.size(), 9u);
  }
  EXPECT_EQ(strict.baseline_rerun.step_ms.size(), 9u);
  options.target_half_width = 1e6;  // met at once
  const RunResult loose =
      Runner({tiny.model.get(), tiny.input, {}}, options)
          .run({{"none", tiny.plain()}, {"again", tiny.plain()}});
  EXPECT_TRUE(loose.converged);
  EXPECT_EQ(loose.rounds, 6);
  EXPECT_GE(loose.load_before, 0);  // /proc/loadavg exists on Linux
  EXPECT_GE(loose.load_after, 0);
}

TEST(Runner, BusyMachineWarningNamesTheLoadItSaw) {
  RunResult result;
  result.load_before = 0.1;
  result.load_after = 1.2;
  EXPECT_FALSE(busy_machine_warning(result, 1).has_value());
  result.load_before = 1.7;
  const auto warning = busy_machine_warning(result, 1);
  ASSERT_TRUE(warning.has_value());
  EXPECT_NE(warning->find("load average 1.7 before the run"), std::string::npos)
      << *warning;
  result.load_before = 0.1;
  result.load_after = 3.0;
  ASSERT_TRUE(busy_machine_warning(result, 2).has_value());
  EXPECT_NE(
      busy_machine_warning(result, 2)->find("3 at its end"), std::string::npos);
}

TEST(RegisterScenario, RejectsASecondScenarioOfTheSameName) {
  const auto setup = [](CLI::App&) -> ScenarioRun {
    return [](const Context&) { return Section(); };
  };
  EXPECT_TRUE(register_scenario({"test-twice", "a test", 1000, setup}));
  EXPECT_THROW(
      register_scenario({"test-twice", "again", 1000, setup}),
      std::logic_error);
}

// From 1075 rounds on, 0.5^n underflows to 0: the binomial terms must not
// all become 0 (which collapsed the interval onto the median with a claimed
// coverage of 1, and so "excluded 1" for ratios spread evenly around 1).
TEST(PairedRatio, KeepsAnIntervalForThousandsOfRounds) {
  for (const int n : {1074, 1075, 2000, 5000}) {
    SCOPED_TRACE(n);
    std::vector<double> compared, baseline(static_cast<size_t>(n), 1.0);
    for (int i = 0; i < n; ++i) {
      compared.push_back(0.5 + static_cast<double>(i) / n);  // 0.5 .. 1.5
    }
    const RatioInterval ratio = paired_ratio(compared, baseline);
    EXPECT_TRUE(ratio.has_interval);
    EXPECT_LT(ratio.low, 0.99);  // about 1 -+ 1.96 * 0.5 / sqrt(n) * ...
    EXPECT_GT(ratio.high, 1.0);
    EXPECT_FALSE(ratio.excludes_one());
    EXPECT_GE(ratio.coverage, 0.95);
    EXPECT_LT(ratio.coverage, 0.97);
  }
}

}  // namespace
}  // namespace remat::bench
