// transmuter::text::ChatTemplate over the C ABI of rust/ (transmuter_text.h, rust/src/chat_template.rs).
#include <fstream>
#include <sstream>
#include <system_error>

#include "text/tokenizer.h"
#include "transmuter/text.h"
#include "transmuter_text.h"

namespace transmuter::text {
namespace {

namespace fs = std::filesystem;

struct ChatTemplateFree {
  void operator()(TtChatTemplate* t) const { tt_chat_template_free(t); }
};

void throw_chat_error(char* error) {
  if (error == nullptr) return;
  std::string message(error);
  tt_error_free(error);
  throw ChatTemplateError(message);
}

std::string take(TtString s) {
  std::string out = s.data == nullptr ? std::string() : std::string(s.data, s.len);
  tt_string_free(s);
  return out;
}

// A JSON string literal of a key (kwargs names are plain identifiers, but be exact anyway).
std::string json_key(const std::string& key) {
  static const char* kHex = "0123456789abcdef";
  std::string out = "\"";
  for (unsigned char c : key) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      out += "\\u00";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + '"';
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TokenizerFileError(str(path.string(), ": cannot read"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

struct ChatTemplate::Impl {
  std::unique_ptr<TtChatTemplate, ChatTemplateFree> handle;
  std::string source;
  std::string special_tokens_json;
};

ChatTemplate ChatTemplate::from_string(std::string_view source, std::string_view special_tokens_json) {
  auto impl = std::make_shared<Impl>();
  TtChatTemplate* handle = nullptr;
  throw_chat_error(tt_chat_template_new(source.data(), source.size(), &handle));
  impl->handle.reset(handle);
  impl->source = std::string(source);
  impl->special_tokens_json = std::string(special_tokens_json);
  return ChatTemplate(std::move(impl));
}

ChatTemplate ChatTemplate::from_folder(const fs::path& dir, std::string_view name) {
  const fs::path config = dir / "tokenizer_config.json";
  const fs::path jinja = dir / "chat_template.jinja";
  std::error_code ec;
  std::optional<std::string> source;
  std::string special_tokens = "{}";
  if (fs::is_regular_file(config, ec)) {
    TtString chat_template{}, special{};
    const bool from_jinja = fs::is_regular_file(jinja, ec) && (name.empty() || name == "default");
    // With a chat_template.jinja the config's template is not needed (nor its name checked).
    throw_if_error(tt_chat_template_config_read(config.c_str(), from_jinja ? nullptr : name.data(),
                                                from_jinja ? 0 : name.size(), &chat_template, &special),
                   true);
    special_tokens = take(special);
    if (chat_template.data != nullptr) source = take(chat_template);
  }
  if (fs::is_regular_file(jinja, ec) && (name.empty() || name == "default")) source = read_file(jinja);
  if (!source)
    throw TokenizerFileError(str(dir.string(),
                                 ": no chat template (neither chat_template.jinja nor a chat_template in ",
                                 "tokenizer_config.json)"));
  return from_string(*source, special_tokens);
}

std::string ChatTemplate::render(std::string_view messages_json, const ChatTemplateOptions& options) const {
  std::string extra;
  if (!options.extra_json.empty()) {
    extra = "{";
    for (const auto& [key, value] : options.extra_json) {
      if (extra.size() > 1) extra += ',';
      extra += json_key(key) + ':' + value;
    }
    extra += '}';
  }
  TtChatContext context{};
  context.messages = messages_json.data();
  context.messages_len = messages_json.size();
  if (options.tools_json) {
    context.tools = options.tools_json->data();
    context.tools_len = options.tools_json->size();
  }
  if (options.documents_json) {
    context.documents = options.documents_json->data();
    context.documents_len = options.documents_json->size();
  }
  context.add_generation_prompt = options.add_generation_prompt ? 1 : 0;
  context.special_tokens = impl_->special_tokens_json.data();
  context.special_tokens_len = impl_->special_tokens_json.size();
  if (!extra.empty()) {
    context.extra = extra.data();
    context.extra_len = extra.size();
  }
  TtString out{};
  throw_chat_error(tt_chat_template_render(impl_->handle.get(), &context, &out));
  return take(out);
}

const std::string& ChatTemplate::source() const { return impl_->source; }
const std::string& ChatTemplate::special_tokens_json() const { return impl_->special_tokens_json; }

}  // namespace transmuter::text
