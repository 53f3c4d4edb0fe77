// The Hugging Face Hub: `hf://org/repo[@revision][/path]` sources, downloaded
// into the cache layout of the `huggingface_hub` Python package, so that files
// either one downloaded are found by the other. docs/hub.md has the details.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "transmuter/error.h"

namespace transmuter::hub {

/** A hub request failed; kind() says why (the message says where: the URL tried). */
class HubError : public Error {
 public:
  enum class Kind {
    kRepositoryNotFound,  // no such repo, or private and not visible with this token
    kRevisionNotFound,
    kEntryNotFound,  // the revision exists, the file does not
    kGatedRepo,      // the repo needs a token of a user who accepted its terms
    kAccessDenied,   // any other 401/403
    kOfflineMiss,    // offline mode, and the cache does not hold the file
    kNetwork,        // no answer, timeouts, 5xx after every retry
    kIntegrity,      // size or sha256 of the download differ from the hub's
    kInvalidAnswer,  // the server sent an unsafe or malformed name, etag or commit
  };
  HubError(Kind kind, const std::string& message) : Error(message), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

/** Bytes of one file downloaded so far; `total` is 0 when unknown. */
struct DownloadProgress {
  std::string file;
  uint64_t downloaded = 0;
  uint64_t total = 0;
  bool finished = false;
};
using ProgressCallback = std::function<void(const DownloadProgress&)>;

/** Where and how to reach the hub. Unset fields come from the environment,
 * as huggingface_hub reads it (resolved() fills them). */
struct HubOptions {
  /** $HF_ENDPOINT, else https://huggingface.co. */
  std::string endpoint;
  /** $HF_TOKEN, $HUGGING_FACE_HUB_TOKEN, then the file $HF_TOKEN_PATH or $HF_HOME/token.
   * An empty string sends no token. */
  std::optional<std::string> token;
  /** $HF_HUB_CACHE, else $HF_HOME/hub; $HF_HOME defaults to $XDG_CACHE_HOME/huggingface
   * or ~/.cache/huggingface. */
  std::filesystem::path cache_dir;
  /** $HF_HUB_OFFLINE or $TRANSFORMERS_OFFLINE ("1", "true", "yes", "on"): the cache only. */
  std::optional<bool> offline;
  /** Seconds without a byte before a download attempt fails ($HF_HUB_DOWNLOAD_TIMEOUT, 10). */
  std::optional<double> download_timeout_s;
  /** Seconds for the metadata (HEAD) request ($HF_HUB_ETAG_TIMEOUT, 10). */
  std::optional<double> etag_timeout_s;
  /** A PEM file of the certificate authorities to trust instead of the system's:
   * $CURL_CA_BUNDLE, $REQUESTS_CA_BUNDLE or $SSL_CERT_FILE (a proxy that re-signs
   * TLS). Peers are verified either way. */
  std::filesystem::path ca_bundle;
  /** Attempts after the first on 429/5xx answers, timeouts and cut connections. */
  int max_retries = 5;
  /** First wait between attempts, doubled each time up to 8 s
   * ($TRANSMUTER_HUB_RETRY_BACKOFF_S, 1). */
  std::optional<double> retry_backoff_s;
  /** Called as bytes arrive (from the downloading thread). */
  ProgressCallback progress;

  /** A copy with every unset field taken from the environment or its default. */
  HubOptions resolved() const;
};

/** "hf://org/repo[@revision][/path/in/repo]" split up; revision "main" when absent. */
struct HubSource {
  std::string repo_id;
  std::string revision = "main";
  std::string path;  // empty: pick the ONNX model by dtype
};

/** Parses an `hf://` source; throws std::invalid_argument naming what is wrong
 * (not hf://, no repo name, an empty revision, `..` or `.` in the path). */
HubSource parse_hub_source(std::string_view source);

/** True for strings that start with "hf://". */
bool is_hub_source(std::string_view source);

/** The files transformers.js tries for a model and dtype, in order:
 * fp32 "", fp16 "_fp16", q8 "_quantized", int8 "_int8", uint8 "_uint8", q4 "_q4",
 * q4f16 "_q4f16", bnb4 "_bnb4" appended to `base`, first in onnx/ then at the root.
 * Throws std::invalid_argument for another dtype. */
std::vector<std::string> onnx_file_candidates(std::string_view dtype, std::string_view base = "model");

/** One file of a repo at a revision, from the cache or downloaded into it, as
 * `huggingface_hub.hf_hub_download` does. Returns its path under
 * `snapshots/<commit>/`. Throws HubError. */
std::filesystem::path download_file(const std::string& repo_id, const std::string& filename,
                                    const std::string& revision = "main", const HubOptions& options = {});

/** What download_model fetched: the ONNX file, then the external-data files it names,
 * all as paths under `snapshots/<commit>/` (symlinks into `blobs_dir`). */
struct ModelFiles {
  std::filesystem::path model;
  std::vector<std::filesystem::path> external_data;
  std::string repo_path;            // the model's path inside the repo ("onnx/model_quantized.onnx")
  std::string commit;               // the revision the files were taken at
  std::filesystem::path blobs_dir;  // where the snapshot's symlinks lead
};

/** The ONNX model of an `hf://` source (its explicit path, or the dtype's file as
 * onnx_file_candidates(dtype, base) lists them: "model", or an encoder-decoder's "encoder_model",
 * "decoder_model_merged", ...) and every external-data file it references. */
ModelFiles download_model(std::string_view source, std::string_view dtype = "fp32",
                          const HubOptions& options = {}, std::string_view base = "model");

/** One snapshot of a cached repo. */
struct CachedRevision {
  std::string commit;
  std::vector<std::string> refs;  // branch or tag names pointing at it
  std::filesystem::path snapshot;
  uint64_t size_on_disk = 0;  // its blobs, each counted once
  size_t file_count = 0;
};

/** One repo folder of the cache (models--org--name). */
struct CachedRepo {
  std::string repo_id;
  std::string repo_type;  // "model", "dataset", "space"
  std::filesystem::path path;
  uint64_t size_on_disk = 0;  // all of blobs/
  size_t file_count = 0;      // distinct blobs its snapshots use (huggingface_hub's nb_files)
  std::vector<CachedRevision> revisions;
};

/** The repos of the cache directory of `options`, sorted by repo id. */
std::vector<CachedRepo> scan_cache(const HubOptions& options = {});

/** Removes a model repo from the cache (empty `revision`) or one snapshot of it
 * (a commit or a ref name: the snapshot, the refs naming it and the blobs no other
 * snapshot uses). Returns the bytes freed; throws HubError when nothing matches. */
uint64_t remove_from_cache(const std::string& repo_id, const std::string& revision = "",
                           const HubOptions& options = {});

}  // namespace transmuter::hub
