"""What only development needs, kept out of the installed provider: the embedded PostgreSQL, the
local Airflow stack and the demo. ``make demo`` and ``make test`` use them from a clone."""
