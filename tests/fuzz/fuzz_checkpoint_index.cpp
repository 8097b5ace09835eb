// model.safetensors.index.json of arbitrary bytes in a checkpoint directory holding a valid config.json and
// two shards: the index may name any file, but only plain files inside the directory may be opened.
#include <array>
#include <cstdint>
#include <vector>

#include "fuzz_support.hpp"
#include "llm/checkpoint.hpp"
#include "xmoe/error.hpp"
#include "xmoe/safetensors.hpp"

namespace {

void write_checkpoint(const xmoe::fuzz::ScratchDir& d) {
  d.write("config.json", xmoe::fuzz::read_file(xmoe::fuzz::data_path("checkpoints/tiny_config.json")));
  static const std::array<float, 4> f32{1.0f, -2.0f, 3.5f, 0.25f};
  static const std::array<uint16_t, 3> bf16{0x3f80, 0xc000, 0x4060};
  const auto bytes = [](const auto& a) { return std::as_bytes(std::span(a)); };
  xmoe::save_safetensors_raw(d.file("model-00001-of-00002.safetensors"),
                             {{"model.embed_tokens.weight", "F32", {2, 2}, {bytes(f32)}},
                              {"lm_head.weight", "BF16", {3}, {bytes(bf16)}}});
  xmoe::save_safetensors_raw(d.file("model-00002-of-00002.safetensors"),
                             {{"model.norm.weight", "F32", {4}, {bytes(f32)}},
                              {"model.codes", "U8", {2}, {std::as_bytes(std::span(bf16).first(1))}}});
}

const xmoe::fuzz::ScratchDir& checkpoint_dir() {
  static const xmoe::fuzz::ScratchDir dir;
  static const bool written = (write_checkpoint(dir), true);
  (void)written;
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const xmoe::fuzz::ScratchDir& dir = checkpoint_dir();
  dir.write("model.safetensors.index.json", xmoe::fuzz::as_text(data, size));
  try {
    const auto c = xmoe::llm::Checkpoint::open(dir.path());
    std::vector<float> values;
    for (const std::string& name : c.tensor_names()) {
      const xmoe::llm::WeightView w = c.weight(name);
      if (w.dtype == xmoe::llm::TensorDType::u8) continue;
      values.resize(static_cast<size_t>(w.numel()));
      w.to_f32(0, w.numel(), values.data());
    }
    volatile size_t sink = c.total_bytes();
    (void)sink;
  } catch (const xmoe::Error&) {
  }
  return 0;
}
