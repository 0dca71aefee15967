"""The real S3-compatible test server (dev/seaweedfs: SeaweedFS) for the upload
tests, started once per session, or the one at $TEST_S3_URL (which must take
dev/seaweedfs's default credentials). Like AWS, it makes no bucket on a put.
Registered as a plugin in tests/conftest.py (fixtures ``s3_server`` and ``bucket``)."""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.processes import dev_tool

URL_ENV = "TEST_S3_URL"
#: dev/seaweedfs's identities: an admin, and a writer (no admin, as a worker's key is).
KEY, SECRET = "stream-export", "stream-export-secret"
WRITER = ("stream-export-writer", "stream-export-writer-secret")
HOW_TO = (
    "The upload tests need SeaweedFS: `dev/seaweedfs build` (dev/setup --dev does it; "
    f"a few minutes from empty Go caches). To use a running one, `dev/seaweedfs start` and "
    f"export {URL_ENV}=$(dev/seaweedfs status)."
)
_buckets = itertools.count()


@dataclass(frozen=True)
class S3Server:
    url: str

    def env(self, *, writer: bool = False) -> dict[str, str]:
        """What a worker needs in its environment to reach it (AWS conventions): the
        admin's key, or the writer's."""
        key, secret = WRITER if writer else (KEY, SECRET)
        return {
            "AWS_ACCESS_KEY_ID": key,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_REGION": "us-east-1",
        }

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=KEY,
            aws_secret_access_key=SECRET,
            region_name="us-east-1",
        )

    def storage_options(self) -> dict[str, Any]:
        """fsspec's (s3fs) options, for ``datasets.load_dataset(..., storage_options=)``."""
        return {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": self.url}}

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = (
            self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        )
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def dev_seaweedfs(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return dev_tool("seaweedfs", *args, env=env, timeout=900)  # a start may build it


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    given = os.environ.get(URL_ENV)
    if given:
        yield S3Server(given.rstrip("/"))
        return
    state = tmp_path_factory.mktemp("seaweedfs")
    env = {**os.environ, "SEAWEEDFS_STATE_DIR": str(state)}
    started = dev_seaweedfs("start", env=env)
    if started.returncode != 0:
        pytest.fail(f"dev/seaweedfs start failed:\n{started.stderr}\n\n{HOW_TO}", pytrace=False)
    try:
        yield S3Server(started.stdout.strip())
    finally:
        dev_seaweedfs("stop", env=env)


@pytest.fixture
def bucket(s3_server: S3Server) -> str:
    """A new, empty bucket."""
    name = f"test-{os.getpid()}-{next(_buckets)}"
    s3_server.client().create_bucket(Bucket=name)
    return name
