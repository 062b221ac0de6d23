// e6_pytorch.cpp — benchmark E6: remat next to PyTorch's own checkpointing.
//
// Procedure (the PyTorch side is bench/pytorch/e6_pytorch.py, driven by a
// PythonPeer):
//  1. This process builds the model (seed 0) and the input, and writes the
//     parameters (raw little-endian float32, named as the Sequential names
//     them) and the input with a JSON manifest into the work folder. The
//     Python process builds the same modules and loads them: both sides
//     train exactly the same numbers.
//  2. Cross-process gradient check, before any timing: every schedule runs
//     one step in both processes with dropout off (eval mode; the gate) and
//     one with dropout on and the same seed (both processes draw from the
//     same CPU generator algorithm, so the masks agree when both consume
//     random numbers in the same order). The Python side writes its
//     parameter gradients; they are compared here with remat's. The planned
//     row, which PyTorch cannot express, is compared with PyTorch's plain run.
//  3. Rounds: warm-up rounds, then measured rounds. In each round every
//     schedule takes one step in each process, the two processes alternating
//     who goes first from round to round, and all schedules interleaved
//     (A_remat A_torch B_remat B_torch ...). Every step of a round uses the
//     same seed, so each process checks its schedules' gradients against its
//     own plain run of that round (bitwise for these CPU ops).
//  4. Each step: parameter gradients zeroed (allocated, not freed), input
//     gradient dropped, seed set, the meter restarted; then forward + loss
//     (y.pow(2).mean()) timed, backward timed. Activation peak = peak live
//     bytes of the step minus the live bytes at the restart. Both processes
//     count bytes with remat's tracking CPU allocator (NOTE: [Tracking
//     allocator] in src/memory_meter.cpp), so the figures are comparable
//     byte for byte.
// The remat side may run on a GPU (--device cuda: the CUDA caching
// allocator's statistics, a device synchronisation around each timed phase);
// the PyTorch side is CPU-only, so it is left out there.
#include "e6_pytorch.h"

#include "python_peer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <utility>

#include <torch/torch.h>
#include <torch/version.h>
#include <nlohmann/json.hpp>

#include "models/models.h"
#include "remat/remat.h"

#ifndef REMAT_E6_SCRIPT
#error "REMAT_E6_SCRIPT must name bench/pytorch/e6_pytorch.py"
#endif
#ifndef REMAT_E6_METER
#error "REMAT_E6_METER must name the built libremat_meter.so"
#endif

static_assert(
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
    "E6 exchanges raw little-endian float32 files");

namespace remat::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Forward = std::function<torch::Tensor(const torch::Tensor&)>;

// The exchange folder: the given one, or a fresh one removed at the end.
class Workdir {
 public:
  explicit Workdir(const std::string& requested) {
    if (!requested.empty()) {
      path_ = requested;
      fs::create_directories(path_);
      return;
    }
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
        "/remat-e6-XXXXXX";
    TORCH_CHECK(
        ::mkdtemp(pattern.data()) != nullptr,
        "remat_bench e6: expected to create a work folder from ",
        pattern,
        ", got an error");
    path_ = pattern;
    owned_ = true;
  }
  ~Workdir() {
    if (owned_) {
      std::error_code ignored;
      fs::remove_all(path_, ignored);
    }
  }
  Workdir(const Workdir&) = delete;
  Workdir& operator=(const Workdir&) = delete;
  std::string file(const std::string& name) const {
    return (path_ / name).string();
  }

 private:
  fs::path path_;
  bool owned_ = false;
};

void write_floats(std::ofstream& stream, const torch::Tensor& tensor) {
  const auto host = tensor.detach().to(torch::kCPU, torch::kFloat).contiguous();
  stream.write(
      reinterpret_cast<const char*>(host.data_ptr<float>()),
      static_cast<std::streamsize>(host.numel() * sizeof(float)));
}

