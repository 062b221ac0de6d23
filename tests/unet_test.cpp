// Tests of the U-Net demo model and the synthetic segmentation data
// (remat_models): the graph stages compute forward() bitwise (2D and 3D,
// every norm, dropout), input sizes and options are checked with messages
// that name the rule and the value, phantoms are deterministic per seed with
// binary labels, the loss and Dice follow their definitions, and a tiny U-Net
// learns to segment phantoms.
#include <models/models.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

namespace {

using namespace remat::models;

/// Runs `stages` in order on `input`: each stage on the values its inputs
/// name; the last stage's value is the result.
torch::Tensor run_stages_in_order(
    const std::vector<remat::GraphStage>& stages, const torch::Tensor& input) {
  std::vector<torch::Tensor> values;
  for (const auto& stage : stages) {
    std::vector<torch::Tensor> arguments;
    for (int index : stage.inputs) {
      arguments.push_back(
          index == remat::kGraphInput ? input
                                      : values.at(static_cast<size_t>(index)));
    }
    values.push_back(stage.forward(arguments));
  }
  return values.back();
}

/// Expects the stages of `net` to give forward()'s output on `input`
/// bitwise, in train mode (from the same RNG state) and in eval mode.
/// Both ways of cutting stages (UNetStageSplit).
void expect_stages_equal_forward(UNet net, const torch::Tensor& input) {
  for (const UNetStageSplit split :
       {UNetStageSplit::kBlock, UNetStageSplit::kConvolution}) {
    const auto stages = net->stages(split);
    for (bool training : {true, false}) {
      SCOPED_TRACE(
          std::string(split == UNetStageSplit::kBlock ? "blocks" : "rounds") +
          (training ? ", train mode" : ", eval mode"));
      net->train(training);
      torch::manual_seed(7);
      const auto direct = net->forward(input);
      torch::manual_seed(7);
      const auto staged = run_stages_in_order(stages, input);
      ASSERT_EQ(staged.sizes(), direct.sizes());
      EXPECT_TRUE(torch::equal(staged, direct))
          << "max difference " << (staged - direct).abs().max().item<double>();
    }
  }
}

/// The number of parameter elements of `stages`' modules.
int64_t staged_parameters(const std::vector<remat::GraphStage>& stages) {
  int64_t count = 0;
  for (const auto& stage : stages) {
    for (const auto& parameter : stage.module->parameters()) {
      count += parameter.numel();
    }
  }
  return count;
}

/// Sets LibTorch's intra-op thread count for the scope, then restores it.
class IntraOpThreadsScope {
 public:
  explicit IntraOpThreadsScope(int threads)
      : threads_before_(torch::get_num_threads()) {
    torch::set_num_threads(threads);
  }
  ~IntraOpThreadsScope() {
    torch::set_num_threads(threads_before_);
  }
  IntraOpThreadsScope(const IntraOpThreadsScope&) = delete;
  IntraOpThreadsScope& operator=(const IntraOpThreadsScope&) = delete;

