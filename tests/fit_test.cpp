// fit_test.cpp: fit_batch on a chain of residual MLP blocks: every answer was
// measured under the cap, checkpointing fits more than no checkpointing and
// the optimal plan at least as much as checkpoint_sequential, and each
// answer is near the largest that fits (20 % more does not fit). fit_size
// over the sequence length of a small GPT: every answer was measured under
// the cap, the optimal plan fits at least no checkpointing's length, and
// each answer is the largest (one more position does not fit the
// strategy's prediction on the chain profiled there, nor, measured, no
// checkpointing or the least-memory plan); with a selective
// policy the optimal plan fits at least as long a sequence. No size above
// max_size is ever made, however narrow the range.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/gpt.h"
#include "remat/fit.h"
#include "remat/remat.h"

namespace {

struct ResidualImpl : torch::nn::Module {
  ResidualImpl()
      : fc1(register_module("fc1", torch::nn::Linear(64, 256))),
        fc2(register_module("fc2", torch::nn::Linear(256, 64))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return x + fc2(torch::relu(fc1(x)));
  }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Residual);

std::vector<remat::Stage> residual_stages(int64_t blocks) {
  torch::manual_seed(2);
  torch::nn::Sequential model;
  for (int64_t i = 0; i < blocks; ++i) {
    model->push_back(Residual());
  }
  return remat::stages_of(model);
}

torch::Tensor rows(int64_t batch) {
  return torch::randn({batch, 64});
}

/// The measured activation peak (input included, loss excluded, as fit
/// measures it) of one step of `plan` over `stages` on `input`.
int64_t measured_peak(
    const std::vector<remat::Stage>& stages,
    const remat::planner::Plan& plan,
    const torch::Tensor& input) {
  remat::PlannedChain net(stages, plan);
  for (auto& parameter : net->parameters()) {  // allocated, as in training
    parameter.mutable_grad() = torch::zeros_like(parameter);
  }
  remat::MemoryMeter meter;
  torch::Tensor loss = net->forward(input).to(torch::kFloat).sum();
  loss.backward();
  return meter.peak_delta_bytes() - 2 * static_cast<int64_t>(loss.nbytes()) +
         static_cast<int64_t>(input.nbytes());
}

TEST(
    FitBatch,
    CheckpointingFitsLargerBatchesAndEveryAnswerWasMeasuredUnderTheCap) {
  const auto stages = residual_stages(16);
  constexpr int64_t kCap = 8 << 20;
  const auto answers = remat::fit_batch(rows, stages, kCap);
  ASSERT_EQ(answers.size(), 3u);
  EXPECT_EQ(answers[0].strategy, "none");
  EXPECT_EQ(answers[1].strategy, "checkpoint_sequential");
  EXPECT_EQ(answers[2].strategy, "optimal");
  for (const auto& answer : answers) {
    SCOPED_TRACE(answer.strategy);
    std::cout << "[ fit      ] " << answer.strategy << ": batch "
              << answer.batch << ", measured " << answer.measured_peak_bytes
              << " of " << kCap << " bytes, " << answer.ms_per_sample()
              << " ms per sample\n";
    ASSERT_GT(answer.batch, 0);
    EXPECT_LE(answer.measured_peak_bytes, kCap);
    EXPECT_LE(answer.predicted_peak_bytes, kCap);
    EXPECT_GT(answer.measured_step_ms, 0);
    EXPECT_GT(answer.ms_per_sample(), 0);
    // Near the largest: 20 % more does not fit the strategy's prediction.
    const int64_t more =
        static_cast<int64_t>(std::ceil(answer.batch * 1.2)) + 1;
    const auto chain = remat::profile_chain(stages, rows(more));
    const int64_t store_all =
        remat::planner::simulate(chain, remat::planner::solve_store_all(chain))
            .peak_bytes;
    if (answer.strategy == "none") {
      EXPECT_GT(store_all, kCap) << "batch " << more << " fits too";
    } else if (answer.strategy == "optimal") {
      EXPECT_GT(remat::planner::min_feasible_budget_bytes(chain), kCap)
          << "batch " << more << " fits too";
    }
  }
  EXPECT_GT(answers[1].batch, answers[0].batch);
  EXPECT_GE(answers[2].batch, answers[1].batch);
  EXPECT_GT(answers[1].segments, 0);
}

// The time limit compares predicted times per sample with no
// checkpointing's: a ratio every plan meets (huge) leaves every answer where
// the cap puts it; one no plan meets (tiny) leaves the checkpointing
// strategies nothing, and no checkpointing its answer. Every answer with a
// size is then timed against no checkpointing's in paired rounds.
TEST(FitBatch, TheTimeLimitKeepsTheCapsAnswersWhenLooseAndNoneWhenImpossible) {
  const auto stages = residual_stages(8);
  constexpr int64_t kCap = 2 << 20;
  const auto options = remat::FitOptions().max_batch(1024);
  const auto free = remat::fit_batch(rows, stages, kCap, options);
  const auto loose = remat::fit_batch(
      rows, stages, kCap, remat::FitOptions(options).max_time_ratio(1e6));
  const auto impossible = remat::fit_batch(
      rows, stages, kCap, remat::FitOptions(options).max_time_ratio(1e-9));
  ASSERT_EQ(free.size(), 3u);
  ASSERT_EQ(loose.size(), 3u);
  ASSERT_EQ(impossible.size(), 3u);
  ASSERT_GT(free[0].batch, 0);
  for (size_t i = 0; i < free.size(); ++i) {
    SCOPED_TRACE(free[i].strategy);
    EXPECT_EQ(loose[i].strategy, free[i].strategy);
    EXPECT_EQ(loose[i].batch, free[i].batch);
    EXPECT_LE(loose[i].measured_peak_bytes, kCap);
    EXPECT_EQ(free[i].measured_time_ratio.rounds, 0) << "no limit, no rounds";
    if (i > 0) {
      const remat::measure::RatioInterval& ratio = loose[i].measured_time_ratio;
      EXPECT_EQ(ratio.rounds, 10);
      EXPECT_TRUE(ratio.has_interval);
      EXPECT_GT(ratio.low, 0);
      EXPECT_LE(ratio.low, ratio.median);
      EXPECT_LE(ratio.median, ratio.high);
      EXPECT_GT(loose[i].predicted_time_ratio, 0);
      EXPECT_EQ(impossible[i].measured_time_ratio.rounds, 0) << "size 0";
    }
    EXPECT_EQ(impossible[i].strategy, free[i].strategy);
    if (i == 0) {
      EXPECT_EQ(impossible[i].batch, free[i].batch);
    } else {
      EXPECT_GT(free[i].batch, free[0].batch);
      EXPECT_EQ(impossible[i].batch, 0);
      EXPECT_EQ(impossible[i].size, 0);
    }
  }
}

// Under a limit between the two, every checkpointing answer is predicted
// within it, and the optimal strategy, whose class holds every
// checkpoint_sequential plan, never ends with a smaller batch.
TEST(FitBatch, UnderATimeLimitOptimalFitsAtLeastCheckpointSequentialsBatch) {
  const auto stages = residual_stages(8);
  constexpr int64_t kCap = 2 << 20;
  for (const double limit : {1.05, 1.3}) {
    SCOPED_TRACE(limit);
    const auto answers = remat::fit_batch(
        rows,
        stages,
        kCap,
        remat::FitOptions().max_batch(1024).max_time_ratio(limit));
    ASSERT_EQ(answers.size(), 3u);
    ASSERT_GT(answers[0].batch, 0);
    EXPECT_GE(answers[2].batch, answers[1].batch);
    for (size_t i = 1; i < answers.size(); ++i) {
      SCOPED_TRACE(answers[i].strategy);
      if (answers[i].batch > 0) {
        EXPECT_LE(answers[i].predicted_time_ratio, limit);
        EXPECT_LE(answers[i].measured_peak_bytes, kCap);
        EXPECT_EQ(answers[i].measured_time_ratio.rounds, 10);
      }
    }
  }
}

/// Whether `strategy` fits `chain` under `cap_bytes` on the prediction, by
/// its own rule: store-all's peak; some checkpoint_sequential(k)'s peak; an
/// optimal plan at the cap.
bool fits_by_prediction(
    const std::string& strategy,
    const remat::planner::Chain& chain,
    int64_t cap_bytes) {
  namespace planner = remat::planner;
  auto peak = [&](const planner::Plan& plan) {
    return planner::simulate(chain, plan).peak_bytes;
  };
  if (strategy == "none") {
    return peak(planner::solve_store_all(chain)) <= cap_bytes;
  }
  if (strategy == "checkpoint_sequential") {
    for (int64_t k = 1; k <= chain.size(); ++k) {
      if (peak(planner::solve_uniform(chain, k)) <= cap_bytes) {
        return true;
      }
    }
    return false;
  }
  const auto plan = planner::solve_optimal(chain, cap_bytes);
  return plan && peak(*plan) <= cap_bytes;
}

TEST(
    FitSize,
    GptSequenceLengthsAreMeasuredUnderTheCapAndOneMorePositionDoesNotFit) {
  namespace models = remat::models;
  torch::manual_seed(3);
  constexpr int64_t kVocab = 16, kBatch = 2, kMaxLength = 256;
  constexpr int64_t kCap = 512 << 10;
  const auto model = models::gpt(models::GptOptions()
                                     .vocab(kVocab)
                                     .seq_len(kMaxLength)
                                     .layers(3)
                                     .hidden(16)
                                     .heads(2)
                                     .dropout(0.1));
  auto make_problem = [&](int64_t length) {
    return remat::FitProblem{
        models::gpt_stages(model, models::causal_mask(length)),
        torch::randint(kVocab, {kBatch, length})};
  };
  const auto answers = remat::fit_size(
      make_problem,
      kCap,
      remat::FitSizeOptions().probe_size(8).max_size(kMaxLength));
  ASSERT_EQ(answers.size(), 3u);
  EXPECT_EQ(answers[0].strategy, "none");
  EXPECT_EQ(answers[1].strategy, "checkpoint_sequential");
  EXPECT_EQ(answers[2].strategy, "optimal");
  for (const auto& answer : answers) {
    SCOPED_TRACE(answer.strategy);
    std::cout << "[ fit      ] " << answer.strategy << ": length "
              << answer.size << ", measured " << answer.measured_peak_bytes
              << " of " << kCap << " bytes, predicted "
              << answer.predicted_peak_bytes << "\n";
    ASSERT_GT(answer.size, 0);
    ASSERT_LT(answer.size, kMaxLength) << "the cap does not bind";
    EXPECT_EQ(answer.batch, kBatch);
    EXPECT_LE(answer.measured_peak_bytes, kCap);
    EXPECT_LE(answer.predicted_peak_bytes, kCap);
    EXPECT_GT(answer.measured_step_ms, 0);
    // The largest: the next length does not fit by the strategy's rule on
    // the chain profiled there.
    const auto next = make_problem(answer.size + 1);
    const auto chain = remat::profile_chain(
        next.stages, next.input, remat::ProfileOptions().repeats(1));
    EXPECT_FALSE(fits_by_prediction(answer.strategy, chain, kCap))
        << "length " << answer.size + 1 << " fits too";
    // And measured: no checkpointing's step, or the least-memory plan, at
    // the next length peaks above the cap (the predictions are not merely
    // consistent with the search, they are what a step measures).
    const remat::planner::Plan tightest =
        answer.strategy == "none" ? remat::planner::solve_store_all(chain)
                                  : remat::planner::solve_min_memory(chain);
    if (answer.strategy != "checkpoint_sequential") {
      EXPECT_GT(measured_peak(next.stages, tightest, next.input), kCap)
          << "length " << answer.size + 1 << " measured under the cap";
    }
  }
  EXPECT_GE(answers[2].size, answers[0].size);

  // Profiled with a selective policy, the model carries the selective costs
  // and the measured step runs selective stages under it: a third way to
  // run each stage can only let the optimal plan fit more.
  const auto selective = remat::fit_size(
      make_problem,
      kCap,
      remat::FitSizeOptions()
          .probe_size(8)
          .max_size(kMaxLength)
          .profile(
              remat::ProfileOptions().warmup(1).repeats(1).selective_policy(
                  remat::policies::save_compute_intensive())));
  ASSERT_EQ(selective.size(), 3u);
  for (const auto& answer : selective) {
    SCOPED_TRACE("selective " + answer.strategy);
    ASSERT_GT(answer.size, 0);
    EXPECT_LE(answer.measured_peak_bytes, kCap);
  }
  EXPECT_GE(selective[2].size, answers[2].size);
}

TEST(FitBatch, RefusesBadArguments) {
  const auto stages = residual_stages(2);
  EXPECT_THROW(remat::fit_batch(rows, stages, 0), c10::Error);
  EXPECT_THROW(
      remat::fit_batch(
          rows, stages, 1 << 20, remat::FitOptions().probe_batch(0)),
      c10::Error);
  try {
    remat::fit_batch(
        [](int64_t) {
          return torch::randn({3, 64});
        },
        stages,
        1 << 20);
    ADD_FAILURE() << "expected an error for an input of the wrong batch";
  } catch (const c10::Error& error) {
    EXPECT_NE(
        std::string(error.what()).find("first dimension is 4, got [3, 64]"),
        std::string::npos)
        << error.what();
  }
}

// With a time limit every answer is timed; the caller's gradients and RNG
// come back as they were, whatever the number of answers timed.
TEST(FitBatch, TimingTheAnswersLeavesGradientsAndRngAsTheyWere) {
  torch::manual_seed(0);
  const auto stages = residual_stages(2);
  std::vector<torch::Tensor> parameters;
  for (const remat::Stage& stage : stages) {
    for (const torch::Tensor& p : stage.module->parameters()) {
      parameters.push_back(p);
    }
  }
  for (torch::Tensor& p : parameters) {
    p.mutable_grad() = torch::full_like(p, 7.0);
  }
  torch::manual_seed(42);
  const torch::Tensor expected = torch::rand({4});
  torch::manual_seed(42);
  const auto answers = remat::fit_batch(
      [](int64_t batch) {
        return torch::ones({batch, 64});
      },
      stages,
      2 << 20,
      remat::FitOptions().probe_batch(4).max_batch(64).max_time_ratio(1.5));
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected));
  for (const torch::Tensor& p : parameters) {
    EXPECT_TRUE(torch::all(p.grad() == 7.0).item<bool>());
  }
}

