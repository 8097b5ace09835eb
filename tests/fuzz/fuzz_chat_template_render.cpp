// The real chat templates (tests/data/chat_templates, from the Hugging Face hub) rendered with an arbitrary
// context: byte 0 picks the template, the rest is JSON ({"messages": ..., "tools": ..., flags} or just the
// messages array). Rendering either gives text or throws xmoe::Error naming the template and line.
#include <algorithm>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fuzz_support.hpp"
#include "xmoe/chat_template.hpp"
#include "xmoe/error.hpp"

namespace {

const std::vector<xmoe::ChatTemplate>& templates() {
  static const std::vector<xmoe::ChatTemplate> all = [] {
    std::vector<std::filesystem::path> paths;
    for (const auto& e : std::filesystem::directory_iterator(xmoe::fuzz::data_path("chat_templates")))
      if (e.path().extension() == ".jinja") paths.push_back(e.path());
    std::sort(paths.begin(), paths.end());  // byte 0 picks the same template on every machine
    std::vector<xmoe::ChatTemplate> v;
    for (const auto& p : paths)
      v.push_back(xmoe::ChatTemplate::parse(xmoe::fuzz::read_file(p), p.filename().string()));
    return v;
  }();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto& all = templates();
  const xmoe::ChatTemplate& t = all[data[0] % all.size()];
  auto context = nlohmann::ordered_json::parse(xmoe::fuzz::as_text(data + 1, size - 1), nullptr, false);
  if (context.is_discarded()) return 0;
  if (!context.is_object()) context = nlohmann::ordered_json{{"messages", std::move(context)}};
  std::tm now{};
  now.tm_year = 126, now.tm_mon = 2, now.tm_mday = 7, now.tm_hour = 9;
  try {
    volatile size_t sink = t.render_ordered(context, now).size();
    (void)sink;
  } catch (const xmoe::Error&) {
  }
  return 0;
}
