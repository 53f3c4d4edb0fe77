#include "hub/file_download.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "hub/http.h"
#include "hub/repo_paths.h"
#include "hub/sha256.h"

namespace transmuter::hub {

namespace fs = std::filesystem;

namespace {

constexpr int kMaxRedirects = 10;
constexpr double kMaxBackoffSeconds = 8;

// What one fetch_file call is about, for requests and error messages.
struct FileRequest {
  const std::string& repo_id;
  const std::string& revision;
  const std::string& filename;
  const HubOptions& options;

  // Whether a request to `url` carried the token (only the endpoint's origin gets it).
  bool token_sent(const std::string& url) const {
    return !options.token->empty() && url_origin(url) == url_origin(options.endpoint);
  }
};

// Hub metadata of one file at one revision (from the HEAD answer).
struct FileMetadata {
  std::string commit;
  std::string etag;
  std::optional<uint64_t> size;
  std::string url;  // the resolve URL after relative redirects: where the GET starts
};

const char* token_phrase(bool sent) { return sent ? "a token was sent" : "no token was sent"; }

bool is_retryable(long status) { return status == 408 || status == 429 || status >= 500; }

bool is_redirect(const HttpResponse& answer) {
  return answer.status >= 300 && answer.status < 400 && !answer.header("location").empty();
}

// huggingface_hub follows a redirect on the metadata request only when it stays
// on the same site (a renamed repo); a redirect to the CDN is the download's.
bool is_relative_location(std::string_view location) {
  return location.find("://") == std::string_view::npos && !location.starts_with("//");
}

bool is_sha256(std::string_view text) {
  return text.size() == 64 && std::all_of(text.begin(), text.end(), [](char c) {
           return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f');
         });
}

std::optional<uint64_t> parse_size(const std::string& text) {
  uint64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// A server-sent text for an error message: printable ASCII, at most 200 characters.
std::string printable(std::string_view text) {
  std::string out;
  for (char c : text.substr(0, 200)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return out;
}

// The token goes only to the endpoint's own origin: never to the CDN or a
// storage host a download is redirected to.
std::vector<std::string> headers_for(const std::string& url, const HubOptions& options) {
  std::vector<std::string> headers = {"Accept-Encoding: identity", "User-Agent: transmuter/0.1"};
  if (!options.token->empty() && url_origin(url) == url_origin(options.endpoint)) {
    headers.push_back("Authorization: Bearer " + *options.token);
  }
  return headers;
}

void sleep_before_retry(const HubOptions& options, int failures) {
  const double seconds =
      std::min(kMaxBackoffSeconds, *options.retry_backoff_s * double(1 << std::min(failures, 10)));
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

[[noreturn]] void throw_for_answer(const HttpResponse& answer, const FileRequest& request,
                                   const std::string& url) {
  const std::string code = answer.header("x-error-code");
  const std::string detail = answer.header("x-error-message");
  const std::string where = str(" (", url_for_messages(url), ", HTTP ", answer.status,
                                detail.empty() ? "" : ": " + printable(detail), ")");
  const bool token = request.token_sent(url);
  const std::string& repo = request.repo_id;
  using Kind = HubError::Kind;
  if (code == "GatedRepo") {
    throw HubError(Kind::kGatedRepo,
                   str(repo, " is a gated repo", where, "; ", token_phrase(token),
                       token ? ": its user has no access yet; accept the repo's terms on the Hub"
                             : ": accept the repo's terms on the Hub and set HF_TOKEN"));
  }
  if (code == "RepoNotFound" || (answer.status == 401 && code.empty())) {
    throw HubError(
        Kind::kRepositoryNotFound,
        str("repository ", repo, " not found", where, "; ", token_phrase(token),
            token ? ": check that it can read this repo" : ": if the repo is private, set HF_TOKEN"));
  }
  if (code == "RevisionNotFound") {
    throw HubError(Kind::kRevisionNotFound,
                   str("revision '", request.revision, "' of ", repo, " not found", where));
  }
  if (code == "EntryNotFound" || answer.status == 404) {
    throw HubError(Kind::kEntryNotFound, str("no file '", request.filename, "' in ", repo, " at revision '",
                                             request.revision, "'", where));
  }
  if (answer.status == 401 || answer.status == 403) {
    throw HubError(Kind::kAccessDenied, str("access to '", request.filename, "' of ", repo, " denied", where,
                                            "; ", token_phrase(token)));
  }
  if (is_retryable(answer.status)) {
    throw HubError(Kind::kNetwork, str("the hub kept failing", where, " after ",
                                       request.options.max_retries + 1, " attempts"));
  }
  throw HubError(Kind::kInvalidAnswer, str("unexpected answer", where));
}

// HEAD, following relative redirects only; `url` ends as the last one asked.
HttpResponse head_once(HttpClient& http, std::string& url, const HubOptions& options) {
  for (int hop = 0;; ++hop) {
    HttpResponse answer = http.send({.method = "HEAD",
                                     .url = url,
                                     .headers = headers_for(url, options),
                                     .connect_timeout_s = *options.etag_timeout_s,
                                     .timeout_s = *options.etag_timeout_s,
                                     .ca_bundle = options.ca_bundle.string()});
    if (!is_redirect(answer) || !is_relative_location(answer.header("location"))) return answer;
    if (hop == kMaxRedirects) {
      throw HubError(HubError::Kind::kInvalidAnswer,
                     str(url_for_messages(url), ": more than ", kMaxRedirects, " redirects"));
    }
    url = resolve_url(url, answer.header("location"));
  }
}

// head_once, tried again after cut connections, timeouts and 429/5xx answers.
// The last answer comes back, even a 5xx one; a TransportError escapes after the last try.
HttpResponse head_with_retries(HttpClient& http, std::string& url, const HubOptions& options) {
  const std::string first_url = url;
  for (int failures = 0;; ++failures) {
    url = first_url;
    try {
      HttpResponse answer = head_once(http, url, options);
      if (!is_retryable(answer.status) || failures >= options.max_retries) return answer;
    } catch (const TransportError&) {
      if (failures >= options.max_retries) throw;
    }
    sleep_before_retry(options, failures);
  }
}

FileMetadata read_metadata(const HttpResponse& answer, const std::string& url) {
  FileMetadata metadata;
  metadata.url = url;
  metadata.commit = answer.header("x-repo-commit");
  const std::string linked_etag = answer.header("x-linked-etag");
  metadata.etag = normalize_etag(linked_etag.empty() ? answer.header("etag") : linked_etag);
  const std::string linked_size = answer.header("x-linked-size");
  metadata.size = parse_size(linked_size.empty() ? answer.header("content-length") : linked_size);
  const std::string shown = url_for_messages(url);
  if (metadata.commit.empty()) {
    throw HubError(
        HubError::Kind::kInvalidAnswer,
        str(shown, ": the answer has no X-Repo-Commit header (is HF_ENDPOINT a Hugging Face Hub?)"));
  }
  if (metadata.etag.empty()) {
    throw HubError(HubError::Kind::kInvalidAnswer, str(shown, ": the answer has no ETag header"));
  }
  check_served_name("commit", metadata.commit, shown);
  check_served_name("etag", metadata.etag, shown);
  return metadata;
}

// The cache's answer when the hub is not asked (offline) or cannot be reached.
CachedFile from_cache(const RepoFolder& folder, const FileRequest& request, HubError::Kind kind,
                      const std::string& reason) {
  std::optional<std::string> commit =
      is_commit_hash(request.revision) ? std::optional(request.revision) : folder.read_ref(request.revision);
  if (commit && is_commit_hash(*commit)) {
    if (auto cached = folder.cached_file(*commit, request.filename)) return {*cached, *commit};
    if (folder.marked_missing(*commit, request.filename)) {
      throw HubError(HubError::Kind::kEntryNotFound,
                     str("no file '", request.filename, "' in ", request.repo_id, " at revision '",
                         request.revision, "' (the cache records it as missing; ", reason, ")"));
    }
  }
  throw HubError(kind, str(reason, ": '", request.filename, "' of ", request.repo_id, " at revision '",
                           request.revision, "' is not in the cache (", folder.root().string(), ")"));
}

class OpenFile {
 public:
  // Opens `path`, created when missing; what it holds is a download's start.
  explicit OpenFile(const fs::path& path) : path_(path) {
    fs::create_directories(path.parent_path());
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd_ < 0) throw Error(str("cannot create ", path.string(), ": ", std::strerror(errno)));
  }
  ~OpenFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;

  void write_all(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t done = ::write(fd_, bytes.data(), bytes.size());
      if (done < 0 && errno == EINTR) continue;
      if (done <= 0) fail("cannot write");
      bytes.remove_prefix(static_cast<size_t>(done));
    }
  }
  void truncate() {
    if (::ftruncate(fd_, 0) != 0 || ::lseek(fd_, 0, SEEK_SET) != 0) fail("cannot truncate");
  }
  // Feeds what the file holds to `consume` and leaves the offset at its end.
  uint64_t read_all(Sha256& consume) {
    char buffer[1 << 16];
    uint64_t total = 0;
    if (::lseek(fd_, 0, SEEK_SET) != 0) fail("cannot seek in");
    while (true) {
      const ssize_t got = ::read(fd_, buffer, sizeof(buffer));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) fail("cannot read");
      if (got == 0) return total;
      consume.update(buffer, static_cast<size_t>(got));
      total += static_cast<uint64_t>(got);
    }
  }
  // On disk before the rename makes it the blob: a crash never leaves a short blob.
  void sync_and_close() {
    if (::fsync(fd_) != 0) fail("cannot sync");
    ::close(fd_);
    fd_ = -1;
  }

 private:
  [[noreturn]] void fail(const char* what) const {
    throw Error(str(what, " ", path_.string(), ": ", std::strerror(errno)));
  }

  fs::path path_;
  int fd_ = -1;
};

// The bytes of one blob into a temporary file, resumed with Range (after a cut
// within the retries, or from a left-over file), checked against the hub's size
// and sha256.
class BlobDownload {
 public:
  // `temporary` may hold the start of the blob (a killed download's): it is resumed.
  BlobDownload(const fs::path& temporary, const FileMetadata& metadata, const FileRequest& request)
      : file_(temporary), metadata_(metadata), request_(request) {
    written_ = file_.read_all(hash_);
    if (metadata_.size && written_ > *metadata_.size) restart();
  }

