#include "quantize_cmd.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "kernels/packed_weight.hpp"
#include "kernels/quant/quantize.hpp"
#include "llm/arch/architecture.hpp"
#include "llm/progress_bar.hpp"
#include "quant_checkpoint.hpp"
#include "safetensors_stream_writer.hpp"
#include "util/text_file.hpp"
#include "xmoe/error.hpp"
#include "xmoe/safetensors.hpp"

namespace xmoe::app {

namespace {

namespace fs = std::filesystem;

struct Source {
  std::map<std::string, std::string> file_of;  // tensor → shard file name
  std::map<std::string, SafetensorsFile> files;
  std::vector<std::string> order;  // shard files in order
  const SafetensorsEntry& entry(const std::string& name) const {
    return files.at(file_of.at(name)).entry(name);
  }
};

Source open_source(const std::string& dir) {
  Source s;
  const std::string index = dir + "/model.safetensors.index.json";
  if (fs::exists(index)) {
    const auto j = nlohmann::json::parse(read_text_file(index));
    XMOE_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), "quantize: ", index,
               ": field 'weight_map' missing or not an object");
    for (const auto& [name, file] : j["weight_map"].items()) {
      s.file_of[name] = file.get<std::string>();
      if (!s.files.count(file.get<std::string>())) {
        s.files.emplace(file.get<std::string>(), SafetensorsFile::open(dir + "/" + file.get<std::string>()));
        s.order.push_back(file.get<std::string>());
      }
    }
  } else {
    XMOE_CHECK(fs::exists(dir + "/model.safetensors"), "quantize: ", dir,
               " has neither model.safetensors nor model.safetensors.index.json");
    s.files.emplace("model.safetensors", SafetensorsFile::open(dir + "/model.safetensors"));
    s.order.push_back("model.safetensors");
    for (const auto& e : s.files.at("model.safetensors").entries()) s.file_of[e.name] = "model.safetensors";
  }
  return s;
}

// A source tensor's values as f32 through the exact f32/bf16/f16 row decoder.
std::vector<float> to_f32(const Source& s, const std::string& name) {
  const SafetensorsFile& f = s.files.at(s.file_of.at(name));
  const SafetensorsEntry& e = f.entry(name);
  kernels::PackedWeight w;
  if (e.dtype == "BF16")
    w.format = kernels::WeightFormat::bf16;
  else if (e.dtype == "F16")
    w.format = kernels::WeightFormat::f16;
  else if (e.dtype == "F32")
    w.format = kernels::WeightFormat::f32;
  else
    throw Error("quantize: " + f.path() + ": tensor '" + name + "' has dtype " + e.dtype +
                " (expected BF16, F16 or F32: the input must be an unquantized checkpoint)");
  // A fused 3-D expert tensor [E, in, out] reads as its E·in rows of out.
  w.rows = e.shape.size() == 3 ? e.shape[0] * e.shape[1] : e.shape[0];
  w.cols = e.shape.back();
  w.data = f.bytes(name).data();
  w.row_bytes = w.cols * (e.dtype == "F32" ? 4 : 2);
  std::vector<float> out(static_cast<size_t>(w.rows * w.cols));
  for (int64_t r = 0; r < w.rows; ++r) w.row_to_f32(r, out.data() + r * w.cols);
  return out;
}

