"""An HDFS directory as a landing directory: listed and checked over WebHDFS (the NameNode's
HTTP API) by the planner and the Spark driver, read by Spark's executors with the HDFS client
Spark ships (``hdfs://``).

The connection is Airflow's ``webhdfs`` type: the NameNode's HTTP host and port (default: the
``hdfs://`` URL's host, port 9870) and the HDFS user as its login (simple authentication; a
Kerberos-secured cluster is not supported by the planner yet). Its extra may say
``{"use_ssl": true}`` for an HTTPS NameNode, and ``{"datanodes": ["dn1", "dn2:9864",
"*.dn.example"]}``: the hosts (host:port, or the hosts under a domain) a read may be redirected to
besides the NameNode's. A read follows the NameNode's redirect only to one of those, and only to
the same file's WebHDFS address: a host field is a host (no path), and an answer's text never
reaches an error (the overview shows errors to every viewer).

A file's version is its file id (a new one for every file created under a name, whatever
replaced it), its length and its modification time (an append changes both): a file appended
to after it was planned is a new version, planned later; the planned one is gone.
"""

from __future__ import annotations

import getpass
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from ..exceptions import BatchUnavailable, ConfigError, SourceUnreachable
from .objects import ObjectStore, StoredFile, checked_host, checked_port, said, split_url

__all__ = ["WebHdfsStore"]

DEFAULT_HTTP_PORT = 9870
_BLOCK = 1 << 20
_TIMEOUT = (10, 60)


