"""The hub client through the `transmuter` CLI (download, cache ls/rm, hf://
sources for info and run), against the fake Hub of fake_hub.py; and the fake
Hub itself against the real `huggingface_hub` client, which shows that the fake
speaks the Hub's protocol and that both share one cache layout.

Run: .venv/bin/python -m pytest -q tests/hub (TRANSMUTER_BIN names the binary)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from conftest import TOKEN, Transmuter
from fake_hub import FakeHub, git_blob_sha1, sha256_hex

CONFIG = b'{"model_type": "tiny", "hidden_size": 4}\n'


def lfs_bytes(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def tree(root: Path, skip: Path | None = None) -> set[str]:
    """Every path under `root` (links not followed), except the subtree `skip`."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if skip is not None and (here == skip or skip in here.parents):
            continue
        for name in dirnames + filenames:
            out.add(str((here / name).relative_to(root)))
    return out


def assert_cached(t: Transmuter, repo_id: str, commit: str, path: str, data: bytes, etag: str) -> None:
    """huggingface_hub's layout: a relative link snapshots/<commit>/<path> -> ../../blobs/<etag>."""
    link = t.snapshot(repo_id, commit, path)
    assert link.is_symlink(), f"{link} is not a symlink"
    target = os.readlink(link)
    assert not os.path.isabs(target), f"{link} -> {target} is absolute"
    assert target == "../" * (2 + path.count("/")) + f"blobs/{etag}"
    assert link.read_bytes() == data
    assert t.blob(repo_id, etag).read_bytes() == data


def cdn_gets(hub: FakeHub, repo_path: str) -> list:
    return hub.cdn.log.entries("GET", repo_path)


def hub_requests(hub: FakeHub, method: str | None = None, repo_path: str | None = None) -> list:
    return hub.log.entries(method, repo_path)


def assert_no_token_printed(result: subprocess.CompletedProcess) -> None:
    assert TOKEN not in result.stdout and TOKEN not in result.stderr


def range_start(entry) -> int | None:
    value = entry.header("range")
    if value is None:
        return None
    assert value.startswith("bytes=") and value.endswith("-"), value
    return int(value[len("bytes=") : -1])


# ------------------------------------------------------------------------------------------------
# The fake against the real client


def hf_download(hub: FakeHub, repo_id: str, filename: str, cache: Path, **kwargs):
    import huggingface_hub

    kwargs.setdefault("token", False)
    return huggingface_hub.hf_hub_download(repo_id, filename, cache_dir=str(cache), endpoint=hub.url, **kwargs)


def test_fake_hub_matches_huggingface_hub_client(hub, tmp_path):
    from huggingface_hub import errors

    big = lfs_bytes(300_000)
    commit = hub.add_repo("org/repo", {"config.json": CONFIG, "onnx/model.onnx": big})
    cache = tmp_path / "cache"

    path = Path(hf_download(hub, "org/repo", "config.json", cache))
    assert path == cache / "models--org--repo" / "snapshots" / commit / "config.json"
    assert path.read_bytes() == CONFIG
    assert os.readlink(path) == f"../../blobs/{git_blob_sha1(CONFIG)}"

    path = Path(hf_download(hub, "org/repo", "onnx/model.onnx", cache, token=TOKEN))
    assert path.read_bytes() == big
    assert os.readlink(path) == f"../../../blobs/{sha256_hex(big)}"
    assert (cache / "models--org--repo" / "refs" / "main").read_text() == commit
    # The client reads the metadata from the 302 and fetches the CDN URL itself, without the token.
    head = hub_requests(hub, "HEAD", "onnx/model.onnx")
    assert [e.status for e in head] == [302] and head[0].header("authorization") == f"Bearer {TOKEN}"
    assert [e.status for e in cdn_gets(hub, "onnx/model.onnx")] == [200]
    assert all(e.header("authorization") is None for e in hub.cdn.log.entries())

    # A renamed repo: the old id answers a relative 307 that the client follows.
    hub.rename("org/repo", "org/renamed")
    hub.reset_logs()
    path = Path(hf_download(hub, "org/repo", "config.json", tmp_path / "cache2"))
    assert path.read_bytes() == CONFIG
    assert [(e.method, e.status) for e in hub.log.entries()] == [("HEAD", 307), ("HEAD", 200), ("GET", 200)]
    assert hub.log.entries()[1].path.startswith("/org/renamed/resolve/main/")

    # A weak etag names the blob without its W/ marker.
    hub.weak_etags = True
    path = Path(hf_download(hub, "org/renamed", "config.json", tmp_path / "cache3"))
    assert os.readlink(path) == f"../../blobs/{git_blob_sha1(CONFIG)}"
    hub.weak_etags = False

    hub.add_repo("org/gated", {"a.txt": b"a"}, gated=True, tokens={TOKEN})
    hub.add_repo("org/private", {"a.txt": b"a"}, private=True, tokens={TOKEN})
    cache = tmp_path / "cache4"
    with pytest.raises(errors.GatedRepoError) as info:
        hf_download(hub, "org/gated", "a.txt", cache)
    assert info.value.response.status_code == 401
    with pytest.raises(errors.GatedRepoError) as info:
        hf_download(hub, "org/gated", "a.txt", cache, token="hf_not_granted")
    assert info.value.response.status_code == 403
    assert Path(hf_download(hub, "org/gated", "a.txt", cache, token=TOKEN)).read_bytes() == b"a"
    with pytest.raises(errors.RepositoryNotFoundError):
        hf_download(hub, "org/private", "a.txt", cache, token="hf_not_granted")
    assert Path(hf_download(hub, "org/private", "a.txt", cache, token=TOKEN)).read_bytes() == b"a"
    with pytest.raises(errors.RepositoryNotFoundError):
        hf_download(hub, "org/missing", "a.txt", cache)
    with pytest.raises(errors.RevisionNotFoundError):
        hf_download(hub, "org/renamed", "config.json", cache, revision="no-such-branch")
    with pytest.raises(errors.EntryNotFoundError):
        hf_download(hub, "org/renamed", "missing.json", cache)
    # ... and the client caches the miss under .no_exist, from the X-Repo-Commit of the 404.
    assert (cache / "models--org--renamed" / ".no_exist" / commit / "missing.json").exists()