 private:
  int threads_before_;
};

/// Success if `call` throws a c10::Error whose message contains `expected`;
/// otherwise a failure showing the message.
template <typename Call>
::testing::AssertionResult throws_containing(
    Call call, const std::string& expected) {
  try {
    call();
  } catch (const c10::Error& error) {
    const std::string message = error.what_without_backtrace();
    if (message.find(expected) != std::string::npos) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure()
           << "expected an error containing '" << expected << "', got '"
           << message << "'";
  }
  return ::testing::AssertionFailure()
         << "expected an error containing '" << expected << "', got none";
}

TEST(UNet, StagesEqualForwardBitwiseIn2dWithBatchNorm) {
  torch::manual_seed(0);
  UNet net(UNetOptions().dims(2).levels(3).base_width(4));
  const auto input = torch::randn({2, 1, 16, 24});
  EXPECT_EQ(net->forward(input).sizes(), (std::vector<int64_t>{2, 2, 16, 24}));
  expect_stages_equal_forward(net, input);
}

TEST(UNet, StagesEqualForwardBitwiseIn2dWithDropout) {
  torch::manual_seed(1);
  UNet net(UNetOptions().dims(2).levels(2).base_width(4).dropout(0.3));
  expect_stages_equal_forward(net, torch::randn({2, 1, 16, 16}));
  // Dropout is live in train mode: two draws differ.
  net->train();
  const auto input = torch::randn({2, 1, 16, 16});
  EXPECT_FALSE(torch::equal(net->forward(input), net->forward(input)));
}

TEST(UNet, StagesEqualForwardBitwiseIn3dWithEveryNorm) {
  for (UNetNorm norm : {UNetNorm::kBatch, UNetNorm::kGroup, UNetNorm::kNone}) {
    SCOPED_TRACE("norm " + to_string(norm));
    torch::manual_seed(2);
    UNet net(UNetOptions()
                 .dims(3)
                 .in_channels(2)
                 .classes(3)
                 .levels(2)
                 .base_width(4)
                 .norm(norm)
                 .norm_groups(2)
                 .dropout(0.1));
    const auto input = torch::randn({2, 2, 8, 8, 12});
    EXPECT_EQ(
        net->forward(input).sizes(), (std::vector<int64_t>{2, 3, 8, 8, 12}));
    expect_stages_equal_forward(net, input);
  }
}

TEST(UNet, StagesShareTheChildrenAndReadTheirSkips) {
  const int64_t levels = 3;
  UNet net(UNetOptions().levels(levels).base_width(4));
  const auto stages = net->stages();
  ASSERT_EQ(stages.size(), static_cast<size_t>(3 * levels + 2));
  // Encoder l and pool l are stages 2l and 2l + 1, each reading the stage
  // before it (encoder 0 the graph input), and use encoder[l] and pools[l].
  for (int64_t level = 0; level < levels; ++level) {
    const auto& block = stages[static_cast<size_t>(2 * level)];
    const auto& pool = stages[static_cast<size_t>(2 * level + 1)];
    EXPECT_EQ(
        block.inputs,
        std::vector<int>{
            level == 0 ? remat::kGraphInput : static_cast<int>(2 * level - 1)});
    EXPECT_EQ(pool.inputs, std::vector<int>{static_cast<int>(2 * level)});
    EXPECT_EQ(block.module.get(), net->encoder[level].ptr().get());
    EXPECT_EQ(pool.module.get(), net->pools[level].ptr().get());
  }
  EXPECT_EQ(stages[2 * levels].module.get(), net->bottleneck.ptr().get());
  // Decoder l reads the stage before it and encoder l's stage.
  for (int64_t level = levels - 1; level >= 0; --level) {
    const auto index = static_cast<size_t>(2 * levels + levels - level);
    EXPECT_EQ(
        stages[index].inputs,
        (std::vector<int>{
            static_cast<int>(index) - 1, static_cast<int>(2 * level)}));
    EXPECT_EQ(stages[index].module.get(), net->decoder[level].ptr().get());
  }
  EXPECT_EQ(stages.back().module.get(), net->head.ptr().get());
  // The stages' modules hold every parameter of the net, once.
  int64_t net_parameters = 0;
  for (const auto& parameter : net->parameters()) {
    net_parameters += parameter.numel();
  }
  EXPECT_EQ(staged_parameters(stages), net_parameters);
}

TEST(UNet, ConvolutionStagesAreTheRoundsOfEveryBlockAndReadTheirSkips) {
  const int64_t levels = 3;
  UNet net(UNetOptions().levels(levels).base_width(4).dropout(0.1));
  const auto stages = net->stages(UNetStageSplit::kConvolution);
  ASSERT_EQ(stages.size(), static_cast<size_t>(6 * levels + 3));
  // Encoder l: rounds at 3l, 3l + 1, then pool l at 3l + 2, in a row.
  for (int64_t level = 0; level < levels; ++level) {
    const auto first = static_cast<size_t>(3 * level);
    for (size_t k = first; k < first + 3; ++k) {
      EXPECT_EQ(
          stages[k].inputs,
          std::vector<int>{
              k == 0 ? remat::kGraphInput : static_cast<int>(k) - 1});
    }
    // A round shares the block's modules: conv, norm, ReLU, Dropout.
    EXPECT_EQ(stages[first].module->children().size(), 4u);
    EXPECT_EQ(
        stages[first].module->children().front().get(),
        net->encoder[level]->layers->children().front().get());
    EXPECT_EQ(
        stages[first + 1].module->children().front().get(),
        net->encoder[level]->layers->children()[4].get());
    EXPECT_EQ(stages[first + 2].module.get(), net->pools[level].ptr().get());
  }
  // Bottleneck rounds at 3L, 3L + 1; then per decoder level (deepest
  // first) join, round 0, round 1; join l reads the stage before it and
  // encoder l's round 1.
  size_t index = static_cast<size_t>(3 * levels + 2);
  for (int64_t level = levels - 1; level >= 0; --level, index += 3) {
    EXPECT_EQ(
        stages[index].inputs,
        (std::vector<int>{
            static_cast<int>(index) - 1, static_cast<int>(3 * level + 1)}));
    EXPECT_EQ(stages[index].module.get(), net->decoder[level]->up.ptr().get());
    EXPECT_EQ(
        stages[index + 1].inputs, std::vector<int>{static_cast<int>(index)});
  }
  EXPECT_EQ(index, stages.size() - 1);
  EXPECT_EQ(stages.back().module.get(), net->head.ptr().get());
  int64_t net_parameters = 0;
  for (const auto& parameter : net->parameters()) {
    net_parameters += parameter.numel();
  }
  EXPECT_EQ(staged_parameters(stages), net_parameters);
  EXPECT_TRUE(throws_containing(
      [&] { net->encoder[0]->round(2); }, "expected round 0 or 1, got 2"));
}

TEST(UNet, RefusesSpatialSizesNotDivisibleByTwoToTheLevels) {
  UNet net(UNetOptions().levels(3).base_width(4));
  const auto wrong = torch::randn({1, 1, 32, 36});
  const std::string rule =
      "expected every spatial size divisible by 2^levels = 8 (levels 3), got "
      "size 36 in dimension 3 of input [1, 1, 32, 36]";
  EXPECT_TRUE(throws_containing([&] { net->forward(wrong); }, rule));
  // The first stage checks the graph input as forward() does.
  const auto stages = net->stages();
  EXPECT_TRUE(throws_containing([&] { stages[0].forward({wrong}); }, rule));
  // A wrong rank or channel count names the shape.
  UNet volume_net(UNetOptions().dims(3).levels(1).base_width(4));
  EXPECT_TRUE(throws_containing(
      [&] {
        volume_net->forward(torch::randn({1, 1, 8, 8}));
      },
      "expected input [N, 1, D, H, W], got [1, 1, 8, 8]"));
  EXPECT_TRUE(throws_containing(
      [&] {
        net->forward(torch::randn({1, 3, 8, 8}));
      },
      "expected input [N, 1, H, W], got [1, 3, 8, 8]"));
  // Multiples of 2^levels, not squares, are what is required.
  EXPECT_EQ(
      net->forward(torch::randn({1, 1, 8, 16})).sizes(),
      (std::vector<int64_t>{1, 2, 8, 16}));
}

// BatchNorm in training needs two values per channel or more: a bottleneck
// of one value (batch 1, an input of 2^levels per side) is refused before
// LibTorch's own error deep inside, by forward() and by the first stage; in
// eval mode, or with GroupNorm, it runs.
TEST(UNet, RefusesABottleneckOfOneValueForBatchNormInTraining) {
  UNet net(UNetOptions().levels(3).base_width(4));
  const auto single = torch::randn({1, 1, 8, 8});
  const std::string rule =
      "BatchNorm in training needs more than one value per channel, and the "
      "bottleneck of input [1, 1, 8, 8] (levels 3) has 1";
  EXPECT_TRUE(throws_containing([&] { net->forward(single); }, rule));
  const auto stages = net->stages();
  EXPECT_TRUE(throws_containing([&] { stages[0].forward({single}); }, rule));
  net->eval();
  EXPECT_EQ(net->forward(single).sizes(), (std::vector<int64_t>{1, 2, 8, 8}));
  EXPECT_EQ(
      stages[0].forward({single}).sizes(),
      (std::vector<int64_t>{1, 4, 8, 8}));  // the first block's output
  UNet grouped(UNetOptions().levels(3).base_width(4).norm(UNetNorm::kGroup));
  EXPECT_EQ(
      grouped->forward(single).sizes(), (std::vector<int64_t>{1, 2, 8, 8}));
}

TEST(UNet, RefusesBadOptionsNamingTheValue) {
  EXPECT_TRUE(throws_containing(
      [] { UNet(UNetOptions().dims(4)); }, "expected dims 2 or 3, got 4"));
  EXPECT_TRUE(throws_containing(
      [] { UNet(UNetOptions().levels(0)); }, "expected levels >= 1, got 0"));
  EXPECT_TRUE(throws_containing(
      [] { UNet(UNetOptions().base_width(0)); }, "base_width >= 1, got 0"));
  EXPECT_TRUE(throws_containing(
      [] { UNet(UNetOptions().classes(0)); }, "classes >= 1, got 0"));
  EXPECT_TRUE(throws_containing(
      [] { UNet(UNetOptions().dropout(1.0)); }, "dropout in [0, 1), got 1"));
  EXPECT_TRUE(throws_containing(
      [] { UNet(UNetOptions().norm(UNetNorm::kGroup).base_width(6)); },
      "norm_groups dividing base_width 6, got 4"));
  EXPECT_EQ(parse_unet_norm("group"), UNetNorm::kGroup);
  EXPECT_EQ(to_string(parse_unet_norm("none")), "none");
  EXPECT_TRUE(throws_containing([] { parse_unet_norm("layer"); }, "'layer'"));
}

TEST(UNet, CloneCopiesParametersIntoNewModules) {
  torch::manual_seed(3);
  UNet net(UNetOptions().levels(2).base_width(4));
  auto copy = std::dynamic_pointer_cast<UNetImpl>(net->clone());
  ASSERT_NE(copy, nullptr);
  net->eval();
  copy->eval();
  const auto input = torch::randn({1, 1, 8, 8});
  EXPECT_TRUE(torch::equal(copy->forward(input), net->forward(input)));
  EXPECT_NE(copy->encoder[0].get(), net->encoder[0].get());
}

TEST(SegmentationData, PhantomsAreDeterministicPerSeed) {
  const auto first = phantom_batch(3, {24, 32}, 11);
  const auto again = phantom_batch(3, {24, 32}, 11);
  const auto other = phantom_batch(3, {24, 32}, 12);
  EXPECT_EQ(first.images.sizes(), (std::vector<int64_t>{3, 1, 24, 32}));
  EXPECT_EQ(first.labels.sizes(), (std::vector<int64_t>{3, 24, 32}));
  EXPECT_EQ(first.images.scalar_type(), torch::kFloat);
  EXPECT_EQ(first.labels.scalar_type(), torch::kLong);
  EXPECT_TRUE(torch::equal(first.images, again.images));
  EXPECT_TRUE(torch::equal(first.labels, again.labels));
  EXPECT_FALSE(torch::equal(first.labels, other.labels));
  // The global RNG is not used.
  torch::manual_seed(5);
  const auto expected = torch::rand({4});
  torch::manual_seed(5);
  phantom_batch(2, {8, 8, 8}, 1);
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected));
}

