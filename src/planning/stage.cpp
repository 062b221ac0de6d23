// stage.cpp: stages_of, a Sequential's children as a chain of stages.
#include "remat/stage.h"

#include <c10/util/Exception.h>
#include <torch/nn/modules/container/any.h>

namespace remat {

std::vector<Stage> stages_of(const torch::nn::Sequential& sequential) {
  TORCH_CHECK(
      !sequential.is_empty(),
      "remat::stages_of: expected a Sequential, got a null one");
  std::vector<Stage> stages;
  for (size_t i = 0; i < sequential->size(); ++i) {
    torch::nn::AnyModule child = sequential->begin()[i];
    stages.push_back(
        {[child](const torch::Tensor& input) mutable {
           return child.forward(input);
         },
         sequential->ptr(i)});
  }
  return stages;
}

}  // namespace remat
