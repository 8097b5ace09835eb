// The chat web page served at GET / (src/serve/web/chat.html, embedded at build time by
// cmake/embed_file.cmake).
#pragma once
#include <string_view>

namespace xmoe::serve {

// The page's bytes (UTF-8 HTML with its CSS and JS inline), valid for the program's lifetime.
std::string_view web_page();

}  // namespace xmoe::serve