TEST(SegmentationData, LabelsAreBinaryWithBothClassesInEveryImage) {
  for (const std::vector<int64_t>& size :
       {std::vector<int64_t>{32, 32}, std::vector<int64_t>{16, 16, 16}}) {
    SCOPED_TRACE("spatial rank " + std::to_string(size.size()));
    for (uint64_t seed = 0; seed < 5; ++seed) {
      SCOPED_TRACE("seed " + std::to_string(seed));
      const auto data = phantom_batch(4, size, seed);
      EXPECT_TRUE(
          data.labels.ge(0).logical_and(data.labels.le(1)).all().item<bool>());
      const auto per_image = data.labels.flatten(1).sum(1);
      const int64_t voxels = data.labels[0].numel();
      EXPECT_TRUE(per_image.gt(0).all().item<bool>()) << per_image;
      EXPECT_TRUE(per_image.lt(voxels).all().item<bool>()) << per_image;
      // Objects are brighter than the background.
      const auto foreground = data.labels.unsqueeze(1).eq(1);
      const double object_mean =
          data.images.masked_select(foreground).mean().item<double>();
      const double background_mean =
          data.images.masked_select(foreground.logical_not())
              .mean()
              .item<double>();
      EXPECT_GT(object_mean, background_mean + 0.4);
    }
  }
}

