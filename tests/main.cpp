// GoogleTest entry point for the LibTorch test binaries. GPU tests belong in
// cuda_test.cpp; a *_CUDA test elsewhere is filtered out, with a note, when no
// GPU is present, so the suite passes on CPU-only machines.
#include <iostream>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!torch::cuda::is_available()) {
    std::string filter = ::testing::GTEST_FLAG(filter);
    filter += (filter.find('-') == std::string::npos ? "-" : ":");
    filter += "*_CUDA:*_CUDA/*:*/*_CUDA";
    ::testing::GTEST_FLAG(filter) = filter;
    std::cout << "note: no CUDA GPU is visible; tests named *_CUDA are skipped\n";
  }
  torch::set_num_threads(2);
  return RUN_ALL_TESTS();
}