class WebHdfsStore(ObjectStore):
    """The files directly under ``hdfs://namenode:port/path``."""

    scheme = "hdfs"

    def __init__(self, root: str, settings: Mapping[str, Any], conn_id: str | None = None) -> None:
        super().__init__(root, settings, conn_id)
        _scheme, authority, self.directory = split_url(root)
        host = checked_host(settings.get("host") or authority.rsplit(":", 1)[0], conn_id)
        port = checked_port(settings.get("port") or DEFAULT_HTTP_PORT, conn_id)
        scheme = "https" if str(settings.get("use_ssl", "")).lower() in ("true", "1") else "http"
        self.base = f"{scheme}://{host}:{port}/webhdfs/v1"
        datanodes = settings.get("datanodes") or []
        if not isinstance(datanodes, list):
            raise ConfigError(f"connection {conn_id!r}: its extra's datanodes must be a list of hosts (or host:port)")
        #: Where a read may be redirected: the NameNode's host, and the declared DataNodes.
        self.redirects = {host.lower(), *(self._datanode(d, conn_id) for d in datanodes)}
        self.user = str(settings.get("login") or getpass.getuser())
        self.prefix = f"hdfs://{authority}"
        self._session: Any = None

    @property
    def session(self) -> Any:
        if self._session is None:
            import requests

            self._session = requests.Session()
        return self._session

    @staticmethod
    def _datanode(entry: Any, conn_id: str | None) -> str:
        host, _, port = str(entry).rpartition(":") if str(entry).count(":") == 1 else (str(entry), "", "")
        checked_host(host.removeprefix("*."), conn_id, "extra's datanodes entry")
        return f"{host.lower()}:{checked_port(port, conn_id)}" if port else host.lower()

    def _allowed(self, host: str, port: int | None) -> bool:
        """Whether a read may be redirected to ``host:port``: a listed host (or host:port), or a host
        under a listed ``*.domain``."""
        return host in self.redirects or f"{host}:{port}" in self.redirects or any(
            d.startswith("*.") and host.endswith(d[1:]) for d in self.redirects)

    def _get(self, path: str, op: str, *, stream: bool = False, **params: Any) -> Any:
        """A WebHDFS call on ``path`` (a path of the file system); None when it names nothing. A
        redirect (an OPEN's, to a DataNode) is followed once, to an allowed host and the same file."""
        import requests

        where = f"HDFS at {self.base.rsplit('/webhdfs', 1)[0]} (connection {self.conn_id!r})"
        url = f"{self.base}{quote(path)}"
        query: dict[str, Any] | None = {"op": op, "user.name": self.user, **params}
        for _hop in range(2):
            try:
                r = self.session.get(url, params=query, timeout=_TIMEOUT, stream=stream, allow_redirects=False)
            except requests.RequestException as exc:
                raise SourceUnreachable(f"{where} did not answer ({type(exc).__name__}): check the NameNode is up and "
                                        "the connection's host and port (its HTTP address)") from None
            if not r.is_redirect:
                break
            url, query = self._redirect(where, r.headers.get("Location", ""), path), None
            r.close()
        else:
            raise SourceUnreachable(f"{where}: {op} {path} was redirected twice; a NameNode redirects a read once")
        if r.status_code == 404:
            return None
        if r.status_code in (401, 403):
            raise ConfigError(f"{where}: user {self.user!r} may not {op} {path} -- give it read access, or set the "
                              "connection's login to a user that has it")
        if not r.ok:
            raise SourceUnreachable(f"{where}: {op} {path} answered {r.status_code} ({self._exception(r)})")
        return r

    def _redirect(self, where: str, location: str, path: str) -> str:
        """Where a redirect may take a read: the same file's WebHDFS address on an allowed host."""
        to = urlsplit(location)
        try:
            port = to.port
        except ValueError:
            port = None
        host = (to.hostname or "").lower()
        # The NameNode spells the path its own way (Hadoop encodes a '%' twice): the same file, decoded.
        same = f"/webhdfs/v1{path}" in (unquote(to.path), unquote(unquote(to.path)))
        if to.scheme not in ("http", "https") or not same or to.username \
                or not self._allowed(host, port):
            raise ConfigError(f"{where}: a read of {path} was redirected to "
                              f"{to.scheme}://{to.netloc[:80]}{to.path[:80]}, not the file on an allowed host; if "
                              "that host is one of the cluster's DataNodes, add it to the connection's extra: "
                              '{"datanodes": ["host"]}')
        return location

    @staticmethod
    def _exception(r: Any) -> str:
        """The kind of a WebHDFS error (its RemoteException's class), never its text."""
        try:
            return said(r.json()["RemoteException"]["exception"])
        except Exception:
            return "an error"

    def _file(self, directory: str, status: Mapping[str, Any]) -> StoredFile:
        name = f"{directory}/{status['pathSuffix']}" if status.get("pathSuffix") else directory
        return StoredFile(f"{self.prefix}{name}", int(status["length"]), str(status["fileId"]),
                          int(status["modificationTime"]) * 1_000_000)

    def listing(self, after: str | None = None) -> Iterator[StoredFile]:
        after = after.rsplit("/", 1)[1] if after else ""
        while True:
            params: dict[str, Any] = {"startafter": after} if after else {}  # the NameNode reads it in lower case
            r = self._get(self.directory, "LISTSTATUS_BATCH", **params)
            if r is None:
                raise ConfigError(f"landing directory {self.root} does not exist: create it or fix the path")
            listing = r.json()["DirectoryListing"]
            entries = listing["partialListing"]["FileStatuses"]["FileStatus"]
            for status in entries:
                if status.get("type") == "FILE":
                    yield self._file(self.directory, status)
            if not entries or not int(listing.get("remainingEntries") or 0):
                return
            after = entries[-1]["pathSuffix"]

    def _path(self, url: str) -> str:
        if not url.startswith(f"{self.prefix}/"):
            raise ConfigError(f"{url} is not on {self.prefix}")
        return url[len(self.prefix):]

    def stat(self, path: str) -> StoredFile | None:
        r = self._get(self._path(path), "GETFILESTATUS")
        if r is None:
            return None
        status = r.json()["FileStatus"]
        return self._file(self._path(path), status) if status.get("type") == "FILE" else None

    def same_content(self, a: StoredFile, b: StoredFile) -> bool:
        return a == b._replace(path=a.path)

    def blocks(self, planned: StoredFile) -> Iterator[bytes]:
        r = self._open(planned, stream=True, length=planned.size)
        read = 0
        try:
            for block in r.iter_content(_BLOCK):
                read += len(block)
                yield block
        finally:
            r.close()
        self._check(planned, short=read != planned.size)

    def piece(self, planned: StoredFile, offset: int, length: int) -> bytes:
        data = bytes(self._open(planned, offset=offset, length=length).content)
        self._check(planned, short=len(data) != length)
        return data

    def _open(self, planned: StoredFile, *, stream: bool = False, **params: Any) -> Any:
        """An OPEN of the ``planned`` version (looked up first: WebHDFS cannot make a read conditional)."""
        self._check(planned)
        r = self._get(self._path(planned.path), "OPEN", stream=stream, **params)
        if r is None:  # gone between the look and the open
            raise BatchUnavailable(f"landing file {planned.path} is gone since it was planned (file id "
                                   f"{planned.version}): restore it, or declare the topology opaque=True")
        return r

    def _check(self, planned: StoredFile, *, short: bool = False) -> None:
        """The name still holds the ``planned`` version (and a read of it was not ``short``)."""
        now = self.stat(planned.path)
        if now is None or not self.same_content(planned, now) or short:
            raise BatchUnavailable(f"landing file {planned.path} is gone or changed since it was planned (file id "
                                   f"{planned.version}, {planned.size} bytes): its content now is a new version, "
                                   "read by a later txid")

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
