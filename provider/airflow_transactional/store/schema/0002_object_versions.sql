-- Landing directories on object storage and HDFS (sources/objectlanding.py): a file there is known by
-- the version its store gives it -- an S3 object's ETag, an HDFS file's file id -- besides its size
-- and modification time (null for a file on a local disk, known by its inode and SHA-256).
ALTER TABLE {s}.landing_files ADD COLUMN version text;
