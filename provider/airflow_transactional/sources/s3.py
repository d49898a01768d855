"""An S3 bucket's prefix as a landing directory: listed and checked with boto3 by the planner
and the Spark driver, read by Spark's executors with Hadoop's s3a.

The connection is the Amazon provider's ``aws`` type: the access key and secret as its login and
password (or none: the machine's own credentials -- an instance profile, a web identity, the
environment), and in its extra ``endpoint_url``, ``region_name``, ``aws_session_token``,
``config_kwargs: {"s3": {"addressing_style": "path"}}``, ``expected_bucket_owner`` (the AWS account
that must own the bucket: every request says so, and S3 refuses one to a bucket of another account
-- a landing URL with a mistyped bucket name never reads a stranger's objects), and ``s3a``: Hadoop
settings for Spark's
reader from :data:`S3A_ALLOWED` (server-side encryption, an assumed role, the credentials
provider, timeouts). Nothing else reaches Spark: a connection's extra is not a way to set any
Hadoop option.

An object's version is its ETag: a new upload of other bytes has another. A bucket with versioning
enabled keeps every upload as a version of its own, with an id: there a version is its ETag and its
id (``"etag"?versionId=id``), a listing shows every version a key ever held (``ListObjectVersions``),
and a version is read by its id -- the planned bytes whatever the key holds now. S3 shows an object in a
listing only once its upload is complete (a multipart upload in progress is not listed), and a
read is conditional on the planned ETag (``If-Match``): the bytes of the planned version or a
clear failure. Spark's s3a reader checks the ETag of every request of a read against the first
(``fs.s3a.change.detection.mode=server``), and the driver checks each planned object before and
after the read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from ..exceptions import BatchUnavailable, ConfigError, SourceUnreachable
from .objects import ObjectStore, StoredFile, checked_endpoint, said, split_url

__all__ = ["S3A_ALLOWED", "VERSION_ID", "S3Store", "etag_and_id", "s3a_options", "version_of"]

#: Hadoop s3a settings a connection's extra may give Spark's reader (under ``"s3a"``).
S3A_ALLOWED = frozenset({
    "fs.s3a.aws.credentials.provider", "fs.s3a.assumed.role.arn", "fs.s3a.assumed.role.session.name",
    "fs.s3a.assumed.role.credentials.provider", "fs.s3a.assumed.role.sts.endpoint",
    "fs.s3a.assumed.role.sts.endpoint.region", "fs.s3a.encryption.algorithm", "fs.s3a.encryption.key",
    "fs.s3a.requester.pays.enabled", "fs.s3a.endpoint.fips", "fs.s3a.cross.region.access.enabled",
    "fs.s3a.connection.maximum", "fs.s3a.threads.max", "fs.s3a.attempts.maximum", "fs.s3a.retry.limit",
    "fs.s3a.retry.interval", "fs.s3a.connection.timeout", "fs.s3a.connection.establish.timeout",
    "fs.s3a.connection.request.timeout", "fs.s3a.readahead.range", "fs.s3a.input.fadvise",
    "fs.s3a.change.detection.version.required",
})
_BLOCK = 1 << 20
T = TypeVar("T")
log = logging.getLogger(__name__)
#: What joins a version's ETag and its id, in a bucket that keeps versions.
VERSION_ID = "?versionId="


def version_of(etag: str, version_id: str | None) -> str:
    """An object version's identity: its ETag, and its id where the bucket keeps versions (S3 calls a
    version written while versioning was off or suspended ``null``: no id to read it by)."""
    return f"{etag}{VERSION_ID}{version_id}" if version_id and version_id != "null" else etag


def etag_and_id(version: str) -> tuple[str, str | None]:
    """The ETag and the version id (None: none) of a version's identity."""
    etag, sep, version_id = version.partition(VERSION_ID)
    return etag, (version_id or None) if sep else None