// Sizes far beyond any memory count as "does not fit", not as a broken
// model; bounds past 2^60 are refused; so are no stages, and stages whose
// count changes with the size.
TEST(FitBatch, HugeBoundsAndChangingStagesAreHandled) {
  const auto stages = residual_stages(2);
  const auto small = remat::fit_batch(
      rows,
      stages,
      1 << 19,
      remat::FitOptions().probe_batch(4).max_batch(1024));
  const auto huge = remat::fit_batch(
      rows,
      stages,
      1 << 19,
      remat::FitOptions().probe_batch(4).max_batch(int64_t{1} << 55));
  ASSERT_EQ(small.size(), huge.size());
  for (size_t k = 0; k < small.size(); ++k) {
    EXPECT_LT(small[k].batch, 1024) << small[k].strategy;
    EXPECT_EQ(small[k].batch, huge[k].batch) << small[k].strategy;
  }
  const auto message = [](const std::function<void()>& body) {
    try {
      body();
    } catch (const c10::Error& error) {
      return std::string(error.what());
    }
    return std::string("(no error)");
  };
  const std::string too_big = message([&] {
    remat::fit_batch(
        rows,
        stages,
        1 << 20,
        remat::FitOptions().max_batch(std::numeric_limits<int64_t>::max()));
  });
  EXPECT_NE(too_big.find("max_batch <= 2^60"), std::string::npos) << too_big;
  const std::string none =
      message([&] { remat::fit_batch(rows, {}, 1 << 20); });
  EXPECT_NE(none.find("at least one stage, got 0"), std::string::npos) << none;
  const std::string changing = message([&] {
    remat::fit_size(
        [&](int64_t n) {
          return remat::FitProblem{residual_stages(n < 8 ? 2 : 3), rows(n)};
        },
        1 << 20,
        remat::FitSizeOptions().probe_size(4).max_size(64));
  });
  EXPECT_NE(changing.find("the same stages at every size"), std::string::npos)
      << changing;
  // A graph whose stages read other stages at other sizes: the answers
  // would rest on a profile of another graph.
  using In = const std::vector<torch::Tensor>&;
  const auto graph_of_size = [](int64_t n) {
    std::vector<remat::GraphStage> stages = {
        {[](In in) { return torch::tanh(in[0]); }, nullptr, {-1}},
        {[](In in) { return in[0] * 2; }, nullptr, {0}},
        {[](In in) { return in[0].sigmoid(); }, nullptr, {1}}};
    if (n > 8) {
      stages[2] = {[](In in) { return in[0] * in[1]; }, nullptr, {1, 0}};
    }
    return stages;
  };
  const std::string rewired = message([&] {
    remat::fit_size(
        [&](int64_t n) {
          return remat::GraphFitProblem{
              graph_of_size(n), torch::randn({n, 16}).requires_grad_(true)};
        },
        1 << 20,
        remat::FitSizeOptions().probe_size(4).max_size(64));
  });
  EXPECT_NE(rewired.find("the same graph at every size"), std::string::npos)
      << rewired;
  EXPECT_NE(rewired.find("stage 2 reading [1]"), std::string::npos) << rewired;
}

