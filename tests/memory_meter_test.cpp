// Tests of remat::MemoryMeter and the tracking CPU allocator: exact byte
// counts, the raw_allocate path, frees of memory the tracker never saw,
// multi-threaded balance, independent peaks of nested meters, unchanged
// results, and bad input; one measured training step (measure_step) and
// zero_gradients. CUDA tests live in cuda_test.cpp.
#include <remat/measure/cpu_memory.h>
#include <remat/measure/step.h>
#include <remat/memory_meter.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/core/CPUAllocator.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace {

TEST(MemoryMeter, CountsAnEmptyFloatTensorExactly) {
  remat::MemoryMeter meter;
  const int64_t baseline = meter.current_bytes();
  EXPECT_EQ(meter.baseline_bytes(), baseline);
  EXPECT_EQ(meter.peak_delta_bytes(), 0);
  {
    auto tensor = torch::empty({1000}, torch::kFloat);
    EXPECT_EQ(meter.current_bytes(), baseline + 4000);
    EXPECT_EQ(meter.peak_bytes(), baseline + 4000);
    EXPECT_EQ(meter.peak_delta_bytes(), 4000);
  }
  EXPECT_EQ(meter.current_bytes(), baseline);
  EXPECT_EQ(meter.peak_delta_bytes(), 4000);
  meter.reset();
  EXPECT_EQ(meter.peak_delta_bytes(), 0);
  EXPECT_EQ(meter.peak_bytes(), baseline);
  {
    auto small = torch::empty({10}, torch::kDouble);
    auto large = torch::empty({2, 50}, torch::kInt64);
    EXPECT_EQ(meter.peak_delta_bytes(), 80 + 800);
  }
  EXPECT_EQ(meter.current_bytes(), baseline);
  EXPECT_TRUE(remat::tracking_allocator_installed());
  EXPECT_TRUE(meter.device().is_cpu());
}

TEST(MemoryMeter, PeakCoversTemporariesOfAnOperation) {
  auto a = torch::ones({100, 100});
  remat::MemoryMeter meter;
  const int64_t baseline = meter.current_bytes();
  auto b = (a * 2 + 1).sum();  // a*2 is a 40000-byte temporary
  EXPECT_GE(meter.peak_delta_bytes(), 40000);
  EXPECT_EQ(meter.current_bytes(), baseline + 4);  // only the scalar result
}

TEST(MemoryMeter, CountsRawAllocateAndRawDeallocate) {
  remat::MemoryMeter meter;
  c10::Allocator* allocator = c10::GetCPUAllocator();
  ASSERT_NE(allocator->raw_deleter(), nullptr);
  const int64_t baseline = meter.current_bytes();
  void* first = allocator->raw_allocate(1234);
  void* second = allocator->raw_allocate(4321);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(meter.current_bytes(), baseline + 1234 + 4321);
  static_cast<char*>(first)[1233] = 1;  // the memory is usable
  allocator->raw_deallocate(first);
  EXPECT_EQ(meter.current_bytes(), baseline + 4321);
  allocator->raw_deallocate(second);
  EXPECT_EQ(meter.current_bytes(), baseline);
  EXPECT_EQ(meter.peak_delta_bytes(), 1234 + 4321);
}

TEST(MemoryMeter, DataPtrContextIsTheDataPointer) {
  remat::MemoryMeter meter;
  c10::DataPtr data = c10::GetCPUAllocator()->allocate(256);
  EXPECT_EQ(data.get(), data.get_context());
  EXPECT_EQ(meter.peak_delta_bytes(), 256);
}

TEST(MemoryMeter, FreeingUntrackedMemoryLeavesCountsAlone) {
  remat::MemoryMeter meter;
  const int64_t baseline = meter.current_bytes();
  // Memory from the original allocator stands for memory allocated before
  // installation; freeing it through the tracker must forward, not count.
  c10::Allocator* original = c10::GetDefaultCPUAllocator();
  ASSERT_NE(original, c10::GetCPUAllocator());
  void* raw = original->raw_allocate(999);
  { c10::DataPtr data = original->allocate(777); }
  EXPECT_EQ(meter.current_bytes(), baseline);
  c10::GetCPUAllocator()->raw_deallocate(raw);
  EXPECT_EQ(meter.current_bytes(), baseline);
  EXPECT_EQ(meter.peak_delta_bytes(), 0);
}

TEST(MemoryMeter, InstallationIsIdempotent) {
  remat::install_tracking_allocator();
  c10::Allocator* installed = c10::GetCPUAllocator();
  remat::install_tracking_allocator();
  EXPECT_EQ(c10::GetCPUAllocator(), installed);
}