def s3a_options(settings: Mapping[str, Any], conn_id: str | None = None) -> dict[str, str]:
    """The Hadoop settings of Spark's s3a reader for a connection's ``settings``: its credentials,
    endpoint and addressing, change detection by ETag, and the allowed ``s3a`` extras."""
    opts = {"fs.s3a.change.detection.mode": "server", "fs.s3a.change.detection.source": "etag"}
    if settings.get("aws_access_key_id"):
        opts["fs.s3a.access.key"] = str(settings["aws_access_key_id"])
        opts["fs.s3a.secret.key"] = str(settings.get("aws_secret_access_key") or "")
        if settings.get("aws_session_token"):
            opts["fs.s3a.session.token"] = str(settings["aws_session_token"])
            opts["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
    endpoint = settings.get("endpoint_url")
    if endpoint:
        endpoint = checked_endpoint(endpoint, conn_id)
        opts["fs.s3a.endpoint"] = endpoint
        opts["fs.s3a.connection.ssl.enabled"] = "false" if str(endpoint).startswith("http://") else "true"
    if settings.get("region_name"):
        opts["fs.s3a.endpoint.region"] = str(settings["region_name"])
    if _path_style(settings):
        opts["fs.s3a.path.style.access"] = "true"
    extra = settings.get("s3a") or {}
    if not isinstance(extra, Mapping):
        raise ConfigError(f"connection {conn_id!r}: its extra's s3a must be an object of Hadoop s3a settings")
    refused = sorted(set(extra) - S3A_ALLOWED)
    if refused:
        raise ConfigError(f"connection {conn_id!r}: s3a settings {refused} are not among those the provider passes "
                          f"to Spark; use {', '.join(sorted(S3A_ALLOWED))}")
    opts.update({str(k): str(v) for k, v in extra.items()})
    return opts


def _path_style(settings: Mapping[str, Any]) -> bool:
    config = settings.get("config_kwargs") or {}
    s3 = config.get("s3") if isinstance(config, Mapping) else None
    return isinstance(s3, Mapping) and s3.get("addressing_style") == "path"


class S3Store(ObjectStore):
    """The objects directly under ``s3a://bucket/prefix`` (the prefix a folder: ``prefix/name``)."""

    scheme = "s3a"

    def __init__(self, root: str, settings: Mapping[str, Any], conn_id: str | None = None) -> None:
        super().__init__(root, settings, conn_id)
        _scheme, self.bucket, path = split_url(root)
        self.prefix = f"{path.strip('/')}/" if path.strip("/") else ""
        self._client: Any = None
        self._versioned: bool | None = None
        s3a_options(settings, conn_id)  # refuse a bad extra now, not in the driver
        owner = settings.get("expected_bucket_owner")
        if owner is not None and not (isinstance(owner, str) and owner.isdigit() and len(owner) == 12):
            raise ConfigError(f"connection {conn_id!r}: expected_bucket_owner must be the 12-digit AWS account id "
                              f"that owns the bucket, got {owner!r}")
        #: Said on every request (S3's ``x-amz-expected-bucket-owner``).
        self.owner = {"ExpectedBucketOwner": owner} if owner else {}

    @property
    def client(self) -> Any:
        if self._client is None:
            try:
                import boto3
                from botocore.config import Config
            except ImportError:
                raise ConfigError("a landing directory on S3 needs boto3: pip install "
                                  "'airflow-provider-transactional[s3]'") from None
            s = self.settings
            config = Config(s3={"addressing_style": "path" if _path_style(s) else "auto"},
                            connect_timeout=10, read_timeout=60, retries={"max_attempts": 3, "mode": "standard"},
                            request_checksum_calculation="when_required",
                            response_checksum_validation="when_required")
            self._client = boto3.session.Session().client(
                "s3", endpoint_url=s.get("endpoint_url") or None, region_name=s.get("region_name") or None,
                aws_access_key_id=s.get("aws_access_key_id") or None,
                aws_secret_access_key=s.get("aws_secret_access_key") or None,
                aws_session_token=s.get("aws_session_token") or None, config=config)
        return self._client

    def spark_options(self) -> dict[str, str]:
        return s3a_options(self.settings, self.conn_id)

    def _url(self, key: str) -> str:
        return f"s3a://{self.bucket}/{key}"

    def _key(self, path: str) -> str:
        prefix = f"s3a://{self.bucket}/"
        if not path.startswith(prefix):
            raise ConfigError(f"{path} is not in bucket {self.bucket}")
        return path[len(prefix):]

    def keeps_versions(self) -> bool:
        """Whether the bucket's versioning is enabled (asked once: a bucket whose versioning was
        suspended keeps its old versions, and writes new ones without an id, as one without)."""
        if self._versioned is None:
            self._versioned = self._call(self._versioning).get("Status") == "Enabled"
        return self._versioned

    def _versioning(self) -> dict[str, Any]:
        from botocore.exceptions import ClientError

        try:
            return dict(self.client.get_bucket_versioning(Bucket=self.bucket, **self.owner))
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("NoSuchBucket", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise  # said as every other request's
            if code in ("NotImplemented", "501"):  # a server that keeps no versions (S3Proxy)
                return {}
            # A role not let ask it: planned as without versions, and said.
            log.warning("S3 bucket %r: its versioning could not be read (%s): its objects are planned as in a bucket "
                        "without versions (a key's overwritten version is not kept); allow s3:GetBucketVersioning "
                        "to have every version counted", self.bucket, said(code))
            return {}

    def listing(self, after: str | None = None) -> Iterator[StoredFile]:
        if self.keeps_versions():
            yield from self._versions(after)
            return
        start = {"StartAfter": self._key(after)} if after else {}
        pages = self._call(lambda: self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix, Delimiter="/", PaginationConfig={"PageSize": 1000}, **start,
            **self.owner))
        for page in self._call(lambda: list(pages)):
            for o in page.get("Contents") or ():
                if not o["Key"].endswith("/"):  # a "folder" marker is not a file
                    yield StoredFile(self._url(o["Key"]), int(o["Size"]), str(o["ETag"]),
                                     int(o["LastModified"].timestamp() * 1e9))

    def _versions(self, after: str | None) -> Iterator[StoredFile]:
        """Every version of every key (not its delete markers), the newest of a key first."""
        start = {"KeyMarker": self._key(after)} if after else {}
        pages = self._call(lambda: self.client.get_paginator("list_object_versions").paginate(
            Bucket=self.bucket, Prefix=self.prefix, Delimiter="/", PaginationConfig={"PageSize": 1000}, **start,
            **self.owner))
        for page in self._call(lambda: list(pages)):
            for o in page.get("Versions") or ():
                if not o["Key"].endswith("/"):
                    version = version_of(str(o["ETag"]), o.get("VersionId"))
                    yield StoredFile(self._url(o["Key"]), int(o["Size"]), version,
                                     int(o["LastModified"].timestamp() * 1e9))

    def stat(self, path: str) -> StoredFile | None:
        head = self._call(lambda: self.client.head_object(Bucket=self.bucket, Key=self._key(path), **self.owner),
                          missing=None)
        if head is None:
            return None
        return StoredFile(path, int(head["ContentLength"]), version_of(str(head["ETag"]), head.get("VersionId")),
                          int(head["LastModified"].timestamp() * 1e9))

    def kept(self, planned: StoredFile) -> bool:
        """Whether the bucket still keeps the ``planned`` version, whatever the key holds now: whether
        the key's versions, as the bucket lists them, hold it (a server may still serve a version
        deleted from the history by its id: S3Mock does)."""
        if etag_and_id(planned.version)[1] is None:
            return super().kept(planned)
        key = self._key(planned.path)
        pages = self._call(lambda: list(self.client.get_paginator("list_object_versions").paginate(
            Bucket=self.bucket, Prefix=key, **self.owner)))
        return any(o["Key"] == key and version_of(str(o["ETag"]), o.get("VersionId")) == planned.version
                   for page in pages for o in page.get("Versions") or ())

    def same_content(self, a: StoredFile, b: StoredFile) -> bool:
        """The same ETag and size: the same bytes, whichever versions hold them."""
        return (etag_and_id(a.version)[0], a.size) == (etag_and_id(b.version)[0], b.size)

    def blocks(self, planned: StoredFile) -> Iterator[bytes]:
        body = self._open(planned)
        try:
            while block := self._call(lambda: body.read(_BLOCK)):
                yield block
        finally:
            body.close()

    def piece(self, planned: StoredFile, offset: int, length: int) -> bytes:
        body = self._open(planned, Range=f"bytes={offset}-{offset + length - 1}")
        try:
            return bytes(self._call(body.read))
        finally:
            body.close()

    def _open(self, planned: StoredFile, **ranged: str) -> Any:
        """The body of exactly the ``planned`` version (by its id where the bucket keeps versions, else
        ``If-Match`` its ETag), or of a range of it."""
        etag, version_id = etag_and_id(planned.version)
        pinned = {"VersionId": version_id} if version_id else {"IfMatch": etag}
        body = self._call(lambda: self.client.get_object(Bucket=self.bucket, Key=self._key(planned.path), **pinned,
                                                          **ranged, **self.owner)["Body"],
                          missing=None, changed=planned.path)
        if body is None:
            if version_id:
                raise BatchUnavailable(f"landing object {planned.path}: its planned version {version_id} was deleted "
                                       "from the bucket's history; declare the topology opaque=True to record the "
                                       "loss and go on")
            raise BatchUnavailable(f"landing object {planned.path} is gone (planned with ETag {etag}) and the bucket "
                                   "keeps no versions: restore the same bytes under that key, or declare the topology "
                                   "opaque=True to record the loss and go on (a bucket with versioning enabled keeps "
                                   "every version readable)")
        return body

    def _call(self, fn: Callable[[], T], *, missing: Any = ..., changed: str | None = None) -> T:
        """``fn()``, its failures said as the provider says them: a store out of reach, a refused
        credential, a missing bucket -- each naming the fix; a missing key is ``missing`` if given."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        where = f"S3 bucket {self.bucket!r} ({self.settings.get('endpoint_url') or 'AWS'}, connection {self.conn_id!r})"
        try:
            return fn()
        except NoCredentialsError:
            raise ConfigError(f"{where}: no credentials -- set the connection's login and password (access key "
                              "and secret), or give this machine a role") from None
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            if code in ("NoSuchKey", "NoSuchVersion", "404", "NotFound") and missing is not ...:
                return missing
            if code in ("PreconditionFailed", "412") and changed:
                raise BatchUnavailable(f"landing object {changed} holds another version than the one planned (its "
                                       "ETag changed): it is a new version, read by a later txid") from None
            if code == "NoSuchBucket":
                raise ConfigError(f"{where}: the bucket does not exist -- create it, or fix the landing URL") from None
            if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403", "Forbidden") \
                    or status == 403:
                owned = (f", and that account {self.owner['ExpectedBucketOwner']} owns the bucket (the connection's "
                         "expected_bucket_owner: S3 refuses a request to another account's bucket)"
                         if self.owner else "")
                raise ConfigError(f"{where}: refused ({code}) -- check the connection's access key and secret, and "
                                  f"that they may list and read the bucket{owned}") from None
            raise SourceUnreachable(f"{where}: answered {status or 'no status'} ({said(code)})") from None
        except BotoCoreError as exc:
            raise SourceUnreachable(f"{where} did not answer ({type(exc).__name__}): check the server is up and the "
                                    "connection's endpoint_url") from None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