// No problem above max_size is made, whatever the size model and however
// narrow [probe_size, max_size]: where 2 or 4 probe_size is past max_size
// the profiles spread over the range, and where the range holds fewer sizes
// than the model needs every size in it is profiled. make_problem refuses
// a size above max_size, as a model built for max_size positions does.
TEST(FitSize, NeverMakesAProblemAboveMaxSize) {
  using remat::SizeModel;
  const auto sizes_of = [](SizeModel model, int64_t probe, int64_t max) {
    return remat::fit_profile_sizes(
        remat::FitSizeOptions().size_model(model).probe_size(probe).max_size(
            max));
  };
  using Sizes = std::vector<int64_t>;
  EXPECT_EQ(sizes_of(SizeModel::kQuadratic, 16, 512), (Sizes{16, 32, 64}));
  EXPECT_EQ(sizes_of(SizeModel::kQuadratic, 16, 64), (Sizes{16, 32, 64}));
  EXPECT_EQ(sizes_of(SizeModel::kQuadratic, 16, 63), (Sizes{16, 39, 63}));
  EXPECT_EQ(sizes_of(SizeModel::kQuadratic, 16, 32), (Sizes{16, 24, 32}));
  EXPECT_EQ(sizes_of(SizeModel::kQuadratic, 16, 18), (Sizes{16, 17, 18}));
  EXPECT_EQ(sizes_of(SizeModel::kQuadratic, 16, 17), (Sizes{16, 17}));
  EXPECT_EQ(sizes_of(SizeModel::kQuadratic, 16, 16), (Sizes{16}));
  EXPECT_EQ(sizes_of(SizeModel::kAffine, 16, 512), (Sizes{16, 32}));
  EXPECT_EQ(sizes_of(SizeModel::kAffine, 16, 20), (Sizes{16, 20}));
  EXPECT_EQ(sizes_of(SizeModel::kAffine, 16, 17), (Sizes{16, 17}));
  EXPECT_EQ(sizes_of(SizeModel::kAffine, 16, 16), (Sizes{16}));
  EXPECT_EQ(
      sizes_of(SizeModel::kQuadratic, int64_t{1} << 59, int64_t{1} << 60),
      (Sizes{int64_t{1} << 59, 3 * (int64_t{1} << 58), int64_t{1} << 60}));

  const auto stages = residual_stages(2);
  constexpr int64_t kCap = 1 << 20;  // every size here fits
  for (const SizeModel model : {SizeModel::kAffine, SizeModel::kQuadratic}) {
    for (const int64_t max_size : {16, 17, 18, 20, 32, 63}) {
      SCOPED_TRACE(
          std::string(model == SizeModel::kAffine ? "affine" : "quadratic") +
          ", max_size " + std::to_string(max_size));
      std::vector<int64_t> made;
      auto make_problem = [&](int64_t batch) {
        made.push_back(batch);
        TORCH_CHECK(
            batch <= max_size,
            "make_problem: expected a size <= ",
            max_size,
            ", got ",
            batch);
        return remat::FitProblem{stages, rows(batch)};
      };
      const auto options =
          remat::FitSizeOptions().size_model(model).probe_size(16).max_size(
              max_size);
      std::vector<remat::FitAnswer> answers;
      EXPECT_NO_THROW(answers = remat::fit_size(make_problem, kCap, options));
      EXPECT_EQ(answers.size(), 3u);
      for (const auto& answer : answers) {
        EXPECT_EQ(answer.size, max_size) << answer.strategy;
        EXPECT_LE(answer.measured_peak_bytes, kCap) << answer.strategy;
      }
      for (const int64_t size : made) {
        EXPECT_GE(size, 16);
        EXPECT_LE(size, max_size) << "make_problem(" << size << ")";
      }
      for (const int64_t size : remat::fit_profile_sizes(options)) {
        EXPECT_NE(std::find(made.begin(), made.end(), size), made.end())
            << "size " << size << " was not profiled";
      }
    }
  }
  // fit_batch: the batches of make_input stay within max_batch too.
  std::vector<int64_t> batches;
  const auto answers = remat::fit_batch(
      [&](int64_t batch) {
        batches.push_back(batch);
        return rows(batch);
      },
      stages,
      kCap,
      remat::FitOptions().probe_batch(4).max_batch(5));
  for (const auto& answer : answers) {
    EXPECT_EQ(answer.batch, 5) << answer.strategy;
  }
  for (const int64_t batch : batches) {
    EXPECT_LE(batch, 5) << "make_input(" << batch << ")";
  }
}