  void run(HttpClient& http) {
    const HubOptions& options = request_.options;
    std::string last_problem;
    // A left-over file may already be whole (killed before its rename): check it as it is.
    const bool whole = metadata_.size && written_ == *metadata_.size && written_ > 0;
    for (int failures = 0; !whole;) {
      const uint64_t before = written_;
      try {
        const HttpResponse answer = get_following_redirects(http);
        if (answer.status == 200 || answer.status == 206) break;
        if (!is_retryable(answer.status)) throw_for_answer(answer, request_, final_url_);
        last_problem = str("HTTP ", answer.status, " from ", url_for_messages(final_url_));
      } catch (const TransportError& e) {
        last_problem = e.what();
      }
      failures = written_ > before ? 0 : failures + 1;  // a cut after progress is no failure
      if (failures > options.max_retries) {
        throw HubError(HubError::Kind::kNetwork,
                       str("downloading '", request_.filename, "' of ", request_.repo_id, " failed after ",
                           failures, " attempts: ", last_problem));
      }
      sleep_before_retry(options, failures - 1);
    }
    verify();
    file_.sync_and_close();
    report(true);
  }

 private:
  HttpResponse get_following_redirects(HttpClient& http) {
    std::string url = metadata_.url;
    bool answer_started = false;
    const BodySink sink = [&](const HttpResponse& answer, std::string_view chunk) {
      if (!answer_started) {
        answer_started = true;
        start_answer(answer);
      }
      receive(chunk);
      return true;
    };
    for (int hop = 0;; ++hop) {
      final_url_ = url;
      HttpResponse answer = http.send({.method = "GET",
                                       .url = url,
                                       .headers = headers_for(url, request_.options),
                                       .connect_timeout_s = *request_.options.download_timeout_s,
                                       .timeout_s = *request_.options.download_timeout_s,
                                       .range_start = written_,
                                       .ca_bundle = request_.options.ca_bundle.string()},
                                      sink);
      if (!is_redirect(answer)) return answer;
      if (hop == kMaxRedirects) {
        throw HubError(HubError::Kind::kInvalidAnswer,
                       str(url_for_messages(metadata_.url), ": more than ", kMaxRedirects, " redirects"));
      }
      url = resolve_url(url, answer.header("location"));
    }
  }