TEST(SegmentationData, RefusesBadArgumentsNamingTheValue) {
  EXPECT_TRUE(throws_containing(
      [] {
        phantom_batch(0, {8, 8}, 1);
      },
      "batch >= 1, got 0"));
  EXPECT_TRUE(throws_containing(
      [] { phantom_batch(1, {8}, 1); }, "2 or 3 spatial sizes, got 1"));
  EXPECT_TRUE(throws_containing(
      [] {
        phantom_batch(1, {8, 8}, 1, PhantomOptions().max_radius(0.5));
      },
      "max_radius < 0.5, got 0.08 and 0.5"));
}

TEST(SegmentationData, LossAndDiceFollowTheirDefinitions) {
  // Labels of two 2x2 images; logits that predict them exactly (confident).
  const auto labels =
      torch::tensor({0, 1, 1, 0, 0, 0, 1, 1}, torch::kLong).view({2, 2, 2});
  const auto foreground = labels.to(torch::kFloat);
  const auto perfect = torch::stack({1 - foreground, foreground}, 1) * 40;
  EXPECT_DOUBLE_EQ(dice_score(perfect, labels), 1.0);
  EXPECT_LT(segmentation_loss(perfect, labels).item<double>(), 1e-6);
  // The inverse prediction has no overlap; all-background predicts nothing.
  EXPECT_DOUBLE_EQ(dice_score(-perfect, labels), 0.0);
  const auto background =
      torch::stack({torch::ones({2, 2, 2}), torch::zeros({2, 2, 2})}, 1);
  EXPECT_DOUBLE_EQ(dice_score(background, labels), 0.0);
  // Uniform logits: cross-entropy log 2; soft Dice with p = 1/2 and 4 of 8
  // voxels foreground: (2 * 2 + 1) / (4 + 4 + 1).
  const auto uniform = torch::zeros({2, 2, 2, 2}, torch::requires_grad());
  const auto loss = segmentation_loss(uniform, labels);
  EXPECT_NEAR(loss.item<double>(), std::log(2.0) + 1.0 - 5.0 / 9.0, 1e-6);
  loss.backward();
  EXPECT_GT(uniform.grad().abs().sum().item<double>(), 0.0);
  // Shapes and the label type are checked.
  EXPECT_TRUE(throws_containing(
      [&] { segmentation_loss(perfect, labels[0]); },
      "expected logits [N, C >= 2, *spatial] and int64 labels [N, *spatial], "
      "got [2, 2, 2, 2] and Long [2, 2]"));
  EXPECT_TRUE(throws_containing(
      [&] { dice_score(perfect, labels.to(torch::kInt)); },
      "got [2, 2, 2, 2] and Int"));
}

