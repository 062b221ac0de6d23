// e6_pytorch_peer.cpp — the PyTorch side of scenario E6: the exchange folder
// and its files, the Python process (bench/pytorch/e6_pytorch.py, a
// PythonPeer), its steps, and the cross-process gradient comparison (steps 1,
// 2 and 4 of the procedure at the top of e6_pytorch.cpp).
//
// Files exchanged: weights.bin (the parameters, raw little-endian float32 in
// the order and under the names the Sequential gives them), input.bin and
// manifest.json (format "remat-e6 1"), written here; grads.bin (the Python
// side's parameter gradients, same layout as weights.bin), read here; and
// pytorch.log, the Python process's stderr.
#include "e6_pytorch.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

static_assert(
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
    "E6 exchanges raw little-endian float32 files");

namespace remat::bench::e6 {
namespace {

namespace fs = std::filesystem;

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
    int threads,
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
      {"threads", threads},
      {"weights", "weights.bin"},
      {"parameters", parameters},
      {"input", {{"file", "input.bin"}, {"shape", input.sizes().vec()}}}};
  std::ofstream(workdir.file("manifest.json")) << manifest.dump(1) << "\n";
  TORCH_CHECK(
      weights.good() && input_file.good(),
      "remat_bench E6: expected to write the weights and input into ",
      workdir.file(""),
      ", got a write error");
}

// remat's gradients against the raw float32 file the Python side wrote.
GradCompare compare_with_file(
    const std::vector<torch::Tensor>& remat_grads, const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  GradCompare compare;
  double largest_pytorch = 0;
  for (const auto& grad : remat_grads) {
    auto pytorch = torch::empty_like(grad);
    stream.read(
        reinterpret_cast<char*>(pytorch.data_ptr<float>()),
        static_cast<std::streamsize>(grad.numel() * sizeof(float)));
    TORCH_CHECK(
        stream.good(),
        "remat_bench E6: expected ",
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

nlohmann::json pytorch_command(
    const Row& row, const E6Options& options, uint64_t seed, bool train) {
  return {
      {"cmd", "step"},
      {"kind", row.pytorch_kind.empty() ? "none" : row.pytorch_kind},
      {"segments", options.segments},
      {"seed", seed},
      {"train", train}};
}

// One step of `row` in both processes under `seed` (dropout on if `train`),
// compared; false, with `pytorch.unavailable` set, when the PyTorch side
// failed.
bool compare_one_step(
    Row& row,
    bool train,
    Runner& runner,
    torch::nn::Sequential& model,
    PytorchSide& pytorch,
    const Workdir& workdir,
    const E6Options& options) {
  constexpr uint64_t kCompareSeed = 7;
  model->train(train);
  runner.step(row.forward, kCompareSeed);
  const auto remat_grads = gradients(model);
  auto command = pytorch_command(row, options, kCompareSeed, train);
  command["cmd"] = "grad";
  command["path"] = workdir.file("grads.bin");
  const auto reply = pytorch.peer->request(command, options.reply_timeout_s);
  if (!reply || reply->contains("error")) {
    pytorch.unavailable =
        reply ? "gradients of " + row.name + ": " + reply->at("error").dump()
              : pytorch.peer->why_unavailable();
    return false;
  }
  (train ? row.dropout_on : row.dropout_off) =
      compare_with_file(remat_grads, workdir.file("grads.bin"));
  return true;
}

}  // namespace

Workdir::Workdir(const std::string& requested) {
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
      "remat_bench E6: expected to create a work folder from ",
      pattern,
      ", got an error");
  path_ = pattern;
  owned_ = true;
}

Workdir::~Workdir() {
  if (owned_) {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
}

std::string Workdir::file(const std::string& name) const {
  return (path_ / name).string();
}

PytorchSide start_pytorch_side(
    const E6Options& options,
    const Context& context,
    const torch::Device& device,
    const Workdir& workdir,
    torch::nn::Sequential& model,
    const torch::Tensor& input) {
  PytorchSide pytorch;
  if (options.no_pytorch) {
    pytorch.unavailable = "left out (--no-pytorch)";
    return pytorch;
  }
  if (!device.is_cpu()) {
    pytorch.unavailable =
        "the PyTorch side runs on the CPU only, remat ran on " + device.str();
    return pytorch;
  }
  write_exchange_files(workdir, options, context.threads, model, input);
  pytorch.peer = std::make_unique<PythonPeer>(
      std::vector<std::string>{
          options.python,
          options.script,
          "--manifest",
          workdir.file("manifest.json"),
          "--meter",
          options.meter,
          "--threads",
          std::to_string(context.threads)},
      workdir.file("pytorch.log"),
      options.reply_timeout_s);
  if (!pytorch.peer->available()) {
    pytorch.unavailable = pytorch.peer->why_unavailable();
  }
  return pytorch;
}

void compare_gradients_with_pytorch(
    std::vector<Row>& rows,
    Runner& runner,
    torch::nn::Sequential& model,
    PytorchSide& pytorch,
    const Workdir& workdir,
    const E6Options& options) {
  for (auto& row : rows) {
    for (const bool train : {false, true}) {
      if (!pytorch.up() ||
          !compare_one_step(
              row, train, runner, model, pytorch, workdir, options)) {
        break;
      }
    }
  }
  model->train();
}

bool pytorch_step(
    PythonPeer& peer,
    Row& row,
    const E6Options& options,
    uint64_t seed,
    bool reference,
    bool timed,
    std::string* why) {
  auto command = pytorch_command(row, options, seed, /*train=*/true);
  command["reference"] = reference;
  const auto reply = peer.request(command, options.reply_timeout_s);
  if (!reply) {
    *why = peer.why_unavailable();
    return false;
  }
  if (reply->contains("error")) {
    *why = "schedule " + row.name + ": " + reply->at("error").dump();
    return false;
  }
  if (!timed) {
    return true;
  }
  const double forward_ms = reply->at("forward_ms").get<double>();
  const double backward_ms = reply->at("backward_ms").get<double>();
  row.pytorch.forward_ms.push_back(forward_ms);
  row.pytorch.backward_ms.push_back(backward_ms);
  row.pytorch.step_ms.push_back(forward_ms + backward_ms);
  if (!reply->at("peak_bytes").is_null()) {
    row.pytorch_peak_measured = true;
    row.pytorch.peak_bytes = std::max(
        row.pytorch.peak_bytes, reply->at("peak_bytes").get<int64_t>());
  }
  if (!reply->at("grad_diff").is_null()) {
    row.pytorch_grad_measured = true;
    row.pytorch.max_grad_diff = std::max(
        row.pytorch.max_grad_diff, reply->at("grad_diff").get<double>());
  }
  return true;
}

}  // namespace remat::bench::e6