def test_fake_hub_revisions_tags_and_moving_branches_with_huggingface_hub(hub, tmp_path):
    first = hub.add_repo("org/repo", {"config.json": b"one"})
    hub.set_ref("org/repo", "refs/pr/1", first)
    hub.set_ref("org/repo", "v1.0", first)
    second = hub.commit("org/repo", {"config.json": b"two"})
    cache = tmp_path / "cache"
    assert Path(hf_download(hub, "org/repo", "config.json", cache)).read_bytes() == b"two"
    assert Path(hf_download(hub, "org/repo", "config.json", cache, revision="refs/pr/1")).read_bytes() == b"one"
    assert hub.log.entries("HEAD")[-1].path == "/org/repo/resolve/refs%2Fpr%2F1/config.json"
    assert Path(hf_download(hub, "org/repo", "config.json", cache, revision="v1.0")).read_bytes() == b"one"
    assert Path(hf_download(hub, "org/repo", "config.json", cache, revision=first)).read_bytes() == b"one"
    repo = cache / "models--org--repo"
    assert (repo / "refs" / "main").read_text() == second
    assert (repo / "refs" / "refs" / "pr" / "1").read_text() == first
    assert {p.name for p in (repo / "snapshots").iterdir()} == {first, second}


def test_fake_cdn_serves_ranges_and_faults(hub):
    data = lfs_bytes(200_000, seed=3)
    hub.add_repo("org/repo", {"w.bin": data})
    digest = sha256_hex(data)
    url = hub.cdn.signed_url(digest, "w.bin")

    def get(headers=None):
        request = urllib.request.Request(url, headers=headers or {})
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()

    status, headers, body = get({"Range": "bytes=150000-"})
    assert status == 206 and body == data[150_000:]
    assert headers["Content-Range"] == f"bytes 150000-{len(data) - 1}/{len(data)}"

    hub.fault("w.bin", ignore_range=True)
    status, _, body = get({"Range": "bytes=150000-"})
    assert status == 200 and body == data

    hub.fault("w.bin", cut_after=1000)
    with pytest.raises(Exception):  # noqa: B017 - http.client.IncompleteRead, or a reset
        get()
    assert get()[2] == data  # only the first GET is cut

    hub.fault("w.bin", corrupt=True)
    body = get()[2]
    assert len(body) == len(data) and body != data

    hub.fault("w.bin", fail_status=503, fail_times=1)
    with pytest.raises(urllib.error.HTTPError) as info:
        get()
    assert info.value.code == 503
    assert get()[2] == data

    # Without the signature the CDN refuses, as a presigned URL's host does.
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{hub.cdn.url}/lfs/{digest}", timeout=10)
    assert info.value.code == 403


def test_fake_hub_resume_after_a_cut_with_huggingface_hub(hub, tmp_path):
    # huggingface_hub reads 10 MB chunks, so a cut before the first chunk restarts from zero:
    # the fault must leave the real client with a correct file all the same.
    data = lfs_bytes(400_000, seed=5)
    hub.add_repo("org/repo", {"w.bin": data})
    hub.fault("w.bin", cut_after=123_456)
    assert Path(hf_download(hub, "org/repo", "w.bin", tmp_path / "c")).read_bytes() == data
    assert len(cdn_gets(hub, "w.bin")) == 2


# ------------------------------------------------------------------------------------------------
# 1. Downloads and the cache layout


def test_download_small_and_lfs_files_into_the_huggingface_cache_layout(hub, transmuter):
    big = lfs_bytes(250_000)
    commit = hub.add_repo("org/repo", {"config.json": CONFIG, "onnx/weights.bin": big})

    result = transmuter.download("hf://org/repo/config.json")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [str(transmuter.snapshot("org/repo", commit, "config.json"))]
    assert "\r" not in result.stderr  # no progress bar without a TTY
    assert_cached(transmuter, "org/repo", commit, "config.json", CONFIG, git_blob_sha1(CONFIG))

    paths = transmuter.download_ok("hf://org/repo/onnx/weights.bin", "--quiet")
    assert paths == [transmuter.snapshot("org/repo", commit, "onnx/weights.bin")]
    assert_cached(transmuter, "org/repo", commit, "onnx/weights.bin", big, sha256_hex(big))
    assert transmuter.ref("org/repo", "main") == commit
    assert transmuter.incomplete_files() == []
    locks = transmuter.cache / ".locks" / "models--org--repo"
    assert {p.name for p in locks.iterdir()} == {f"{git_blob_sha1(CONFIG)}.lock", f"{sha256_hex(big)}.lock"}
    assert [e.header("authorization") for e in hub.log.entries()] == [None] * len(hub.log)

    # Downloaded once: again is a HEAD per file to learn the commit, and no body.
    hub.reset_logs()
    assert transmuter.download_ok("hf://org/repo/onnx/weights.bin", "--quiet") == paths
    assert transmuter.download_ok("hf://org/repo/config.json", "--quiet")[0].read_bytes() == CONFIG
    assert [e.method for e in hub.log.entries()] == ["HEAD", "HEAD"]
    assert len(hub.cdn.log) == 0


def test_a_weak_etag_names_the_blob_without_its_marker(hub, transmuter):
    hub.weak_etags = True
    commit = hub.add_repo("org/repo", {"config.json": CONFIG})
    transmuter.download_ok("hf://org/repo/config.json")
    assert_cached(transmuter, "org/repo", commit, "config.json", CONFIG, git_blob_sha1(CONFIG))


def test_download_at_a_tag_a_pr_ref_and_a_commit(hub, transmuter):
    first = hub.add_repo("org/repo", {"config.json": b"one"})
    hub.set_ref("org/repo", "v1.0", first)
    hub.set_ref("org/repo", "refs/pr/1", first)
    second = hub.commit("org/repo", {"config.json": b"two"})

    assert transmuter.download_ok("hf://org/repo@v1.0/config.json")[0].read_bytes() == b"one"
    assert transmuter.ref("org/repo", "v1.0") == first
    [path] = transmuter.download_ok("hf://org/repo@refs%2Fpr%2F1/config.json")
    assert path == transmuter.snapshot("org/repo", first, "config.json")
    assert hub.log.entries("HEAD")[-1].path == "/org/repo/resolve/refs%2Fpr%2F1/config.json"
    assert transmuter.ref("org/repo", "refs/pr/1") == first
    [path] = transmuter.download_ok(f"hf://org/repo@{second}/config.json")
    assert path.read_bytes() == b"two" and path == transmuter.snapshot("org/repo", second, "config.json")


# ------------------------------------------------------------------------------------------------
# 2. Redirects and where the token goes


def test_a_renamed_repo_redirect_is_followed_and_the_token_stays_on_the_hub(hub, transmuter):
    big = lfs_bytes(200_000, seed=1)
    commit = hub.add_repo("org/old", {"config.json": CONFIG, "weights.bin": big})
    hub.rename("org/old", "org/new")

    for path, data in (("config.json", CONFIG), ("weights.bin", big)):
        result = transmuter.download(f"hf://org/old/{path}", HF_TOKEN=TOKEN)
        assert result.returncode == 0, result.stderr
        assert_no_token_printed(result)
        [printed] = result.stdout.splitlines()
        # Stored under the id asked for, as huggingface_hub does.
        assert Path(printed) == transmuter.snapshot("org/old", commit, path)
        assert Path(printed).read_bytes() == data

    statuses = [(e.method, e.path.split("/resolve/")[0], e.status) for e in hub.log.entries()]
    assert ("HEAD", "/org/old", 307) in statuses and ("HEAD", "/org/new", 200) in statuses
    assert all(e.header("authorization") == f"Bearer {TOKEN}" for e in hub.log.entries())
    assert [e.status for e in cdn_gets(hub, "weights.bin")] == [200]
    assert all(e.header("authorization") is None for e in hub.cdn.log.entries())


