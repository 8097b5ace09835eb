#include "quant_checkpoint.hpp"

#include <algorithm>
#include <cstring>

#include "kernels/quant/quantize.hpp"
#include "util/text_file.hpp"
#include "xmoe/error.hpp"

namespace xmoe::app {

namespace {

std::string base_of(const std::string& weight_name) {
  return weight_name.substr(0, weight_name.size() - std::string(".weight").size());
}

std::vector<uint8_t> f32_bytes(float v) {
  std::vector<uint8_t> b(4);
  std::memcpy(b.data(), &v, 4);
  return b;
}

}  // namespace

QuantTarget parse_quant_target(const std::string& flag) {
  if (flag == "fp8-block") return QuantTarget::fp8_block;
  if (flag == "mxfp4") return QuantTarget::mxfp4;
  if (flag == "nvfp4") return QuantTarget::nvfp4;
  throw Error("unknown quantized format '" + flag + "' (expected fp8-block, mxfp4 or nvfp4)");
}

const char* quant_target_flag(QuantTarget t) {
  switch (t) {
    case QuantTarget::fp8_block:
      return "fp8-block";
    case QuantTarget::mxfp4:
      return "mxfp4";
    case QuantTarget::nvfp4:
      return "nvfp4";
  }
  return "?";
}

std::vector<StreamedTensor> quantized_tensor_specs(QuantTarget t, const std::string& name, int64_t rows,
                                                   int64_t cols) {
  const std::string base = base_of(name);
  const auto n = [](int64_t a, int64_t b) { return static_cast<size_t>(a * b); };
  switch (t) {
    case QuantTarget::fp8_block: {
      const int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
      return {{base + ".weight", "F8_E4M3", {rows, cols}, n(rows, cols)},
              {base + ".weight_scale_inv", "F32", {sr, sc}, n(sr, sc) * 4}};
    }
    case QuantTarget::mxfp4:
      XMOE_CHECK(cols % 32 == 0, "mxfp4: tensor '", name, "' has ", cols,
                 " columns, not a multiple of the 32-element block");
      return {{base + ".weight_packed", "U8", {rows, cols / 2}, n(rows, cols / 2)},
              {base + ".weight_scale", "U8", {rows, cols / 32}, n(rows, cols / 32)}};
    case QuantTarget::nvfp4:
      XMOE_CHECK(cols % 16 == 0, "nvfp4: tensor '", name, "' has ", cols,
                 " columns, not a multiple of the 16-element block");
      return {{base + ".weight", "U8", {rows, cols / 2}, n(rows, cols / 2)},
              {base + ".weight_scale", "F8_E4M3", {rows, cols / 16}, n(rows, cols / 16)},
              {base + ".weight_scale_2", "F32", {}, 4},
              {base + ".input_scale", "F32", {}, 4}};
  }
  return {};
}

std::vector<std::vector<uint8_t>> quantized_tensor_bytes(QuantTarget t, const float* w, int64_t rows,
                                                         int64_t cols, float nvfp4_weight_scale_2) {
  switch (t) {
    case QuantTarget::fp8_block: {
      auto q = kernels::quant::quantize_fp8_block(w, rows, cols);
      return {std::move(q.data), std::move(q.scales)};
    }
    case QuantTarget::mxfp4: {
      auto q = kernels::quant::quantize_mxfp4(w, rows, cols);
      return {std::move(q.data), std::move(q.scales)};
    }
    case QuantTarget::nvfp4: {
      auto q = kernels::quant::quantize_nvfp4(w, rows, cols, nvfp4_weight_scale_2);
      // input_scale is a calibration result (activation amax / (6·448)); without calibration data it is 1,
      // and the CPU kernels, which keep activations in f32, do not read it.
      return {std::move(q.data), std::move(q.scales), f32_bytes(q.global_scale), f32_bytes(1.0f)};
    }
  }
  return {};
}

void write_quantization_config(QuantTarget t, nlohmann::ordered_json& config,
                               std::vector<std::string> kept_modules, const std::string& dir) {
  std::stable_partition(kept_modules.begin(), kept_modules.end(),
                        [](const std::string& m) { return m.find('.') == std::string::npos; });
  const nlohmann::ordered_json excluded = kept_modules;
  nlohmann::ordered_json q;
  switch (t) {
    case QuantTarget::fp8_block:
      q["quant_method"] = "fp8";
      q["fmt"] = "e4m3";
      q["activation_scheme"] = "dynamic";
      q["weight_block_size"] = {128, 128};
      q["modules_to_not_convert"] = excluded;
      break;
    case QuantTarget::mxfp4: {
      nlohmann::ordered_json weights;
      weights["num_bits"] = 4;
      weights["type"] = "float";
      weights["strategy"] = "group";
      weights["group_size"] = 32;
      weights["symmetric"] = true;
      weights["dynamic"] = false;
      nlohmann::ordered_json group;
      group["targets"] = {"Linear"};
      group["weights"] = weights;
      group["input_activations"] = nullptr;
      group["output_activations"] = nullptr;
      group["format"] = "mxfp4-pack-quantized";
      q["quant_method"] = "compressed-tensors";
      q["format"] = "mxfp4-pack-quantized";
      q["quantization_status"] = "compressed";
      q["config_groups"] = {{"group_0", group}};
      q["ignore"] = excluded;
      break;
    }
    case QuantTarget::nvfp4: {
      nlohmann::ordered_json quantization;
      quantization["quant_algo"] = "NVFP4";
      quantization["kv_cache_quant_algo"] = nullptr;
      quantization["group_size"] = 16;
      quantization["exclude_modules"] = excluded;
      nlohmann::ordered_json hf;
      hf["producer"] = {{"name", "xmoe"}};
      hf["quantization"] = quantization;
      write_text_file(dir + "/hf_quant_config.json", hf.dump(2) + "\n");
      q["quant_method"] = "modelopt";
      q["quant_algo"] = "NVFP4";
      q["group_size"] = 16;
      q["kv_cache_quant_algo"] = nullptr;
      q["exclude_modules"] = excluded;
      break;
    }
  }
  config["quantization_config"] = q;
}

}  // namespace xmoe::app
