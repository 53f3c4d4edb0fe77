"""A fake Hugging Face Hub for tests: the `resolve` endpoint of the Hub and a CDN
for large (LFS) files, as the `huggingface_hub` 1.x client talks to them.

Two HTTP servers on 127.0.0.1, each on an ephemeral port:

- `FakeHub`: HEAD/GET `/{org}/{name}/resolve/{revision}/{path}`. A small file is
  answered 200 with `X-Repo-Commit`, a quoted `ETag` (the git blob sha1 of the
  content) and its bytes. An LFS file is answered 302 to a presigned-looking CDN
  URL with `X-Linked-Etag` (sha256 of the content) and `X-Linked-Size`, which is
  where the client reads its metadata (it does not follow a redirect to another
  host on HEAD). Errors carry `X-Error-Code` / `X-Error-Message` as the Hub's do.
- `CdnServer`: GET/HEAD of the LFS bytes, with `Range: bytes=N-` answered 206.
  Its URLs name the host `localhost` (the hub's say `127.0.0.1`): another host
  and another port, so another origin both for a client that compares hosts
  (huggingface_hub) and for one that compares host and port.

Faults (`Fault`) and hostile answers are set per file from the tests; every
request is logged per server (`RequestLog`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import secrets
import socket
import ssl
import threading
import time
import urllib.parse
from typing import Any

RANGE_PREFIX = "bytes="
CHUNK = 16 * 1024
# The Hub moves files stored with LFS (in practice: binaries, or above ~10 MB) to the CDN.
DEFAULT_LFS_THRESHOLD = 100 * 1024
_FAULT_LOCK = threading.Lock()


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob: the ETag the Hub sends for a file kept in git."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def new_commit_id() -> str:
    return secrets.token_hex(20)


@dataclasses.dataclass
class Fault:
    """What to do wrong when serving one file (matched by its path in the repo).

    Body faults act on the answer that carries the bytes: the CDN's GET for an
    LFS file, the hub's GET for a small one. Status faults act on every request
    for the path, on either server, HEAD and GET, unless `fail_methods` narrows it.
    """

    cut_after: int | None = None  # close the socket after this many body bytes...
    cut_times: int = 1  # ...for the first this many GETs
    ignore_range: bool = False  # answer 200 with the whole body even to a Range request
    fail_status: int | None = None  # answer this status (500, 503, ...)...
    fail_times: int = 1  # ...to the first this many requests (a large number: always)
    fail_methods: tuple[str, ...] = ("HEAD", "GET")
    fail_server: str | None = None  # "hub" or "cdn" to act on one server only
    fail_after: int = 0  # let this many matching requests through before failing
    throttle_bps: int | None = None  # bytes per second of the body
    stall_after: int | None = None  # send this many body bytes, then nothing for stall_seconds...
    stall_seconds: float = 3.0
    stall_times: int = 1  # ...for the first this many GETs (then the connection is closed)
    corrupt: bool = False  # same length, other bytes
    length_delta: int = 0  # serve this many bytes more (> 0) or fewer (< 0), Content-Length to match
    # counters, updated by the servers
    cuts_done: int = 0
    fails_done: int = 0
    stalls_done: int = 0


@dataclasses.dataclass
class Repo:
    repo_id: str
    refs: dict[str, str] = dataclasses.field(default_factory=dict)  # branch, tag or refs/pr/N -> commit
    commits: dict[str, dict[str, bytes]] = dataclasses.field(default_factory=dict)
    lfs_paths: set[str] = dataclasses.field(default_factory=set)
    lfs_threshold: int = DEFAULT_LFS_THRESHOLD
    gated: bool = False
    private: bool = False
    tokens: set[str] = dataclasses.field(default_factory=set)  # tokens granted access (gated or private)
    renamed_to: str | None = None
    # hostile answers: sent instead of the true values when set
    commit_header: str | None = None
    etag_header: str | None = None  # the bare etag value, quoted by the server

    def is_lfs(self, path: str, data: bytes) -> bool:
        return path in self.lfs_paths or len(data) >= self.lfs_threshold


@dataclasses.dataclass
class LoggedRequest:
    server: str  # "hub" or "cdn"
    method: str
    path: str  # as requested, query included
    headers: dict[str, str]  # lowercased names
    status: int = 0
    repo_path: str | None = None  # the file's path in its repo, where known

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


class RequestLog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[LoggedRequest] = []

    def add(self, entry: LoggedRequest) -> None:
        with self._lock:
            self._entries.append(entry)

    def entries(self, method: str | None = None, repo_path: str | None = None) -> list[LoggedRequest]:
        with self._lock:
            return [
                e
                for e in self._entries
                if (method is None or e.method == method) and (repo_path is None or e.repo_path == repo_path)
            ]

    def reset(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True


class _BaseHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeHub/1.0"
    owner: "_ServerBase"  # set on the subclass made per server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep test output clean
        pass

    def do_HEAD(self) -> None:  # noqa: N802
        self._handle("HEAD")

    def do_GET(self) -> None:  # noqa: N802
        self._handle("GET")

    def _handle(self, method: str) -> None:
        entry = LoggedRequest(
            server=self.owner.name,
            method=method,
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
        )
        # Logged before it is answered (its status filled in as it is): a client may finish
        # reading a body before this thread has returned from writing it.
        self.owner.log.add(entry)
        try:
            self.owner.serve(self, method, entry)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True

    # -- answers -----------------------------------------------------------------------------

    def send_status(self, entry: LoggedRequest, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        entry.status = status
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def send_error_code(
        self, entry: LoggedRequest, status: int, code: str | None, message: str, extra: dict[str, str] | None = None
    ) -> None:
        headers = dict(extra or {})
        if code:
            headers["X-Error-Code"] = code
        headers["X-Error-Message"] = message
        headers["Content-Type"] = "application/json"
        body = ('{"error": "%s"}' % message.replace('"', "'")).encode()
        self.send_status(entry, status, headers, body)

    def send_body(
        self, entry: LoggedRequest, method: str, data: bytes, headers: dict[str, str], fault: Fault | None
    ) -> None:
        """200 or 206 with `data` (or the part a Range asks for), with the body faults applied."""
        if fault is not None and method == "GET":
            if fault.corrupt and data:
                data = bytes(b ^ 0x5A for b in data)
            if fault.length_delta > 0:
                data = data + b"\0" * fault.length_delta
            elif fault.length_delta < 0:
                data = data[: max(0, len(data) + fault.length_delta)]
        total = len(data)
        status, start = 200, 0
        range_header = self.headers.get("Range")
        if range_header and not (fault is not None and fault.ignore_range):
            parsed = _parse_range(range_header, total)
            if parsed is None:
                self.send_status(entry, 416, {"Content-Range": f"bytes */{total}"})
                return
            start, end = parsed
            data = data[start : end + 1]
            status = 206
            headers = dict(headers, **{"Content-Range": f"bytes {start}-{end}/{total}"})
        entry.status = status
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if method == "HEAD":
            return
        limit = len(data)
        cut = stall = False
        if fault is not None and fault.cut_after is not None:
            with _FAULT_LOCK:
                cut = fault.cuts_done < fault.cut_times
                fault.cuts_done += cut
            if cut:
                limit = min(limit, fault.cut_after)
        if fault is not None and fault.stall_after is not None and not cut:
            with _FAULT_LOCK:
                stall = fault.stalls_done < fault.stall_times
                fault.stalls_done += stall
            if stall:  # a silent server: the client's timeout must end the attempt
                self.wfile.write(data[: fault.stall_after])
                self.wfile.flush()
                time.sleep(fault.stall_seconds)
                limit, cut = 0, True
                data = b""
        self._write_throttled(data[:limit], fault.throttle_bps if fault else None)
        if cut:
            self.wfile.flush()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _write_throttled(self, data: bytes, bps: int | None) -> None:
        if not bps:
            self.wfile.write(data)
            return
        piece = max(1, min(CHUNK, bps // 20))
        began = time.monotonic()
        sent = 0
        deadline = began + 2 * len(data) / bps + 30  # bounded whatever happens
        while sent < len(data) and time.monotonic() < deadline:
            self.wfile.write(data[sent : sent + piece])
            self.wfile.flush()
            sent += piece
            if sent >= len(data):
                break
            ahead = sent / bps - (time.monotonic() - began)
            if ahead > 0:
                time.sleep(ahead)


def _parse_range(header: str, total: int) -> tuple[int, int] | None:
    """`bytes=N-` or `bytes=N-M` -> (first, last) byte; None when not satisfiable."""
    if not header.startswith(RANGE_PREFIX) or "," in header:
        return None
    first, _, last = header[len(RANGE_PREFIX) :].strip().partition("-")
    try:
        if first == "":  # suffix form: the last M bytes
            n = int(last)
            return (max(0, total - n), total - 1) if n > 0 and total > 0 else None
        start = int(first)
        end = int(last) if last else total - 1
    except ValueError:
        return None
    if start >= total or end < start:
        return None
    return start, min(end, total - 1)


class _ServerBase:
    name = "?"
    host_in_urls = "127.0.0.1"

    def __init__(self) -> None:
        self.log = RequestLog()
        self.tls: ssl.SSLContext | None = None  # set before start() to serve https
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "server not started"
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host_in_urls}:{self.port}"

    def start(self) -> "_ServerBase":
        handler = type(f"{type(self).__name__}Handler", (_BaseHandler,), {"owner": self})
        self._server = _Server(("127.0.0.1", 0), handler)
        if self.tls is not None:
            self._server.socket = self.tls.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def serve(self, handler: _BaseHandler, method: str, entry: LoggedRequest) -> None:
        raise NotImplementedError


class CdnServer(_ServerBase):
    """Serves LFS blobs at `/lfs/<sha256>?<signature-like query>`, with Range support."""

    name = "cdn"
    host_in_urls = "localhost"

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._blobs: dict[str, bytes] = {}
        self.faults: dict[str, Fault] = {}  # shared with the hub: set by FakeHub

    def put(self, data: bytes) -> str:
        digest = sha256_hex(data)
        with self._lock:
            self._blobs[digest] = data
        return digest

    def signed_url(self, digest: str, repo_path: str) -> str:
        query = urllib.parse.urlencode(
            {
                "response-content-disposition": f'attachment; filename="{repo_path.rsplit("/", 1)[-1]}"',
                "path": repo_path,
                "X-Amz-Algorithm": "AWS4-HMAC-SHA256",
                "X-Amz-Expires": "3600",
                "expires": str(int(time.time()) + 3600),
                "X-Amz-Signature": secrets.token_hex(32),
            }
        )
        return f"{self.url}/lfs/{digest}?{query}"

    def serve(self, handler: _BaseHandler, method: str, entry: LoggedRequest) -> None:
        parts = urllib.parse.urlsplit(handler.path)
        query = urllib.parse.parse_qs(parts.query)
        entry.repo_path = (query.get("path") or [None])[0]
        digest = parts.path.removeprefix("/lfs/")
        if not parts.path.startswith("/lfs/") or "X-Amz-Signature" not in query:
            handler.send_status(entry, 403, {"Content-Type": "text/plain"}, b"AccessDenied")
            return
        with self._lock:
            data = self._blobs.get(digest)
        if data is None:
            handler.send_status(entry, 404, {"Content-Type": "text/plain"}, b"NoSuchKey")
            return
        fault = self.faults.get(entry.repo_path) if entry.repo_path else None
        if _status_fault(fault, method, self.name):
            handler.send_status(entry, fault.fail_status, {"Content-Type": "text/plain"}, b"Service Unavailable")
            return
        headers = {"ETag": f'"{digest}"', "Content-Type": "application/octet-stream"}
        handler.send_body(entry, method, data, headers, fault)


def _status_fault(fault: Fault | None, method: str, server: str) -> bool:
    if fault is None or fault.fail_status is None or method not in fault.fail_methods:
        return False
    if fault.fail_server is not None and fault.fail_server != server:
        return False
    with _FAULT_LOCK:
        if fault.fail_after > 0:
            fault.fail_after -= 1
            return False
        if fault.fails_done >= fault.fail_times:
            return False
        fault.fails_done += 1
    return True


class FakeHub(_ServerBase):
    """In-memory repos behind the Hub's `resolve` endpoint; LFS bytes go through `cdn`."""

    name = "hub"

    def __init__(self, cdn: CdnServer | None = None) -> None:
        super().__init__()
        self.cdn = cdn if cdn is not None else CdnServer()
        self._own_cdn = cdn is None
        self.repos: dict[str, Repo] = {}
        self.faults: dict[str, Fault] = self.cdn.faults
        self.weak_etags = False  # send `W/"..."` for small files
        self._lock = threading.Lock()

    def start(self) -> "FakeHub":
        if self._own_cdn:
            self.cdn.start()
        super().start()
        return self

    def stop(self) -> None:
        super().stop()
        if self._own_cdn:
            self.cdn.stop()

    # -- repos ---------------------------------------------------------------------------------

    def add_repo(
        self,
        repo_id: str,
        files: dict[str, bytes],
        *,
        branch: str = "main",
        lfs: tuple[str, ...] | set[str] = (),
        lfs_threshold: int = DEFAULT_LFS_THRESHOLD,
        gated: bool = False,
        private: bool = False,
        tokens: tuple[str, ...] | set[str] = (),
    ) -> str:
        """Creates a repo with one commit on `branch`; returns the commit id."""
        repo = Repo(
            repo_id=repo_id,
            lfs_paths=set(lfs),
            lfs_threshold=lfs_threshold,
            gated=gated,
            private=private,
            tokens=set(tokens),
        )
        with self._lock:
            self.repos[repo_id] = repo
        return self.commit(repo_id, files, branch=branch, keep=False)

    def commit(self, repo_id: str, files: dict[str, bytes], *, branch: str = "main", keep: bool = True) -> str:
        """A new commit on `branch` (its files, plus the branch's current ones when `keep`),
        and the branch moved to it: the ETag and X-Repo-Commit of `branch` change."""
        repo = self.repos[repo_id]
        with self._lock:
            base = dict(repo.commits.get(repo.refs.get(branch, ""), {})) if keep else {}
            base.update(files)
            commit = new_commit_id()
            repo.commits[commit] = base
            repo.refs[branch] = commit
        for path, data in base.items():
            if repo.is_lfs(path, data):
                self.cdn.put(data)
        return commit

    def set_ref(self, repo_id: str, name: str, commit: str) -> None:
        """A tag or another ref (`v1.0`, `refs/pr/1`) pointing at an existing commit."""
        repo = self.repos[repo_id]
        assert commit in repo.commits
        with self._lock:
            repo.refs[name] = commit

    def rename(self, old_id: str, new_id: str) -> None:
        """The repo moves to `new_id`; `old_id` answers a relative 307 to the new place."""
        with self._lock:
            repo = self.repos.pop(old_id)
            repo.repo_id = new_id
            self.repos[new_id] = repo
            self.repos[old_id] = Repo(repo_id=old_id, renamed_to=new_id)

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        repo = self.repos[repo_id]
        return repo.commits[repo.refs.get(revision, revision)]

    def fault(self, repo_path: str, **kwargs: Any) -> Fault:
        """Sets (replaces) the fault for a file path; returns it to read its counters."""
        fault = Fault(**kwargs)
        self.faults[repo_path] = fault
        return fault

    def clear_faults(self) -> None:
        self.faults.clear()

    def reset_logs(self) -> None:
        self.log.reset()
        self.cdn.log.reset()

    def resolve_url(self, repo_id: str, revision: str, path: str) -> str:
        return f"{self.url}/{repo_id}/resolve/{urllib.parse.quote(revision, safe='')}/{path}"

    # -- the endpoint -------------------------------------------------------------------------

    def serve(self, handler: _BaseHandler, method: str, entry: LoggedRequest) -> None:
        raw_path = urllib.parse.urlsplit(handler.path).path
        segments = raw_path.lstrip("/").split("/")
        if len(segments) < 5 or segments[2] != "resolve":
            handler.send_error_code(entry, 404, None, "Sorry, we can't find the page you are looking for.")
            return
        org, name, _, raw_revision = segments[:4]
        repo_id = f"{urllib.parse.unquote(org)}/{urllib.parse.unquote(name)}"
        revision = urllib.parse.unquote(raw_revision)
        path = urllib.parse.unquote("/".join(segments[4:]))
        entry.repo_path = path

        with self._lock:
            repo = self.repos.get(repo_id)
        if repo is not None and repo.renamed_to is not None:
            location = f"/{repo.renamed_to}/resolve/{raw_revision}/{'/'.join(segments[4:])}"
            handler.send_status(entry, 307, {"Location": location, "Content-Type": "text/plain"}, b"Redirecting")
            return

        token = _bearer(handler.headers.get("Authorization"))
        if repo is None or (repo.private and token not in repo.tokens):
            handler.send_error_code(entry, 401, "RepoNotFound", "Repository not found")
            return
        if repo.gated and token not in repo.tokens:
            if token is None:
                handler.send_error_code(
                    entry,
                    401,
                    "GatedRepo",
                    f"Access to model {repo_id} is restricted. You must have access to it and be authenticated to access it. Please log in.",
                )
            else:
                handler.send_error_code(
                    entry,
                    403,
                    "GatedRepo",
                    f"Access to model {repo_id} is restricted and you are not in the authorized list. "
                    f"Visit https://huggingface.co/{repo_id} to ask for access.",
                )
            return

        with self._lock:
            commit = repo.refs.get(revision)
            if commit is None and revision in repo.commits:
                commit = revision
            files = repo.commits.get(commit) if commit else None
        if files is None:
            handler.send_error_code(entry, 404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return
        commit_header = repo.commit_header if repo.commit_header is not None else commit

        fault = self.faults.get(path)
        if _status_fault(fault, method, self.name):
            handler.send_status(
                entry, fault.fail_status, {"Content-Type": "text/plain"}, b"Internal Error - We're working hard to fix this"
            )
            return

        data = files.get(path)
        if data is None:
            handler.send_error_code(
                entry, 404, "EntryNotFound", f"{path} does not exist on \"{revision}\"", {"X-Repo-Commit": commit_header}
            )
            return

        if repo.is_lfs(path, data):
            etag = repo.etag_header if repo.etag_header is not None else sha256_hex(data)
            headers = {
                "Location": self.cdn.signed_url(sha256_hex(data), path),
                "X-Repo-Commit": commit_header,
                "X-Linked-Etag": f'"{etag}"',
                "X-Linked-Size": str(len(data)),
                "ETag": f'"{git_blob_sha1(data)}"',  # of the pointer file in git, as the Hub's
                "Content-Type": "text/plain; charset=utf-8",
            }
            handler.send_status(entry, 302, headers, b"" if method == "HEAD" else b"Found. Redirecting")
            return

        etag = repo.etag_header if repo.etag_header is not None else git_blob_sha1(data)
        headers = {
            "X-Repo-Commit": commit_header,
            "ETag": f'W/"{etag}"' if self.weak_etags else f'"{etag}"',
            "Content-Type": "application/octet-stream",
        }
        handler.send_body(entry, method, data, headers, fault)


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None
