-- Landing directories on object storage and HDFS (sources/objectlanding.py): a file there is known by
-- the version its store gives it -- an S3 object's ETag, an HDFS file's file id -- besides its size
-- and modification time (null for a file on a local disk, known by its inode and SHA-256).
ALTER TABLE {s}.landing_files ADD COLUMN version text;
-- The greatest name registered in byte order (an S3 listing's and an HDFS directory's order), where
-- an incremental listing starts: found at the end of this index, whatever the number of files.
CREATE INDEX ON {s}.landing_files (topology_id, path COLLATE "C");

-- When a landing directory listed incrementally (only the names after the last one registered) last
-- listed all of its files: a full listing now and then finds names that sorted earlier and overwrites.
CREATE TABLE {s}.landing_listings (
    topology_id text PRIMARY KEY REFERENCES {s}.topologies ON DELETE CASCADE,
    full_at     timestamptz NOT NULL
);
