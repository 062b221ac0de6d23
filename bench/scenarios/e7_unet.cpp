// e7_unet.cpp — scenario E7 of remat_bench: U-Nets (2D and 3D), graphs with
// skip connections: no checkpointing, per-block checkpointing (what MONAI
// users do), encoder-only checkpointing and the optimal graph plan over a
// budget sweep, with the same U-Net checkpointed per block by PyTorch in the
// same run.
//
// Procedure, per model (2D, then 3D):
//  1. The model (remat::models::UNet, seed 0, BatchNorm, no dropout) and a
//     synthetic phantom batch (phantom_batch, seed 1). The graph is the
//     U-Net's stages() plus one more stage: the loss (segmentation_loss:
//     cross-entropy + soft Dice) reading the head's logits, so that every
//     prediction and every measured peak include the loss's own memory. The
//     labels are a constant of that stage; the graph input is the images.
//  2. profile_graph() on the images; the configurations: none (run_graph,
//     plain autograd), per-block (schedule_graph with every stage
//     kCheckpoint), encoder-only (encoder blocks and pools kCheckpoint, the
//     rest kRecord), the optimal plan (plan_within) at each budget of the
//     sweep and at the minimum feasible budget, and the optimal plan at the
//     measured peaks of per-block and of encoder-only (one probe step each;
//     simulate()'s units: activation peak plus the input's bytes). Budgets
//     that resolve to one plan share one configuration. None and the hand
//     schedules run on the U-Net cut one stage per block; the optimal plans
//     on the cut --optimal-stages names (default: one stage per convolution
//     round, UNetStageSplit::kConvolution, profiled on its own).
//  3. The PyTorch side (bench/pytorch/e7_pytorch.py, a PythonPeer as E6's)
//     builds the same U-Net, loads this process's parameters, images and
//     labels, and runs none and per-block (torch.utils.checkpoint,
//     use_reentrant=False, on every stage but the loss), measured by remat's
//     tracking allocator loaded from libremat_meter.so (as E6). One untimed
//     step of each compares its parameter gradients with remat's.
//  4. Rounds: a gate round, warm-up rounds, timed rounds; in each every
//     configuration takes one step (Runner::step; every step of a round has
//     one seed) and is checked bitwise against none's gradients of the round
//     (GradientMismatch otherwise); the PyTorch steps go next to remat's of
//     the same schedule, the process going first alternating by round. Then
//     both plain runs are re-run `rounds` times. Ratios are paired by round.
//
// Not supported: a GPU for the PyTorch side (it is then left out, with the
// reason in the section).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "chain_plans.h"
#include "harness/scenario.h"
#include "models/models.h"
#include "python_peer.h"
#include "remat/remat.h"

#ifndef REMAT_E7_SCRIPT
#error "REMAT_E7_SCRIPT must name bench/pytorch/e7_pytorch.py"
#endif
#ifndef REMAT_BENCH_METER
#error "REMAT_BENCH_METER must name the built libremat_meter.so"
#endif

static_assert(
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
    "E7 exchanges raw little-endian float32 files");

namespace remat::bench {
namespace {

namespace fs = std::filesystem;

// E7's own flags (the common ones come from the Context).
struct E7Options {
  std::vector<int64_t> dims = {2, 3};  // which U-Nets: 2D, 3D or both
  int64_t size_2d = 128;               // 2D images: size x size
  int64_t batch_2d = 8;
  int64_t size_3d = 32;  // 3D volumes: size^3
  int64_t batch_3d = 2;
  int64_t levels = 3;                                // U-Net poolings
  int64_t base_width = 8;                            // channels of level 0
  std::vector<double> percents = {100, 80, 60, 40};  // sweep, of store-all
  // The cut the optimal plans run on: "convolution" (one stage per
  // convolution round) or "block" (the hand schedules' cut).
  std::string optimal_stages = "convolution";
  bool no_pytorch = false;  // the remat side only
  std::string python = "/usr/bin/python3";
  std::string script = REMAT_E7_SCRIPT;   // e7_pytorch.py
  std::string meter = REMAT_BENCH_METER;  // libremat_meter.so
  int reply_timeout_s = 600;              // longest wait for one reply
};

// --quick: the smallest sizes.
E7Options sized_for(const E7Options& requested, const Context& context) {
  E7Options options = requested;
  if (context.quick) {
    options.size_2d = 32;
    options.batch_2d = 2;
    options.size_3d = 16;
    options.batch_3d = 1;
    options.base_width = 4;
  }
  return options;
}

// A fresh folder for the exchanged files, removed at the end.
class ExchangeFolder {
 public:
  ExchangeFolder() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
        "/remat-e7-XXXXXX";
    TORCH_CHECK(
        ::mkdtemp(pattern.data()) != nullptr,
        "remat_bench E7: expected to create a work folder from ",
        pattern,
        ", got an error");
    path_ = pattern;
  }
  ~ExchangeFolder() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  ExchangeFolder(const ExchangeFolder&) = delete;
  ExchangeFolder& operator=(const ExchangeFolder&) = delete;
  std::string file(const std::string& name) const {
    return (path_ / name).string();
  }