# ------------------------------------------------------------------------------------------------
# 3., 4. Interrupted transfers


def test_a_cut_connection_resumes_with_a_range_request(hub, transmuter):
    data = lfs_bytes(2_000_000, seed=2)
    commit = hub.add_repo("org/repo", {"weights.bin": data})
    cut = 700_000
    hub.fault("weights.bin", cut_after=cut)

    transmuter.download_ok("hf://org/repo/weights.bin", "--quiet")
    assert_cached(transmuter, "org/repo", commit, "weights.bin", data, sha256_hex(data))
    gets = cdn_gets(hub, "weights.bin")
    assert len(gets) == 2, [(e.status, e.header("range")) for e in gets]
    assert range_start(gets[0]) is None
    start = range_start(gets[1])
    assert start is not None and 0 < start <= cut, gets[1].header("range")
    assert gets[1].status == 206
    assert transmuter.incomplete_files() == []


def test_a_200_answer_to_a_range_request_restarts_from_zero(hub, transmuter):
    data = lfs_bytes(1_500_000, seed=4)
    commit = hub.add_repo("org/repo", {"weights.bin": data})
    hub.fault("weights.bin", cut_after=500_000, ignore_range=True)

    transmuter.download_ok("hf://org/repo/weights.bin", "--quiet")
    assert_cached(transmuter, "org/repo", commit, "weights.bin", data, sha256_hex(data))
    gets = cdn_gets(hub, "weights.bin")
    assert [e.status for e in gets] == [200, 200]
    assert range_start(gets[1]) is not None  # it asked to resume; the answer was the whole file


# ------------------------------------------------------------------------------------------------
# 5. Server errors


def test_server_errors_are_retried(hub, transmuter):
    big = lfs_bytes(150_000, seed=6)
    commit = hub.add_repo("org/repo", {"config.json": CONFIG, "weights.bin": big})
    hub.fault("config.json", fail_status=503, fail_times=2)
    transmuter.download_ok("hf://org/repo/config.json", "--quiet")
    assert_cached(transmuter, "org/repo", commit, "config.json", CONFIG, git_blob_sha1(CONFIG))
    assert [e.status for e in hub_requests(hub, repo_path="config.json")][:3] == [503, 503, 200]

    hub.fault("weights.bin", fail_status=500, fail_times=2, fail_server="cdn")
    transmuter.download_ok("hf://org/repo/weights.bin", "--quiet")
    assert_cached(transmuter, "org/repo", commit, "weights.bin", big, sha256_hex(big))
    assert [e.status for e in cdn_gets(hub, "weights.bin")] == [500, 500, 200]


def test_a_server_that_keeps_failing_gives_up_with_a_clear_error(hub, transmuter):
    hub.add_repo("org/repo", {"config.json": CONFIG})
    hub.fault("config.json", fail_status=503, fail_times=10**9)
    result = transmuter.download("hf://org/repo/config.json", timeout=90)
    assert result.returncode != 0
    assert "503" in result.stderr
    assert hub.resolve_url("org/repo", "main", "config.json") in result.stderr
    assert result.stdout == ""
    assert len(hub.log) == 6  # the first try and max_retries (5) more, then a clear error
    assert not (transmuter.repo_dir("org/repo") / "snapshots").exists() or not any(
        (transmuter.repo_dir("org/repo") / "snapshots").rglob("config.json")
    )


# ------------------------------------------------------------------------------------------------
# 6. 401, 403, 404


def failed(t: Transmuter, source: str, *args: str, **env: str | None) -> subprocess.CompletedProcess:
    result = t.download(source, *args, **env)
    assert result.returncode != 0, f"download {source} should fail:\n{result.stdout}"
    assert result.stdout == ""
    assert_no_token_printed(result)
    return result


def test_errors_name_the_url_and_whether_a_token_was_sent(hub, transmuter):
    commit = hub.add_repo("org/repo", {"config.json": CONFIG})
    hub.add_repo("org/gated", {"config.json": CONFIG}, gated=True, tokens={TOKEN})
    hub.add_repo("org/private", {"config.json": CONFIG}, private=True, tokens={TOKEN})

    result = failed(transmuter, "hf://org/missing/config.json")
    assert hub.resolve_url("org/missing", "main", "config.json") in result.stderr
    assert "no token was sent" in result.stderr
    result = failed(transmuter, "hf://org/missing/config.json", HF_TOKEN=TOKEN)
    assert "a token was sent" in result.stderr

    result = failed(transmuter, "hf://org/repo@no-such-branch/config.json")
    assert hub.resolve_url("org/repo", "no-such-branch", "config.json") in result.stderr
    assert "revision" in result.stderr.lower()

    result = failed(transmuter, "hf://org/repo/missing.json")
    assert hub.resolve_url("org/repo", "main", "missing.json") in result.stderr
    assert (transmuter.repo_dir("org/repo") / ".no_exist" / commit / "missing.json").is_file()

    result = failed(transmuter, "hf://org/gated/config.json")
    assert hub.resolve_url("org/gated", "main", "config.json") in result.stderr
    assert "gated" in result.stderr.lower() and "no token was sent" in result.stderr
    result = failed(transmuter, "hf://org/gated/config.json", HF_TOKEN="hf_not_granted")
    assert "gated" in result.stderr.lower() and "a token was sent" in result.stderr
    assert "hf_not_granted" not in result.stderr
    assert hub.log.entries()[-1].status == 403

    result = failed(transmuter, "hf://org/private/config.json")
    assert "no token was sent" in result.stderr
    result = failed(transmuter, "hf://org/private/config.json", HF_TOKEN="hf_not_granted")
    assert hub.resolve_url("org/private", "main", "config.json") in result.stderr
    assert "a token was sent" in result.stderr
    assert "hf_not_granted" not in result.stderr

    for repo_id in ("org/gated", "org/private"):
        result = transmuter.download(f"hf://{repo_id}/config.json", HF_TOKEN=TOKEN)
        assert result.returncode == 0, result.stderr
        assert_no_token_printed(result)
        assert Path(result.stdout.strip()).read_bytes() == CONFIG