TEST(UNet, TrainingOnPhantomsRaisesDice) {
  const uint64_t seed = 4;
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Its tensors are too small to gain from a second thread, and on shared
  // cores a second thread's waits at every operator cost more than it
  // computes.
  IntraOpThreadsScope one_thread(1);
  const auto start = std::chrono::steady_clock::now();
  torch::manual_seed(seed);
  UNet net(UNetOptions().dims(2).levels(2).base_width(4));
  torch::optim::Adam optimizer(
      net->parameters(), torch::optim::AdamOptions(1e-2));
  const auto held_out = phantom_batch(8, {32, 32}, 1000 + seed);
  auto held_out_dice = [&] {
    torch::NoGradGuard no_grad;
    net->eval();
    const double dice =
        dice_score(net->forward(held_out.images), held_out.labels);
    net->train();
    return dice;
  };
  const double initial_dice = held_out_dice();
  const int steps = 50;
  for (int step = 0; step < steps; ++step) {
    const auto batch =
        phantom_batch(8, {32, 32}, seed * 100000 + static_cast<uint64_t>(step));
    optimizer.zero_grad();
    auto loss = segmentation_loss(net->forward(batch.images), batch.labels);
    loss.backward();
    optimizer.step();
  }
  const double final_dice = held_out_dice();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  std::cout << "[ dice     ] " << initial_dice << " -> " << final_dice
            << " after " << steps << " steps in " << seconds << " s\n";
  EXPECT_GT(final_dice, 0.8);
  EXPECT_GT(final_dice, initial_dice + 0.2);
}

}  // namespace
