"""Fixtures for the hub tests: a fake Hub (and its CDN) per test, a temporary
Hugging Face cache, and the `transmuter` binary run with an environment that
points at both and holds nothing of the real user's HF_* settings."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from fake_hub import CdnServer, FakeHub  # noqa: E402

BIN = os.environ.get("TRANSMUTER_BIN", str(ROOT / "build" / "transmuter"))
TOKEN = "hf_secret_TEST_123"

# Variables of the user's own setup that would change what the binary or the
# huggingface_hub client in this process do.
_INHERITED_PREFIXES = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_")
_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")

# huggingface_hub reads its settings once, when imported: settle them now,
# before any test imports it (the tests pass endpoint=, cache_dir= and token= per call).
for _name in list(os.environ):
    if _name.startswith(_INHERITED_PREFIXES) or _name in _PROXY_VARIABLES:
        del os.environ[_name]
os.environ.update(
    HF_HOME=tempfile.mkdtemp(prefix="hf_home_pytest_"),
    HF_HUB_DISABLE_TELEMETRY="1",
    HF_HUB_DISABLE_PROGRESS_BARS="1",
    HF_HUB_DISABLE_IMPLICIT_TOKEN="1",
    HF_HUB_DISABLE_XET="1",
    NO_PROXY="127.0.0.1,localhost",
    no_proxy="127.0.0.1,localhost",
)


def clean_environment() -> dict[str, str]:
    """The inherited environment without HF_*, HUGGINGFACE_*, TRANSFORMERS_* and proxies."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_INHERITED_PREFIXES) and k not in _PROXY_VARIABLES
    }


@pytest.fixture
def hub():
    """A running fake Hub with its own CDN (`hub.cdn`), stopped after the test."""
    server = FakeHub(CdnServer())
    server.cdn.start()
    server.start()
    try:
        yield server
    finally:
        server.stop()
        server.cdn.stop()


class Transmuter:
    """The binary, run against one fake Hub and one cache directory."""

    def __init__(self, binary: str, hub: FakeHub, root: Path) -> None:
        self.binary = binary
        self.hub = hub
        self.root = root  # the test's own folder: nothing may appear here but what the test makes
        self.cache = root / "hf" / "hub"  # HF_HUB_CACHE; its parent holds only it
        self.home = root / "home"  # HF_HOME
        self.cache.mkdir(parents=True)
        self.home.mkdir()
        self.env = clean_environment()
        self.env.update(
            HF_ENDPOINT=hub.url,
            HF_HUB_CACHE=str(self.cache),
            HF_HOME=str(self.home),
            HF_HUB_DOWNLOAD_TIMEOUT="10",
            HF_HUB_ETAG_TIMEOUT="10",
            TRANSMUTER_HUB_RETRY_BACKOFF_S="0.05",
        )

    def environment(self, **extra: str | None) -> dict[str, str]:
        env = dict(self.env)
        for name, value in extra.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return env

    def run(self, *args: str, timeout: float = 120, **env: str | None) -> subprocess.CompletedProcess:
        """Runs `transmuter ARGS...`; keyword arguments set (str) or remove (None) variables."""
        return subprocess.run(
            [self.binary, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.environment(**env),
            stdin=subprocess.DEVNULL,
        )

    def popen(self, *args: str, **env: str | None) -> subprocess.Popen:
        return subprocess.Popen(
            [self.binary, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=self.environment(**env),
            start_new_session=True,
        )

    def download(self, source: str, *args: str, timeout: float = 120, **env: str | None) -> subprocess.CompletedProcess:
        return self.run("download", source, *args, timeout=timeout, **env)

    def download_ok(self, source: str, *args: str, **env: str | None) -> list[Path]:
        """Downloads and asserts success; returns the printed paths."""
        result = self.download(source, *args, **env)
        assert result.returncode == 0, f"download {source} failed ({result.returncode}):\n{result.stderr}"
        return [Path(line) for line in result.stdout.splitlines()]

    # -- the cache layout (huggingface_hub's) --------------------------------------------------

    def repo_dir(self, repo_id: str) -> Path:
        return self.cache / ("models--" + repo_id.replace("/", "--"))

    def snapshot(self, repo_id: str, commit: str, path: str = "") -> Path:
        base = self.repo_dir(repo_id) / "snapshots" / commit
        return base / path if path else base

    def blob(self, repo_id: str, etag: str) -> Path:
        return self.repo_dir(repo_id) / "blobs" / etag

    def ref(self, repo_id: str, name: str) -> str | None:
        path = self.repo_dir(repo_id) / "refs" / name
        return path.read_text() if path.exists() else None

    def incomplete_files(self) -> list[Path]:
        return sorted(self.cache.rglob("*.incomplete"))


@pytest.fixture
def transmuter(hub, tmp_path):
    """The CLI against `hub`, with a fresh cache; skips when the binary is not built."""
    if not os.path.exists(BIN):
        pytest.skip(f"the transmuter binary is not built ({BIN}); set TRANSMUTER_BIN")
    runner = Transmuter(BIN, hub, tmp_path)
    started: list[subprocess.Popen] = []
    original_popen = runner.popen

    def tracked_popen(*args: str, **env: str | None) -> subprocess.Popen:
        process = original_popen(*args, **env)
        started.append(process)
        return process

    runner.popen = tracked_popen  # type: ignore[method-assign]
    try:
        yield runner
    finally:
        for process in started:  # none may outlive its test
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
