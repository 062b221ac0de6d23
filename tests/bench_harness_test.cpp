// Tests of the benchmark harness (bench/harness): the statistics every table
// reports, the report writers, the interleaved runner and its gradient gate,
// and the scenario registry. Tiny models: each test takes milliseconds.
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "harness/report.h"
#include "harness/runner.h"
#include "harness/scenario.h"
#include "harness/statistics.h"
#include "remat/remat.h"

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
  Measurement slower = baseline;
  slower.step_ms = {6, 12, 18};
  const std::vector<Cell> cells = step_time_cells(slower, baseline);
  ASSERT_EQ(cells.size(), step_time_columns().size());
  EXPECT_DOUBLE_EQ(cells[0].value(), 2);   // forward median
  EXPECT_DOUBLE_EQ(cells[1].value(), 4);   // backward median
  EXPECT_DOUBLE_EQ(cells[2].value(), 12);  // step median
  EXPECT_DOUBLE_EQ(cells[3].value(), 12);  // step spread
  EXPECT_DOUBLE_EQ(cells[4].value(), 2);   // ratio to the baseline
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

}  // namespace
}  // namespace remat::bench
