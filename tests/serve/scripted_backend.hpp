// A Backend for the adapter tests: the Qwen3 chat template and a real Qwen tokenizer (tests/data fixtures),
// and streams that deliver scripted text in given pieces (token counts are the tokenizer's, as the real
// service reports them). It records what was submitted and whether the stream was cancelled.
#pragma once
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "serve/api.hpp"
#include "serve/backend.hpp"

namespace xmoe::serve::testing {

inline std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

struct Script {
  Script() = default;
  Script(std::vector<std::string> pieces_, llm::FinishReason finish_ = llm::FinishReason::stop,
         std::string stop_string_ = {})
      : pieces(std::move(pieces_)), finish(finish_), stop_string(std::move(stop_string_)) {}
  std::vector<std::string> pieces;  // one GenerationDelta each
  llm::FinishReason finish = llm::FinishReason::stop;
  std::string stop_string;
};

struct StreamLog {
  bool cancelled = false;
  int delivered = 0;
};

class ScriptedStream final : public GenerationStream {
 public:
  ScriptedStream(std::vector<Script> scripts, int64_t prompt_tokens, const Tokenizer& tok,
                 std::shared_ptr<StreamLog> log, int throw_after)
      : scripts_(std::move(scripts)), tok_(tok), log_(std::move(log)), throw_after_(throw_after) {
    prompt_tokens_ = prompt_tokens;
    pos_.assign(scripts_.size(), 0);
  }
  bool next(GenerationDelta& out) override {
    if (log_->cancelled) return false;
    if (throw_after_ >= 0 && log_->delivered == throw_after_) throw std::runtime_error("engine failure");
    // Round robin over the choices that have pieces left.
    for (size_t k = 0; k < scripts_.size(); ++k) {
      const size_t i = (turn_ + k) % scripts_.size();
      if (pos_[i] >= scripts_[i].pieces.size()) continue;
      turn_ = i + 1;
      const Script& s = scripts_[i];
      out = GenerationDelta{};
      out.index = static_cast<int>(i);
      out.text = s.pieces[pos_[i]];
      out.tokens = tok_.encode(out.text);
      for (int32_t t : out.tokens)
        out.logprobs.push_back(TokenLogprob{t, -0.5f, {{t, -0.5f}, {t + 1, -1.5f}}});
      if (++pos_[i] == s.pieces.size()) {
        out.finish = s.finish;
        out.stop_string = s.stop_string;
      }
      ++log_->delivered;
      return true;
    }
    return false;
  }
  void cancel() override { log_->cancelled = true; }

 private:
  std::vector<Script> scripts_;
  std::vector<size_t> pos_;
  size_t turn_ = 0;
  const Tokenizer& tok_;
  std::shared_ptr<StreamLog> log_;
  int throw_after_;
};

class ScriptedBackend final : public Backend {
 public:
  explicit ScriptedBackend(const std::string& template_file = "Qwen-Qwen3-0.6B.jinja")
      : tokenizer_(
            Tokenizer::from_file(std::string(XMOE_TEST_DATA_DIR) + "/tokenizer/qwen2/tokenizer.json")) {
    chat_.chat_template =
        read_text_file(std::string(XMOE_TEST_DATA_DIR) + "/chat_templates/" + template_file);
    chat_.chat_template_origin = template_file;
    chat_.eos_token = "<|im_end|>";
    chat_.eos_token_ids = {*tokenizer_.token_to_id("<|im_end|>"), *tokenizer_.token_to_id("<|endoftext|>")};
    info_.served_name = "tiny-qwen3";
    info_.max_seq_len = 4096;
    info_.created = 1700000000;
    info_.chat = &chat_;
    info_.tokenizer = &tokenizer_;
    info_.output_format = output_format_of_template(chat_);
  }
  const ModelInfo& info() const override { return info_; }
  std::unique_ptr<GenerationStream> submit(SubmitRequest request) override {
    ++submits;
    if (refuse_status) throw ApiError(refuse_status, "rate_limit_error", "the request queue is full");
    last = std::move(request);
    log = std::make_shared<StreamLog>();
    std::vector<Script> s = scripts;
    if (s.empty()) s.push_back(Script{});
    return std::make_unique<ScriptedStream>(std::move(s), static_cast<int64_t>(last.prompt.size()),
                                            tokenizer_, log, throw_after);
  }

  ModelInfo info_;
  llm::ChatSetup chat_;
  Tokenizer tokenizer_;
  std::vector<Script> scripts;  // one per choice
  SubmitRequest last;
  std::shared_ptr<StreamLog> log;
  int submits = 0;
  int refuse_status = 0;
  int throw_after = -1;
};

// Collects what a streaming response writes; can play a client that leaves after `limit` writes.
class CollectingWriter final : public StreamWriter {
 public:
  explicit CollectingWriter(int limit = -1) : limit_(limit) {}
  bool write(std::string_view chunk) override {
    if (limit_ >= 0 && writes >= limit_) return false;
    ++writes;
    body += chunk;
    return true;
  }
  std::string body;
  int writes = 0;

 private:
  int limit_;
};

inline std::string run_stream(const ApiResponse& r, int limit = -1) {
  CollectingWriter w(limit);
  if (r.stream) r.stream(w);
  return w.body;
}

}  // namespace xmoe::serve::testing