// The GPT's position embedding holds seq_len positions: fitting up to
// max_size = seq_len, with the default probe_size (16, whose 4 times is
// past 32), never asks for a longer sequence.
TEST(FitSize, AGptBuiltForMaxSizePositionsFitsUpToIt) {
  namespace models = remat::models;
  torch::manual_seed(4);
  constexpr int64_t kVocab = 16, kBatch = 2, kMaxLength = 32;
  const auto model = models::gpt(models::GptOptions()
                                     .vocab(kVocab)
                                     .seq_len(kMaxLength)
                                     .layers(1)
                                     .hidden(16)
                                     .heads(2));
  auto make_problem = [&](int64_t length) {
    return remat::FitProblem{
        models::gpt_stages(model, models::causal_mask(length)),
        torch::randint(kVocab, {kBatch, length})};
  };
  std::vector<remat::FitAnswer> answers;
  ASSERT_NO_THROW(
      answers = remat::fit_size(
          make_problem,
          64 << 20,
          remat::FitSizeOptions().max_size(kMaxLength)));
  ASSERT_EQ(answers.size(), 3u);
  for (const auto& answer : answers) {
    EXPECT_EQ(answer.size, kMaxLength) << answer.strategy;
  }
}

TEST(FitSize, RefusesBadArgumentsNamingTheValue) {
  const auto stages = residual_stages(2);
  auto make_problem = [&](int64_t batch) {
    return remat::FitProblem{stages, rows(batch)};
  };
  struct Case {
    int64_t cap_bytes;
    remat::FitSizeOptions options;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {0, {}, "expected cap_bytes > 0, got 0"},
      {1 << 20,
       remat::FitSizeOptions().probe_size(0),
       "expected probe_size >= 1, got 0"},
      {1 << 20,
       remat::FitSizeOptions().probe_size(8).max_size(4),
       "expected max_size >= probe_size (8), got 4"},
      {1 << 20,
       remat::FitSizeOptions().max_time_ratio(-1),
       "expected max_time_ratio >= 0, got -1"},
      {1 << 20,
       remat::FitSizeOptions().units_of_size(
           [](int64_t n) { return n == 16 ? 0.0 : 1.0; }),
       "units_of_size(16) must be a positive finite number, got 0"},
      {1 << 20,
       remat::FitSizeOptions().max_size(32).units_of_size([](int64_t n) {
         return n == 32 ? std::numeric_limits<double>::infinity() : 1.0;
       }),
       "units_of_size(32) must be a positive finite number, got inf"},
  };
  for (const Case& test : cases) {
    try {
      remat::fit_size(make_problem, test.cap_bytes, test.options);
      ADD_FAILURE() << "expected an error: " << test.expected;
    } catch (const c10::Error& error) {
      EXPECT_NE(
          std::string(error.what()).find("remat::fit_size: " + test.expected),
          std::string::npos)
          << error.what();
    }
  }
  try {
    remat::fit_size(
        [&](int64_t) {
          return remat::FitProblem{stages, torch::Tensor()};
        },
        1 << 20);
    ADD_FAILURE() << "expected an error for an undefined input";
  } catch (const c10::Error& error) {
    EXPECT_NE(
        std::string(error.what()).find("make_problem(16) must return"),
        std::string::npos)
        << error.what();
  }
}