// The architecture's tensor plans of the input's config: what to quantize comes from the per-expert plan
// (the layout the published quantized checkpoints hold); a tensor only the fused plan names is refused.
struct Plans {
  std::vector<llm::PlannedTensor> per_expert, fused;
  // The planned tensor to quantize under this name, or nullptr to copy it as is.
  const llm::PlannedTensor* quantized(const std::string& name, const SafetensorsEntry& e) const {
    const llm::PlannedTensor* t = llm::find_planned(per_expert, name);
    if (t == nullptr) {
      const llm::PlannedTensor* f = llm::find_planned(fused, name);
      XMOE_CHECK(
          f == nullptr || e.shape.size() != 3, "quantize: tensor '", name,
          "' is a fused 3-D expert tensor; quantized checkpoints hold per-expert linears (write the input "
          "with per-expert tensors)");
      return nullptr;
    }
    return t->role == llm::TensorRole::quantized_linear && e.shape.size() == 2 ? t : nullptr;
  }
  // The planned tensor when `name` is one of gpt-oss's fused expert tensors published in MXFP4, else nullptr.
  const llm::PlannedTensor* mxfp4_experts(const std::string& name, const SafetensorsEntry& e) const {
    const llm::PlannedTensor* t = llm::find_planned(per_expert, name);
    return t && t->role == llm::TensorRole::mxfp4_experts && e.shape.size() == 3 ? t : nullptr;
  }
  bool has_mxfp4_experts() const {
    return std::any_of(per_expert.begin(), per_expert.end(),
                       [](const llm::PlannedTensor& t) { return t.role == llm::TensorRole::mxfp4_experts; });
  }
};

std::vector<StreamedTensor> output_specs(const Source& s, const Plans& plans, const std::string& name,
                                         QuantTarget to) {
  const SafetensorsEntry& e = s.entry(name);
  if (plans.quantized(name, e)) return quantized_tensor_specs(to, name, e.shape[0], e.shape[1]);
  if (plans.mxfp4_experts(name, e))
    return mxfp4_fused_expert_specs(to, name, e.shape[0], e.shape[1], e.shape[2]);
  return {{name, e.dtype, e.shape, e.end - e.begin}};
}

void copy_side_files(const std::string& in, const std::string& out) {
  for (const auto& entry : fs::directory_iterator(in)) {
    const std::string file = entry.path().filename().string();
    if (!entry.is_regular_file() || file == "config.json" || file == "model.safetensors.index.json" ||
        entry.path().extension() == ".safetensors")
      continue;
    fs::copy_file(entry.path(), fs::path(out) / file, fs::copy_options::overwrite_existing);
  }
}

}  // namespace

CLI::App* add_quantize_subcommand(CLI::App& app, QuantizeOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "quantize", "Convert a BF16/F16/F32 Hugging Face checkpoint to a published quantized layout");
  cmd->add_option("--to", o.to,
                  "fp8-block (DeepSeek/Qwen3-FP8) | mxfp4 (compressed-tensors) | nvfp4 (ModelOpt, or see "
                  "--quant-layout)")
      ->required()
      ->check(CLI::IsMember(kQuantTargetFlags));
  cmd->add_option("--quant-layout", o.layout, kQuantLayoutHelp)->check(CLI::IsMember(kQuantLayoutFlags));
  cmd->add_option("in", o.in, "input checkpoint directory")->required()->check(CLI::ExistingDirectory);
  cmd->add_option("out", o.out, "output directory (created; must be empty if it exists)")->required();
  return cmd;
}

