-- Which COPY wrote a bad record: ``slice`` names the attempt's COPY and the Spark partition it
-- streamed (``3:17``), ``writer`` the Spark task attempt that ran it (null: the driver, which runs
-- each COPY once). A task run again after its COPY committed -- its executor lost with the task's
-- result, a Spark Connect query re-executed -- copies its slice again; the commit keeps one
-- writer's rows per slice. (Two rows of one writer are two records, even with equal text.)
ALTER TABLE {s}.quarantine ADD COLUMN slice text;
ALTER TABLE {s}.quarantine ADD COLUMN writer bigint;
