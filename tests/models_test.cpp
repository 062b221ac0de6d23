// Tests of the demo models (remat_models): output shapes, chains of
// one-tensor stages, GPT learning on the built-in text, causal masking,
// BatchNorm statistics, and the text helpers.
#include <models/models.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/remat.h"

namespace {

using namespace remat::models;

// Runs the children of `model` one by one, each as Tensor -> Tensor, and checks
// the result equals model->forward (eval mode, so deterministic).
void expect_chain_of_tensor_stages(
    torch::nn::Sequential model, const torch::Tensor& input) {
  model->eval();
  torch::NoGradGuard no_grad;
  torch::Tensor staged = input;
  for (auto& child : *model) {
    staged = child.forward<torch::Tensor>(staged);
    ASSERT_TRUE(staged.defined());
  }
  auto direct = model->forward(input);
  EXPECT_TRUE(torch::equal(staged, direct))
      << "max difference " << (staged - direct).abs().max().item<double>();
}

TEST(MlpChain, HasOneStagePerWidthPair) {
  torch::manual_seed(0);
  auto model = mlp_chain(MlpChainOptions({16, 64, 8}).dropout(0.5));
  EXPECT_EQ(model->size(), 2u);
  EXPECT_EQ(
      model->forward(torch::randn({5, 16})).sizes(),
      (std::vector<int64_t>{5, 8}));
  expect_chain_of_tensor_stages(model, torch::randn({5, 16}));
  EXPECT_THROW(mlp_chain(MlpChainOptions({16})), c10::Error);
}

TEST(MlpChain, UniformChainIsTheE1Model) {
  auto model = uniform_mlp_chain(6);
  ASSERT_EQ(model->size(), 6u);
  for (auto& child : *model) {
    auto stage = child.ptr<LinearReluImpl>();
    ASSERT_NE(stage, nullptr);
    EXPECT_EQ(stage->options.in_features(), 512);
    EXPECT_EQ(stage->options.out_features(), 512);
    EXPECT_TRUE(stage->dropout.is_empty());
  }
  EXPECT_EQ(
      model->forward(torch::randn({3, 512})).sizes(),
      (std::vector<int64_t>{3, 512}));
}

TEST(MlpChain, VaryingWidthsSpan256To2048) {
  auto widths = varying_mlp_widths(12);
  ASSERT_EQ(widths.size(), 13u);
  EXPECT_EQ(*std::min_element(widths.begin(), widths.end()), 256);
  EXPECT_EQ(*std::max_element(widths.begin(), widths.end()), 2048);
  EXPECT_EQ(widths, varying_mlp_widths(12));  // deterministic
}

TEST(ResidualFfnStack, DefaultsAreTheCheckpointBenchmarkModel) {
  ResidualFfnStackOptions defaults;
  EXPECT_EQ(defaults.blocks(), 32);
  EXPECT_EQ(defaults.dim(), 512);
  EXPECT_EQ(defaults.hidden(), 2048);
  torch::manual_seed(0);
  auto model = residual_ffn_stack(
      ResidualFfnStackOptions().blocks(3).dim(16).hidden(64));
  EXPECT_EQ(model->size(), 3u);
  auto input = torch::randn({4, 16});
  EXPECT_EQ(model->forward(input).sizes(), input.sizes());
  expect_chain_of_tensor_stages(model, input);
}

TEST(SmallCnn, ProducesLogitsAndIsAChain) {
  torch::manual_seed(0);
  auto model =
      small_cnn(SmallCnnOptions().image_size(16).channels({4, 8}).classes(5));
  auto input = torch::randn({2, 3, 16, 16});
  EXPECT_EQ(model->forward(input).sizes(), (std::vector<int64_t>{2, 5}));
  expect_chain_of_tensor_stages(model, input);
  EXPECT_THROW(small_cnn(SmallCnnOptions().image_size(18)), c10::Error);
}

TEST(ResNetChain, GrowsChannelsAndShrinksResolution) {
  torch::manual_seed(0);
  auto model = resnet_chain(ResNetChainOptions()
                                .stage_channels({4, 8, 16})
                                .blocks_per_stage(2)
                                .classes(7));
  EXPECT_EQ(model->size(), 2u + 3u * 2u);
  auto input = torch::randn({2, 3, 16, 16});
  EXPECT_EQ(model->forward(input).sizes(), (std::vector<int64_t>{2, 7}));
  // Resolution halves at the first block of every stage after the first.
  model->eval();
  torch::NoGradGuard no_grad;
  auto x = input;
  std::vector<std::vector<int64_t>> shapes;
  for (auto& child : *model) {
    x = child.forward<torch::Tensor>(x);
    shapes.push_back(x.sizes().vec());
  }
  EXPECT_EQ(shapes[0], (std::vector<int64_t>{2, 4, 16, 16}));
  EXPECT_EQ(shapes[3], (std::vector<int64_t>{2, 8, 8, 8}));
  EXPECT_EQ(shapes[6], (std::vector<int64_t>{2, 16, 4, 4}));
  expect_chain_of_tensor_stages(model, input);
}

TEST(ResNetChain, BatchNormInTrainModeUpdatesRunningStats) {
  torch::manual_seed(0);
  auto model = resnet_chain(
      ResNetChainOptions().stage_channels({4, 8}).blocks_per_stage(1));
  auto stem = (*model)[0]->as<ConvBnReluImpl>();
  ASSERT_NE(stem, nullptr);
  auto mean_before = stem->bn->running_mean.clone();
  auto count_before = stem->bn->num_batches_tracked.item<int64_t>();
  model->train();
  model->forward(torch::randn({4, 3, 8, 8}) * 3 + 1);
  EXPECT_FALSE(torch::equal(stem->bn->running_mean, mean_before));
  EXPECT_EQ(stem->bn->num_batches_tracked.item<int64_t>(), count_before + 1);
  // Eval mode leaves them alone.
  model->eval();
  auto mean_after = stem->bn->running_mean.clone();
  model->forward(torch::randn({4, 3, 8, 8}));
  EXPECT_TRUE(torch::equal(stem->bn->running_mean, mean_after));
}

GptOptions tiny_gpt(int64_t vocab) {
  return GptOptions()
      .vocab(vocab)
      .seq_len(32)
      .layers(2)
      .hidden(32)
      .heads(4)
      .dropout(0.1);
}

TEST(Gpt, ProducesLogitsAndExposesTheAttentionCore) {
  torch::manual_seed(0);
  auto options = tiny_gpt(20);
  auto model = gpt(options);
  EXPECT_EQ(model->size(), 2u + 2u);
  auto tokens = torch::randint(20, {3, 10}, torch::kLong);
  EXPECT_EQ(model->forward(tokens).sizes(), (std::vector<int64_t>{3, 10, 20}));
  expect_chain_of_tensor_stages(model, tokens);
  auto block = (*model)[1]->as<TransformerBlockImpl>();
  ASSERT_NE(block, nullptr);
  auto core = block->attention->core;
  EXPECT_TRUE(core->parameters().empty());
  auto qkv = torch::randn({3, 10, 3 * 32});
  EXPECT_EQ(core->forward(qkv).sizes(), (std::vector<int64_t>{3, 10, 32}));
  EXPECT_THROW(model->forward(torch::zeros({1, 33}, torch::kLong)), c10::Error);
  EXPECT_THROW(gpt(GptOptions().hidden(30).heads(4)), c10::Error);
}

TEST(Gpt, AttentionIsCausal) {
  torch::manual_seed(0);
  auto model = gpt(tiny_gpt(20));
  model->eval();
  torch::NoGradGuard no_grad;
  auto tokens = torch::randint(20, {2, 12}, torch::kLong);
  auto changed = tokens.clone();
  changed.index_put_(
      {torch::indexing::Slice(), 8}, (tokens.select(1, 8) + 1) % 20);
  auto logits = model->forward(tokens);
  auto changed_logits = model->forward(changed);
  EXPECT_TRUE(
      torch::equal(logits.narrow(1, 0, 8), changed_logits.narrow(1, 0, 8)));
  EXPECT_FALSE(
      torch::equal(logits.narrow(1, 8, 4), changed_logits.narrow(1, 8, 4)));
}

TEST(Gpt, LossOnBuiltinTextDecreasesWithAdam) {
  const uint64_t seed = 2024;
  SCOPED_TRACE("seed " + std::to_string(seed));
  torch::manual_seed(seed);
  CharTokenizer tokenizer(builtin_text());
  CharBatchSampler sampler(tokenizer.encode(builtin_text()), 32, 16);
  auto model = gpt(tiny_gpt(tokenizer.vocab_size()));
  model->train();
  torch::optim::Adam optimizer(
      model->parameters(), torch::optim::AdamOptions(3e-3));
  at::Generator generator = make_cpu_generator(seed);
  std::vector<double> losses;
  for (int step = 0; step < 30; ++step) {
    TextBatch batch = sampler.sample(generator);
    optimizer.zero_grad();
    auto loss = gpt_loss(model->forward(batch.inputs), batch.targets);
    loss.backward();
    optimizer.step();
    losses.push_back(loss.item<double>());
  }
  const double first = (losses[0] + losses[1] + losses[2]) / 3;
  const double last = (losses[27] + losses[28] + losses[29]) / 3;
  EXPECT_LT(last, first - 0.5) << "first " << first << ", last " << last;
}

/// Gradients of every parameter of a small GPT after one step under
/// `recipe`, and the step's activation peak.
std::vector<torch::Tensor> gpt_step_under(
    GptRecompute recipe, int64_t* peak_bytes) {
  torch::manual_seed(21);
  auto model =
      gpt(GptOptions().vocab(32).seq_len(64).layers(2).hidden(64).heads(4));
  for (auto& p : model->parameters()) {
    p.mutable_grad() = torch::zeros_like(p);
  }
  const auto tokens = torch::randint(32, {4, 64});
  const auto targets = torch::randint(32, {4, 64});
  set_recompute(model, recipe);
  torch::manual_seed(22);
  remat::MemoryMeter meter;
  gpt_loss(model->forward(tokens), targets).backward();
  *peak_bytes = meter.peak_delta_bytes();
  std::vector<torch::Tensor> grads;
  for (const auto& p : model->parameters()) {
    grads.push_back(p.grad().clone());
  }
  return grads;
}

TEST(Gpt, RecomputeRecipesKeepGradientsAndLowerThePeak) {
  int64_t none = 0, full = 0, attention = 0, selective = 0;
  const auto reference = gpt_step_under(GptRecompute::kNone, &none);
  const std::vector<std::pair<GptRecompute, int64_t*>> recipes = {
      {GptRecompute::kFull, &full},
      {GptRecompute::kAttention, &attention},
      {GptRecompute::kSelective, &selective}};
  for (const auto& [recipe, peak] : recipes) {
    const auto grads = gpt_step_under(recipe, peak);
    ASSERT_EQ(grads.size(), reference.size());
    for (size_t i = 0; i < grads.size(); ++i) {
      EXPECT_TRUE(torch::equal(grads[i], reference[i]))
          << "recipe " << static_cast<int>(recipe) << ", parameter " << i
          << ": max difference "
          << (grads[i] - reference[i]).abs().max().item<double>();
    }
  }
  EXPECT_LT(full, selective);
  EXPECT_LT(selective, none);
  EXPECT_LT(attention, none);
}

TEST(Gpt, ParseRecomputeNamesEveryRecipeAndRefusesOthers) {
  EXPECT_EQ(parse_gpt_recompute("none"), GptRecompute::kNone);
  EXPECT_EQ(parse_gpt_recompute("full"), GptRecompute::kFull);
  EXPECT_EQ(parse_gpt_recompute("attention"), GptRecompute::kAttention);
  EXPECT_EQ(parse_gpt_recompute("selective"), GptRecompute::kSelective);
  try {
    parse_gpt_recompute("optimal");
    FAIL() << "expected an error";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("'optimal'"), std::string::npos);
  }
}

