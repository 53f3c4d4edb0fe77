// One HTTP exchange at a time over libcurl, with redirects left to the caller:
// the hub client decides per hop whether to follow it (relative redirects for
// metadata, any for downloads) and whether the token may go along (only to the
// endpoint's own origin), as huggingface_hub does.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "transmuter/error.h"

namespace transmuter::hub {

/** No HTTP answer: refused or cut connection, DNS failure, TLS failure, timeout. */
class TransportError : public Error {
 public:
  TransportError(const std::string& message, bool timed_out) : Error(message), timed_out_(timed_out) {}
  bool timed_out() const { return timed_out_; }

 private:
  bool timed_out_;
};

struct HttpRequest {
  std::string method = "GET";  // "GET" or "HEAD"
  std::string url;
  std::vector<std::string> headers = {};  // "Name: value"
  double connect_timeout_s = 10;
  /** HEAD: the whole exchange. GET: the longest stretch without a byte. */
  double timeout_s = 10;
  /** GET from this byte on (`Range: bytes=N-`); 0 asks for the whole body. */
  uint64_t range_start = 0;
  /** PEM file of trusted certificate authorities; empty: the system's. */
  std::string ca_bundle = {};
};

struct HttpResponse {
  long status = 0;
  std::map<std::string, std::string> headers;  // names lowercased; the last of repeated ones
  /** Up to 64 KiB of the body of an answer that is not 200/206 (error texts). */
  std::string error_body;

  /** The header's value, or "" when absent. */
  std::string header(std::string_view lowercase_name) const;
};

/** Receives the body of a 200/206 answer in chunks, with the answer's status and
 * headers; false (or an exception, rethrown by send) aborts the transfer. */
using BodySink = std::function<bool(const HttpResponse& answer, std::string_view chunk)>;

/** One libcurl easy handle (its connections are reused between requests).
 * Not shareable across threads; TLS peers are always verified. */
class HttpClient {
 public:
  HttpClient();
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  /** Sends `request` without following redirects. Throws TransportError when no
   * complete answer arrives (a body cut short included). */
  HttpResponse send(const HttpRequest& request, const BodySink& sink = {});

 private:
  struct Handle;
  std::unique_ptr<Handle> handle_;
};

/** `location` (absolute or relative) resolved against `base`. */
std::string resolve_url(const std::string& base, const std::string& location);
/** "scheme://host:port" with the scheme's default port filled in. */
std::string url_origin(const std::string& url);
/** The URL without its query and fragment: presigned URLs carry signatures
 * that must not reach logs or error messages. */
std::string url_for_messages(const std::string& url);

}  // namespace transmuter::hub
