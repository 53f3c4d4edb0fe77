// `transmuter download` and `transmuter cache ls|rm`: the hub cache from the
// command line, like `hf download` and `hf cache`.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>

#include "cli.h"
#include "transmuter/transmuter.h"

namespace transmuter::cli {

#if TRANSMUTER_WITH_HUB

namespace {

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int unit = 0;
  while (bytes >= 1000 && unit < 4) bytes /= 1000, ++unit;
  char text[32];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.1f %s", bytes, units[unit]);
  return text;
}

// One line on stderr, redrawn at most ten times a second: file, bytes, rate, ETA.
class ProgressBar {
 public:
  void operator()(const hub::DownloadProgress& progress) {
    const auto now = std::chrono::steady_clock::now();
    if (progress.file != file_) {
      file_ = progress.file;
      started_ = now;
      drawn_ = {};
    }
    if (!progress.finished && now - drawn_ < std::chrono::milliseconds(100)) return;
    drawn_ = now;
    const double seconds = std::chrono::duration<double>(now - started_).count();
    const double rate = seconds > 0 ? progress.downloaded / seconds : 0;
    std::string line = str(file_, "  ", human_bytes(progress.downloaded));
    if (progress.total > 0) {
      line += str(" / ", human_bytes(progress.total), "  ", 100 * progress.downloaded / progress.total, "%");
    }
    line += str("  ", human_bytes(rate), "/s");
    if (progress.total > progress.downloaded && rate > 0) {
      line += str("  ETA ", static_cast<long>((progress.total - progress.downloaded) / rate), " s");
    }
    std::cerr << "\r\033[2K" << line << (progress.finished ? "\n" : "") << std::flush;
  }

 private:
  std::string file_;
  std::chrono::steady_clock::time_point started_, drawn_;
};

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& part : parts) out += (out.empty() ? "" : ",") + part;
  return out.empty() ? "-" : out;
}

int cache_ls(const Args& args) {
  const bool by_revision = args.has("revisions");
  uint64_t total = 0;
  const std::vector<hub::CachedRepo> repos = hub::scan_cache();
  for (const hub::CachedRepo& repo : repos) {
    total += repo.size_on_disk;
    if (!by_revision) {
      std::vector<std::string> refs;
      for (const hub::CachedRevision& revision : repo.revisions) {
        refs.insert(refs.end(), revision.refs.begin(), revision.refs.end());
      }
      std::cout << repo.repo_id << "  " << repo.repo_type << "  " << human_bytes(repo.size_on_disk) << "  "
                << repo.file_count << " files  refs: " << join(refs) << "  " << repo.path.string() << "\n";
      continue;
    }
    for (const hub::CachedRevision& revision : repo.revisions) {
      std::cout << repo.repo_id << "  " << revision.commit << "  " << human_bytes(revision.size_on_disk)
                << "  " << revision.file_count << " files  refs: " << join(revision.refs) << "  "
                << revision.snapshot.string() << "\n";
    }
  }
  std::cerr << repos.size() << " repo(s), " << human_bytes(total) << " in "
            << hub::HubOptions{}.resolved().cache_dir.string() << "\n";
  return 0;
}

int cache_rm(const Args& args) {
  if (args.positional.size() != 2) throw Error("usage: transmuter cache rm org/repo[@revision]");
  std::string target = args.positional[1];
  if (target.starts_with("hf://")) target = target.substr(5);
  const size_t at = target.find('@');
  const std::string repo_id = target.substr(0, at);
  const std::string revision = at == std::string::npos ? "" : target.substr(at + 1);
  const uint64_t freed = hub::remove_from_cache(repo_id, revision);
  std::cout << "removed " << target << ": " << human_bytes(freed) << " freed\n";
  return 0;
}

}  // namespace

std::shared_ptr<const hub::HubOptions> hub_options(const Args& args) {
  auto options = std::make_shared<hub::HubOptions>();
  if (!args.has("quiet") && ::isatty(STDERR_FILENO)) options->progress = ProgressBar();
  return options;
}

int download_main(const Args& args) {
  if (args.positional.size() != 1 || !hub::is_hub_source(args.positional[0])) {
    throw Error("usage: transmuter download hf://org/repo[@revision][/path] [--dtype D] [--quiet]");
  }
  const hub::ModelFiles files =
      hub::download_model(args.positional[0], args.get("dtype", "fp32"), *hub_options(args));
  std::cout << files.model.string() << "\n";
  for (const auto& data : files.external_data) std::cout << data.string() << "\n";
  return 0;
}

int cache_main(const Args& args) {
  const std::string action = args.positional.empty() ? "" : args.positional[0];
  if (action == "ls") return cache_ls(args);
  if (action == "rm") return cache_rm(args);
  throw Error("usage: transmuter cache ls [--revisions] | transmuter cache rm org/repo[@revision]");
}

#else  // a build without the hub client

std::shared_ptr<const hub::HubOptions> hub_options(const Args&) { return nullptr; }

int download_main(const Args&) {
  throw Error("this build has no Hugging Face Hub client (configured with -DTRANSMUTER_HUB=OFF)");
}

int cache_main(const Args& args) { return download_main(args); }

#endif

}  // namespace transmuter::cli