TEST(TextData, TokenizerRoundTripsTheBuiltinText) {
  const std::string& text = builtin_text();
  EXPECT_GT(text.size(), 3000u);
  CharTokenizer tokenizer(text);
  EXPECT_GT(tokenizer.vocab_size(), 30);
  EXPECT_LT(tokenizer.vocab_size(), 100);
  auto ids = tokenizer.encode(text);
  EXPECT_EQ(ids.numel(), static_cast<int64_t>(text.size()));
  EXPECT_EQ(tokenizer.decode(ids), text);
  EXPECT_THROW(tokenizer.encode("~~~"), c10::Error);
  EXPECT_THROW(CharTokenizer(""), c10::Error);
}

TEST(TextData, SamplerGivesShiftedWindowsReproducibly) {
  CharTokenizer tokenizer(builtin_text());
  auto tokens = tokenizer.encode(builtin_text());
  CharBatchSampler sampler(tokens, 24, 5);
  at::Generator first_generator = make_cpu_generator(9);
  at::Generator second_generator = make_cpu_generator(9);
  TextBatch batch = sampler.sample(first_generator);
  TextBatch again = sampler.sample(second_generator);
  EXPECT_EQ(batch.inputs.sizes(), (std::vector<int64_t>{5, 24}));
  EXPECT_EQ(batch.targets.sizes(), (std::vector<int64_t>{5, 24}));
  EXPECT_TRUE(torch::equal(batch.inputs, again.inputs));
  EXPECT_TRUE(torch::equal(
      batch.inputs.narrow(1, 1, 23), batch.targets.narrow(1, 0, 23)));
  const std::string window = tokenizer.decode(batch.inputs[0]);
  EXPECT_NE(builtin_text().find(window), std::string::npos);
  TextBatch next = sampler.sample(first_generator);
  EXPECT_FALSE(torch::equal(batch.inputs, next.inputs));
  EXPECT_THROW(CharBatchSampler(tokens.narrow(0, 0, 10), 10, 1), c10::Error);
}

}  // namespace