TEST(MemoryMeter, BalancesExactlyUnderMultiThreadedStress) {
  const uint64_t seed = 1234;
  SCOPED_TRACE("seed " + std::to_string(seed));
  remat::MemoryMeter meter;
  const int64_t baseline = meter.current_bytes();
  constexpr int kThreads = 8;
  constexpr int kIterations = 3000;
  std::vector<std::thread> threads;
  for (int thread_index = 0; thread_index < kThreads; ++thread_index) {
    threads.emplace_back([&, thread_index] {
      std::mt19937_64 random(seed + thread_index);
      std::vector<torch::Tensor> held;
      std::vector<void*> raw_held;
      c10::Allocator* allocator = c10::GetCPUAllocator();
      for (int i = 0; i < kIterations; ++i) {
        const int64_t numel = 1 + static_cast<int64_t>(random() % 4096);
        switch (random() % 4) {
          case 0:
          case 1:
            held.push_back(torch::empty({numel}, torch::kFloat));
            break;
          case 2:
            raw_held.push_back(allocator->raw_allocate(numel));
            break;
          default:
            if (!held.empty()) {
              held.erase(held.begin() + random() % held.size());
            }
            if (!raw_held.empty()) {
              allocator->raw_deallocate(raw_held.back());
              raw_held.pop_back();
            }
        }
        if (held.size() > 64) {
          held.clear();
        }
      }
      for (void* pointer : raw_held) {
        allocator->raw_deallocate(pointer);
      }
    });
  }
  for (auto& thread : threads) {
    thread.join();
  }
  EXPECT_EQ(meter.current_bytes(), baseline);
  EXPECT_GE(meter.peak_delta_bytes(), 4);
}

TEST(MemoryMeter, NestedMetersHaveIndependentPeaks) {
  remat::MemoryMeter outer;
  {
    auto spike = torch::empty({250000}, torch::kFloat);  // 1 MB
  }
  remat::MemoryMeter inner;
  EXPECT_EQ(inner.peak_delta_bytes(), 0);
  {
    auto tensor = torch::empty({1000}, torch::kFloat);
    EXPECT_EQ(inner.peak_delta_bytes(), 4000);
  }
  EXPECT_EQ(outer.peak_delta_bytes(), 1000000);
  inner.reset();
  EXPECT_EQ(outer.peak_delta_bytes(), 1000000);
  outer.reset();
  EXPECT_EQ(inner.peak_delta_bytes(), 0);
  { auto tensor = torch::empty({10}, torch::kFloat); }
  EXPECT_EQ(inner.peak_delta_bytes(), 40);
  EXPECT_EQ(outer.peak_delta_bytes(), 40);
}

TEST(MemoryMeter, MetersOnDifferentThreadsHaveIndependentPeaks) {
  std::mutex mutex;
  std::condition_variable changed;
  int step = 0;
  auto wait_for = [&](int wanted) {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return step >= wanted; });
  };
  auto advance = [&] {
    std::lock_guard<std::mutex> lock(mutex);
    ++step;
    changed.notify_all();
  };
  int64_t first_peak_delta = -1;
  int64_t second_peak_delta = -1;
  std::thread first([&] {
    remat::MemoryMeter meter;
    { auto spike = torch::empty({100000}, torch::kFloat); }
    advance();  // step 1: spike freed
    wait_for(2);
    first_peak_delta = meter.peak_delta_bytes();
  });
  std::thread second([&] {
    wait_for(1);
    remat::MemoryMeter meter;
    { auto small = torch::empty({100}, torch::kFloat); }
    second_peak_delta = meter.peak_delta_bytes();
    advance();  // step 2
  });
  first.join();
  second.join();
  EXPECT_EQ(first_peak_delta, 400000);
  EXPECT_EQ(second_peak_delta, 400);
}

TEST(MemoryMeter, ManyMetersAliveAtOnce) {
  std::vector<remat::MemoryMeter> meters;
  for (int i = 0; i < 150; ++i) {  // more than one block of slots
    meters.emplace_back();
  }
  auto tensor = torch::empty({16}, torch::kFloat);
  for (const auto& meter : meters) {
    EXPECT_EQ(meter.peak_delta_bytes(), 64);
  }
  remat::MemoryMeter moved = std::move(meters.back());
  meters.pop_back();
  EXPECT_EQ(moved.peak_delta_bytes(), 64);
}

