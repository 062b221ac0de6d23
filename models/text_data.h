// text_data.h — built-in training text, a character-level tokenizer and a
// random-window batch sampler, so that the GPT demo trains with no download.
//
// The corpus is a few KB of English prose written for this project (see
// text_corpus.cpp). The tokenizer's vocabulary is the sorted set of distinct
// bytes of the text it is built from; it does not handle unseen characters
// (encode() throws) and treats UTF-8 multi-byte characters as separate bytes.
#pragma once

#include <ATen/core/Generator.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace remat::models {

/// The built-in English text (a few KB, ASCII only).
const std::string& builtin_text();

/// Character-level tokenizer: ids are positions in the sorted vocabulary.
class CharTokenizer {
 public:
  /// Builds the vocabulary from `text`. Throws c10::Error if text is empty.
  explicit CharTokenizer(const std::string& text);

  /// Number of distinct characters.
  int64_t vocab_size() const;
  /// Token ids of `text`, int64 [text.size()].
  /// Throws c10::Error naming the first character outside the vocabulary.
  torch::Tensor encode(const std::string& text) const;
  /// Text of int64 token ids of any shape (flattened).
  /// Throws c10::Error on an id outside [0, vocab_size()).
  std::string decode(const torch::Tensor& tokens) const;
  /// The vocabulary, sorted.
  const std::string& vocabulary() const {
    return vocabulary_;
  }

 private:
  std::string vocabulary_;
  std::vector<int64_t> id_of_byte_;  // 256 entries, -1 when absent
};

/// One batch of next-token training data.
struct TextBatch {
  torch::Tensor inputs;   // int64 [batch, seq]
  torch::Tensor targets;  // int64 [batch, seq], inputs shifted left by one
};

/// Samples random windows of a token sequence.
///
/// Example:
///   CharTokenizer tokenizer(builtin_text());
///   CharBatchSampler sampler(tokenizer.encode(builtin_text()), 64, 16);
///   at::Generator generator = make_cpu_generator(42);
///   TextBatch batch = sampler.sample(generator);
class CharBatchSampler {
 public:
  /// REQUIRES: tokens int64 1-D with more than seq_len elements.
  /// Throws c10::Error otherwise or if seq_len or batch_size < 1.
  CharBatchSampler(torch::Tensor tokens, int64_t seq_len, int64_t batch_size);

  /// batch_size windows at uniformly random starts drawn from `generator`
  /// (a CPU generator); the same generator state gives the same batch.
  TextBatch sample(at::Generator& generator) const;

  int64_t seq_len() const {
    return seq_len_;
  }
  int64_t batch_size() const {
    return batch_size_;
  }

 private:
  torch::Tensor tokens_;
  int64_t seq_len_;
  int64_t batch_size_;
};

/// A new CPU generator seeded with `seed`, independent of the global one.
at::Generator make_cpu_generator(uint64_t seed);

}  // namespace remat::models
