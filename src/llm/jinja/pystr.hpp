// Python str semantics over UTF-8 std::string: code-point indexing, whitespace, strip/split, repr quoting.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace xmoe::jinja::pystr {

std::u32string decode(const std::string& utf8);
std::string encode(const std::u32string& text);
void append_utf8(std::string& out, char32_t cp);
size_t length(const std::string& utf8);
// Well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF); the byte offset of the
// first bad sequence otherwise.
std::optional<size_t> find_invalid_utf8(const std::string& text);  // in code points, like len(str)

bool is_space(char32_t cp);  // str.isspace()
// str.strip / lstrip / rstrip; `chars` absent strips whitespace.
std::string strip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right);
// str.split(sep, maxsplit); absent sep splits on runs of whitespace.
std::vector<std::string> split(const std::string& s, const std::optional<std::string>& sep, long maxsplit);
std::string replace(const std::string& s, const std::string& old, const std::string& with, long count);
std::string upper(const std::string& s);
std::string lower(const std::string& s);
// markupsafe.escape: & < > " ' as HTML entities.
std::string html_escape(const std::string& s);
// repr(str): quotes chosen and characters escaped as CPython does.
std::string repr(const std::string& s);

}  // namespace xmoe::jinja::pystr