// Runs a seeded MLP training step and returns the updated parameters and the
// matmul of two random matrices.
std::vector<torch::Tensor> seeded_training_step() {
  torch::manual_seed(7);
  torch::nn::Sequential model(
      torch::nn::Linear(32, 64),
      torch::nn::ReLU(),
      torch::nn::Dropout(0.2),
      torch::nn::Linear(64, 8));
  torch::optim::Adam optimizer(model->parameters(), 1e-2);
  auto input = torch::randn({16, 32});
  auto target = torch::randn({16, 8});
  for (int step = 0; step < 3; ++step) {
    optimizer.zero_grad();
    auto loss = torch::mse_loss(model->forward(input), target);
    loss.backward();
    optimizer.step();
  }
  std::vector<torch::Tensor> results;
  for (const auto& parameter : model->parameters()) {
    results.push_back(parameter.detach().clone());
  }
  results.push_back(
      torch::matmul(torch::randn({67, 45}), torch::randn({45, 31})));
  return results;
}

TEST(MemoryMeter, LeavesResultsBitwiseUnchanged) {
  remat::install_tracking_allocator();
  c10::Allocator* tracker = c10::GetCPUAllocator();
  // Reference with the original allocator, then the same with the tracker.
  c10::SetCPUAllocator(c10::GetDefaultCPUAllocator(), UINT8_MAX);
  std::vector<torch::Tensor> reference = seeded_training_step();
  c10::SetCPUAllocator(tracker, UINT8_MAX);
  remat::MemoryMeter meter;
  std::vector<torch::Tensor> measured = seeded_training_step();
  EXPECT_GT(meter.peak_delta_bytes(), 0);
  ASSERT_EQ(reference.size(), measured.size());
  for (size_t i = 0; i < reference.size(); ++i) {
    EXPECT_TRUE(torch::equal(reference[i], measured[i]))
        << "tensor " << i << " differs by up to "
        << (reference[i] - measured[i]).abs().max().item<double>();
  }
}

TEST(MemoryMeter, RejectsUnsupportedDevices) {
  try {
    remat::MemoryMeter meter(c10::Device(c10::kXLA));
    FAIL() << "expected an error";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("xla"), std::string::npos)
        << error.what();
    EXPECT_NE(
        std::string(error.what()).find("remat::MemoryMeter"),
        std::string::npos);
  }
  if (!torch::cuda::is_available()) {
    EXPECT_THROW(remat::MemoryMeter(c10::Device(c10::kCUDA)), c10::Error);
  }
}

// A small model's step: Linear, ReLU, sum, on an input that does not
// require grad (the same every call: seed 7).
struct SmallStep {
  torch::nn::Linear linear{torch::nn::LinearOptions(64, 48)};
  torch::Tensor input;
  SmallStep() {
    torch::manual_seed(7);
    input = torch::randn({32, 64});
    remat::measure::zero_gradients(linear->parameters());
  }
  torch::Tensor loss() {
    return torch::relu(linear->forward(input)).sum();
  }
};

TEST(MeasureStep, PeakIsTheMetersLessTheLossAndItsSeedGradient) {
  SmallStep model;
  int64_t by_hand = 0;
  {
    remat::MemoryMeter meter;
    torch::Tensor loss = model.loss();
    loss.backward();
    by_hand = meter.peak_delta_bytes();
  }
  remat::measure::zero_gradients(model.linear->parameters());
  const remat::measure::StepMeasurement step =
      remat::measure::measure_step(c10::kCPU, [&] { return model.loss(); });
  EXPECT_EQ(step.peak_delta_bytes, by_hand);
  EXPECT_EQ(step.activation_peak_bytes(), by_hand - 2 * 4);  // fp32 scalars
  // ReLU keeps its 32x48 fp32 output for backward.
  EXPECT_GE(step.activation_peak_bytes(), 32 * 48 * 4);
  EXPECT_GE(step.forward_ms, 0);
  EXPECT_GE(step.backward_ms, 0);
  EXPECT_GE(step.cpu_ms, 0);
  EXPECT_DOUBLE_EQ(step.step_ms(), step.forward_ms + step.backward_ms);
  EXPECT_TRUE(step.loss.defined());
  EXPECT_TRUE(model.linear->weight.grad().abs().sum().item<double>() > 0);
}

