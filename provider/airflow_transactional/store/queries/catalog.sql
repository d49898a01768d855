-- What the database itself knows (whether a table exists, its columns, the clock), session
-- wake-up notices, and the few statements that act on a whole table.

-- name: catalog_exists
SELECT to_regclass(%(name)s) IS NOT NULL

-- name: catalog_comment
SELECT obj_description(to_regclass(%(name)s), 'pg_class')

-- name: catalog_owned
-- Whether the current user owns the table (or is a member of its owner): may alter or comment on it.
SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = to_regclass(%(name)s)

-- name: catalog_schema_exists
SELECT to_regnamespace(%(name)s) IS NOT NULL

-- name: catalog_columns
SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
WHERE a.attrelid = to_regclass(%(name)s) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum

-- name: catalog_role
-- is_me: the current user, or a member of it: it has (or may take) the current user's rights.
SELECT rolsuper AS superuser, rolbypassrls AS bypasses_rls, pg_has_role(rolname, current_user, 'MEMBER') AS is_me
FROM pg_roles WHERE rolname = %(name)s

-- name: catalog_shares_rights
-- Whether either role is a member of the other (it has, or may take, the other's rights).
SELECT pg_has_role(%(a)s, %(b)s, 'MEMBER') OR pg_has_role(%(b)s, %(a)s, 'MEMBER')

-- name: catalog_now
-- clock_timestamp(), not now(): one time for everything a step records, even inside a long transaction.
SELECT clock_timestamp()

-- name: catalog_count
SELECT count(*) FROM {table}

-- name: drop_table_if_exists
DROP TABLE IF EXISTS {table}

-- name: notice_send
-- Sent inside the transaction that commits a txid or records that one failed: Postgres delivers it
-- when (and only if) that transaction commits.
SELECT pg_notify(%(channel)s, %(payload)s)

-- name: drop_table
DROP TABLE {table}

-- name: catalog_version
SELECT version()

-- name: catalog_set_comment
COMMENT ON TABLE {table} IS {comment}

-- name: catalog_rename_table
ALTER TABLE {table} RENAME TO {name}

-- name: catalog_rename_view
ALTER VIEW {table} RENAME TO {name}

-- name: select_all
SELECT * FROM {table}

-- name: copy_out
COPY ({select}) TO STDOUT

-- name: savepoint
-- A statement that may fail (a sum past its type) is tried under a savepoint, so the commit's
-- transaction survives it.
SAVEPOINT {savepoint}

-- name: savepoint_rollback
ROLLBACK TO SAVEPOINT {savepoint}

-- name: savepoint_release
RELEASE SAVEPOINT {savepoint}

-- name: notice_listen
LISTEN {channel}
