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

// One compressed-tensors quantization scheme over 4-bit floats in groups, as llm-compressor writes it.
nlohmann::ordered_json fp4_group_args(const char* strategy, int group_size,
                                      const nlohmann::ordered_json& dynamic) {
  nlohmann::ordered_json a;
  a["num_bits"] = 4;
  a["type"] = "float";
  a["symmetric"] = true;
  a["group_size"] = group_size;
  a["strategy"] = strategy;
  a["block_structure"] = nullptr;
  a["dynamic"] = dynamic;
  a["actorder"] = nullptr;
  a["observer"] = "minmax";
  a["observer_kwargs"] = nlohmann::ordered_json::object();
  return a;
}

nlohmann::ordered_json compressed_tensors_config(const char* format, const nlohmann::ordered_json& weights,
                                                 const nlohmann::ordered_json& inputs,
                                                 const nlohmann::ordered_json& ignore) {
  nlohmann::ordered_json group;
  group["targets"] = {"Linear"};
  group["weights"] = weights;
  group["input_activations"] = inputs;
  group["output_activations"] = nullptr;
  group["format"] = format;
  nlohmann::ordered_json q;
  q["quant_method"] = "compressed-tensors";
  q["format"] = format;
  q["quantization_status"] = "compressed";
  q["config_groups"] = {{"group_0", group}};
  q["ignore"] = ignore;
  q["kv_cache_scheme"] = nullptr;
  q["sparsity_config"] = nlohmann::ordered_json::object();
  return q;
}

}  // namespace

QuantTarget parse_quant_target(const std::string& flag, const std::string& layout) {
  const auto only = [&](QuantTarget t, const char* name) {
    XMOE_CHECK(layout.empty() || layout == name, "quantized format ", flag, " is written in the ", name,
               " layout only, not '", layout, "'");
    return t;
  };
  if (flag == "fp8-block") {
    if (layout.empty()) return QuantTarget::fp8_block;
    if (layout == "ue8m0") return QuantTarget::fp8_block_ue8m0;
    throw Error("unknown layout '" + layout + "' for fp8-block (expected ue8m0, or none for f32 scales)");
  }
  if (flag == "mxfp4") return only(QuantTarget::mxfp4, "compressed-tensors");
  if (flag == "nvfp4") {
    if (layout.empty() || layout == "modelopt") return QuantTarget::nvfp4;
    if (layout == "compressed-tensors") return QuantTarget::nvfp4_compressed;
    throw Error("unknown layout '" + layout + "' for nvfp4 (expected modelopt or compressed-tensors)");
  }
  throw Error("unknown quantized format '" + flag + "' (expected fp8-block, mxfp4 or nvfp4)");
}

const char* quant_target_flag(QuantTarget t) {
  switch (t) {
    case QuantTarget::fp8_block:
    case QuantTarget::fp8_block_ue8m0:
      return "fp8-block";
    case QuantTarget::mxfp4:
      return "mxfp4";
    case QuantTarget::nvfp4:
    case QuantTarget::nvfp4_compressed:
      return "nvfp4";
  }
  return "?";
}