  // A server may answer a Range request with the whole file (200): start over.
  void start_answer(const HttpResponse& answer) {
    if (answer.status == 200 && written_ > 0) {
      restart();
    } else if (answer.status == 206) {
      const std::string range = answer.header("content-range");  // "bytes START-END/TOTAL"
      const size_t dash = range.find('-');
      const std::optional<uint64_t> start = range.starts_with("bytes ") && dash != std::string::npos
                                                ? parse_size(range.substr(6, dash - 6))
                                                : std::nullopt;
      if (start != written_) {
        throw HubError(HubError::Kind::kInvalidAnswer,
                       str(url_for_messages(final_url_), ": asked for bytes from ", written_,
                           " on, the server sent the range '", printable(range), "'"));
      }
    }
  }

  void restart() {
    file_.truncate();
    hash_.reset();
    written_ = 0;
  }

  void receive(std::string_view chunk) {
    if (metadata_.size && written_ + chunk.size() > *metadata_.size) {
      throw HubError(
          HubError::Kind::kIntegrity,
          str("'", request_.filename, "' of ", request_.repo_id, ": the download is larger than the ",
              *metadata_.size, " bytes the hub announced (", url_for_messages(final_url_), ")"));
    }
    file_.write_all(chunk);
    hash_.update(chunk.data(), chunk.size());
    written_ += chunk.size();
    report(false);
  }