// weights.bin, input.bin and manifest.json for the Python side.
void write_exchange_files(
    const Workdir& workdir,
    const E6Options& options,
    torch::nn::Sequential& model,
    const torch::Tensor& input) {
  nlohmann::json parameters = nlohmann::json::array();
  std::ofstream weights(workdir.file("weights.bin"), std::ios::binary);
  int64_t offset_bytes = 0;
  for (const auto& item : model->named_parameters()) {
    const auto& tensor = item.value();
    parameters.push_back(
        {{"name", item.key()},
         {"shape", tensor.sizes().vec()},
         {"numel", tensor.numel()},
         {"offset_bytes", offset_bytes}});
    write_floats(weights, tensor);
    offset_bytes += tensor.numel() * static_cast<int64_t>(sizeof(float));
  }
  std::ofstream input_file(workdir.file("input.bin"), std::ios::binary);
  write_floats(input_file, input);
  const nlohmann::json manifest = {
      {"format", "remat-e6 1"},
      {"blocks", options.blocks},
      {"dim", options.dim},
      {"hidden", options.hidden},
      {"dropout", options.dropout},
      {"threads", options.threads},
      {"weights", "weights.bin"},
      {"parameters", parameters},
      {"input", {{"file", "input.bin"}, {"shape", input.sizes().vec()}}}};
  std::ofstream(workdir.file("manifest.json")) << manifest.dump(1) << "\n";
  TORCH_CHECK(
      weights.good() && input_file.good(),
      "remat_bench e6: expected to write the weights and input into ",
      workdir.file(""),
      ", got a write error");
}

std::vector<torch::Tensor> gradients_on_cpu(torch::nn::Sequential& model) {
  std::vector<torch::Tensor> grads;
  for (const auto& parameter : model->parameters()) {
    grads.push_back(parameter.grad().detach().to(torch::kCPU).clone());
  }
  return grads;
}

double max_abs_difference(
    const std::vector<torch::Tensor>& lhs,
    const std::vector<torch::Tensor>& rhs) {
  double difference = 0;
  for (size_t index = 0; index < lhs.size(); ++index) {
    difference = std::max(
        difference,
        (lhs[index] - rhs[index].to(lhs[index].device()))
            .abs()
            .max()
            .item<double>());
  }
  return difference;
}

// remat's gradients against the raw float32 file the Python side wrote.
E6GradCompare compare_with_file(
    const std::vector<torch::Tensor>& remat_grads, const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  E6GradCompare compare;
  double largest_pytorch = 0;
  for (const auto& grad : remat_grads) {
    auto pytorch = torch::empty_like(grad);
    stream.read(
        reinterpret_cast<char*>(pytorch.data_ptr<float>()),
        static_cast<std::streamsize>(grad.numel() * sizeof(float)));
    TORCH_CHECK(
        stream.good(),
        "remat_bench e6: expected ",
        grad.numel(),
        " more gradient values in ",
        path,
        ", got fewer");
    compare.max_abs_diff = std::max(
        compare.max_abs_diff, (grad - pytorch).abs().max().item<double>());
    largest_pytorch =
        std::max(largest_pytorch, pytorch.abs().max().item<double>());
    compare.differing += grad.ne(pytorch).sum().item<int64_t>();
  }
  compare.max_rel_diff =
      largest_pytorch > 0 ? compare.max_abs_diff / largest_pytorch : 0;
  compare.measured = true;
  return compare;
}

struct StepSample {
  double forward_ms = 0;
  double backward_ms = 0;
  int64_t peak_bytes = 0;
};

