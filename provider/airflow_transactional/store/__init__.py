"""The PostgreSQL state store: connections, migrations, and all of its SQL."""
