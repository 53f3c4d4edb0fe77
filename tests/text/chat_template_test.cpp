// transmuter::text::ChatTemplate against transformers 5.23.0's apply_chat_template(tokenize=False)
// on real templates of 12 models (tests/text/chat_template_references.txt, recorded by
// scripts/make_chat_template_references.py; the templates are fetched into .cache/chat_templates/
// by scripts/fetch_chat_templates.py). Tolerance: none, every rendering is compared byte for byte.
#include <gtest/gtest.h>

#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "transmuter/text.h"

namespace fs = std::filesystem;
using transmuter::text::ChatTemplate;
using transmuter::text::ChatTemplateError;
using transmuter::text::ChatTemplateOptions;

namespace {

const fs::path kSource = fs::path(TRANSMUTER_SOURCE_DIR);
const fs::path kTemplates = kSource / ".cache" / "chat_templates";

struct Case {
  std::string template_file, set, special, messages, tools, extra, today_format;
  bool add_generation_prompt = false;
  bool is_error = false;
  std::string text;  // the expected rendering, or the error message
};

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<Case> read_cases() {
  std::ifstream in(kSource / "tests" / "text" / "chat_template_references.txt", std::ios::binary);
  EXPECT_TRUE(in);
  std::vector<Case> cases;
  std::string line;
  Case c;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.find(' ');
    const std::string key = line.substr(0, space), value = line.substr(space + 1);
    if (key == "case") {
      c = Case{};
      std::istringstream fields(value);
      int agp = 0;
      fields >> c.template_file >> c.set >> agp;
      c.add_generation_prompt = agp != 0;
    } else if (key == "special") {
      c.special = value;
    } else if (key == "messages") {
      c.messages = value;
    } else if (key == "tools") {
      c.tools = value;
    } else if (key == "extra") {
      c.extra = value;
    } else if (key == "today") {
      c.today_format = value;
    } else if (key == "expected" || key == "error") {
      c.is_error = key == "error";
      c.text.resize(std::stoul(value));
      in.read(c.text.data(), static_cast<std::streamsize>(c.text.size()));
      in.get();  // the newline after the bytes
      cases.push_back(c);
    }
  }
  return cases;
}

std::string today(const std::string& format) {
  std::time_t now = std::time(nullptr);
  char buffer[128];
  return std::string(buffer, std::strftime(buffer, sizeof buffer, format.c_str(), std::localtime(&now)));
}

void replace_all(std::string& text, const std::string& from, const std::string& to) {
  for (size_t at = 0; (at = text.find(from, at)) != std::string::npos; at += to.size())
    text.replace(at, from.size(), to);
}

}  // namespace

TEST(ChatTemplate, RealTemplatesMatchTransformers) {
  // scripts/test fetches them: their absence is a failure, never a silent skip.
  ASSERT_TRUE(fs::is_directory(kTemplates))
      << kTemplates << " is missing: run scripts/fetch_chat_templates.py";
  const std::vector<Case> cases = read_cases();
  ASSERT_EQ(cases.size(), 120u);
  size_t rendered = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.template_file + " / " + c.set +
                 (c.add_generation_prompt ? " / add_generation_prompt" : ""));
    const std::string source = read_file(kTemplates / c.template_file);
    ChatTemplate chat_template = ChatTemplate::from_string(source, c.special);
    ChatTemplateOptions options;
    options.add_generation_prompt = c.add_generation_prompt;
    if (c.tools != "null") options.tools_json = c.tools;
    options.extra_json["date_string"] = "\"26 Jul 2024\"";
    ASSERT_EQ(c.extra, R"({"date_string": "26 Jul 2024"})");
    if (!c.is_error) {
      std::string expected = c.text;
      if (!c.today_format.empty()) replace_all(expected, "<<TODAY>>", today(c.today_format));
      EXPECT_EQ(chat_template.render(c.messages, options), expected);
      ++rendered;
    } else if (source.find(c.text) != std::string::npos) {
      // The template's own raise_exception: the same message.
      try {
        chat_template.render(c.messages, options);
        ADD_FAILURE() << "no error; transformers raised: " << c.text;
      } catch (const ChatTemplateError& e) {
        EXPECT_EQ(std::string(e.what()), c.text);
      }
    } else {
      // A Python error inside the template, not raise_exception: the *-tool_use templates iterate
      // `tools` when it is none, and Command-R's reads tool fields our OpenAI-style tools lack.
      // minijinja is lenient there (none iterates as empty): known divergences, not compared.
      EXPECT_TRUE(c.text == "'NoneType' object is not iterable" ||
                  c.text == "'dict object' has no attribute 'description'")
          << c.text;
    }
  }
  EXPECT_GT(rendered, 90u);
}

