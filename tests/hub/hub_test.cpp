// The hub client's pieces that need no server: sources, file choice, settings
// from the environment, cache names and their checks, hashing, URLs, and the
// cache listing and removal. tests/hub/test_hub.py runs it against a server.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "hub/file_download.h"
#include "hub/http.h"
#include "hub/repo_paths.h"
#include "hub/sha256.h"
#include "support/expect_error.h"
#include "transmuter/hub.h"

namespace transmuter::hub {
namespace {

namespace fs = std::filesystem;
using testing::error_of;

// Sets environment variables for one test and puts the old values back.
class ScopedEnvironment {
 public:
  ScopedEnvironment(std::initializer_list<std::pair<const char*, const char*>> values) {
    for (const char* name : kVariables) {
      const char* old = std::getenv(name);
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      ::unsetenv(name);
    }
    for (auto [name, value] : values) ::setenv(name, value, 1);
  }
  ~ScopedEnvironment() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }

 private:
  static constexpr const char* kVariables[] = {"HF_ENDPOINT",
                                               "HF_TOKEN",
                                               "HUGGING_FACE_HUB_TOKEN",
                                               "HF_TOKEN_PATH",
                                               "HF_HOME",
                                               "HF_HUB_CACHE",
                                               "HUGGINGFACE_HUB_CACHE",
                                               "XDG_CACHE_HOME",
                                               "HOME",
                                               "HF_HUB_OFFLINE",
                                               "TRANSFORMERS_OFFLINE",
                                               "HF_HUB_DOWNLOAD_TIMEOUT",
                                               "HF_HUB_ETAG_TIMEOUT",
                                               "TRANSMUTER_HUB_RETRY_BACKOFF_S"};
  std::map<std::string, std::optional<std::string>> saved_;
};

fs::path fresh_folder(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(HubSource, RepoRevisionAndPath) {
  const HubSource plain = parse_hub_source("hf://org/repo");
  EXPECT_EQ(plain.repo_id, "org/repo");
  EXPECT_EQ(plain.revision, "main");
  EXPECT_EQ(plain.path, "");
  const HubSource full = parse_hub_source("hf://Xenova/all-MiniLM-L6-v2@v1.0/onnx/model_quantized.onnx");
  EXPECT_EQ(full.repo_id, "Xenova/all-MiniLM-L6-v2");
  EXPECT_EQ(full.revision, "v1.0");
  EXPECT_EQ(full.path, "onnx/model_quantized.onnx");
  EXPECT_EQ(parse_hub_source("hf://org/repo@refs%2Fpr%2F1/model.onnx").revision, "refs/pr/1");
}

TEST(HubSource, BadSourcesSayWhatIsWrong) {
  auto message = [](const char* source) {
    return error_of<std::invalid_argument>([&] { parse_hub_source(source); });
  };
  EXPECT_NE(message("org/repo").find("is not an hf:// source"), std::string::npos);
  EXPECT_NE(message("hf://repo").find("expected hf://org/repo"), std::string::npos);
  EXPECT_NE(message("hf://org/repo@/model.onnx").find("empty revision"), std::string::npos);
  EXPECT_NE(message("hf://org/repo/../x.onnx").find("'..' component"), std::string::npos);
  EXPECT_NE(message("hf://org/repo/onnx//model.onnx").find("empty component"), std::string::npos);
  EXPECT_NE(message("hf://org/re po").find("may hold only letters"), std::string::npos);
  EXPECT_NE(message("hf://org/repo@..%2F..%2Fx").find("'..' component"), std::string::npos);
}

TEST(OnnxFileCandidates, AsTransformersJsNamesThem) {
  EXPECT_EQ(onnx_file_candidates("fp32"), (std::vector<std::string>{"onnx/model.onnx", "model.onnx"}));
  EXPECT_EQ(onnx_file_candidates("q8"),
            (std::vector<std::string>{"onnx/model_quantized.onnx", "model_quantized.onnx"}));
  EXPECT_EQ(onnx_file_candidates("q4f16", "decoder_model_merged")[0], "onnx/decoder_model_merged_q4f16.onnx");
  for (const char* dtype : {"fp16", "int8", "uint8", "q4", "bnb4"}) {
    EXPECT_EQ(onnx_file_candidates(dtype)[0], str("onnx/model_", dtype, ".onnx"));
  }
  EXPECT_NE(
      error_of<std::invalid_argument>([] { onnx_file_candidates("fp64"); }).find("unknown dtype 'fp64'"),
      std::string::npos);
}

TEST(HubOptions, DefaultsFollowHuggingfaceHub) {
  ScopedEnvironment env({{"HOME", "/home/u"}});
  const HubOptions options = HubOptions{}.resolved();
  EXPECT_EQ(options.endpoint, "https://huggingface.co");
  EXPECT_EQ(options.cache_dir, fs::path("/home/u/.cache/huggingface/hub"));
  EXPECT_EQ(*options.token, "");
  EXPECT_FALSE(*options.offline);
  EXPECT_EQ(*options.download_timeout_s, 10);
  EXPECT_EQ(*options.etag_timeout_s, 10);
}

TEST(HubOptions, EnvironmentVariablesInHuggingfaceHubsOrder) {
  const fs::path home = fresh_folder("transmuter_hf_home");
  std::ofstream(home / "token") << "  hf_from_file\n";
  {
    ScopedEnvironment env({{"HF_HOME", home.c_str()}, {"HF_ENDPOINT", "http://127.0.0.1:9/"}});
    const HubOptions options = HubOptions{}.resolved();
    EXPECT_EQ(*options.token, "hf_from_file");
    EXPECT_EQ(options.cache_dir, home / "hub");
    EXPECT_EQ(options.endpoint, "http://127.0.0.1:9");  // trailing slash dropped
  }
  {
    ScopedEnvironment env({{"HF_HOME", home.c_str()},
                           {"HF_TOKEN", "hf_var"},
                           {"HUGGING_FACE_HUB_TOKEN", "hf_old"},
                           {"HF_HUB_CACHE", "/c"},
                           {"XDG_CACHE_HOME", "/x"},
                           {"TRANSFORMERS_OFFLINE", "yes"},
                           {"HF_HUB_DOWNLOAD_TIMEOUT", "2.5"}});
    const HubOptions options = HubOptions{}.resolved();
    EXPECT_EQ(*options.token, "hf_var");
    EXPECT_EQ(options.cache_dir, fs::path("/c"));
    EXPECT_TRUE(*options.offline);
    EXPECT_EQ(*options.download_timeout_s, 2.5);
  }
  {
    ScopedEnvironment env({{"XDG_CACHE_HOME", "/x"}, {"HF_HUB_OFFLINE", "0"}});
    const HubOptions options = HubOptions{}.resolved();
    EXPECT_EQ(options.cache_dir, fs::path("/x/huggingface/hub"));
    EXPECT_FALSE(*options.offline);
  }
  {
    ScopedEnvironment env({{"HF_HUB_ETAG_TIMEOUT", "soon"}});
    EXPECT_NE(error_of<std::invalid_argument>([] { HubOptions{}.resolved(); }).find("HF_HUB_ETAG_TIMEOUT"),
              std::string::npos);
  }
  // Fields set by the caller win over the environment.
  ScopedEnvironment env({{"HF_TOKEN", "hf_var"}});
  HubOptions explicit_options;
  explicit_options.token = "";
  explicit_options.offline = true;
  EXPECT_EQ(*explicit_options.resolved().token, "");
  EXPECT_TRUE(*explicit_options.resolved().offline);
  fs::remove_all(home);
}

TEST(CacheNames, FoldersAndUrlsAsHuggingfaceHubWritesThem) {
  EXPECT_EQ(repo_folder_name("Xenova/bert-base-uncased"), "models--Xenova--bert-base-uncased");
  const RepoFolder folder("/cache", "org/repo");
  EXPECT_EQ(folder.blob("abc"), fs::path("/cache/models--org--repo/blobs/abc"));
  EXPECT_EQ(folder.pointer("c0ffee", "onnx/model.onnx"),
            fs::path("/cache/models--org--repo/snapshots/c0ffee/onnx/model.onnx"));
  EXPECT_EQ(folder.lock_file("abc"), fs::path("/cache/.locks/models--org--repo/abc.lock"));
  HubOptions options;
  options.endpoint = "http://127.0.0.1:8080";
  EXPECT_EQ(file_url(options, "org/repo", "refs/pr/1", "onnx/model q.onnx"),
            "http://127.0.0.1:8080/org/repo/resolve/refs%2Fpr%2F1/onnx/model%20q.onnx");
  EXPECT_EQ(normalize_etag("W/\"abc\""), "abc");
  EXPECT_EQ(normalize_etag("\"abc\""), "abc");
  EXPECT_EQ(normalize_etag("abc"), "abc");
  EXPECT_TRUE(is_commit_hash(std::string(40, 'a')));
  EXPECT_FALSE(is_commit_hash(std::string(40, 'A')));
  EXPECT_FALSE(is_commit_hash("main"));
}

TEST(CacheNames, ServedNamesThatCouldLeaveTheCacheAreRefused) {
  for (const char* name : {"../../escape", "a/b", "..", ".hidden", "", "x\ny"}) {
    const std::string message =
        error_of<HubError>([&] { check_served_name("commit", name, "http://hub/x"); });
    EXPECT_NE(message.find("not a plain file name"), std::string::npos) << name;
  }
  check_served_name("etag", std::string(64, 'f'), "http://hub/x");  // a sha256 passes
}

TEST(Sha256, KnownDigests) {
  auto digest = [](const std::string& text) {
    Sha256 hash;
    hash.update(text.data(), text.size());
    return hash.hex_digest();
  };
  // FIPS 180-4 examples.
  EXPECT_EQ(digest(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(digest("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(digest("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // A million 'a's fed in uneven pieces crosses every buffering path.
  Sha256 hash;
  const std::string piece(997, 'a');
  size_t fed = 0;
  for (; fed + piece.size() <= 1000000; fed += piece.size()) hash.update(piece.data(), piece.size());
  hash.update(piece.data(), 1000000 - fed);
  EXPECT_EQ(hash.hex_digest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Urls, RedirectTargetsOriginsAndMessages) {
  EXPECT_EQ(resolve_url("http://127.0.0.1:8/a/b/c", "/new/place"), "http://127.0.0.1:8/new/place");
  EXPECT_EQ(resolve_url("http://127.0.0.1:8/a/b/c", "d"), "http://127.0.0.1:8/a/b/d");
  EXPECT_EQ(resolve_url("http://127.0.0.1:8/a", "https://cdn.example/x?sig=1"),
            "https://cdn.example/x?sig=1");
  EXPECT_EQ(url_origin("https://HuggingFace.co/org/repo"), "https://huggingface.co:443");
  EXPECT_EQ(url_origin("http://127.0.0.1:8/x"), "http://127.0.0.1:8");
  EXPECT_NE(url_origin("http://127.0.0.1:8/x"), url_origin("http://127.0.0.1:9/x"));
  EXPECT_EQ(url_for_messages("https://cdn/x?X-Amz-Signature=secret"), "https://cdn/x?…");
}

TEST(Http, AnUnreachableServerIsATransportErrorNamingTheUrl) {
  // Port 9 (discard) on the loopback address: nothing listens in the test sandbox.
  HttpClient http;
  const std::string message = error_of<TransportError>([&] {
    http.send(
        {.method = "HEAD", .url = "http://127.0.0.1:9/org/repo", .connect_timeout_s = 2, .timeout_s = 2});
  });
  EXPECT_NE(message.find("HEAD http://127.0.0.1:9/org/repo"), std::string::npos) << message;
  EXPECT_NE(error_of<Error>([&] { http.send({.url = "file:///etc/passwd"}); }).find("file:///etc/passwd"),
            std::string::npos);
}

TEST(Offline, TheCacheAnswersAndMissesSayWhatIsMissing) {
  const fs::path cache = fresh_folder("transmuter_offline_cache");
  const std::string commit(40, 'c');
  const RepoFolder folder(cache, "org/repo");
  fs::create_directories(folder.root() / "blobs");
  std::ofstream(folder.blob("e1")) << "{}";
  folder.link_pointer(commit, "config.json", "e1");
  folder.write_ref("main", commit);
  folder.mark_missing(commit, "tokenizer.json");
  HubOptions options;
  options.cache_dir = cache;
  options.offline = true;
  EXPECT_EQ(fs::read_symlink(folder.pointer(commit, "config.json")), fs::path("../../blobs/e1"));
  EXPECT_EQ(download_file("org/repo", "config.json", "main", options), folder.pointer(commit, "config.json"));
  EXPECT_EQ(download_file("org/repo", "config.json", commit, options), folder.pointer(commit, "config.json"));
  const std::string missing =
      error_of<HubError>([&] { download_file("org/repo", "model.onnx", "main", options); });
  EXPECT_NE(missing.find("offline mode is on"), std::string::npos) << missing;
  EXPECT_NE(missing.find("'model.onnx' of org/repo"), std::string::npos) << missing;
  const std::string recorded =
      error_of<HubError>([&] { download_file("org/repo", "tokenizer.json", "main", options); });
  EXPECT_NE(recorded.find("records it as missing"), std::string::npos) << recorded;
  const std::string by_dtype = error_of<HubError>([&] { download_model("hf://org/repo", "q4", options); });
  EXPECT_NE(by_dtype.find("onnx/model_q4.onnx"), std::string::npos) << by_dtype;
  EXPECT_NE(by_dtype.find("model_q4.onnx' of org/repo"), std::string::npos) << by_dtype;
  fs::remove_all(cache);
}

TEST(CacheScan, ListsReposRevisionsAndRemovesWhatNoOtherSnapshotUses) {
  const fs::path cache = fresh_folder("transmuter_scan_cache");
  const std::string old_commit(40, 'a'), new_commit(40, 'b');
  const RepoFolder folder(cache, "org/repo");
  fs::create_directories(folder.root() / "blobs");
  std::ofstream(folder.blob("shared")) << "12345";
  std::ofstream(folder.blob("old")) << "123";
  std::ofstream(folder.blob("new")) << "1234567";
  folder.link_pointer(old_commit, "config.json", "shared");
  folder.link_pointer(old_commit, "onnx/model.onnx", "old");
  folder.link_pointer(new_commit, "config.json", "shared");
  folder.link_pointer(new_commit, "onnx/model.onnx", "new");
  folder.write_ref("main", new_commit);
  folder.write_ref("v1", old_commit);
  fs::create_directories(cache / "not-a-repo");
  HubOptions options;
  options.cache_dir = cache;

  const std::vector<CachedRepo> repos = scan_cache(options);
  ASSERT_EQ(repos.size(), 1u);
  EXPECT_EQ(repos[0].repo_id, "org/repo");
  EXPECT_EQ(repos[0].repo_type, "model");
  EXPECT_EQ(repos[0].size_on_disk, 15u);
  EXPECT_EQ(repos[0].file_count, 3u);  // "shared" once
  ASSERT_EQ(repos[0].revisions.size(), 2u);
  EXPECT_EQ(repos[0].revisions[0].commit, old_commit);
  EXPECT_EQ(repos[0].revisions[0].refs, std::vector<std::string>{"v1"});
  EXPECT_EQ(repos[0].revisions[0].file_count, 2u);
  EXPECT_EQ(repos[0].revisions[0].size_on_disk, 8u);
  EXPECT_EQ(repos[0].revisions[1].refs, std::vector<std::string>{"main"});

  EXPECT_EQ(remove_from_cache("org/repo", "v1", options), 3u);  // "old" only; "shared" stays
  EXPECT_FALSE(fs::exists(folder.blob("old")));
  EXPECT_TRUE(fs::exists(folder.blob("shared")));
  EXPECT_FALSE(fs::exists(folder.snapshot_dir(old_commit)));
  EXPECT_FALSE(fs::exists(folder.root() / "refs" / "v1"));
  EXPECT_NE(
      error_of<HubError>([&] { remove_from_cache("org/repo", "v1", options); }).find("not in the cache"),
      std::string::npos);
  EXPECT_EQ(remove_from_cache("org/repo", "", options), 12u);
  EXPECT_FALSE(fs::exists(folder.root()));
  EXPECT_NE(error_of<HubError>([&] {
              remove_from_cache("org/repo", "", options);
            }).find("org/repo is not in the cache"),
            std::string::npos);
  fs::remove_all(cache);
}

TEST(CacheLinks, APlantedSymlinkOnTheWayIsRefused) {
  const fs::path cache = fresh_folder("transmuter_planted_cache");
  const fs::path outside = fresh_folder("transmuter_planted_outside");
  const std::string commit(40, 'd');
  const RepoFolder folder(cache, "org/repo");
  fs::create_directories(folder.snapshot_dir(commit));
  fs::create_directories(folder.root() / "blobs");
  std::ofstream(folder.blob("e")) << "x";
  fs::create_directory_symlink(outside, folder.snapshot_dir(commit) / "onnx");
  const std::string message =
      error_of<HubError>([&] { folder.link_pointer(commit, "onnx/model.onnx", "e"); });
  EXPECT_NE(message.find("resolves outside its snapshot"), std::string::npos) << message;
  EXPECT_TRUE(fs::is_empty(outside));
  fs::remove_all(cache);
  fs::remove_all(outside);
}

}  // namespace
}  // namespace transmuter::hub