double elapsed_ms(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// The remat side of the experiment: model, input, schedules.
class RematSide {
 public:
  RematSide(const E6Options& options, torch::Device device) : device_(device) {
    torch::manual_seed(0);
    model = remat::models::residual_ffn_stack(
        remat::models::ResidualFfnStackOptions()
            .blocks(options.blocks)
            .dim(options.dim)
            .hidden(options.hidden)
            .dropout(options.dropout));
    model->to(device_);
    // Reentrant checkpointing reaches the parameters only through an input
    // that requires grad, so every schedule gets such an input.
    input = torch::randn({options.batch, options.dim})
                .to(device_)
                .requires_grad_(true);
    for (auto& parameter : model->parameters()) {
      parameter.mutable_grad() = torch::zeros_like(parameter);
    }
  }

  void synchronize() const {
    if (device_.is_cuda()) {
      torch::cuda::synchronize(device_.has_index() ? device_.index() : -1);
    }
  }

  StepSample step(const Forward& forward, uint64_t seed, bool train) {
    for (auto& parameter : model->parameters()) {
      parameter.mutable_grad().zero_();
    }
    input.mutable_grad() = torch::Tensor();
    model->train(train);
    torch::manual_seed(seed);
    synchronize();
    remat::MemoryMeter meter(device_);
    const auto start = Clock::now();
    auto output = forward(input);
    auto loss = output.pow(2).mean();
    synchronize();
    const auto forward_end = Clock::now();
    loss.backward();
    synchronize();
    const auto backward_end = Clock::now();
    StepSample sample;
    sample.forward_ms = elapsed_ms(start, forward_end);
    sample.backward_ms = elapsed_ms(forward_end, backward_end);
    sample.peak_bytes = meter.peak_delta_bytes();
    input.mutable_grad() = torch::Tensor();
    return sample;
  }

  torch::nn::Sequential model{nullptr};
  torch::Tensor input;

 private:
  torch::Device device_;
};

torch::Tensor per_block(
    torch::nn::Sequential& model, torch::Tensor x, remat::Mode mode) {
  for (auto& module : *model) {
    auto block = module;
    x = remat::checkpoint(
        [block](const torch::Tensor& in) mutable { return block.forward(in); },
        x,
        remat::CheckpointOptions().mode(mode));
  }
  return x;
}

struct Schedule {
  E6Row row;
  Forward forward;
};

std::vector<Schedule> make_schedules(
    const E6Options& options, RematSide& remat_side, E6Result& result) {
  auto model = remat_side.model;
  const std::string k = std::to_string(options.segments);
  std::vector<Schedule> schedules;
  const auto add = [&](std::string name,
                       std::string remat_call,
                       std::string pytorch_kind,
                       std::string pytorch_call,
                       Forward forward) {
    Schedule schedule;
    schedule.row.name = std::move(name);
    schedule.row.remat_call = std::move(remat_call);
    schedule.row.pytorch_kind = std::move(pytorch_kind);
    schedule.row.pytorch_call = std::move(pytorch_call);
    schedule.forward = std::move(forward);
    schedules.push_back(std::move(schedule));
  };
  add("none",
      "plain autograd",
      "none",
      "plain autograd",
      [model](const torch::Tensor& x) mutable { return model->forward(x); });
  add("per-block",
      "remat::checkpoint per block",
      "per-block",
      "checkpoint(block, use_reentrant=False) per block",
      [model](const torch::Tensor& x) mutable {
        return per_block(model, x, remat::Mode::kNonReentrant);
      });
  add("per-block-reentrant",
      "remat::checkpoint per block, Mode::kReentrant",
      "per-block-reentrant",
      "checkpoint(block, use_reentrant=True) per block",
      [model](const torch::Tensor& x) mutable {
        return per_block(model, x, remat::Mode::kReentrant);
      });
  add("sequential(" + k + ")",
      "remat::checkpoint_sequential(" + k + ")",
      "sequential",
      "checkpoint_sequential(" + k + "), non-reentrant",
      [model, segments = options.segments](const torch::Tensor& x) {
        return remat::checkpoint_sequential(model, segments, x);
      });
  add("sequential(" + k + ")-reentrant",
      "remat::checkpoint_sequential(" + k + "), Mode::kReentrant",
      "sequential-reentrant",
      "checkpoint_sequential(" + k + "), reentrant",
      [model, segments = options.segments](const torch::Tensor& x) {
        return remat::checkpoint_sequential(
            model,
            segments,
            x,
            remat::CheckpointOptions().mode(remat::Mode::kReentrant));
      });
  if (options.budget_fraction > 0) {
    const auto budget = remat::Budget::fraction(options.budget_fraction);
    model->train();
    const auto chain = remat::profile_chain(model, remat_side.input);
    result.planned_budget_bytes = budget.resolve_bytes(chain);
    result.input_bytes = chain.input_bytes();
    const auto plan =
        remat::planner::solve_optimal(chain, result.planned_budget_bytes);
    TORCH_CHECK(
        plan.has_value(),
        "remat_bench e6: expected a plan within ",
        budget.to_string(),
        " (",
        result.planned_budget_bytes,
        " bytes), got none; the minimum is ",
        remat::planner::min_feasible_budget_bytes(chain),
        " bytes");
    remat::PlannedSequential planned(model, *plan);
    const std::string percent =
        std::to_string(std::lround(options.budget_fraction * 100)) + "%";
    add("planned(" + percent + ")",
        "remat::PlannedSequential, the optimal plan within " +
            budget.to_string(),
        "",
        "(no counterpart)",
        [planned](const torch::Tensor& x) mutable {
          return planned->forward(x);
        });
  }
  return schedules;
}

nlohmann::json step_command(
    const E6Row& row, const E6Options& options, uint64_t seed, bool train) {
  return {
      {"cmd", "step"},
      {"kind", row.pytorch_kind.empty() ? "none" : row.pytorch_kind},
      {"segments", options.segments},
      {"seed", seed},
      {"train", train}};
}

// Step 2 of the procedure: one row's cross-process gradient comparison.
E6GradCompare cross_check(
    Schedule& schedule,
    RematSide& remat_side,
    PythonPeer& peer,
    const E6Options& options,
    const Workdir& workdir,
    bool train) {
  constexpr uint64_t kSeed = 7;
  remat_side.step(schedule.forward, kSeed, train);
  const auto remat_grads = gradients_on_cpu(remat_side.model);
  auto command = step_command(schedule.row, options, kSeed, train);
  command["cmd"] = "grad";
  command["path"] = workdir.file("grads.bin");
  const auto reply = peer.request(command, options.reply_timeout_s);
  if (!reply || reply->contains("error")) {
    return {};
  }
  return compare_with_file(remat_grads, workdir.file("grads.bin"));
}

}  // namespace

