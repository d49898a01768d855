"""What a connection to an object store may make the provider fetch, and what of a store's answer
reaches an error: a host field is a host, an endpoint names a server, a read follows a NameNode's
redirect only to the same file on an allowed host, and an answer's text never reaches an error
(the overview shows errors to every viewer). The "store" here is a real HTTP server on loopback
answering as an attacker-chosen one would."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from airflow_transactional.exceptions import BatchUnavailable, ConfigError, SourceUnreachable
from airflow_transactional.sources.objectlanding import object_store
from airflow_transactional.sources.objects import StoredFile

pytestmark = pytest.mark.integration

SECRET = "internal-secret-7f3a"
FILE_ID = 16386


class Server:
    """An HTTP server on loopback answering each GET with ``answer(path_and_query)``: (status,
    headers, body); every request it got in ``seen``."""

    def __init__(self, answer: Callable[[str], tuple[int, dict[str, str], bytes]]) -> None:
        seen: list[str] = []
        self.seen = seen

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(self.path)
                status, headers, body = answer(self.path)
                self.send_response(status)
                for k, v in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[str], tuple[int, dict[str, str], bytes]]], Server]]:
    servers: list[Server] = []

    def start(answer: Callable[[str], tuple[int, dict[str, str], bytes]]) -> Server:
        servers.append(Server(answer))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


STATUS = (b'{"FileStatus": {"pathSuffix": "", "type": "FILE", "length": 6, "fileId": %d, '
          b'"modificationTime": 1}}' % FILE_ID)


def _namenode(redirect_to: Callable[[int], str]) -> Callable[[str], tuple[int, dict[str, str], bytes]]:
    """A NameNode whose file /in/a.json is 6 bytes, and whose OPEN redirects to ``redirect_to(port)``."""
    def answer(path: str) -> tuple[int, dict[str, str], bytes]:
        if "op=GETFILESTATUS" in path:
            return 200, {"Content-Type": "application/json"}, STATUS
        if "op=OPEN" in path and path.startswith("/webhdfs/v1/in/a.json"):
            return 307, {"Location": redirect_to(0)}, b""
        return 200, {}, f"{SECRET}\n".encode()  # what an internal address would answer
    return answer


@pytest.mark.parametrize("host", ["127.0.0.1:9870/internal/error?x=", "127.0.0.1/x", "user@127.0.0.1",
                                  "127.0.0.1#frag", "nn:9870", "a b"])
def test_a_webhdfs_host_field_is_a_host_and_nothing_else(host: str) -> None:
    with pytest.raises(ConfigError, match="host name or IP address"):
        object_store("hdfs://nn:8020/in", {"host": host, "port": 9870}, "webhdfs_x")
    with pytest.raises(ConfigError, match="port number"):
        object_store("hdfs://nn:8020/in", {"host": "127.0.0.1", "port": "9870/x"}, "webhdfs_x")


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:9000/internal/error", "http://127.0.0.1:9000?x=1",
                                      "http://user:pw@127.0.0.1:9000", "ftp://127.0.0.1", "127.0.0.1:9000",
                                      "http://127.0.0.1:99999", "http://127.0.0.1:9000#x"])
def test_an_s3_endpoint_names_a_server_and_nothing_else(endpoint: str) -> None:
    with pytest.raises(ConfigError, match=r"not http\(s\)://host\[:port\]"):
        object_store("s3a://bucket/in", {"endpoint_url": endpoint, "aws_access_key_id": "k",
                                         "aws_secret_access_key": "s"}, "aws_x")
    object_store("s3a://bucket/in", {"endpoint_url": "https://s3.internal:9000/"}, "aws_x")  # a server: taken


def test_a_read_follows_a_redirect_only_to_the_same_file_on_an_allowed_host(serve: Any) -> None:
    namenode = serve(_namenode(lambda _p: "http://127.0.0.1:1/internal/secret"))
    store = object_store("hdfs://nn:8020/in", {"host": "127.0.0.1", "port": namenode.port}, "webhdfs_x")
    planned = StoredFile("hdfs://nn:8020/in/a.json", 6, str(FILE_ID), 1_000_000)
    with pytest.raises(ConfigError, match=r"redirected to http://127\.0\.0\.1:1/internal/secret, not the file") as e:
        b"".join(store.blocks(planned))
    assert "datanodes" in str(e.value)
    store.close()

    # The same file's address, on a host the connection does not list: refused too.
    datanode = serve(lambda path: (200, {}, b"hello\n"))
    where = f"http://localhost:{datanode.port}/webhdfs/v1/in/a.json?op=OPEN&offset=0"
    namenode = serve(_namenode(lambda _p: where))
    store = object_store("hdfs://nn:8020/in", {"host": "127.0.0.1", "port": namenode.port}, "webhdfs_x")
    with pytest.raises(ConfigError, match="datanodes"):
        b"".join(store.blocks(planned))
    assert datanode.seen == []  # never asked
    store.close()

    # Listed: followed, and the file is read.
    store = object_store("hdfs://nn:8020/in", {"host": "127.0.0.1", "port": namenode.port,
                                               "datanodes": [f"localhost:{datanode.port}"]}, "webhdfs_x")
    assert b"".join(store.blocks(planned)) == b"hello\n"
    assert datanode.seen == ["/webhdfs/v1/in/a.json?op=OPEN&offset=0"]
    store.close()
    store = object_store("hdfs://nn:8020/in", {"host": "127.0.0.1", "port": namenode.port,
                                               "datanodes": ["*.localhost", "*.host"]}, "webhdfs_x")
    with pytest.raises(ConfigError, match="datanodes"):  # a domain's hosts, not the domain's name itself
        b"".join(store.blocks(planned))
    store.close()


def test_a_store_answer_never_reaches_an_error(serve: Any) -> None:
    body = b'{"RemoteException": {"exception": "SafeModeException", "message": "%s"}}' % SECRET.encode()
    namenode = serve(lambda path: (500, {"Content-Type": "application/json"}, body))
    store = object_store("hdfs://nn:8020/in", {"host": "127.0.0.1", "port": namenode.port}, "webhdfs_x")
    with pytest.raises(SourceUnreachable) as e:
        list(store.listing())
    assert "SafeModeException" in str(e.value) and "500" in str(e.value) and SECRET not in str(e.value)
    store.close()

    namenode = serve(lambda path: (502, {}, f"<html>{SECRET}</html>".encode()))
    store = object_store("hdfs://nn:8020/in", {"host": "127.0.0.1", "port": namenode.port}, "webhdfs_x")
    with pytest.raises(SourceUnreachable) as e:
        list(store.listing())
    assert "502" in str(e.value) and SECRET not in str(e.value)
    store.close()

    xml = (f"<?xml version='1.0'?><Error><Code>SlowDownNow</Code><Message>{SECRET}</Message>"
           f"<Resource>{SECRET}</Resource></Error>").encode()
    s3 = serve(lambda path: (400, {"Content-Type": "application/xml"}, xml))
    store = object_store("s3a://bucket/in", {"endpoint_url": f"http://127.0.0.1:{s3.port}", "aws_access_key_id": "k",
                                             "aws_secret_access_key": "s",
                                             "config_kwargs": {"s3": {"addressing_style": "path"}}}, "aws_x")
    with pytest.raises((SourceUnreachable, BatchUnavailable, ConfigError)) as e:
        list(store.listing())
    assert s3.seen and SECRET not in str(e.value), str(e.value)
    assert "SlowDownNow" in str(e.value)
    store.close()