 private:
  fs::path path_;
};

// One way to run the model, in this process and (pytorch_kind set) in the
// PyTorch one.
struct Config {
  std::string name;                   // "none", "per-block", "optimal@80%", ...
  std::string call;                   // what runs
  std::optional<planner::Plan> plan;  // empty: plain autograd
  planner::Simulation predicted;      // simulate() of the plan (store-all)
  /// predicted.step_ms over the store-all plan's on the same profile: the
  /// cut's own no-checkpoint time, so that the scale of each profile (the
  /// two cuts are profiled separately, and profiles of one model differ by
  /// several per cent) cancels.
  double predicted_ratio = 1;
  ForwardFn forward;
  Measurement remat;
  std::string pytorch_kind;  // e7_pytorch.py's schedule; "" none
  Measurement pytorch;
  bool pytorch_peak_measured = false;
};

// A line of the main table: a budget (or a fixed schedule) and the
// configuration that runs it.
struct Line {
  std::string label;             // "no checkpointing", "optimal, 80 %", ...
  std::string budget;            // how the budget was given; "" for schedules
  int64_t budget_bytes = 0;      // 0: none
  std::optional<size_t> config;  // empty: infeasible
  std::string note;              // why infeasible
};

// The cross-process gradient comparison of one schedule.
struct GradCompare {
  std::string schedule;
  double max_abs_diff = 0;
  double max_rel_diff = 0;  // max_abs_diff / largest |PyTorch gradient|
  int64_t differing = 0;    // elements not bitwise equal
  int64_t elements = 0;
};

// What run_model() found for the closing summary.
struct ModelResult {
  std::string id;
  double best_memory_within_time = 0;  // lowest memory ratio at time <= 1.20
  std::string best_memory_row;
  double lowest_memory = 1;          // lowest memory ratio of any row ...
  RatioInterval lowest_memory_time;  // ... its time ratio
  std::string lowest_memory_row;
  std::vector<std::pair<std::string, RatioInterval>> equal_memory;
  std::optional<RatioInterval> per_block_vs_pytorch;
};

void write_floats(std::ofstream& stream, const torch::Tensor& tensor) {
  const auto host = tensor.detach().to(torch::kCPU, torch::kFloat).contiguous();
  stream.write(
      reinterpret_cast<const char*>(host.data_ptr<float>()),
      static_cast<std::streamsize>(host.numel() * sizeof(float)));
}

// The stages of `net` cut by `split`, followed by the loss stage (see the
// top).
std::vector<GraphStage> stages_with_loss(
    const models::UNet& net,
    const torch::Tensor& labels,
    models::UNetStageSplit split) {
  std::vector<GraphStage> stages = net->stages(split);
  const int head = static_cast<int>(stages.size()) - 1;
  stages.push_back(
      {[labels](const std::vector<torch::Tensor>& in) {
         return models::segmentation_loss(in.at(0), labels);
       },
       nullptr,
       {head}});
  return stages;
}

std::string percent_text(double percent) {
  std::ostringstream text;
  text << percent << " %";
  return text.str();
}

// ------------------------------------------------------ the PyTorch side

struct PytorchSide {
  std::unique_ptr<PythonPeer> peer;
  std::string unavailable;  // empty while the side takes part
  bool up() const {
    return unavailable.empty();
  }
};

PytorchSide start_pytorch_side(
    const E7Options& options,
    const Context& context,
    const ExchangeFolder& folder,
    models::UNet& net,
    const models::SegmentationBatch& data) {
  PytorchSide side;
  if (options.no_pytorch) {
    side.unavailable = "left out (--no-pytorch)";
    return side;
  }
  if (!context.torch_device().is_cpu()) {
    side.unavailable = "the PyTorch side runs on the CPU only";
    return side;
  }
  nlohmann::json parameters = nlohmann::json::array();
  std::ofstream weights(folder.file("weights.bin"), std::ios::binary);
  int64_t offset_bytes = 0;
  for (const auto& item : net->named_parameters()) {
    parameters.push_back(
        {{"name", item.key()},
         {"shape", item.value().sizes().vec()},
         {"numel", item.value().numel()},
         {"offset_bytes", offset_bytes}});
    write_floats(weights, item.value());
    offset_bytes += item.value().numel() * static_cast<int64_t>(sizeof(float));
  }
  std::ofstream images(folder.file("images.bin"), std::ios::binary);
  write_floats(images, data.images);
  std::ofstream labels(folder.file("labels.bin"), std::ios::binary);
  write_floats(labels, data.labels);
  const auto& unet = net->options;
  const nlohmann::json manifest = {
      {"format", "remat-e7 1"},
      {"dims", unet.dims()},
      {"in_channels", unet.in_channels()},
      {"classes", unet.classes()},
      {"levels", unet.levels()},
      {"base_width", unet.base_width()},
      {"weights", "weights.bin"},
      {"parameters", parameters},
      {"images",
       {{"file", "images.bin"}, {"shape", data.images.sizes().vec()}}},
      {"labels",
       {{"file", "labels.bin"}, {"shape", data.labels.sizes().vec()}}}};
  std::ofstream(folder.file("manifest.json")) << manifest.dump(1) << "\n";
  weights.close();
  images.close();
  labels.close();
  TORCH_CHECK(
      !weights.fail() && !images.fail() && !labels.fail(),
      "remat_bench E7: expected to write the exchange files into ",
      folder.file(""),
      ", got a write error");
  side.peer = std::make_unique<PythonPeer>(
      std::vector<std::string>{
          options.python,
          options.script,
          "--manifest",
          folder.file("manifest.json"),
          "--meter",
          options.meter,
          "--threads",
          std::to_string(context.threads)},
      folder.file("pytorch.log"),
      options.reply_timeout_s);
  if (!side.peer->available()) {
    side.unavailable = side.peer->why_unavailable();
  }
  return side;
}

// NOTE: [A quiet start for every step]
// The two processes take turns on the same cores. After a step, a process's
// OpenMP workers spin for a while before they sleep (libgomp's default wait
// policy: about a millisecond), so a step that starts right after the other
// process's step shares the cores with that spinning: 2-5 % of a 50 ms
// step. The order of the rounds does not make that even: a remat step
// follows a PyTorch step, while a PyTorch step follows a remat step and its
// gradient check, during which remat's own workers spin out. So every
// step, on either side, starts after kQuietPause of sleep.
constexpr auto kQuietPause = std::chrono::milliseconds(20);

void quiet_pause() {
  std::this_thread::sleep_for(kQuietPause);
}

// One PyTorch step of `kind`; appended to `into` when timed. False, with
// side.unavailable set, when the side failed. Starts with quiet_pause().
bool pytorch_step(
    PytorchSide& side,
    const std::string& kind,
    uint64_t seed,
    bool timed,
    const E7Options& options,
    Config* into) {
  if (!side.up()) {
    return false;
  }
  quiet_pause();
  const auto reply = side.peer->request(
      {{"cmd", "step"}, {"kind", kind}, {"seed", seed}},
      options.reply_timeout_s);
  if (!reply) {
    side.unavailable = side.peer->why_unavailable();
    return false;
  }
  if (reply->contains("error")) {
    side.unavailable = kind + ": " + reply->at("error").dump();
    return false;
  }
  if (timed && into != nullptr) {
    const double forward_ms = reply->at("forward_ms").get<double>();
    const double backward_ms = reply->at("backward_ms").get<double>();
    into->pytorch.forward_ms.push_back(forward_ms);
    into->pytorch.backward_ms.push_back(backward_ms);
    into->pytorch.step_ms.push_back(forward_ms + backward_ms);
    into->pytorch.cpu_ms.push_back(reply->at("cpu_ms").get<double>());
    if (!reply->at("peak_bytes").is_null()) {
      into->pytorch_peak_measured = true;
      into->pytorch.peak_bytes = std::max(
          into->pytorch.peak_bytes, reply->at("peak_bytes").get<int64_t>());
    }
  }
  return true;
}

// One untimed step of `config` in both processes (same seed); the Python
// side's gradients, written to grads.bin, against remat's.
std::optional<GradCompare> compare_gradients(
    Config& config,
    Runner& runner,
    models::UNet& net,
    PytorchSide& side,
    const ExchangeFolder& folder,
    const E7Options& options) {
  constexpr uint64_t kCompareSeed = 7;
  runner.step(config.forward, kCompareSeed);
  const auto remat_grads = gradients(*net);
  const auto reply = side.peer->request(
      {{"cmd", "grad"},
       {"kind", config.pytorch_kind},
       {"seed", kCompareSeed},
       {"path", folder.file("grads.bin")}},
      options.reply_timeout_s);
  if (!reply || reply->contains("error")) {
    side.unavailable =
        reply ? "gradients of " + config.name + ": " + reply->at("error").dump()
              : side.peer->why_unavailable();
    return std::nullopt;
  }
  std::ifstream stream(folder.file("grads.bin"), std::ios::binary);
  GradCompare compare;
  compare.schedule = config.name;
  double largest = 0;
  for (const auto& grad : remat_grads) {
    auto pytorch = torch::empty_like(grad);
    stream.read(
        reinterpret_cast<char*>(pytorch.data_ptr<float>()),
        static_cast<std::streamsize>(grad.numel() * sizeof(float)));
    TORCH_CHECK(
        stream.good(),
        "remat_bench E7: expected ",
        grad.numel(),
        " more gradient values in grads.bin, got fewer");
    compare.max_abs_diff = std::max(
        compare.max_abs_diff, (grad - pytorch).abs().max().item<double>());
    largest = std::max(largest, pytorch.abs().max().item<double>());
    compare.differing += grad.ne(pytorch).sum().item<int64_t>();
    compare.elements += grad.numel();
  }
  compare.max_rel_diff = largest > 0 ? compare.max_abs_diff / largest : 0;
  return compare;
}

// ------------------------------------------------------------ the rounds

// A gate round, warm-up rounds and timed rounds of every configuration
// (see the top, step 4), then the baselines re-run. Returns the remat and
// PyTorch re-runs of none.
std::pair<Measurement, Measurement> run_rounds(
    std::vector<Config>& configs,
    Runner& runner,
    models::UNet& net,
    PytorchSide& side,
    const Context& context,
    const E7Options& options) {
  const uint64_t first_seed = context.runner_options().seed;
  const bool bitwise = context.torch_device().is_cpu();
  for (int index = -1; index < context.warmup + context.rounds; ++index) {
    const bool timed = index >= context.warmup;
    const uint64_t seed = first_seed + 1 + static_cast<uint64_t>(index + 1);
    std::vector<torch::Tensor> reference;
    for (size_t c = 0; c < configs.size(); ++c) {
      Config& config = configs[c];
      const bool with_pytorch = !config.pytorch_kind.empty() && side.up();
      const bool pytorch_first = with_pytorch && index % 2 != 0;
      if (pytorch_first) {
        pytorch_step(side, config.pytorch_kind, seed, timed, options, &config);
      }
      quiet_pause();
      const Measurement step = runner.step(config.forward, seed);
      const auto grads = gradients(*net);
      if (c == 0) {
        reference = grads;
      } else {
        check_gradients(
            "E7", config.name, grads, reference, bitwise, config.remat);
      }
      if (timed) {
        append(config.remat, step);
      } else {
        config.remat.peak_bytes =
            std::max(config.remat.peak_bytes, step.peak_bytes);
      }
      if (with_pytorch && !pytorch_first) {
        pytorch_step(side, config.pytorch_kind, seed, timed, options, &config);
      }
    }
  }
  Config rerun = configs.front();
  rerun.remat = Measurement{};
  rerun.pytorch = Measurement{};
  for (int round = 0; round < context.rounds; ++round) {
    const uint64_t seed = first_seed + 1000 + static_cast<uint64_t>(round);
    quiet_pause();
    append(rerun.remat, runner.step(rerun.forward, seed));
    pytorch_step(side, rerun.pytorch_kind, seed, true, options, &rerun);
  }
  return {rerun.remat, rerun.pytorch};
}

// ------------------------------------------------------------- one model

std::string describe(const E7Options& options, int64_t dims) {
  std::ostringstream text;
  const int64_t size = dims == 2 ? options.size_2d : options.size_3d;
  const int64_t batch = dims == 2 ? options.batch_2d : options.batch_3d;
  text << dims << "D U-Net (" << options.levels << " levels, base width "
       << options.base_width << ", BatchNorm), " << size;
  for (int64_t d = 1; d < dims; ++d) {
    text << "×" << size;
  }
  text << " phantoms, batch " << batch;
  return text.str();
}

ModelResult run_model(
    int64_t dims,
    const E7Options& options,
    const Context& context,
    Section& section) {
  const std::string id = std::to_string(dims) + "d";
  const int64_t size = dims == 2 ? options.size_2d : options.size_3d;
  const int64_t batch = dims == 2 ? options.batch_2d : options.batch_3d;
  const std::string description = describe(options, dims);
  torch::manual_seed(0);
  models::UNet net(models::UNetOptions()
                       .dims(dims)
                       .levels(options.levels)
                       .base_width(options.base_width));
  net->train();
  const auto data = models::phantom_batch(
      batch, std::vector<int64_t>(static_cast<size_t>(dims), size), 1);
  const torch::Tensor images = data.images;
  const int64_t input_bytes = static_cast<int64_t>(images.nbytes());
  // The hand schedules and none run on one stage per block; the optimal
  // plans on options.optimal_stages.
  const auto stages =
      stages_with_loss(net, data.labels, models::UNetStageSplit::kBlock);
  const int64_t stage_count = static_cast<int64_t>(stages.size());
  const planner::Graph graph = profile_graph(stages, images);
  const bool fine = options.optimal_stages == "convolution";
  const auto optimal_stages =
      fine ? stages_with_loss(
                 net, data.labels, models::UNetStageSplit::kConvolution)
           : stages;
  const planner::Graph optimal_graph =
      fine ? profile_graph(optimal_stages, images) : graph;
  const double block_store_all_ms =
      planner::simulate(graph, planner::solve_store_all(graph)).step_ms;
  const double optimal_store_all_ms =
      planner::simulate(optimal_graph, planner::solve_store_all(optimal_graph))
          .step_ms;
  // The loss value (the graph's output, which the step holds) and the
  // gradient that seeds backward (which autograd holds) stay alive to the end
  // of backward, past where the memory model frees them: as in every remat
  // measurement of a step (fit, the tool's trainer, the tests), they are not
  // counted.
  const int64_t loss_bytes = 2 * graph.value_bytes(graph.size());
  // A measured step's peak in simulate()'s units.
  const auto model_peak = [&](int64_t activation_peak_bytes) {
    return activation_peak_bytes - loss_bytes + input_bytes;
  };

  Workload workload;
  workload.model = net.ptr().get();
  workload.input = images;
  workload.loss = [](const torch::Tensor& loss) { return loss; };
  Runner runner(workload, context.runner_options());

  std::vector<Config> configs;
  std::map<std::string, size_t> config_of_plan;
  // A configuration running `plan` on the block cut, or (`optimal`) on the
  // optimal plans' cut.
  const auto add_plan = [&](const std::string& name,
                            const std::string& call,
                            const planner::Plan& plan,
                            bool optimal = false) {
    const std::vector<GraphStage>& cut = optimal ? optimal_stages : stages;
    const std::string key =
        std::string(optimal && fine ? "rounds " : "blocks ") + plan.to_string();
    if (const auto found = config_of_plan.find(key);
        found != config_of_plan.end()) {
      return found->second;
    }
    Config config;
    config.name = name;
    config.call = call;
    config.plan = plan;
    config.predicted = planner::simulate(optimal ? optimal_graph : graph, plan);
    config.predicted_ratio =
        config.predicted.step_ms /
        (optimal ? optimal_store_all_ms : block_store_all_ms);
    PlannedGraph planned(cut, plan);
    config.forward = [planned](const torch::Tensor& x) mutable {
      return planned->forward(x);
    };
    configs.push_back(std::move(config));
    config_of_plan[key] = configs.size() - 1;
    return configs.size() - 1;
  };
  {
    Config none;
    none.name = "none";
    none.call = "run_graph (plain autograd)";
    none.predicted = planner::simulate(graph, planner::solve_store_all(graph));
    none.predicted_ratio = 1;
    none.forward = [stages](const torch::Tensor& x) {
      return run_graph(stages, x);
    };
    none.pytorch_kind = "none";
    configs.push_back(std::move(none));
  }
  // The last stage (the loss) is recorded whatever its mode.
  const size_t per_block = add_plan(
      "per-block",
      "schedule_graph, every stage kCheckpoint",
      planner::schedule_graph(
          graph,
          std::vector<planner::StageMode>(
              static_cast<size_t>(stage_count),
              planner::StageMode::kCheckpoint)));
  configs[per_block].pytorch_kind = "per-block";
  std::vector<planner::StageMode> encoder_modes(
      static_cast<size_t>(stage_count), planner::StageMode::kRecord);
  for (int64_t s = 0; s < 2 * options.levels; ++s) {
    encoder_modes[static_cast<size_t>(s)] = planner::StageMode::kCheckpoint;
  }
  const size_t encoder_only = add_plan(
      "encoder-only",
      "schedule_graph, encoder blocks and pools kCheckpoint, the rest kRecord",
      planner::schedule_graph(graph, encoder_modes));

  std::vector<Line> lines;
  lines.push_back({"no checkpointing", "", 0, 0, ""});
  lines.push_back({"per-block", "", 0, per_block, ""});
  lines.push_back({"encoder-only", "", 0, encoder_only, ""});
  const int64_t store_all_bytes = configs[0].predicted.peak_bytes;
  const int64_t minimum_bytes =
      planner::min_feasible_budget_bytes(optimal_graph);
  const auto add_optimal = [&](const std::string& label,
                               const std::string& budget_text,
                               int64_t budget_bytes) {
    Line line{label, budget_text, budget_bytes, std::nullopt, ""};
    if (budget_bytes < minimum_bytes) {
      line.note = "infeasible: below the minimum " +
                  planner::format_bytes(minimum_bytes);
    } else {
      const auto plan = plan_within(optimal_graph, Budget::bytes(budget_bytes));
      line.config = add_plan(
          "optimal@" + budget_text,
          "plan_within(graph, " + budget_text + ")",
          plan,
          /*optimal=*/true);
    }
    lines.push_back(std::move(line));
  };
  for (const double percent : options.percents) {
    const auto budget = Budget::fraction(percent / 100);
    add_optimal(
        "optimal, " + percent_text(percent),
        percent_text(percent),
        budget.resolve_bytes(optimal_graph));
  }
  add_optimal("optimal, minimum feasible", "minimum", minimum_bytes);
  // Equal memory: the hand schedules' measured peaks (probe steps).
  const int64_t per_block_probe =
      model_peak(runner.step(configs[per_block].forward, 1).peak_bytes);
  const int64_t encoder_probe =
      model_peak(runner.step(configs[encoder_only].forward, 1).peak_bytes);
  const size_t equal_first = lines.size();
  add_optimal(
      "optimal at per-block's peak", "per-block's peak", per_block_probe);
  add_optimal(
      "optimal at encoder-only's peak", "encoder-only's peak", encoder_probe);

  ExchangeFolder folder;
  PytorchSide side = start_pytorch_side(options, context, folder, net, data);
  std::vector<GradCompare> grad_compares;
  for (auto& config : configs) {
    if (!config.pytorch_kind.empty() && side.up()) {
      if (auto compare =
              compare_gradients(config, runner, net, side, folder, options)) {
        grad_compares.push_back(*compare);
      }
    }
  }
  const double load_before = read_load_average();
  const auto [rerun_remat, rerun_pytorch] =
      run_rounds(configs, runner, net, side, context, options);
  const double load_after = read_load_average();
  const bool with_pytorch = side.up();

  // ---- the texts and tables
  const Measurement& none = configs[0].remat;
  const auto peak = [&](size_t c) {
    return model_peak(configs[c].remat.peak_bytes);
  };
  std::ostringstream about;
  const int64_t optimal_store_all_bytes =
      planner::simulate(optimal_graph, planner::solve_store_all(optimal_graph))
          .peak_bytes;
  about << "**" << description << "**: " << stage_count
        << " stages per block (the U-Net's " << stage_count - 1
        << " and the loss)";
  if (fine) {
    about << ", " << optimal_graph.size()
          << " per convolution round (the optimal plans' cut)";
  }
  about << "; store-all peak predicted "
        << planner::format_bytes(store_all_bytes);
  if (fine) {
    about << " (per round: " << planner::format_bytes(optimal_store_all_bytes)
          << ")";
  }
  about << ", measured " << planner::format_bytes(peak(0));
  about << "; store-all step predicted "
        << Cell::ms(block_store_all_ms).markdown() << " ms";
  if (fine) {
    about << " (per round: " << Cell::ms(optimal_store_all_ms).markdown()
          << " ms)";
  }
  about << "; the optimal plans' minimum feasible budget "
        << planner::format_bytes(minimum_bytes) << " ("
        << Cell::ratio(
               static_cast<double>(minimum_bytes) / optimal_store_all_bytes)
               .markdown()
        << " of their store-all); input " << planner::format_bytes(input_bytes)
        << "; baseline step " << Cell::ms(none.step().median).markdown()
        << " ms in the rounds, "
        << Cell::ms(rerun_remat.step().median).markdown()
        << " ms re-run alone at the end; load average "
        << Cell::number(load_before, 2).markdown() << " before the rounds, "
        << Cell::number(load_after, 2).markdown() << " after.";
  section.add_text(about.str());

  ModelResult result;
  result.id = id;
  result.best_memory_within_time = 1;
  result.best_memory_row = "none of the checkpointing rows";
  Table table;
  table.name = "E7-" + id;
  table.caption = description + ": every row (time ratios against none)";
  table.columns = {
      "row",
      "configuration",
      "budget",
      "predicted peak",
      "measured peak",
      "memory ratio",
      "stage forwards",
      "predicted time ratio"};
  for (const auto& column : step_time_columns()) {
    table.columns.push_back(column);
  }
  table.columns.push_back("within budget");
  for (const Line& line : lines) {
    std::vector<Cell> row{
        Cell::text(line.label),
        line.config ? Cell::text(configs[*line.config].name) : Cell::empty(),
        line.budget_bytes > 0 ? Cell::bytes(line.budget_bytes) : Cell::empty()};
    if (!line.config) {
      row.push_back(Cell::text(line.note));
      while (row.size() < table.columns.size()) {
        row.push_back(Cell::empty());
      }
      table.add_row(std::move(row));
      continue;
    }
    const size_t c = *line.config;
    const Config& config = configs[c];
    const double memory_ratio =
        static_cast<double>(config.remat.peak_bytes) / none.peak_bytes;
    row.push_back(Cell::bytes(config.predicted.peak_bytes));
    row.push_back(Cell::bytes(peak(c)));
    row.push_back(Cell::ratio(memory_ratio));
    row.push_back(
        config.plan ? Cell::integer(stage_forwards(*config.plan))
                    : Cell::integer(stage_count));
    row.push_back(Cell::ratio(config.predicted_ratio));
    for (Cell& cell : step_time_cells(config.remat, none)) {
      row.push_back(std::move(cell));
    }
    // An overshoot is shown with its size (the loss's backward seed, a
    // few bytes, is outside the graph's memory model).
    row.push_back(
        line.budget_bytes <= 0 ? Cell::empty()
        : peak(c) <= line.budget_bytes
            ? Cell::text("yes")
            : Cell::text(
                  "NO (+" + std::to_string(peak(c) - line.budget_bytes) +
                  " B)"));
    table.add_row(std::move(row));
    if (c != 0) {
      const RatioInterval time = config.remat.step_ratio(none);
      if (memory_ratio < result.lowest_memory) {
        result.lowest_memory = memory_ratio;
        result.lowest_memory_time = time;
        result.lowest_memory_row = line.label;
      }
      if (time.has_interval && time.high <= 1.20 &&
          memory_ratio < result.best_memory_within_time) {
        result.best_memory_within_time = memory_ratio;
        result.best_memory_row = line.label;
      }
    }
  }
  section.add_table(std::move(table));

  // At equal memory: the optimal plan against the fastest hand schedule
  // (per-block, encoder-only) whose measured peak fits the same budget.
  Table equal;
  equal.name = "E7-" + id + "-equal-memory";
  equal.caption =
      description +
      ": at equal memory, the optimal plan against the fastest hand "
      "schedule that fits";
  equal.columns = {
      "budget",
      "budget bytes",
      "optimal",
      "optimal peak",
      "fastest fitting hand schedule",
      "its peak",
      "time ratio optimal / hand [95% CI]",
      "CPU ratio optimal / hand [95% CI]",
      "predicted ratio"};
  for (size_t l = equal_first; l < lines.size(); ++l) {
    const Line& line = lines[l];
    std::optional<size_t> hand;
    for (const size_t c : {per_block, encoder_only}) {
      if (peak(c) <= line.budget_bytes &&
          (!hand || configs[c].remat.step().median <
                        configs[*hand].remat.step().median)) {
        hand = c;
      }
    }
    std::vector<Cell> row{
        Cell::text(line.budget), Cell::bytes(line.budget_bytes)};
    if (!line.config || !hand) {
      row.push_back(Cell::text(line.config ? line.note : "infeasible"));
      while (row.size() < equal.columns.size()) {
        row.push_back(Cell::empty());
      }
      equal.add_row(std::move(row));
      continue;
    }
    const Config& optimal = configs[*line.config];
    const Config& other = configs[*hand];
    const RatioInterval time = optimal.remat.step_ratio(other.remat);
    row.push_back(Cell::text(optimal.name));
    row.push_back(Cell::bytes(peak(*line.config)));
    row.push_back(Cell::text(other.name));
    row.push_back(Cell::bytes(peak(*hand)));
    row.push_back(
        *line.config == *hand ? Cell::text("same plan")
                              : Cell::ratio_interval(time));
    row.push_back(
        *line.config == *hand
            ? Cell::text("same plan")
            : paired_ratio_cell(optimal.remat.cpu_ms, other.remat.cpu_ms));
    row.push_back(Cell::ratio(optimal.predicted_ratio / other.predicted_ratio));
    equal.add_row(std::move(row));
    if (*line.config != *hand) {
      result.equal_memory.emplace_back(
          id + " at " + line.budget + " (against " + other.name + ")", time);
    }
  }
  section.add_table(std::move(equal));

  // remat next to PyTorch.
  std::ostringstream pytorch_text;
  if (side.peer && side.peer->available()) {
    const auto& greeting = side.peer->greeting();
    pytorch_text << "PyTorch side: torch "
                 << greeting.value("torch", std::string("?")) << " ("
                 << greeting.value("executable", std::string("?"))
                 << "), memory meter: "
                 << greeting.value("meter", std::string("?")) << ".";
  }
  if (!with_pytorch) {
    pytorch_text << " **The PyTorch column was not measured:** "
                 << side.unavailable << ".";
  }
  section.add_text(pytorch_text.str());
  if (with_pytorch) {
    const Config& pytorch_none = configs[0];
    Table peer;
    peer.name = "E7-" + id + "-pytorch";
    peer.caption = description + ": remat next to PyTorch";
    peer.columns = {
        "schedule",
        "remat call",
        "PyTorch call",
        "remat peak",
        "PyTorch peak",
        "memory remat/PyTorch",
        "remat step ms",
        "PyTorch step ms",
        "remat time ratio [95% CI]",
        "PyTorch time ratio [95% CI]",
        "remat/PyTorch step [95% CI]",
        "remat/PyTorch CPU [95% CI]"};
    for (const size_t c : {size_t{0}, per_block}) {
      const Config& config = configs[c];
      const RatioInterval versus = config.remat.step_ratio(config.pytorch);
      peer.add_row(
          {Cell::text(config.name),
           Cell::text(config.call),
           Cell::text(
               c == 0 ? "plain autograd"
                      : "checkpoint(stage, use_reentrant=False) per stage, "
                        "loss plain"),
           Cell::bytes(config.remat.peak_bytes),
           config.pytorch_peak_measured ? Cell::bytes(config.pytorch.peak_bytes)
                                        : Cell::empty(),
           config.pytorch_peak_measured
               ? Cell::ratio(
                     static_cast<double>(config.remat.peak_bytes) /
                     config.pytorch.peak_bytes)
               : Cell::empty(),
           Cell::ms(config.remat.step().median),
           Cell::ms(config.pytorch.step().median),
           Cell::ratio_interval(config.remat.step_ratio(none)),
           Cell::ratio_interval(
               config.pytorch.step_ratio(pytorch_none.pytorch)),
           Cell::ratio_interval(versus),
           paired_ratio_cell(config.remat.cpu_ms, config.pytorch.cpu_ms)});
      if (c == per_block) {
        result.per_block_vs_pytorch = versus;
      }
    }
    section.add_table(std::move(peer));
    std::ostringstream grads;
    grads << "Gradients, one untimed step of each schedule in both processes "
             "(same seed): ";
    for (size_t g = 0; g < grad_compares.size(); ++g) {
      const auto& compare = grad_compares[g];
      grads << (g > 0 ? "; " : "") << compare.schedule << ": "
            << compare.differing << " of " << compare.elements
            << " parameter-gradient elements differ from PyTorch's, max abs "
               "diff "
            << compare.max_abs_diff << " (relative " << compare.max_rel_diff
            << ")";
    }
    grads << ". Baselines re-run after the rounds: remat none "
          << Cell::ms(rerun_remat.step().median).markdown()
          << " ms, PyTorch none "
          << Cell::ms(rerun_pytorch.step().median).markdown() << " ms.";
    section.add_text(grads.str());
  }
  return result;
}

std::string summary(const std::vector<ModelResult>& results) {
  std::ostringstream text;
  text << "**Summary against the targets.** ";
  for (const ModelResult& result : results) {
    text << result.id << ": lowest memory ratio with a time-ratio interval "
         << "entirely ≤ 1.20: "
         << Cell::ratio(result.best_memory_within_time).markdown() << " ("
         << result.best_memory_row << "; target ≤ 0.35: "
         << (result.best_memory_within_time <= 0.35 ? "met" : "missed")
         << "); lowest memory ratio of any row "
         << Cell::ratio(result.lowest_memory).markdown() << " ("
         << result.lowest_memory_row << ") at time ratio "
         << Cell::ratio_interval(result.lowest_memory_time).markdown() << ". ";
  }
  int64_t faster = 0;
  int64_t ten_percent = 0;
  int64_t slower = 0;
  int64_t compared = 0;
  for (const ModelResult& result : results) {
    for (const auto& [what, ratio] : result.equal_memory) {
      ++compared;
      faster += ratio.excludes_one() && ratio.high < 1;
      ten_percent += ratio.has_interval && ratio.high <= 0.90;
      slower += ratio.excludes_one() && ratio.low > 1;
      text << what << ": " << Cell::ratio_interval(ratio).markdown() << ". ";
    }
  }
  text << "At equal memory (" << compared
       << " comparisons where the optimal plan differs from the fastest "
          "fitting hand schedule): faster at "
       << faster << " (interval below 1), at least 10 % faster with the "
       << "whole interval at ≤ 0.90 at " << ten_percent << ", slower at "
       << slower << " (interval above 1), indistinguishable at "
       << compared - faster - slower << ". ";
  for (const ModelResult& result : results) {
    if (result.per_block_vs_pytorch) {
      const auto& ratio = *result.per_block_vs_pytorch;
      text << result.id << " per-block remat/PyTorch step "
           << Cell::ratio_interval(ratio).markdown() << ": "
           << (ratio.excludes_one() && ratio.low > 1
                   ? "remat slower (target missed)"
               : ratio.excludes_one() ? "remat faster"
                                      : "indistinguishable")
           << ". ";
    } else {
      text << result.id << ": PyTorch per-block not measured. ";
    }
  }
  return text.str();
}

Section run_e7(const E7Options& requested, const Context& context) {
  const E7Options options = sized_for(requested, context);
  Section section;
  section.scenario = "E7";
  section.title = "E7 — U-Net (2D and 3D), graphs with skip connections";
  std::ostringstream intro;
  intro << "U-Nets (`remat::models::UNet`, its graph stages `stages()`) on "
           "synthetic phantoms (`phantom_batch`, seed 1). **The loss is the "
           "graph's last stage** (cross-entropy + soft Dice of the head's "
           "logits), so every row's prediction and measured peak include the "
           "loss's memory; the labels are a constant of that stage. Rows: no "
           "checkpointing (`run_graph`, plain autograd); per-block "
           "(`schedule_graph` with every stage `kCheckpoint`, what MONAI users "
           "do; the loss stage, last, is always recorded); encoder-only "
           "(encoder blocks and pools `kCheckpoint`, bottleneck, decoder, "
           "head and loss `kRecord`); these three on the U-Net cut one "
           "stage per block (`stages()`). The optimal plan (`plan_within`) "
           "runs on the cut "
        << (options.optimal_stages == "convolution"
                ? "one stage per convolution round "
                  "(`stages(UNetStageSplit::kConvolution)`: conv, norm, ReLU; "
                  "a decoder level's upsampling and concatenation its own "
                  "stage)"
                : "one stage per block")
        << ", at budgets of ";
  for (size_t p = 0; p < options.percents.size(); ++p) {
    intro << (p > 0 ? ", " : "") << percent_text(options.percents[p]);
  }
  intro << " (fractions of its graph's store-all peak, as `remat::Budget` "
           "means them) and at the minimum feasible budget; and the optimal "
           "plan at the measured peaks of per-block and of encoder-only "
           "(equal memory). Budgets that give one plan share one "
           "configuration; stage forwards count the stages of the row's own "
           "cut. Predicted time ratios are simulate()'s step time against "
           "the store-all plan's on the profile of the row's own cut (each "
           "cut is profiled once; dividing by its own store-all cancels the "
           "scale by which the two profiles differ), so the optimal plan at "
           "100 % is predicted at 1 and its measured ratio shows what "
           "running the finer cut costs. Peaks are in simulate()'s units: "
           "the measured "
           "activation peak (tracking allocator, `MemoryMeter`) plus the "
           "input's bytes, less the loss value and backward's seed gradient "
           "(8 bytes, held past the loss stage's backward by the caller and "
           "by autograd, as in every remat measurement of a step); the "
           "remat/PyTorch table compares raw activation peaks; the memory "
           "ratio is of activation peaks. Every "
           "configuration takes one step per round (a gate round, "
        << context.warmup << " warm-up, " << context.rounds
        << " timed rounds), its gradients checked bitwise against none's "
           "of the round; ratios are paired by round with their 95 % "
           "interval. Every step, on either side, starts after a 20 ms "
           "sleep, so that it does not share the cores with the spinning "
           "OpenMP workers of the step before it, in either process "
           "(without it, remat's per-block steps, which follow PyTorch's, "
           "measured 1.026 and 1.049 of PyTorch's in 2D and 3D on "
           "2026-12-07 at 00:42 UTC). "
           "PyTorch (/usr/bin/python3, "
           "bench/pytorch/e7_pytorch.py) runs the same U-Net with the same "
           "parameters, images and labels: none and per-block "
           "(`torch.utils.checkpoint(use_reentrant=False)` on every stage but "
           "the loss), its steps next to remat's of the same schedule, "
           "memory counted by remat's tracking allocator loaded from "
           "libremat_meter.so (as E6).";
  section.add_text(intro.str());
  std::vector<ModelResult> results;
  for (const int64_t dims : options.dims) {
    TORCH_CHECK(
        dims == 2 || dims == 3,
        "remat_bench E7: expected --dims of 2 or 3, got ",
        dims);
    results.push_back(run_model(dims, options, context, section));
  }
  section.add_text(summary(results));
  return section;
}

ScenarioRun setup_e7(CLI::App& command) {
  auto options = std::make_shared<E7Options>();
  command.add_option("--dims", options->dims, "U-Nets to run: 2, 3 or both")
      ->capture_default_str();
  command.add_option("--size-2d", options->size_2d, "2D image edge")
      ->capture_default_str();
  command.add_option("--batch-2d", options->batch_2d, "2D batch")
      ->capture_default_str();
  command.add_option("--size-3d", options->size_3d, "3D volume edge")
      ->capture_default_str();
  command.add_option("--batch-3d", options->batch_3d, "3D batch")
      ->capture_default_str();
  command.add_option("--levels", options->levels, "U-Net levels")
      ->capture_default_str();
  command.add_option("--base-width", options->base_width, "level-0 channels")
      ->capture_default_str();
  command
      .add_option(
          "--optimal-stages",
          options->optimal_stages,
          "the optimal plans' cut: one stage per convolution round or per "
          "block")
      ->check(CLI::IsMember({"convolution", "block"}))
      ->capture_default_str();
  command
      .add_option(
          "--percents",
          options->percents,
          "budgets of the optimal rows, % of the store-all peak")
      ->capture_default_str();
  command.add_flag(
      "--no-pytorch", options->no_pytorch, "measure the remat side only");
  command
      .add_option(
          "--python", options->python, "the interpreter of the PyTorch side")
      ->capture_default_str();
  command.add_option("--script", options->script, "e7_pytorch.py")
      ->capture_default_str();
  command.add_option("--meter", options->meter, "libremat_meter.so")
      ->capture_default_str();
  return
      [options](const Context& context) { return run_e7(*options, context); };
}

const bool kE7Registered = register_scenario(
    {"E7",
     "U-Nets (2D, 3D): per-block, encoder-only and optimal graph plans, "
     "PyTorch per block",
     70,
     setup_e7});

}  // namespace
}  // namespace remat::bench