E6Result run_e6(const E6Options& options) {
  TORCH_CHECK(
      options.warmup >= 0 && options.rounds >= 1,
      "remat_bench e6: expected --warmup >= 0 and --rounds >= 1, got ",
      options.warmup,
      " and ",
      options.rounds);
  const torch::Device device(options.device);
  TORCH_CHECK(
      !device.is_cuda() || torch::cuda::is_available(),
      "remat_bench e6: expected a CUDA GPU for --device ",
      options.device,
      ", got none");
  E6Result result;
  result.options = options;
  result.libtorch_version = TORCH_VERSION;
  torch::set_num_threads(options.threads);
  remat::install_tracking_allocator();

  RematSide remat_side(options, device);
  auto schedules = make_schedules(options, remat_side, result);
  Workdir workdir(options.workdir);

  std::unique_ptr<PythonPeer> peer;
  if (!options.pytorch) {
    result.pytorch_unavailable = "left out (--no-pytorch)";
  } else if (!device.is_cpu()) {
    result.pytorch_unavailable =
        "the PyTorch side runs on the CPU only, the remat side on " +
        device.str();
  } else {
    write_exchange_files(workdir, options, remat_side.model, remat_side.input);
    const std::string script =
        options.script.empty() ? REMAT_E6_SCRIPT : options.script;
    const std::string meter =
        options.meter.empty() ? REMAT_E6_METER : options.meter;
    peer = std::make_unique<PythonPeer>(
        std::vector<std::string>{
            options.python,
            script,
            "--manifest",
            workdir.file("manifest.json"),
            "--meter",
            meter,
            "--threads",
            std::to_string(options.threads)},
        workdir.file("pytorch.log"),
        options.reply_timeout_s);
    if (!peer->available()) {
      result.pytorch_unavailable = peer->why_unavailable();
    } else {
      const auto& greeting = peer->greeting();
      result.pytorch_version = greeting.value("torch", "");
      result.pytorch_notes = greeting.value("sequential", "");
      result.pytorch_meter = greeting.value("meter", "");
    }
  }
  const auto pytorch_up = [&] { return peer != nullptr && peer->available(); };

  // 2. cross-process gradients
  if (pytorch_up()) {
    for (auto& schedule : schedules) {
      schedule.row.eval = cross_check(
          schedule, remat_side, *peer, options, workdir, /*train=*/false);
      schedule.row.train = cross_check(
          schedule, remat_side, *peer, options, workdir, /*train=*/true);
    }
  }

  // 3. interleaved rounds
  std::vector<torch::Tensor> reference_grads;
  for (int round = 0; round < options.warmup + options.rounds; ++round) {
    const bool measured = round >= options.warmup;
    const uint64_t seed = 1000 + static_cast<uint64_t>(round);
    for (size_t index = 0; index < schedules.size(); ++index) {
      auto& schedule = schedules[index];
      auto& row = schedule.row;
      const auto run_remat = [&] {
        const auto sample = remat_side.step(schedule.forward, seed, true);
        if (!measured) {
          return;
        }
        row.remat.forward_ms.push_back(sample.forward_ms);
        row.remat.backward_ms.push_back(sample.backward_ms);
        row.remat.step_ms.push_back(sample.forward_ms + sample.backward_ms);
        row.remat_peak_bytes =
            std::max(row.remat_peak_bytes, sample.peak_bytes);
        if (index == 0) {
          reference_grads = gradients_on_cpu(remat_side.model);
        } else {
          row.remat_grad_diff = std::max(
              row.remat_grad_diff,
              max_abs_difference(
                  gradients_on_cpu(remat_side.model), reference_grads));
        }
      };
      const auto run_pytorch = [&] {
        if (!pytorch_up() || row.pytorch_kind.empty()) {
          return;
        }
        auto command = step_command(row, options, seed, true);
        command["reference"] = index == 0;
        const auto reply = peer->request(command, options.reply_timeout_s);
        if (!reply) {
          result.pytorch_unavailable = peer->why_unavailable();
          return;
        }
        if (reply->contains("error")) {
          result.pytorch_unavailable = "schedule " + row.name + ": " +
                                       reply->at("error").get<std::string>();
          return;
        }
        if (!measured) {
          return;
        }
        const double forward_ms = reply->at("forward_ms").get<double>();
        const double backward_ms = reply->at("backward_ms").get<double>();
        row.pytorch.forward_ms.push_back(forward_ms);
        row.pytorch.backward_ms.push_back(backward_ms);
        row.pytorch.step_ms.push_back(forward_ms + backward_ms);
        if (!reply->at("peak_bytes").is_null()) {
          row.pytorch_peak_bytes = std::max(
              row.pytorch_peak_bytes.value_or(0),
              reply->at("peak_bytes").get<int64_t>());
        }
        if (!reply->at("grad_diff").is_null()) {
          row.pytorch_grad_diff = std::max(
              row.pytorch_grad_diff.value_or(0),
              reply->at("grad_diff").get<double>());
        }
      };
      if (round % 2 == 0) {
        run_remat();
        run_pytorch();
      } else {
        run_pytorch();
        run_remat();
      }
    }
  }
  for (auto& schedule : schedules) {
    result.rows.push_back(std::move(schedule.row));
  }
  return result;
}

}  // namespace remat::bench