def test_the_token_is_read_from_hf_home(hub, transmuter):
    hub.add_repo("org/gated", {"config.json": CONFIG}, gated=True, tokens={TOKEN})
    (transmuter.home / "token").write_text(TOKEN + "\n")
    result = transmuter.download("hf://org/gated/config.json")
    assert result.returncode == 0, result.stderr
    assert_no_token_printed(result)
    assert hub_requests(hub, repo_path="config.json")[0].header("authorization") == f"Bearer {TOKEN}"


# ------------------------------------------------------------------------------------------------
# 7. A branch that moves


def test_a_moved_branch_gives_a_new_snapshot_and_keeps_the_old_one(hub, transmuter):
    shared = lfs_bytes(150_000, seed=7)
    first = hub.add_repo("org/repo", {"config.json": b"old", "weights.bin": shared})
    transmuter.download_ok("hf://org/repo/config.json")
    transmuter.download_ok("hf://org/repo/weights.bin")
    second = hub.commit("org/repo", {"config.json": b"new"})

    [path] = transmuter.download_ok("hf://org/repo/config.json")
    assert path == transmuter.snapshot("org/repo", second, "config.json") and path.read_bytes() == b"new"
    assert transmuter.ref("org/repo", "main") == second
    assert transmuter.snapshot("org/repo", first, "config.json").read_bytes() == b"old"
    assert transmuter.blob("org/repo", git_blob_sha1(b"old")).read_bytes() == b"old"
    # The unchanged LFS file of the new commit links to the blob already there: no new GET.
    hub.reset_logs()
    transmuter.download_ok("hf://org/repo/weights.bin")
    assert_cached(transmuter, "org/repo", second, "weights.bin", shared, sha256_hex(shared))
    assert len(hub.cdn.log) == 0


# ------------------------------------------------------------------------------------------------
# 8. Integrity


@pytest.mark.parametrize(
    "fault, words",
    [
        (dict(corrupt=True), ("sha256",)),
        (dict(length_delta=-1000), ("size", "bytes")),
        (dict(length_delta=+1000), ("size", "bytes")),
    ],
    ids=["corrupt", "short", "long"],
)
def test_a_download_that_does_not_match_the_hub_metadata_is_refused(hub, transmuter, fault, words):
    data = lfs_bytes(300_000, seed=8)
    commit = hub.add_repo("org/repo", {"weights.bin": data})
    hub.fault("weights.bin", **fault)
    result = failed(transmuter, "hf://org/repo/weights.bin")
    assert any(word in result.stderr.lower() for word in words), result.stderr
    assert not os.path.lexists(transmuter.snapshot("org/repo", commit, "weights.bin"))
    assert not os.path.lexists(transmuter.blob("org/repo", sha256_hex(data)))


def test_a_small_file_of_the_wrong_size_is_refused(hub, transmuter):
    commit = hub.add_repo("org/repo", {"config.json": CONFIG})
    hub.fault("config.json", length_delta=-5)
    result = failed(transmuter, "hf://org/repo/config.json")
    assert "size" in result.stderr.lower()
    assert not os.path.lexists(transmuter.snapshot("org/repo", commit, "config.json"))
    assert not os.path.lexists(transmuter.blob("org/repo", git_blob_sha1(CONFIG)))


# ------------------------------------------------------------------------------------------------
# 9., 10. Concurrency and kills


def test_two_processes_downloading_one_blob_fetch_it_once(hub, transmuter):
    data = lfs_bytes(600_000, seed=9)
    commit = hub.add_repo("org/repo", {"weights.bin": data})
    hub.fault("weights.bin", throttle_bps=400_000)  # ~1.5 s
    processes = [transmuter.popen("download", "hf://org/repo/weights.bin", "--quiet") for _ in range(2)]
    results = [p.communicate(timeout=60) for p in processes]
    for process, (stdout, stderr) in zip(processes, results):
        assert process.returncode == 0, stderr
        assert stdout.splitlines() == [str(transmuter.snapshot("org/repo", commit, "weights.bin"))]
    assert_cached(transmuter, "org/repo", commit, "weights.bin", data, sha256_hex(data))
    assert len(cdn_gets(hub, "weights.bin")) == 1
    assert transmuter.incomplete_files() == []


def assert_nothing_partial_is_visible(t: Transmuter, repo_id: str, expected: dict[str, bytes]) -> None:
    repo = t.repo_dir(repo_id)
    for entry in (repo / "snapshots").rglob("*") if (repo / "snapshots").exists() else []:
        if entry.is_dir() and not entry.is_symlink():
            continue
        relative = "/".join(entry.relative_to(repo / "snapshots").parts[1:])
        assert relative in expected, f"unexpected {entry}"
        assert entry.exists(), f"{entry} is a dangling link"
        assert entry.read_bytes() == expected[relative], f"{entry} is partial"
    digests = {sha256_hex(d) for d in expected.values()}
    for blob in (repo / "blobs").iterdir() if (repo / "blobs").exists() else []:
        if blob.name.endswith(".incomplete"):
            continue
        assert blob.name in digests, f"unexpected blob {blob.name}"
        assert sha256_hex(blob.read_bytes()) == blob.name, f"blob {blob.name} is partial"


def test_a_download_killed_at_any_moment_leaves_no_partial_file_visible(hub, transmuter):
    data = lfs_bytes(1_000_000, seed=10)
    commit = hub.add_repo("org/repo", {"onnx/weights.bin": data})
    hub.fault("onnx/weights.bin", throttle_bps=800_000)  # ~1.25 s a full download
    rng = random.Random(20240601)
    for _ in range(20):
        process = transmuter.popen("download", "hf://org/repo/onnx/weights.bin", "--quiet")
        time.sleep(rng.uniform(0.0, 1.5))
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=10)
        assert_nothing_partial_is_visible(transmuter, "org/repo", {"onnx/weights.bin": data})
        if os.path.exists(transmuter.snapshot("org/repo", commit, "onnx/weights.bin")):
            # Done before the kill: start over, to kill more downloads in their middle.
            shutil.rmtree(transmuter.repo_dir("org/repo"))
    transmuter.download_ok("hf://org/repo/onnx/weights.bin", "--quiet")
    assert_cached(transmuter, "org/repo", commit, "onnx/weights.bin", data, sha256_hex(data))
    assert transmuter.incomplete_files() == []


# ------------------------------------------------------------------------------------------------
# 11. Hostile names