std::vector<StreamedTensor> quantized_tensor_specs(QuantTarget t, const std::string& name, int64_t rows,
                                                   int64_t cols) {
  const std::string base = base_of(name);
  const auto n = [](int64_t a, int64_t b) { return static_cast<size_t>(a * b); };
  switch (t) {
    case QuantTarget::fp8_block:
    case QuantTarget::fp8_block_ue8m0: {
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
    case QuantTarget::nvfp4_compressed:
      XMOE_CHECK(cols % 16 == 0, "nvfp4: tensor '", name, "' has ", cols,
                 " columns, not a multiple of the 16-element block");
      if (t == QuantTarget::nvfp4)
        return {{base + ".weight", "U8", {rows, cols / 2}, n(rows, cols / 2)},
                {base + ".weight_scale", "F8_E4M3", {rows, cols / 16}, n(rows, cols / 16)},
                {base + ".weight_scale_2", "F32", {}, 4},
                {base + ".input_scale", "F32", {}, 4}};
      return {{base + ".weight_packed", "U8", {rows, cols / 2}, n(rows, cols / 2)},
              {base + ".weight_scale", "F8_E4M3", {rows, cols / 16}, n(rows, cols / 16)},
              {base + ".weight_global_scale", "F32", {1}, 4},
              {base + ".input_global_scale", "F32", {1}, 4}};
  }
  return {};
}

std::vector<std::vector<uint8_t>> quantized_tensor_bytes(QuantTarget t, const float* w, int64_t rows,
                                                         int64_t cols, float nvfp4_weight_scale_2) {
  switch (t) {
    case QuantTarget::fp8_block:
    case QuantTarget::fp8_block_ue8m0: {
      auto q = kernels::quant::quantize_fp8_block(w, rows, cols, t == QuantTarget::fp8_block_ue8m0);
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
    case QuantTarget::nvfp4_compressed: {
      // The same codes and block scales; compressed-tensors stores the global scale inverted
      // (6·448 / amax), and input_global_scale = 1 / ModelOpt's input_scale of 1.
      auto q = kernels::quant::quantize_nvfp4(w, rows, cols, nvfp4_weight_scale_2);
      return {std::move(q.data), std::move(q.scales), f32_bytes(1.0f / q.global_scale), f32_bytes(1.0f)};
    }
  }
  return {};
}

std::vector<StreamedTensor> mxfp4_fused_expert_specs(QuantTarget t, const std::string& name, int64_t experts,
                                                     int64_t in, int64_t out) {
  XMOE_CHECK(
      t == QuantTarget::mxfp4 && in % 32 == 0, "tensor '", name,
      "' (fused experts) is published as MXFP4 only (--quant/--to mxfp4, input dimension a multiple of "
      "32), got ",
      quant_target_flag(t), " and ", in, " inputs");
  return {{name + "_blocks", "U8", {experts, out, in / 32, 16}, static_cast<size_t>(experts * out * in / 2)},
          {name + "_scales", "U8", {experts, out, in / 32}, static_cast<size_t>(experts * out * in / 32)}};
}

void append_mxfp4_fused_expert(const float* w, int64_t in, int64_t out,
                               std::vector<std::vector<uint8_t>>& bytes) {
  std::vector<float> wt(static_cast<size_t>(in * out));
  for (int64_t i = 0; i < in; ++i)
    for (int64_t o = 0; o < out; ++o)
      wt[static_cast<size_t>(o * in + i)] = w[static_cast<size_t>(i * out + o)];
  const kernels::quant::QuantizedMatrix q = kernels::quant::quantize_mxfp4(wt.data(), out, in);
  bytes.resize(2);
  bytes[0].insert(bytes[0].end(), q.data.begin(), q.data.end());
  bytes[1].insert(bytes[1].end(), q.scales.begin(), q.scales.end());
}

void write_mxfp4_experts_config(nlohmann::ordered_json& config,
                                const std::vector<std::string>& kept_modules) {
  config["quantization_config"] = {{"quant_method", "mxfp4"}, {"modules_to_not_convert", kept_modules}};
}

void write_quantization_config(QuantTarget t, nlohmann::ordered_json& config,
                               std::vector<std::string> kept_modules, const std::string& dir) {
  std::stable_partition(kept_modules.begin(), kept_modules.end(),
                        [](const std::string& m) { return m.find('.') == std::string::npos; });
  const nlohmann::ordered_json excluded = kept_modules;
  nlohmann::ordered_json q;
  switch (t) {
    case QuantTarget::fp8_block:
    case QuantTarget::fp8_block_ue8m0:
      q["quant_method"] = "fp8";
      q["fmt"] = "e4m3";
      q["activation_scheme"] = "dynamic";
      if (t == QuantTarget::fp8_block_ue8m0) q["scale_fmt"] = "ue8m0";
      q["weight_block_size"] = {128, 128};
      q["modules_to_not_convert"] = excluded;
      break;
    case QuantTarget::mxfp4:
      q = compressed_tensors_config("mxfp4-pack-quantized", fp4_group_args("group", 32, false), nullptr,
                                    excluded);
      break;
    case QuantTarget::nvfp4_compressed:
      // Red Hat's NVFP4 (W4A4): activations quantized per 16 at run time, per tensor group.
      q = compressed_tensors_config("nvfp4-pack-quantized", fp4_group_args("tensor_group", 16, false),
                                    fp4_group_args("tensor_group", 16, "local"), excluded);
      break;
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