  void verify() {
    const std::string what = str("'", request_.filename, "' of ", request_.repo_id);
    if (metadata_.size && written_ != *metadata_.size) {
      throw HubError(HubError::Kind::kIntegrity,
                     str(what, ": downloaded ", written_, " bytes, the hub announced a size of ",
                         *metadata_.size, " (", url_for_messages(final_url_), ")"));
    }
    if (is_sha256(metadata_.etag)) {
      const std::string digest = hash_.hex_digest();
      if (digest != metadata_.etag) {
        throw HubError(HubError::Kind::kIntegrity,
                       str(what, ": the download's sha256 is ", digest, ", the hub's is ", metadata_.etag,
                           " (", url_for_messages(final_url_), ")"));
      }
    }
  }

  void report(bool finished) const {
    if (!request_.options.progress) return;
    request_.options.progress({.file = request_.filename,
                               .downloaded = written_,
                               .total = metadata_.size.value_or(0),
                               .finished = finished});
  }

  OpenFile file_;
  const FileMetadata& metadata_;
  const FileRequest& request_;
  Sha256 hash_;
  uint64_t written_ = 0;
  std::string final_url_;
};

// Temporary files of this blob left by killed downloads: ours
// (<etag>.<16 hex>.incomplete) and huggingface_hub's (<etag>.incomplete). Only
// the holder of the blob's lock writes them, so under the lock every one is
// stale. The longest becomes `temporary`, to be resumed; the others go.
void adopt_stale_download(const fs::path& blob, const fs::path& temporary) {
  const std::string etag = blob.filename().string();
  std::error_code error;
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(blob.parent_path(), error)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name.size() == etag.size() + 1 + 16 + 11 && name.starts_with(etag + ".") &&
                      name.ends_with(".incomplete");
    if ((ours || name == etag + ".incomplete") && entry.is_regular_file(error)) stale.push_back(entry.path());
  }
  auto size = [](const fs::path& path) {
    std::error_code ignored;
    const uint64_t bytes = fs::file_size(path, ignored);
    return ignored ? 0 : bytes;
  };
  std::sort(stale.begin(), stale.end(),
            [&](const fs::path& a, const fs::path& b) { return size(a) > size(b); });
  for (size_t i = 0; i < stale.size(); ++i) {
    if (i == 0) {
      fs::rename(stale[i], temporary, error);
    } else {
      fs::remove(stale[i], error);
    }
  }
}

void download_blob(HttpClient& http, const RepoFolder& folder, const FileMetadata& metadata,
                   const FileRequest& request) {
  const fs::path blob = folder.blob(metadata.etag);
  if (fs::exists(blob)) return;
  FileLock lock(folder.lock_file(metadata.etag));
  if (fs::exists(blob)) return;  // another process downloaded it while we waited
  fs::create_directories(blob.parent_path());
  const fs::path temporary = temporary_sibling(blob, "incomplete");
  adopt_stale_download(blob, temporary);
  // A download that ran out of retries keeps its bytes for the next one to resume;
  // bytes that failed a check, or a file that cannot be written, are dropped.
  auto drop_temporary = [&] {
    std::error_code ignored;
    fs::remove(temporary, ignored);
  };
  try {
    BlobDownload(temporary, metadata, request).run(http);
    fs::rename(temporary, blob);
  } catch (const HubError& e) {
    if (e.kind() != HubError::Kind::kNetwork) drop_temporary();
    throw;
  } catch (...) {
    drop_temporary();
    throw;
  }
}

}  // namespace