def test_hostile_commit_and_etag_values_are_refused(hub, transmuter):
    before = tree(transmuter.root, skip=transmuter.cache)
    hub.add_repo("org/repo", {"config.json": CONFIG, "weights.bin": lfs_bytes(150_000)})
    repo = hub.repos["org/repo"]
    for commit_header, etag_header, path in [
        ("../../../escape", None, "config.json"),
        ("abc/def", None, "config.json"),
        (None, "aa/../../../../evil", "config.json"),
        (None, "..", "config.json"),
        (None, "../../../../evil", "weights.bin"),
    ]:
        repo.commit_header, repo.etag_header = commit_header, etag_header
        result = failed(transmuter, f"hf://org/repo/{path}")
        assert (commit_header or etag_header) in result.stderr, result.stderr
    assert tree(transmuter.root, skip=transmuter.cache) == before
    names = {p.name for p in transmuter.cache.rglob("*")}
    assert "escape" not in names and "evil" not in names and "def" not in names
    snapshots = transmuter.repo_dir("org/repo") / "snapshots"
    assert not snapshots.exists() or list(snapshots.iterdir()) == []


def test_a_symlink_planted_in_a_snapshot_is_not_followed_out_of_the_cache(hub, transmuter):
    model = matmul_add_model(np.eye(4, 3, dtype=np.float32), np.zeros(3, np.float32)).SerializeToString()
    commit = hub.add_repo("org/repo", {"onnx/model.onnx": model})
    outside = transmuter.root / "outside"
    outside.mkdir()
    snapshot = transmuter.snapshot("org/repo", commit)
    snapshot.mkdir(parents=True)
    (snapshot / "onnx").symlink_to(outside, target_is_directory=True)
    result = failed(transmuter, "hf://org/repo/onnx/model.onnx")
    assert "onnx" in result.stderr
    assert list(outside.iterdir()) == []


def test_a_path_with_dot_dot_is_refused_before_any_request(hub, transmuter):
    hub.add_repo("org/repo", {"config.json": CONFIG})
    for source in ("hf://org/repo/../x", "hf://org/repo/a/../../config.json", "hf://org/repo/./config.json"):
        result = failed(transmuter, source)
        assert source in result.stderr or ".." in result.stderr, result.stderr
    assert len(hub.log) == 0


def test_external_data_outside_the_model_folder_is_refused(hub, transmuter):
    model = external_data_model_pointing_at("../outside.bin")
    hub.add_repo("org/repo", {"onnx/model.onnx": model, "outside.bin": b"\0" * 48})
    result = failed(transmuter, "hf://org/repo/onnx/model.onnx")
    assert "../outside.bin" in result.stderr
    assert hub_requests(hub, repo_path="outside.bin") == []
    assert not any(p.name == "outside.bin" for p in transmuter.root.rglob("*"))


# ------------------------------------------------------------------------------------------------
# 12. Offline


