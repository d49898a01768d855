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

-- name: landing_latest_of
-- The latest version of each of the given paths (a plan that listed only some of the directory).
SELECT DISTINCT ON (path) seq, path, size, mtime_ns, inode, sha256, plain, version FROM {s}.landing_files
WHERE topology_id = %(topology)s AND path = ANY(%(paths)s) ORDER BY path, seq DESC

-- name: landing_registered
-- Every version of the given paths registered (a bucket that keeps versions lists them all).
SELECT path, version FROM {s}.landing_files WHERE topology_id = %(topology)s AND path = ANY(%(paths)s)

-- name: landing_last_path
-- The greatest name registered, in byte order (an S3 listing's and an HDFS directory's order).
SELECT max(path COLLATE "C") FROM {s}.landing_files WHERE topology_id = %(topology)s

-- name: landing_waiting
-- The versions registered past the committed seq that are still their path's latest (or all of them,
-- where the store keeps every version): files waiting.
SELECT count(*), coalesce(sum(size), 0) FROM {s}.landing_files a
WHERE a.topology_id = %(topology)s AND a.seq > %(seq)s AND (%(every)s OR NOT EXISTS (
    SELECT 1 FROM {s}.landing_files b WHERE b.topology_id = a.topology_id AND b.path = a.path AND b.seq > a.seq))

-- name: landing_full_listing_due
SELECT coalesce(max(full_at) < now() - make_interval(secs => %(seconds)s), true) FROM {s}.landing_listings
WHERE topology_id = %(topology)s

-- name: landing_listed_fully
INSERT INTO {s}.landing_listings (topology_id, full_at) VALUES (%(topology)s, now())
ON CONFLICT (topology_id) DO UPDATE SET full_at = now()
