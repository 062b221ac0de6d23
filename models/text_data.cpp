// text_data.cpp — character tokenizer and batch sampler (see text_data.h).
#include <models/text_data.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>

namespace remat::models {

CharTokenizer::CharTokenizer(const std::string& text) : id_of_byte_(256, -1) {
  TORCH_CHECK(
      !text.empty(),
      "remat::models::CharTokenizer: expected a non-empty text, got an empty "
      "one");
  std::vector<bool> present(256, false);
  for (unsigned char byte : text) {
    present[byte] = true;
  }
  for (int byte = 0; byte < 256; ++byte) {
    if (present[byte]) {
      id_of_byte_[byte] = static_cast<int64_t>(vocabulary_.size());
      vocabulary_.push_back(static_cast<char>(byte));
    }
  }
}

int64_t CharTokenizer::vocab_size() const {
  return static_cast<int64_t>(vocabulary_.size());
}

torch::Tensor CharTokenizer::encode(const std::string& text) const {
  auto ids = torch::empty({static_cast<int64_t>(text.size())}, torch::kLong);
  auto* data = ids.data_ptr<int64_t>();
  for (size_t index = 0; index < text.size(); ++index) {
    const auto byte = static_cast<unsigned char>(text[index]);
    TORCH_CHECK(
        id_of_byte_[byte] >= 0,
        "remat::models::CharTokenizer::encode: expected characters of the "
        "vocabulary, got byte ",
        static_cast<int>(byte),
        " at position ",
        index);
    data[index] = id_of_byte_[byte];
  }
  return ids;
}

std::string CharTokenizer::decode(const torch::Tensor& tokens) const {
  auto flat = tokens.to(torch::kCPU, torch::kLong).contiguous().view({-1});
  const auto* data = flat.data_ptr<int64_t>();
  std::string text;
  text.reserve(flat.numel());
  for (int64_t index = 0; index < flat.numel(); ++index) {
    TORCH_CHECK(
        data[index] >= 0 && data[index] < vocab_size(),
        "remat::models::CharTokenizer::decode: expected ids in [0, ",
        vocab_size(),
        "), got ",
        data[index]);
    text.push_back(vocabulary_[data[index]]);
  }
  return text;
}

CharBatchSampler::CharBatchSampler(
    torch::Tensor tokens, int64_t seq_len, int64_t batch_size)
    : tokens_(std::move(tokens)), seq_len_(seq_len), batch_size_(batch_size) {
  TORCH_CHECK(
      seq_len_ >= 1 && batch_size_ >= 1,
      "remat::models::CharBatchSampler: expected seq_len and batch_size >= 1, "
      "got ",
      seq_len_,
      " and ",
      batch_size_);
  TORCH_CHECK(
      tokens_.dim() == 1 && tokens_.scalar_type() == torch::kLong &&
          tokens_.numel() > seq_len_,
      "remat::models::CharBatchSampler: expected int64 1-D tokens longer than "
      "seq_len ",
      seq_len_,
      ", got ",
      tokens_.scalar_type(),
      " ",
      tokens_.sizes());
}

TextBatch CharBatchSampler::sample(at::Generator& generator) const {
  const int64_t start_count = tokens_.numel() - seq_len_;  // starts in [0, n)
  auto starts =
      torch::randint(start_count, {batch_size_, 1}, generator, torch::kLong);
  auto offsets = torch::arange(seq_len_ + 1, torch::kLong).unsqueeze(0);
  auto indices = (starts + offsets).view({-1}).to(tokens_.device());
  auto windows =
      tokens_.index_select(0, indices).view({batch_size_, seq_len_ + 1});
  return {
      windows.narrow(1, 0, seq_len_).contiguous(),
      windows.narrow(1, 1, seq_len_).contiguous()};
}

at::Generator make_cpu_generator(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

}  // namespace remat::models