// Each expected string is Python's json.dumps(value, ensure_ascii=False, ...) of the same value.
TEST(ChatTemplate, TojsonIsPythonJsonDumps) {
  const std::string value =
      R"({"b": [1, 2.5, 1e20, 0.0001, true, null], "a": "é<>&'\"\\\n\t\u0001 👋", "c": {}, "d": [], "e": {"z": 1, "y": [{}]}})";
  struct {
    const char* call;
    const char* expected;
  } cases[] = {
      {"x | tojson",
       R"({"b": [1, 2.5, 1e+20, 0.0001, true, null], "a": "é<>&'\"\\\n\t\u0001 👋", "c": {}, "d": [], "e": {"z": 1, "y": [{}]}})"},
      {"x | tojson(sort_keys=true)",
       R"({"a": "é<>&'\"\\\n\t\u0001 👋", "b": [1, 2.5, 1e+20, 0.0001, true, null], "c": {}, "d": [], "e": {"y": [{}], "z": 1}})"},
      {"x | tojson(separators=(',', ':'))",
       R"({"b":[1,2.5,1e+20,0.0001,true,null],"a":"é<>&'\"\\\n\t\u0001 👋","c":{},"d":[],"e":{"z":1,"y":[{}]}})"},
      {"x.e | tojson(indent=2)", "{\n  \"z\": 1,\n  \"y\": [\n    {}\n  ]\n}"},
      {"x.e | tojson(indent=0)", "{\n\"z\": 1,\n\"y\": [\n{}\n]\n}"},
      {"x.e | tojson(indent='\\t', separators=(', ', ' = '))",
       "{\n\t\"z\" = 1, \n\t\"y\" = [\n\t\t{}\n\t]\n}"},
      {"x.a | tojson(ensure_ascii=true)", R"("\u00e9<>&'\"\\\n\t\u0001 \ud83d\udc4b")"},
      {"'plain' | tojson", R"("plain")"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.call);
    ChatTemplate t = ChatTemplate::from_string(std::string("{{ ") + c.call + " }}");
    ChatTemplateOptions options;
    options.extra_json["x"] = value;
    EXPECT_EQ(t.render("[]", options), c.expected);
  }
}

TEST(ChatTemplate, RaiseExceptionIsTheError) {
  ChatTemplate t = ChatTemplate::from_string(
      "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools for ' + m.name) }}{% "
      "endif %}"
      "{% endfor %}");
  EXPECT_EQ(t.render(R"([{"role": "user"}])"), "");
  try {
    t.render(R"([{"role": "tool", "name": "get_weather"}])");
    FAIL() << "no error";
  } catch (const ChatTemplateError& e) {
    EXPECT_STREQ(e.what(), "no tools for get_weather");
  }
}

TEST(ChatTemplate, StrftimeNowIsToday) {
  ChatTemplate t = ChatTemplate::from_string("{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%d %b %Y') }}");
  EXPECT_EQ(t.render("[]"), today("%Y-%m-%d") + "|" + today("%d %b %Y"));
}

TEST(ChatTemplate, SyntaxErrorNamesTheLine) {
  try {
    ChatTemplate::from_string("{% for m in messages %}\n{{ m.content }}\n{% if %}\n{% endfor %}");
    FAIL() << "no error";
  } catch (const ChatTemplateError& e) {
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("syntax error"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, LoopControlsAndBlockTrimming) {
  // trim_blocks drops the newline after a block tag, lstrip_blocks the indentation before one.
  ChatTemplate t = ChatTemplate::from_string(
      "{% for m in messages %}\n"
      "    {% if m.skip %}{% continue %}{% endif %}\n"
      "    {% if m.stop %}{% break %}{% endif %}\n"
      "[{{ m.content }}]\n"
      "{% endfor %}\n");
  EXPECT_EQ(t.render(R"([{"content": "a"}, {"content": "b", "skip": true}, {"content": "c"}, {"stop": true},
                         {"content": "d"}])"),
            "[a]\n[c]\n");
}

TEST(ChatTemplate, ContextVariables) {
  ChatTemplate t = ChatTemplate::from_string(
      "{{ bos_token }}|{{ 1 if tools is none else 0 }}|{{ 1 if documents is none else 0 }}"
      "|{{ 1 if add_generation_prompt else 0 }}|{{ (tools or []) | length }}|{{ documents[0].title if "
      "documents else '' }}"
      "|{{ 1 if enable_thinking is false else 0 }}|{{ messages[0]['content'].strip() }}",
      R"({"bos_token": "<s>", "eos_token": "</s>"})");
  EXPECT_EQ(t.render(R"([{"role": "user", "content": "  hi  "}])"), "<s>|1|1|0|0||0|hi");
  ChatTemplateOptions options;
  options.add_generation_prompt = true;
  options.tools_json = R"([{"type": "function"}])";
  options.documents_json = R"([{"title": "T", "text": "x"}])";
  options.extra_json["enable_thinking"] = "false";
  options.extra_json["bos_token"] = "\"<BOS>\"";
  EXPECT_EQ(t.render(R"([{"role": "user", "content": "  hi  "}])", options), "<BOS>|0|0|1|1|T|1|hi");
}

TEST(ChatTemplate, BadJsonIsAnError) {
  ChatTemplate t = ChatTemplate::from_string("{{ messages }}");
  EXPECT_THROW(t.render("[{"), ChatTemplateError);
  EXPECT_THROW(t.render("{}"), ChatTemplateError);  // not an array
}

TEST(ChatTemplate, FromFolderPicksTheTemplate) {
  const fs::path dir = fs::temp_directory_path() / ("chat_template_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"bos_token": {"content": "<s>", "special": true}, "eos_token": "</s>", "pad_token": null,
             "chat_template": [{"name": "default", "template": "D{{ bos_token }}"},
                               {"name": "tool_use", "template": "T{{ eos_token }}"}]})";
  EXPECT_EQ(ChatTemplate::from_folder(dir).render("[]"), "D<s>");
  EXPECT_EQ(ChatTemplate::from_folder(dir, "tool_use").render("[]"), "T</s>");
  EXPECT_THROW(ChatTemplate::from_folder(dir, "rag"), transmuter::text::TokenizerFileError);
  std::ofstream(dir / "chat_template.jinja") << "J{{ bos_token }}\n";
  EXPECT_EQ(ChatTemplate::from_folder(dir).render("[]"),
            "J<s>");  // the file wins; its last newline is dropped
  fs::remove_all(dir);
  EXPECT_THROW(ChatTemplate::from_folder(dir), transmuter::text::TokenizerFileError);
}
