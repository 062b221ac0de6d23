// models.h — umbrella header of remat_models, the built-in demo models
// (namespace remat::models). Examples used by tests, benchmarks and the CLI;
// not the remat API. Each model but the U-Net is a torch::nn::Sequential whose
// children each take and return one Tensor, i.e. a chain of stages for the
// planner; the U-Net gives a graph of stages (UNet::stages()).
#pragma once

#include <models/cnn.h>
#include <models/gpt.h>
#include <models/mlp.h>
#include <models/residual_ffn.h>
#include <models/segmentation_data.h>
#include <models/text_data.h>
#include <models/unet.h>
