// The page compiled into the binary is the committed file, byte for byte, and it is self-contained: nothing
// it references lives outside it (no CDN, fonts or scripts from elsewhere), so it works on an offline host.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "serve/web_page.hpp"

namespace {

std::string read_page_file() {
  const auto path =
      std::filesystem::path(XMOE_TEST_DATA_DIR) / ".." / ".." / "src" / "serve" / "web" / "chat.html";
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

TEST(WebPage, EmbeddedBytesEqualTheFile) {
  const std::string file = read_page_file();
  ASSERT_FALSE(file.empty());
  EXPECT_EQ(xmoe::serve::web_page(), file);
}

TEST(WebPage, ReferencesNothingOutsideItself) {
  const std::string page(xmoe::serve::web_page());
  // Attributes and CSS that would load another resource.
  const std::regex external(R"((\bsrc|\bhref)\s*=|@import|url\(|<link\b|https?://)", std::regex::icase);
  std::smatch found;
  EXPECT_FALSE(std::regex_search(page, found, external)) << "external reference: " << found.str();
  EXPECT_NE(page.find("<meta charset=\"utf-8\">"), std::string::npos);
  EXPECT_NE(page.find("name=\"viewport\""), std::string::npos);  // usable on a narrow screen
}

}  // namespace