// The top of the int64_t range: every size in a range narrower than the
// model needs, without stepping past INT64_MAX.
TEST(FitSize, ProfileSizesReachTheTopOfTheRange) {
  constexpr int64_t kTop = std::numeric_limits<int64_t>::max();
  using Sizes = std::vector<int64_t>;
  for (const auto model :
       {remat::SizeModel::kAffine, remat::SizeModel::kQuadratic}) {
    EXPECT_EQ(
        remat::fit_profile_sizes(
            remat::FitSizeOptions().size_model(model).probe_size(kTop).max_size(
                kTop)),
        (Sizes{kTop}));
  }
  EXPECT_EQ(
      remat::fit_profile_sizes(remat::FitSizeOptions()
                                   .size_model(remat::SizeModel::kQuadratic)
                                   .probe_size(kTop - 1)
                                   .max_size(kTop)),
      (Sizes{kTop - 1, kTop}));
}

// Memory that is a step in the size (4 rows below 100, 4000 from 100 on):
// the model through profiles on the flat part is wrong far from them, and
// the checks take several rounds. checkpoint_sequential's plans are in the
// optimal plan's class (each check weighs them on the same profile), so the
// optimal plan never answers below it, with a time limit or without.
TEST(FitSize, OptimalNeverAnswersBelowCheckpointSequentialOnAStepInMemory) {
  const auto stages = residual_stages(3);
  constexpr int64_t kCap = 1 << 20;  // 4 rows fit, 4000 do not
  auto make_problem = [&](int64_t size) {
    return remat::FitProblem{stages, rows(size < 100 ? 4 : 4000)};
  };
  for (const double ratio : {0.0, 1.5}) {
    SCOPED_TRACE("max_time_ratio " + std::to_string(ratio));
    const auto answers = remat::fit_size(
        make_problem,
        kCap,
        remat::FitSizeOptions()
            .size_model(remat::SizeModel::kAffine)
            .probe_size(16)
            .max_size(4096)
            .max_time_ratio(ratio));
    ASSERT_EQ(answers.size(), 3u);
    EXPECT_GT(answers[1].size, 0);
    EXPECT_GE(answers[2].size, answers[1].size);
    for (const auto& answer : answers) {
      EXPECT_LT(answer.size, 100) << answer.strategy;
      EXPECT_LE(answer.measured_peak_bytes, kCap) << answer.strategy;
    }
  }
}

}  // namespace
