"""The chaos harness's slow link in front of the real S3 server: while slowed it holds object GETs
and trickles their answers, and lets listings and uploads pass; a server killed behind it is a
reset connection, and the same endpoint serves again once the server is back."""

from __future__ import annotations

import time

import pytest

from dev.s3 import S3Server

pytestmark = pytest.mark.integration


def timed(call: object) -> float:
    started = time.monotonic()
    call()  # type: ignore[operator]
    return time.monotonic() - started


def test_a_slowed_link_holds_object_gets_and_nothing_else(s3: S3Server) -> None:
    assert s3.link is not None
    s3.create_bucket("slow-link")
    client = s3.client()
    body = b"x" * 200_000
    client.put_object(Bucket="slow-link", Key="a/b.json", Body=body)
    held = s3.link.held
    s3.link.slow(8, (1.5, 1.5))
    took = timed(lambda: client.get_object(Bucket="slow-link", Key="a/b.json")["Body"].read() == body or 1 / 0)
    # held 1.5 s, then 200 kB trickled 16 KiB a 50 ms: 0.6 s more
    assert took >= 1.9 and s3.link.held == held + 1
    assert timed(lambda: client.list_objects_v2(Bucket="slow-link", Prefix="a/")) < 1.0
    assert timed(lambda: client.head_object(Bucket="slow-link", Key="a/b.json")) < 1.0
    assert timed(lambda: client.put_object(Bucket="slow-link", Key="a/c.json", Body=body)) < 1.0
    s3.link.slow(0)
    assert timed(lambda: client.get_object(Bucket="slow-link", Key="a/b.json")["Body"].read()) < 1.0


def test_a_server_killed_behind_the_link_is_a_failed_request_then_serves_again(s3: S3Server) -> None:
    s3.create_bucket("slow-link")
    client = s3.client()
    client.put_object(Bucket="slow-link", Key="k.json", Body=b"{}\n")
    s3.kill()
    try:
        with pytest.raises(Exception, match=r"(?i)connect|closed|reset|aborted"):
            client.get_object(Bucket="slow-link", Key="k.json")
    finally:
        s3.start()
    assert client.get_object(Bucket="slow-link", Key="k.json")["Body"].read() == b"{}\n"
