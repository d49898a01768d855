-- The landing_files table: every version of every file a landing directory's topology has seen,
-- numbered in the order it was found (seq); a plan takes files by seq, so a batch is a seq range.

-- name: landing_latest_versions
SELECT DISTINCT ON (path) seq, path, size, mtime_ns, inode, sha256, plain, version FROM {s}.landing_files
WHERE topology_id = %(topology)s ORDER BY path, seq DESC

-- name: landing_last_seq
SELECT coalesce(max(seq), 0) FROM {s}.landing_files WHERE topology_id = %(topology)s

-- name: landing_latest
SELECT seq, path, size, mtime_ns, inode, sha256, plain, version FROM {s}.landing_files
WHERE topology_id = %(topology)s AND path = %(path)s ORDER BY seq DESC LIMIT 1

-- name: landing_insert
INSERT INTO {s}.landing_files (topology_id, seq, path, size, mtime, mtime_ns, inode, sha256, plain, version)
VALUES (%(topology)s, %(seq)s, %(path)s, %(size)s, %(mtime)s, %(mtime_ns)s, %(inode)s, %(sha256)s, %(plain)s,
        %(version)s)

-- name: landing_update
-- A version whose bytes are unchanged (touched), or rewritten before any plan took it: the entry follows it.
UPDATE {s}.landing_files SET size = %(size)s, mtime = %(mtime)s, mtime_ns = %(mtime_ns)s, inode = %(inode)s,
                             sha256 = %(sha256)s, plain = %(plain)s, version = %(version)s
WHERE topology_id = %(topology)s AND seq = %(seq)s

-- name: landing_after
SELECT seq, path, size, mtime_ns, inode, sha256, plain, version FROM {s}.landing_files
WHERE topology_id = %(topology)s AND seq > %(seq)s ORDER BY seq

-- name: landing_through
SELECT seq, path, size, mtime_ns, inode, sha256, plain, version FROM {s}.landing_files
WHERE topology_id = %(topology)s AND seq <= %(seq)s ORDER BY seq
