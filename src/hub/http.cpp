#include "hub/http.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <exception>
#include <mutex>

namespace transmuter::hub {

namespace {

constexpr size_t kMaxErrorBody = 64 * 1024;

void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) throw Error("libcurl failed to initialize");
  });
}

std::string lowercase(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string trim(std::string_view text) {
  const char* space = " \t\r\n";
  const size_t first = text.find_first_not_of(space);
  if (first == std::string_view::npos) return {};
  return std::string(text.substr(first, text.find_last_not_of(space) - first + 1));
}

// What the callbacks of one transfer share.
struct Transfer {
  CURL* curl = nullptr;
  HttpResponse response;
  const BodySink* sink = nullptr;
  std::exception_ptr sink_error;  // a sink that threw: rethrown after the transfer
};

size_t on_header(char* data, size_t size, size_t count, void* user) {
  auto& transfer = *static_cast<Transfer*>(user);
  const std::string_view line(data, size * count);
  if (line.starts_with("HTTP/")) {
    transfer.response.headers.clear();  // a new answer (after 100 Continue)
  } else if (const size_t colon = line.find(':'); colon != std::string_view::npos) {
    transfer.response.headers[lowercase(trim(line.substr(0, colon)))] = trim(line.substr(colon + 1));
  }
  return size * count;
}

size_t on_body(char* data, size_t size, size_t count, void* user) {
  auto& transfer = *static_cast<Transfer*>(user);
  const size_t bytes = size * count;
  long& status = transfer.response.status;
  curl_easy_getinfo(transfer.curl, CURLINFO_RESPONSE_CODE, &status);
  if (status != 200 && status != 206) {
    std::string& body = transfer.response.error_body;
    body.append(data, std::min(bytes, kMaxErrorBody - std::min(kMaxErrorBody, body.size())));
    return bytes;
  }
  if (transfer.sink == nullptr || !*transfer.sink) return bytes;
  try {
    return (*transfer.sink)(transfer.response, std::string_view(data, bytes)) ? bytes : 0;
  } catch (...) {
    transfer.sink_error = std::current_exception();
    return 0;
  }
}

// A CURLU parsed from `url`; throws naming the URL when it is not one.
struct ParsedUrl {
  CURLU* handle = curl_url();
  explicit ParsedUrl(const std::string& url, unsigned flags = 0) {
    if (handle == nullptr) throw std::bad_alloc();
    if (curl_url_set(handle, CURLUPART_URL, url.c_str(), flags) != CURLUE_OK) {
      curl_url_cleanup(handle);
      throw Error(str("'", url_for_messages(url), "' is not a valid URL"));
    }
  }
  ~ParsedUrl() { curl_url_cleanup(handle); }
  ParsedUrl(const ParsedUrl&) = delete;
  ParsedUrl& operator=(const ParsedUrl&) = delete;

  std::string get(CURLUPart part, unsigned flags = 0) const {
    char* value = nullptr;
    if (curl_url_get(handle, part, &value, flags) != CURLUE_OK) return {};
    std::string out(value);
    curl_free(value);
    return out;
  }
};

}  // namespace

std::string HttpResponse::header(std::string_view lowercase_name) const {
  auto found = headers.find(std::string(lowercase_name));
  return found == headers.end() ? std::string() : found->second;
}

struct HttpClient::Handle {
  CURL* curl = nullptr;
  ~Handle() {
    if (curl != nullptr) curl_easy_cleanup(curl);
  }
};

HttpClient::HttpClient() : handle_(std::make_unique<Handle>()) {
  init_curl_once();
  handle_->curl = curl_easy_init();
  if (handle_->curl == nullptr) throw Error("libcurl could not create a transfer handle");
}

HttpClient::~HttpClient() = default;

HttpResponse HttpClient::send(const HttpRequest& request, const BodySink& sink) {
  CURL* curl = handle_->curl;
  curl_easy_reset(curl);  // keeps the connection cache
  Transfer transfer;
  transfer.curl = curl;
  transfer.sink = &sink;
  char error_text[CURL_ERROR_SIZE] = {0};

  curl_slist* headers = nullptr;
  for (const std::string& header : request.headers) headers = curl_slist_append(headers, header.c_str());
  const std::string range = std::to_string(request.range_start) + "-";
  const auto ms = [](double seconds) { return static_cast<long>(std::ceil(seconds * 1000)); };

  curl_easy_setopt(curl, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 2L);
  if (!request.ca_bundle.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, request.ca_bundle.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error_text);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, ms(request.connect_timeout_s));
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &transfer);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &transfer);
  if (request.method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, ms(request.timeout_s));
  } else {
    // A stalled download fails after timeout_s without a byte, however long it runs.
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, std::max(1L, ms(request.timeout_s) / 1000));
    if (request.range_start > 0) curl_easy_setopt(curl, CURLOPT_RANGE, range.c_str());
  }

  const CURLcode code = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  if (transfer.sink_error) std::rethrow_exception(transfer.sink_error);
  if (code != CURLE_OK) {
    const std::string detail = error_text[0] != '\0' ? error_text : curl_easy_strerror(code);
    throw TransportError(str(request.method, " ", url_for_messages(request.url), ": ", detail),
                         code == CURLE_OPERATION_TIMEDOUT);
  }
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &transfer.response.status);
  return std::move(transfer.response);
}

std::string resolve_url(const std::string& base, const std::string& location) {
  ParsedUrl url(base);
  if (curl_url_set(url.handle, CURLUPART_URL, location.c_str(), CURLU_ALLOW_SPACE) != CURLUE_OK) {
    throw Error(str("redirect from ", url_for_messages(base), " to an invalid location"));
  }
  return url.get(CURLUPART_URL);
}

std::string url_origin(const std::string& url) {
  ParsedUrl parsed(url);
  return str(lowercase(parsed.get(CURLUPART_SCHEME)), "://", lowercase(parsed.get(CURLUPART_HOST)), ":",
             parsed.get(CURLUPART_PORT, CURLU_DEFAULT_PORT));
}

std::string url_for_messages(const std::string& url) {
  const size_t end = url.find_first_of("?#");
  return end == std::string::npos ? url : url.substr(0, end) + "?…";
}

}  // namespace transmuter::hub
