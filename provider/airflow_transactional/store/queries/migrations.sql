-- The migration runner's own statements (the migrations are store/schema/NNNN_name.sql).

-- name: migration_lock
-- Two processes migrating one schema at once take turns.
SELECT pg_advisory_xact_lock(%(key)s)

-- name: migration_create_schema
CREATE SCHEMA {s}

-- name: migration_create_table
CREATE TABLE IF NOT EXISTS {s}.schema_migrations (version integer PRIMARY KEY, name text NOT NULL,
                                                  applied_at timestamptz NOT NULL DEFAULT now())

-- name: migration_applied
SELECT version, name FROM {s}.schema_migrations ORDER BY version

-- name: migration_record
INSERT INTO {s}.schema_migrations (version, name) VALUES (%(version)s, %(name)s)