TEST(MeasureStep, CountsWhatTheForwardKeepsAndFreesWhatItDoesNot) {
  SmallStep model;
  torch::Tensor kept;
  const remat::measure::StepMeasurement with_kept =
      remat::measure::measure_step(c10::kCPU, [&] {
        kept = torch::ones({250000});  // 1,000,000 bytes, held by the caller
        torch::Tensor dropped = torch::ones({500000});  // freed at return
        return model.loss();
      });
  remat::measure::zero_gradients(model.linear->parameters());
  kept = torch::Tensor();
  const remat::measure::StepMeasurement without =
      remat::measure::measure_step(c10::kCPU, [&] { return model.loss(); });
  // The 2,000,000-byte temporary was the peak of the forward; the kept
  // tensor then lasts through the backward.
  EXPECT_GE(with_kept.activation_peak_bytes(), 3000000);
  EXPECT_LE(
      with_kept.activation_peak_bytes(),
      3000000 + without.activation_peak_bytes());
}

TEST(MeasureStep, RunsAfterBackwardOnceTheGradientsExist) {
  SmallStep model;
  int calls = 0;
  double weight_grad = 0;
  remat::measure::measure_step(
      c10::kCPU,
      [&] { return model.loss(); },
      [&] {
        ++calls;
        weight_grad = model.linear->weight.grad().abs().sum().item<double>();
      });
  EXPECT_EQ(calls, 1);
  EXPECT_GT(weight_grad, 0);
}

TEST(MeasureStep, RefusesALossBackwardCannotStartFrom) {
  SmallStep model;
  const auto message_of = [&](const std::function<torch::Tensor()>& loss) {
    try {
      remat::measure::measure_step(c10::kCPU, loss);
    } catch (const std::invalid_argument& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  const std::string undefined = message_of([] { return torch::Tensor(); });
  EXPECT_NE(undefined.find("an undefined tensor"), std::string::npos)
      << undefined;
  const std::string vector = message_of(
      [&] { return torch::relu(model.linear->forward(model.input)); });
  EXPECT_NE(vector.find("[32, 48]"), std::string::npos) << vector;
  EXPECT_NE(vector.find("1536 elements"), std::string::npos) << vector;
  const std::string no_grad = message_of([&] {
    torch::NoGradGuard guard;
    return model.loss();
  });
  EXPECT_NE(no_grad.find("does not require grad"), std::string::npos)
      << no_grad;
  // Nothing was accumulated by the refused steps.
  EXPECT_EQ(model.linear->weight.grad().abs().sum().item<double>(), 0);
}

TEST(ZeroGradients, AllocatesZerosZeroesInPlaceAndLeavesFrozenParameters) {
  torch::Tensor trained = torch::ones({3, 4}, torch::requires_grad());
  torch::Tensor accumulated = torch::ones({5}, torch::requires_grad());
  accumulated.mutable_grad() = torch::full({5}, 2.0);
  const void* storage = accumulated.grad().data_ptr();
  torch::Tensor frozen = torch::ones({2});
  remat::measure::zero_gradients({trained, accumulated, frozen});
  ASSERT_TRUE(trained.grad().defined());
  EXPECT_TRUE(torch::equal(trained.grad(), torch::zeros({3, 4})));
  EXPECT_TRUE(torch::equal(accumulated.grad(), torch::zeros({5})));
  EXPECT_EQ(accumulated.grad().data_ptr(), storage);  // in place
  EXPECT_FALSE(frozen.grad().defined());
}

}  // namespace

#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 33)
// After keep_freed_cpu_memory(), a 64 MiB CPU tensor comes from the heap
// (glibc's default would map it on its own: 64 MiB is above any threshold
// its defaults reach), and freeing it keeps the memory in the process.
TEST(KeepFreedCpuMemory, LargeTensorsComeFromTheHeapAndStayThere) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer replaces malloc: glibc's settings and "
                  "statistics do not apply";
#endif
  ASSERT_TRUE(remat::measure::keep_freed_cpu_memory());
  const size_t mapped_before = mallinfo2().hblkhd;
  {
    auto big = torch::empty({16 << 20}, torch::kFloat32);  // 64 MiB
    big.fill_(1);
    EXPECT_EQ(mallinfo2().hblkhd, mapped_before)
        << "the tensor was mapped apart from the heap";
  }
  EXPECT_GE(mallinfo2().fordblks, size_t{64} << 20)
      << "the freed tensor's memory left the process";
}
#endif

TEST(KeepFreedCpuMemory, TunablesNameTheSameSettings) {
  EXPECT_EQ(
      remat::measure::keep_freed_cpu_memory_tunables(),
      "glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold="
      "1073741824:glibc.malloc.top_pad=268435456");
}