int run_quantize(const QuantizeOptions& o) {
  const QuantTarget to = parse_quant_target(o.to, o.layout);
  const Source src = open_source(o.in);
  auto config = nlohmann::ordered_json::parse(read_text_file(o.in + "/config.json"));
  XMOE_CHECK(!config.contains("quantization_config"), "quantize: ", o.in,
             "/config.json already has a quantization_config (the input must be unquantized)");
  const llm::ModelConfig model_config = llm::parse_model_config(o.in + "/config.json");
  const llm::Architecture& arch = llm::architecture_of(model_config);
  const Plans plans{arch.tensors(model_config, llm::ExpertLayout::per_expert),
                    arch.tensors(model_config, llm::ExpertLayout::fused)};
  // gpt-oss publishes its fused experts in MXFP4 and the rest unquantized: no other target exists for it.
  XMOE_CHECK(!plans.has_mxfp4_experts() || to == QuantTarget::mxfp4, "quantize: ", o.in, "/config.json (",
             arch.name(), ")", " has fused experts published in MXFP4 only; --to ", o.to,
             " is not a layout of this architecture");
  std::error_code ec;
  if (fs::exists(o.out, ec))
    XMOE_CHECK(fs::is_directory(o.out, ec) && fs::is_empty(o.out, ec), "quantize: ", o.out,
               " exists and is not an empty directory");
  fs::create_directories(o.out, ec);
  XMOE_CHECK(!ec, "quantize: cannot create ", o.out, ": ", ec.message());

  size_t total = 0, done = 0, written = 0;
  for (const auto& [file, f] : src.files)
    for (const auto& e : f.entries()) total += e.end - e.begin;
  llm::ProgressBar progress("quantize " + o.out);
  nlohmann::json weight_map = nlohmann::json::object();
  for (const std::string& file : src.order) {
    const SafetensorsFile& f = src.files.at(file);
    std::vector<StreamedTensor> specs;
    for (const auto& e : f.entries())
      for (auto& spec : output_specs(src, plans, e.name, to)) {
        weight_map[spec.name] = file;
        specs.push_back(std::move(spec));
      }
    SafetensorsStreamWriter writer(o.out + "/" + file, specs, {{"format", "pt"}});
    for (const auto& e : f.entries()) {
      if (const llm::PlannedTensor* planned = plans.quantized(e.name, e)) {
        const std::vector<float> w = to_f32(src, e.name);
        float scale_2 = 0.0f;
        if (is_nvfp4(to)) {
          scale_2 = kernels::quant::nvfp4_weight_scale_2(w.data(), static_cast<int64_t>(w.size()));
          const std::string& partner = planned->scale_partner;
          if (!partner.empty() && src.file_of.count(partner)) {
            const std::vector<float> pv = to_f32(src, partner);
            scale_2 = std::max(
                scale_2, kernels::quant::nvfp4_weight_scale_2(pv.data(), static_cast<int64_t>(pv.size())));
          }
        }
        for (const auto& bytes : quantized_tensor_bytes(to, w.data(), e.shape[0], e.shape[1], scale_2)) {
          writer.write({reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()});
          written += bytes.size();
        }
      } else if (plans.mxfp4_experts(e.name, e)) {
        const std::vector<float> w = to_f32(src, e.name);
        const int64_t in = e.shape[1], out = e.shape[2];
        std::vector<std::vector<uint8_t>> bytes(2);
        for (int64_t x = 0; x < e.shape[0]; ++x)
          append_mxfp4_fused_expert(w.data() + x * in * out, in, out, bytes);
        for (const auto& b : bytes) {
          writer.write({reinterpret_cast<const std::byte*>(b.data()), b.size()});
          written += b.size();
        }
      } else {
        writer.write(f.bytes(e.name));
        written += e.end - e.begin;
      }
      done += e.end - e.begin;
      progress.update(done, total);
    }
    writer.finish();
  }
  progress.finish();
  if (src.order.size() > 1 || fs::exists(o.in + "/model.safetensors.index.json")) {
    nlohmann::json index;
    index["metadata"] = {{"total_size", written}};
    index["weight_map"] = weight_map;
    write_text_file(o.out + "/model.safetensors.index.json", index.dump(2) + "\n");
  }
  if (plans.has_mxfp4_experts())
    write_mxfp4_experts_config(config, llm::kept_linear_modules(plans.per_expert));
  else
    write_quantization_config(to, config, llm::kept_linear_modules(plans.per_expert), o.out);
  write_text_file(o.out + "/config.json", config.dump(2) + "\n");
  copy_side_files(o.in, o.out);
  std::printf("wrote %s: %s, %.3f GB (from %.3f GB) in %zu file(s)\n", o.out.c_str(), quant_target_flag(to),
              static_cast<double>(written) / 1e9, static_cast<double>(total) / 1e9, src.order.size());
  return 0;
}

}  // namespace xmoe::app