@pytest.mark.parametrize("variable", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_offline_uses_the_cache_and_sends_nothing(hub, transmuter, variable):
    big = lfs_bytes(120_000, seed=11)
    hub.add_repo("org/repo", {"config.json": CONFIG, "weights.bin": big, "other.json": b"{}"})
    online = transmuter.download_ok("hf://org/repo/config.json") + transmuter.download_ok("hf://org/repo/weights.bin")
    hub.reset_logs()

    offline = transmuter.download_ok("hf://org/repo/config.json", **{variable: "1"})
    offline += transmuter.download_ok("hf://org/repo/weights.bin", **{variable: "1"})
    assert offline == online
    result = transmuter.download("hf://org/repo/other.json", **{variable: "1"})
    assert result.returncode != 0
    assert "offline" in result.stderr.lower() and "other.json" in result.stderr
    result = transmuter.download("hf://org/never/config.json", **{variable: "1"})
    assert result.returncode != 0 and "offline" in result.stderr.lower()
    assert len(hub.log) == 0 and len(hub.cdn.log) == 0


# ------------------------------------------------------------------------------------------------
# 13. One cache with huggingface_hub, both ways


def test_huggingface_hub_finds_what_transmuter_downloaded(hub, transmuter):
    big = lfs_bytes(200_000, seed=12)
    hub.add_repo("org/repo", {"config.json": CONFIG, "onnx/weights.bin": big})
    ours = transmuter.download_ok("hf://org/repo/config.json") + transmuter.download_ok("hf://org/repo/onnx/weights.bin")
    hub.reset_logs()
    import huggingface_hub

    for path, data, our_path in (("config.json", CONFIG, ours[0]), ("onnx/weights.bin", big, ours[1])):
        theirs = huggingface_hub.hf_hub_download(
            "org/repo", path, cache_dir=str(transmuter.cache), local_files_only=True
        )
        assert Path(theirs) == our_path and Path(theirs).read_bytes() == data
    assert len(hub.log) == 0


def test_transmuter_finds_what_huggingface_hub_downloaded(hub, transmuter):
    big = lfs_bytes(200_000, seed=13)
    commit = hub.add_repo("org/repo", {"config.json": CONFIG, "onnx/weights.bin": big})
    theirs = [Path(hf_download(hub, "org/repo", p, transmuter.cache)) for p in ("config.json", "onnx/weights.bin")]
    hub.reset_logs()
    ours = transmuter.download_ok("hf://org/repo/config.json", HF_HUB_OFFLINE="1")
    ours += transmuter.download_ok("hf://org/repo/onnx/weights.bin", HF_HUB_OFFLINE="1")
    assert ours == theirs
    assert ours[1].read_bytes() == big
    assert len(hub.log) == 0 and len(hub.cdn.log) == 0
    # Online, it finds the same blobs and fetches nothing.
    assert transmuter.download_ok(f"hf://org/repo@{commit}/onnx/weights.bin") == [ours[1]]
    assert len(hub.cdn.log) == 0 and hub_requests(hub, "GET") == []


# ------------------------------------------------------------------------------------------------
# 14. Models through hf:// sources


def matmul_add_model(weight: np.ndarray, bias: np.ndarray):
    """Y = X @ W + B, X: float32 [batch, 4]; W, B initializers."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["XW"]), helper.make_node("Add", ["XW", "B"], ["Y"])],
        "matmul_add",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", weight.shape[0]])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", weight.shape[1]])],
        [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(bias, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def external_data_model(tmp: Path, weight: np.ndarray, bias: np.ndarray) -> tuple[bytes, bytes]:
    """The model and its `model.onnx_data`, as onnx saves them."""
    import onnx

    tmp.mkdir(parents=True, exist_ok=True)
    onnx.save_model(
        matmul_add_model(weight, bias),
        str(tmp / "model.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.onnx_data",
        size_threshold=0,
    )
    return (tmp / "model.onnx").read_bytes(), (tmp / "model.onnx_data").read_bytes()


def external_data_model_pointing_at(location: str) -> bytes:
    from onnx import TensorProto

    model = matmul_add_model(np.zeros((4, 3), np.float32), np.zeros(3, np.float32))
    weight = model.graph.initializer[0]
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "48")):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    return model.SerializeToString()


@pytest.fixture
def model_repo(hub, tmp_path):
    rng = np.random.default_rng(0)
    weight, bias = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    model, data = external_data_model(tmp_path / "export", weight, bias)
    quantized = matmul_add_model(weight * 2, bias).SerializeToString()
    commit = hub.add_repo(
        "org/tiny",
        {
            "onnx/model.onnx": model,
            "onnx/model.onnx_data": data,
            "onnx/model_quantized.onnx": quantized,
            "config.json": CONFIG,
        },
        lfs={"onnx/model.onnx_data"},
    )
    return commit


def test_dtype_picks_the_model_file_as_transformers_js_does(hub, transmuter, model_repo):
    commit = model_repo
    [path] = transmuter.download_ok("hf://org/tiny", "--dtype", "q8", "--quiet")
    assert path == transmuter.snapshot("org/tiny", commit, "onnx/model_quantized.onnx")
    paths = transmuter.download_ok("hf://org/tiny", "--quiet")  # fp32 by default
    assert paths == [
        transmuter.snapshot("org/tiny", commit, "onnx/model.onnx"),
        transmuter.snapshot("org/tiny", commit, "onnx/model.onnx_data"),
    ]
    assert transmuter.download_ok("hf://org/tiny", "--dtype", "fp32") == paths
    [path] = transmuter.download_ok("hf://org/tiny/config.json")
    assert path.read_bytes() == CONFIG

    result = failed(transmuter, "hf://org/tiny", "--dtype", "fp16")
    assert "onnx/model_fp16.onnx" in result.stderr and "model_fp16.onnx" in result.stderr.replace(
        "onnx/model_fp16.onnx", ""
    )
    result = failed(transmuter, "hf://org/tiny", "--dtype", "fp64")
    assert "fp64" in result.stderr


def test_a_root_level_model_is_found_when_onnx_folder_has_none(hub, transmuter):
    model = matmul_add_model(np.eye(4, 3, dtype=np.float32), np.zeros(3, np.float32)).SerializeToString()
    commit = hub.add_repo("org/flat", {"model_q4.onnx": model})
    assert transmuter.download_ok("hf://org/flat", "--dtype", "q4") == [
        transmuter.snapshot("org/flat", commit, "model_q4.onnx")
    ]


def test_run_and_info_load_a_model_through_the_hub_and_then_offline(hub, transmuter, model_repo, tmp_path):
    import onnxruntime as ort

    commit = model_repo
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)

    result = transmuter.run("info", "hf://org/tiny")
    assert result.returncode == 0, result.stderr
    assert "X: float32 [batch, 4]" in result.stdout and "Y: float32 [batch, 3]" in result.stdout

    online = tmp_path / "online"
    result = transmuter.run("run", "hf://org/tiny", "--output-dir", str(online), "--dim", "batch=3")
    assert result.returncode == 0, result.stderr
    assert np.load(online / "Y.npy").shape == (3, 3)

    hub.stop()  # the cache alone from here on
    offline = tmp_path / "offline"
    result = transmuter.run(
        "run", "hf://org/tiny", "--input", f"X={tmp_path / 'x.npy'}", "--output-dir", str(offline), HF_HUB_OFFLINE="1"
    )
    assert result.returncode == 0, result.stderr
    local = transmuter.snapshot("org/tiny", commit, "onnx/model.onnx")
    [expected] = ort.InferenceSession(str(local), providers=["CPUExecutionProvider"]).run(["Y"], {"X": x})
    # A 4-term dot product and an add in float32: the two differ by rounding only.
    np.testing.assert_allclose(np.load(offline / "Y.npy"), expected, rtol=0, atol=1e-5)

    result = transmuter.run("run", "hf://org/tiny", "--dtype", "q8", "--output-dir", str(offline), HF_HUB_OFFLINE="1")
    assert result.returncode != 0 and "offline" in result.stderr.lower()
    assert "model_quantized.onnx" in result.stderr


# ------------------------------------------------------------------------------------------------
# 15. cache ls and cache rm


def cache_lines(t: Transmuter, *args: str) -> list[str]:
    result = t.run("cache", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_cache_ls_and_rm(hub, transmuter):
    shared = lfs_bytes(130_000, seed=14)
    first = hub.add_repo("org/a", {"config.json": b"a1", "weights.bin": shared})
    transmuter.download_ok("hf://org/a/config.json")
    transmuter.download_ok("hf://org/a/weights.bin")
    second = hub.commit("org/a", {"config.json": b"a2"})
    transmuter.download_ok("hf://org/a/config.json")
    transmuter.download_ok("hf://org/a/weights.bin")
    b_commit = hub.add_repo("org/b", {"config.json": b"b"})
    transmuter.download_ok("hf://org/b/config.json")

    lines = cache_lines(transmuter, "ls")
    [a_line] = [line for line in lines if line.split()[0] == "org/a"]
    [b_line] = [line for line in lines if line.split()[0] == "org/b"]
    assert "main" in a_line and "main" in b_line
    # Files counted as huggingface_hub's scan_cache_dir counts them (nb_files): blobs, each
    # once -- a1, a2 and the one both snapshots share.
    assert "3" in a_line.split()[1:] or "3 files" in a_line

    lines = cache_lines(transmuter, "ls", "--revisions")
    [old_line] = [line for line in lines if first in line]
    [new_line] = [line for line in lines if second in line]
    assert "org/a" in old_line and "main" not in old_line
    assert "org/a" in new_line and "main" in new_line
    assert any(b_commit in line and "main" in line for line in lines)

    # One snapshot: its own blob goes, the blob the other snapshot shares stays.
    result = transmuter.run("cache", "rm", f"org/a@{first}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() != ""
    assert not transmuter.snapshot("org/a", first).exists()
    assert transmuter.snapshot("org/a", second, "config.json").read_bytes() == b"a2"
    assert transmuter.snapshot("org/a", second, "weights.bin").read_bytes() == shared
    assert not transmuter.blob("org/a", git_blob_sha1(b"a1")).exists()
    assert transmuter.blob("org/a", sha256_hex(shared)).exists()
    assert transmuter.ref("org/a", "main") == second

    # A snapshot named by its ref: the ref goes with it.
    result = transmuter.run("cache", "rm", "org/a@main")
    assert result.returncode == 0, result.stderr
    assert not transmuter.snapshot("org/a", second).exists()
    assert transmuter.ref("org/a", "main") is None

    result = transmuter.run("cache", "rm", "org/b")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() != ""
    assert not transmuter.repo_dir("org/b").exists()
    assert all(not line.startswith("org/b") for line in cache_lines(transmuter, "ls"))

    for target in ("org/unknown", f"org/b@{b_commit}", "org/a@" + "0" * 40):
        result = transmuter.run("cache", "rm", target)
        assert result.returncode != 0, target
        assert result.stderr.strip() != ""


# ------------------------------------------------------------------------------------------------
# The progress bar: on a terminal only, never with --quiet


def run_with_terminal_stderr(t: Transmuter, *args: str) -> tuple[int, str, str]:
    """Runs the CLI with stderr on a pseudo-terminal; returns (exit code, stdout, what the terminal got)."""
    import pty

    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [t.binary, *args], stdout=subprocess.PIPE, stderr=follower, stdin=subprocess.DEVNULL, env=t.environment()
    )
    os.close(follower)
    screen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal is closed once the process is gone
            break
        if not chunk:
            break
        screen += chunk
    stdout = process.communicate(timeout=60)[0].decode()
    os.close(leader)
    return process.returncode, stdout, screen.decode(errors="replace")


def test_a_progress_bar_shows_on_a_terminal_and_not_with_quiet(hub, transmuter):
    data = lfs_bytes(600_000, seed=30)
    hub.add_repo("org/repo", {"weights.bin": data, "other.bin": lfs_bytes(600_000, seed=31)})
    hub.fault("weights.bin", throttle_bps=1_000_000)  # ~0.6 s: several redraws
    code, stdout, screen = run_with_terminal_stderr(transmuter, "download", "hf://org/repo/weights.bin")
    assert code == 0, screen
    assert stdout.strip().endswith("weights.bin")  # stdout stays the path alone
    assert "weights.bin" in screen and "600.0 kB" in screen and "100%" in screen and "/s" in screen
    assert "\r" in screen  # redrawn in place
    code, stdout, screen = run_with_terminal_stderr(transmuter, "download", "hf://org/repo/other.bin", "--quiet")
    assert code == 0, screen
    assert screen == ""


def test_run_by_dtype_downloads_once_then_runs_offline(hub, transmuter, model_repo, tmp_path):
    import onnxruntime as ort

    x = np.random.default_rng(2).standard_normal((2, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    run_args = ("run", "hf://org/tiny", "--dtype", "q8", "--input", f"X={tmp_path / 'x.npy'}")
    for attempt in ("first", "second"):
        result = transmuter.run(*run_args, "--output-dir", str(tmp_path / attempt))
        assert result.returncode == 0, result.stderr
    # Downloaded once; the second run only asked for the metadata.
    assert len(hub_requests(hub, "GET", "onnx/model_quantized.onnx")) == 1
    assert len(hub_requests(hub, "HEAD", "onnx/model_quantized.onnx")) == 2
    assert hub_requests(hub, None, "onnx/model.onnx") == []  # the fp32 file is never touched

    hub.stop()
    result = transmuter.run(*run_args, "--output-dir", str(tmp_path / "offline"), HF_HUB_OFFLINE="1")
    assert result.returncode == 0, result.stderr
    local = transmuter.snapshot("org/tiny", model_repo, "onnx/model_quantized.onnx")
    [expected] = ort.InferenceSession(str(local), providers=["CPUExecutionProvider"]).run(["Y"], {"X": x})
    for attempt in ("first", "offline"):
        # float32 rounding of a 4-term dot product and an add: 1e-5 absolute.
        np.testing.assert_allclose(np.load(tmp_path / attempt / "Y.npy"), expected, rtol=0, atol=1e-5)


def test_a_silent_server_times_out_and_the_download_resumes(hub, transmuter):
    data = lfs_bytes(1_000_000, seed=40)
    commit = hub.add_repo("org/repo", {"weights.bin": data})
    hub.fault("weights.bin", stall_after=300_000, stall_seconds=4)
    transmuter.download_ok("hf://org/repo/weights.bin", HF_HUB_DOWNLOAD_TIMEOUT="1")
    assert_cached(transmuter, "org/repo", commit, "weights.bin", data, sha256_hex(data))
    gets = cdn_gets(hub, "weights.bin")
    assert len(gets) == 2 and range_start(gets[0]) is None
    assert range_start(gets[1]) == 300_000  # resumed after the timeout, not restarted


def test_an_unreachable_hub_falls_back_to_the_cache(hub, transmuter):
    commit = hub.add_repo("org/repo", {"config.json": CONFIG})
    transmuter.download_ok("hf://org/repo/config.json")
    hub.stop()  # connections are refused from now on
    [path] = transmuter.download_ok("hf://org/repo/config.json")
    assert path == transmuter.snapshot("org/repo", commit, "config.json") and path.read_bytes() == CONFIG
    result = failed(transmuter, "hf://org/repo/tokenizer.json")
    assert "could not be reached" in result.stderr and "tokenizer.json" in result.stderr


# ------------------------------------------------------------------------------------------------
# Resuming across processes: a left-over .incomplete file is the next download's start


def test_a_killed_download_is_resumed_by_the_next_process(hub, transmuter):
    data = lfs_bytes(1_000_000, seed=50)
    commit = hub.add_repo("org/repo", {"weights.bin": data})
    hub.fault("weights.bin", throttle_bps=400_000)
    process = transmuter.popen("download", "hf://org/repo/weights.bin", "--quiet")
    blobs = transmuter.repo_dir("org/repo") / "blobs"
    for _ in range(200):  # at most 10 s for the first 200 kB
        partial = list(blobs.glob("*.incomplete")) if blobs.exists() else []
        if partial and partial[0].stat().st_size >= 200_000:
            break
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate(timeout=10)
    [partial] = list(blobs.glob("*.incomplete"))
    kept = partial.stat().st_size
    assert 200_000 <= kept < len(data)
    hub.clear_faults()
    hub.reset_logs()
    transmuter.download_ok("hf://org/repo/weights.bin", "--quiet")
    assert_cached(transmuter, "org/repo", commit, "weights.bin", data, sha256_hex(data))
    [get] = cdn_gets(hub, "weights.bin")
    assert range_start(get) == kept
    assert transmuter.incomplete_files() == []


def test_huggingface_hubs_incomplete_file_is_resumed_and_a_bad_one_is_refused(hub, transmuter):
    data = lfs_bytes(500_000, seed=51)
    etag = sha256_hex(data)
    commit = hub.add_repo("org/repo", {"weights.bin": data})
    blobs = transmuter.repo_dir("org/repo") / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{etag}.incomplete").write_bytes(bytes(b ^ 1 for b in data[:100_000]))  # not the file's start
    result = failed(transmuter, "hf://org/repo/weights.bin")
    assert "sha256" in result.stderr
    assert transmuter.incomplete_files() == []  # bad bytes are not kept for the next try
    (blobs / f"{etag}.incomplete").write_bytes(data[:300_000])  # as huggingface_hub leaves it
    hub.reset_logs()
    transmuter.download_ok("hf://org/repo/weights.bin")
    assert_cached(transmuter, "org/repo", commit, "weights.bin", data, etag)
    [get] = cdn_gets(hub, "weights.bin")
    assert range_start(get) == 300_000
    assert transmuter.incomplete_files() == []


def test_a_download_that_runs_out_of_retries_keeps_its_bytes_for_the_next_one(hub, transmuter):
    data = lfs_bytes(800_000, seed=52)
    commit = hub.add_repo("org/repo", {"weights.bin": data})
    # The first GET is cut after 250 kB, every later one answers 503.
    hub.fault("weights.bin", cut_after=250_000, fail_status=503, fail_times=10**9, fail_server="cdn",
              fail_methods=("GET",), fail_after=1)
    result = failed(transmuter, "hf://org/repo/weights.bin")
    assert "503" in result.stderr
    [partial] = transmuter.incomplete_files()
    assert partial.stat().st_size == 250_000 and partial.read_bytes() == data[:250_000]
    hub.clear_faults()
    hub.reset_logs()
    transmuter.download_ok("hf://org/repo/weights.bin")
    assert_cached(transmuter, "org/repo", commit, "weights.bin", data, sha256_hex(data))
    [get] = cdn_gets(hub, "weights.bin")
    assert range_start(get) == 250_000
    assert transmuter.incomplete_files() == []


def test_a_whole_left_over_file_is_checked_and_used_without_a_download(hub, transmuter):
    data = lfs_bytes(200_000, seed=53)
    etag = sha256_hex(data)
    commit = hub.add_repo("org/repo", {"weights.bin": data})
    blobs = transmuter.repo_dir("org/repo") / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{etag}.0123456789abcdef.incomplete").write_bytes(data)  # killed just before its rename
    transmuter.download_ok("hf://org/repo/weights.bin")
    assert_cached(transmuter, "org/repo", commit, "weights.bin", data, etag)
    assert cdn_gets(hub, "weights.bin") == []
    assert transmuter.incomplete_files() == []


# ------------------------------------------------------------------------------------------------
# TLS: peers are verified; a custom CA bundle is honoured


def test_tls_peers_are_verified_and_a_ca_bundle_is_honoured(transmuter, tmp_path):
    import ssl

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    secure = FakeHub()
    secure.tls = context
    secure.start()
    try:
        commit = secure.add_repo("org/repo", {"config.json": CONFIG})
        source = "hf://org/repo/config.json"
        result = failed(transmuter, source, HF_ENDPOINT=secure.url)  # self-signed: not trusted
        assert "certificate" in result.stderr.lower(), result.stderr
        assert not transmuter.repo_dir("org/repo").joinpath("blobs").exists() or not any(
            transmuter.repo_dir("org/repo").joinpath("blobs").iterdir()
        )
        bundles = ("CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")  # in the order they are read
        unset = {name: None for name in bundles}
        result = failed(transmuter, source, HF_ENDPOINT=secure.url, **unset)  # the system's CAs only
        assert "certificate" in result.stderr.lower(), result.stderr
        for variable in bundles:
            [path] = transmuter.download_ok(source, HF_ENDPOINT=secure.url, **dict(unset, **{variable: str(cert)}))
            assert path == transmuter.snapshot("org/repo", commit, "config.json") and path.read_bytes() == CONFIG
    finally:
        secure.stop()


def test_a_pipeline_reads_its_files_from_the_model_commit_then_offline(hub, transmuter, tmp_path):
    """`transmuter embed hf://...`: the ONNX file in onnx/ (transformers.js's layout), the tokenizer and
    the sentence-transformers files at the root and in 1_Pooling/, all from one commit; then offline."""
    import json

    fixture = Path(__file__).resolve().parents[1] / "pipelines" / "fixtures" / "bert_embedding"
    files = {"onnx/model.onnx": (fixture / "model.onnx").read_bytes()}
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "modules.json",
                 "sentence_bert_config.json", "1_Pooling/config.json"):
        files[name] = (fixture / name).read_bytes()
    commit = hub.add_repo("org/embedder", files, lfs={"onnx/model.onnx"})
    expected = json.loads((fixture / "expected.json").read_text())
    text = expected["sentences"][0]
    want = expected["poolings"]["mean_normalize"][0]

    result = transmuter.run("embed", "hf://org/embedder", text)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)["embedding"]
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-4
    assert transmuter.snapshot("org/embedder", commit, "1_Pooling/config.json").is_file()

    hub.stop()
    result = transmuter.run("embed", "hf://org/embedder", text, HF_HUB_OFFLINE="1")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["embedding"] == got


def test_generate_reads_the_generation_config_from_the_model_commit(hub, transmuter):
    """`transmuter generate hf://...`: model, tokenizer, config.json and generation_config.json from one
    commit; the greedy text equals the one transformers generated (tests/pipelines/fixtures)."""
    import json

    fixture = Path(__file__).resolve().parents[1] / "pipelines" / "fixtures" / "llama_decoder"
    files = {name: (fixture / name).read_bytes() for name in
             ("model.onnx", "tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json")}
    hub.add_repo("org/decoder", files, lfs={"model.onnx"})
    case = next(c for c in json.loads((fixture / "expected.json").read_text())["cases"] if c["name"] == "stops_on_eos")
    result = transmuter.run("generate", "hf://org/decoder", case["prompts"][0], "--max-new-tokens",
                            str(case["generate"]["max_new_tokens"]), "--jsonl")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.splitlines()[0])
    # generation_config.json's eos_token_id ends it early, as it ended transformers' run.
    assert out["stop_reason"] == "eos_token"
    assert out["tokens"] == case["new_token_ids"][0]  # one prompt: no pad tokens after the eos
    assert out["text"] == case["texts"][0]


def test_generate_fetches_an_encoder_decoders_files(hub, transmuter):
    """`transmuter generate hf://...` on an encoder-decoder repo laid out as transformers.js repos are
    (onnx/encoder_model.onnx, onnx/decoder_model_merged.onnx): both files from the same commit, greedy
    tokens equal transformers' (tests/pipelines/fixtures/bart_seq2seq)."""
    import json

    fixture = Path(__file__).resolve().parents[1] / "pipelines" / "fixtures" / "bart_seq2seq"
    files = {name: (fixture / name).read_bytes() for name in
             ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json")}
    for name in ("encoder_model.onnx", "decoder_model_merged.onnx"):
        files["onnx/" + name] = (fixture / name).read_bytes()
    commit = hub.add_repo("org/seq2seq", files, lfs={"onnx/encoder_model.onnx", "onnx/decoder_model_merged.onnx"})
    case = next(c for c in json.loads((fixture / "expected.json").read_text())["cases"] if c["name"] == "single")
    result = transmuter.run("generate", "hf://org/seq2seq", case["texts"][0], "--max-new-tokens",
                            str(case["generate"]["max_new_tokens"]), "--jsonl")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.splitlines()[0])
    assert out["tokens"] == case["new_token_ids"][0]
    assert transmuter.snapshot("org/seq2seq", commit, "onnx/decoder_model_merged.onnx").is_file()