std::string normalize_etag(std::string etag) {
  if (etag.starts_with("W/")) etag.erase(0, 2);
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') etag = etag.substr(1, etag.size() - 2);
  return etag;
}

std::string file_url(const HubOptions& options, const std::string& repo_id, const std::string& revision,
                     const std::string& filename) {
  return str(options.endpoint, "/", repo_id, "/resolve/", url_encode(revision, false), "/",
             url_encode(filename, true));
}

CachedFile fetch_file(const std::string& repo_id, const std::string& filename, const std::string& revision,
                      const HubOptions& options) {
  const std::string context = str("hf://", repo_id, "@", revision, "/", filename);
  check_repo_id(repo_id, context);
  check_repo_file_path(filename, context);
  check_revision(revision, context);
  const FileRequest request{repo_id, revision, filename, options};
  const RepoFolder folder(options.cache_dir, repo_id);
  if (*options.offline) {
    return from_cache(folder, request, HubError::Kind::kOfflineMiss, "offline mode is on (HF_HUB_OFFLINE)");
  }
  // A commit never changes: its cached files need no request.
  if (is_commit_hash(revision)) {
    if (auto cached = folder.cached_file(revision, filename)) return {*cached, revision};
  }

  HttpClient http;
  std::string url = file_url(options, repo_id, revision, filename);
  HttpResponse answer;
  try {
    answer = head_with_retries(http, url, options);
  } catch (const TransportError& e) {
    return from_cache(folder, request, HubError::Kind::kNetwork,
                      str("the hub could not be reached (", e.what(), ")"));
  }
  if (is_retryable(answer.status)) {
    return from_cache(
        folder, request, HubError::Kind::kNetwork,
        str(url_for_messages(url), " answered HTTP ", answer.status, " ", options.max_retries + 1, " times"));
  }
  if (answer.status >= 400) {
    const std::string commit = answer.header("x-repo-commit");
    if (answer.status == 404 && answer.header("x-error-code") == "EntryNotFound" && is_commit_hash(commit)) {
      folder.mark_missing(commit, filename);
      folder.write_ref(revision, commit);
    }
    throw_for_answer(answer, request, url);
  }

  const FileMetadata metadata = read_metadata(answer, url);
  folder.write_ref(revision, metadata.commit);
  if (auto cached = folder.cached_file(metadata.commit, filename)) return {*cached, metadata.commit};
  download_blob(http, folder, metadata, request);
  folder.link_pointer(metadata.commit, filename, metadata.etag);
  return {folder.pointer(metadata.commit, filename), metadata.commit};
}

std::filesystem::path download_file(const std::string& repo_id, const std::string& filename,
                                    const std::string& revision, const HubOptions& options) {
  return fetch_file(repo_id, filename, revision, options.resolved()).path;
}

}  // namespace transmuter::hub
